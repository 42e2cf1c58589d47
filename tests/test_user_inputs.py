"""#37 inputs that are not data: `--inputs FILE.npz` (the user's samples are the reference inputs and fix the compile
shapes), `--freeze NAME` (an input folded into the graph at its sample value), parameter inputs (shapes, axes) given
valid seeded values or named in one line, and a GPT-2 KV-cache decoder compiled once for past=1..512."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from helpers import assert_clean_error, gpt2_kv_inputs, gpt2_kv_onnx, mlp_onnx, run_mlc


def node_test(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    """An onnx backend node test's model and its shipped inputs (test_data_set_0)."""
    case = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node" / name
    model = onnx.load(str(case / "model.onnx"))
    weights = {i.name for i in model.graph.initializer}
    feeds = {}
    for i, value in enumerate(v for v in model.graph.input if v.name not in weights):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((case / "test_data_set_0" / f"input_{i}.pb").read_bytes())
        feeds[value.name] = numpy_helper.to_array(tensor)
    return case / "model.onnx", feeds


def manifest(artifact: Path) -> dict:
    return json.loads((artifact / "manifest.json").read_text())


def test_samples_are_the_reference_and_fix_the_shapes(tmp_path):
    model = mlp_onnx(tmp_path / "mlp.onnx")
    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    np.savez(tmp_path / "sample.npz", x=x)
    art = tmp_path / "art"
    run_mlc("compile", model, "-o", art, "--inputs", tmp_path / "sample.npz", check=True)
    m = manifest(art)
    assert m["inputs"][0]["shape"] == [3, 16]  # batch fixed at the sample's 3, not mlc's default 2
    assert np.array_equal(np.load(art / "reference" / "inputs.npz")["x"], x)
    user = m["reference"]["user_inputs"]
    assert user["file"] == str((tmp_path / "sample.npz").resolve())
    assert len(user["sha256"]) == 64
    assert "--inputs" in m["compile"]["recipe"] and m["compile"]["options"]["inputs"] == user["file"]


def test_dynamic_keeps_a_dim_the_samples_give(tmp_path):
    model = mlp_onnx(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "sample.npz", x=np.ones((3, 16), np.float32))
    art = tmp_path / "art"
    run_mlc("compile", model, "-o", art, "--inputs", tmp_path / "sample.npz", "--dynamic", "batch=1..8", check=True)
    assert manifest(art)["inputs"][0]["shape"] == ["batch", 16]


@pytest.mark.parametrize("arrays, fragments", [
    ({}, ["lacks x", "the model's inputs are: x"]),
    ({"x": np.ones((2, 16), np.float32), "z": np.ones(3, np.float32)}, ["has z, which the model does not take"]),
    ({"x": np.ones((2, 16), np.float64)}, ["'x' is float64", "takes float32", "save it as float32"]),
    ({"x": np.ones(16, np.float32)}, ["rank 1", "takes rank 2"]),
    ({"x": np.ones((2, 15), np.float32)}, ["fixes axis 1 at 16"]),
])
def test_bad_samples_are_one_line_errors(tmp_path, arrays, fragments):
    model = mlp_onnx(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "sample.npz", **arrays)
    proc = run_mlc("compile", model, "-o", tmp_path / "art", "--inputs", tmp_path / "sample.npz")
    assert_clean_error(proc, 1, "--inputs", *fragments)
    assert not (tmp_path / "art").exists()


def test_option_conflicts_are_one_line_errors(tmp_path):
    model = mlp_onnx(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "sample.npz", x=np.ones((3, 16), np.float32))
    proc = run_mlc("compile", model, "--inputs", tmp_path / "sample.npz", "--input-shape", "x:2x16")
    assert_clean_error(proc, 1, "--input-shape x:2x16 conflicts with --inputs", "[3, 16]")
    proc = run_mlc("compile", model, "--freeze", "x")
    assert_clean_error(proc, 1, "--freeze x", "--inputs FILE.npz")
    proc = run_mlc("compile", model, "--inputs", tmp_path / "sample.npz", "--freeze", "nope")
    assert_clean_error(proc, 1, "--freeze nope", "no such input", "x")
    proc = run_mlc("compile", model, "--inputs", tmp_path / "missing.npz")
    assert_clean_error(proc, 1, "--inputs", "not found")


@pytest.mark.parametrize("name, needs", [
    ("test_cumsum_1d_exclusive", "input 'axis' sets the axis of CumSum"),  # TVM needs the axis constant
    ("test_col2im_dilations", "input 'image_shape' sets the image shape of Col2Im"),  # no value is valid for all
    ("test_constantofshape_int_shape_zero", "input 'x' sets the output shape of ConstantOfShape"),  # was exit 70
])
def test_parameter_inputs_are_named_without_samples(tmp_path, name, needs):
    model, _ = node_test(name)
    proc = run_mlc("compile", model, "-o", tmp_path / "art")
    assert_clean_error(proc, 1, needs, "--inputs FILE.npz")


def test_expand_shape_gets_a_valid_seeded_value(tmp_path):
    model, _ = node_test("test_expand_dim_changed")  # seeded 0..3 made "invalid expand shape" in ONNX Runtime
    art = tmp_path / "art"
    proc = run_mlc("compile", model, "-o", art, check=True)
    assert np.array_equal(np.load(art / "reference" / "inputs.npz")["new_shape"], [1, 3, 1])  # data is 3x1
    assert "input 'new_shape' sets the shape of Expand: the check ran on a value mlc chose" in proc.stderr


@pytest.mark.parametrize("name, frozen", [
    ("test_cumsum_1d_exclusive", ["axis"]),
    ("test_expand_dim_changed", ["new_shape"]),
    ("test_col2im_dilations", ["image_shape", "block_shape"]),
    ("test_constantofshape_int_shape_zero", ["x"]),  # every input frozen: an artifact without inputs
])
def test_frozen_node_tests_match_the_shipped_outputs(tmp_path, name, frozen):
    model, feeds = node_test(name)
    np.savez(tmp_path / "sample.npz", **feeds)
    art = tmp_path / "art"
    run_mlc("compile", model, "-o", art, "--inputs", tmp_path / "sample.npz",
            *[a for n in frozen for a in ("--freeze", n)], check=True)
    m = manifest(art)
    assert [i["name"] for i in m["inputs"]] == [n for n in feeds if n not in frozen]
    assert {n: r["value"] for n, r in m["frozen"].items()} == {n: feeds[n].tolist() for n in frozen}
    # the runtime refuses the frozen input in one line, naming its value
    proc = run_mlc("run", art, "--inputs", tmp_path / "sample.npz")
    assert_clean_error(proc, 1, f"input '{frozen[0]}' was frozen at compile time (--freeze) to "
                       f"{feeds[frozen[0]].tolist()}")
    np.savez(tmp_path / "data.npz", **{n: v for n, v in feeds.items() if n not in frozen})
    run_mlc("run", art, "--inputs", tmp_path / "data.npz", "-o", tmp_path / "out.npz", check=True)
    case = model.parent / "test_data_set_0"
    expected = numpy_helper.to_array(onnx.load_tensor(str(case / "output_0.pb")))
    got = next(iter(np.load(tmp_path / "out.npz").values()))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    if name == "test_cumsum_1d_exclusive":  # mlc debug rebuilds it from the recipe: samples and freeze included
        proc = run_mlc("debug", art)
        assert proc.returncode == 0 and "no divergence" in proc.stdout, proc.stderr


def test_gpt2_kv_cache_compiles_once_for_every_past_length(tmp_path):
    """total = past + seq: with samples (past 7, seq 1) and --dynamic past=1..512 the relation is learnt by running
    the model (total moves with past), compiled as past+1, and the artifact matches ONNX Runtime at past 1..511."""
    import onnxruntime as ort

    from mlc.runtime.runner import FeedError, Runner

    model = gpt2_kv_onnx(tmp_path / "gpt2kv.onnx")
    np.savez(tmp_path / "sample.npz", **gpt2_kv_inputs(past=7))
    art = tmp_path / "art"
    run_mlc("compile", model, "-o", art, "--inputs", tmp_path / "sample.npz", "--dynamic", "past=1..512", check=True)
    m = manifest(art)
    shapes = {i["name"]: i["shape"] for i in m["inputs"]}
    assert shapes["attention_mask"] == [1, "past+1"] and shapes["past_key_0"] == [1, 2, "past", 8]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    runner = Runner(art)
    for past in (1, 100, 511):
        feeds = gpt2_kv_inputs(past=past, seed=past)
        got = runner.run(feeds)
        for name, want in zip(names, session.run(names, feeds)):
            assert got[name].shape == want.shape, (past, name)
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"past={past} {name}")
    feeds = gpt2_kv_inputs(past=10)
    feeds["attention_mask"] = feeds["attention_mask"][:, :5]
    with pytest.raises(FeedError, match="dimension 'past\\+1' must be past\\+1: the inputs give past=10 but 5"):
        runner.run(feeds)


GATE_FACTORY = '''
import torch


class Gate(torch.nn.Module):
    def forward(self, features, scale):
        return torch.sigmoid(features) * scale, features.sum(dim=-1)


def make():
    return Gate(), (torch.randn(2, 4), torch.randn(2, 4))
'''


def test_framework_model_runs_eagerly_on_the_samples(tmp_path):
    pytest.importorskip("torch")
    factory = tmp_path / "gate.py"
    factory.write_text(GATE_FACTORY)
    rng = np.random.default_rng(3)
    samples = {n: rng.standard_normal((5, 4)).astype(np.float32) for n in ("features", "scale")}
    np.savez(tmp_path / "sample.npz", **samples)
    proc = run_mlc("export", f"{factory}:make", "-o", tmp_path / "gate.onnx", "--inputs", tmp_path / "sample.npz")
    assert proc.returncode == 0, proc.stderr
    assert " 5x4 " in proc.stdout  # the comparison ran on the samples' batch of 5 (seeded inputs have 2)
    np.savez(tmp_path / "bad.npz", features=samples["features"])
    proc = run_mlc("export", f"{factory}:make", "-o", tmp_path / "bad.onnx", "--inputs", tmp_path / "bad.npz")
    assert_clean_error(proc, 1, "lacks scale")
    art = tmp_path / "art"
    run_mlc("compile", f"{factory}:make", "-o", art, "--inputs", tmp_path / "sample.npz", check=True)
    m = manifest(art)
    assert m["reference"]["producer"].startswith("torch") and m["inputs"][0]["shape"] == [5, 4]
    reference = np.load(art / "reference" / "inputs.npz")
    assert all(np.array_equal(reference[n], v) for n, v in samples.items())
