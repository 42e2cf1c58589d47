"""Issue #19: transformers models exported the usual ways (the TorchScript exporter with dynamic_axes, the
dynamo exporter with dynamic_shapes), dynamic batch and seq, compile as plain ONNX files with no flags, keep
both dims symbolic, and match ONNX Runtime on the same file at sizes other than the reference's."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnxruntime as ort
import pytest

from mlc import api
from mlc.runtime import runner as thin_runtime
from helpers import run_mlc

pytest.importorskip("torch")
pytest.importorskip("transformers")

VOCAB = 1000
SIZES = ((1, 5), (2, 16), (3, 33))  # (batch, seq); the reference runs at (2, 16)
INPUTS = ["input_ids", "attention_mask"]


def _model(kind: str):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if kind == "bert":
        model = tf.BertModel(tf.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=128))
    elif kind == "distilbert":
        model = tf.DistilBertModel(tf.DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=2, hidden_dim=128))
    elif kind == "roberta":
        model = tf.RobertaModel(tf.RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                                 num_attention_heads=2, intermediate_size=128))
    else:
        model = tf.GPT2Model(tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=128))

    class Wrapped(torch.nn.Module):
        """Keyword call: transformers 5's config-default decorator and the TorchScript exporter's
        positional defaults both pass `use_cache` when the model is called positionally."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            extra = {"use_cache": False} if kind == "gpt2" else {}
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).to_tuple()

    return Wrapped().eval()


def export(kind: str, exporter: str, path) -> None:
    import torch

    model = _model(kind)
    ids = torch.randint(0, VOCAB, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes = {name: {0: "batch", 1: "seq"} for name in INPUTS}
            torch.onnx.export(model, (ids, mask), str(path), input_names=INPUTS, dynamic_axes=axes, opset_version=17,
                              dynamo=False)
        else:
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            shapes = {name: {0: batch, 1: seq} for name in INPUTS}
            torch.onnx.export(model, (ids, mask), str(path), input_names=INPUTS, dynamic_shapes=shapes,
                              opset_version=18, dynamo=True, verbose=False)


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2 + 1:] = 0  # the last sentence is padded
    return {"input_ids": rng.integers(2, VOCAB, (batch, seq), dtype=np.int64), "attention_mask": mask}


CASES = [
    ("bert", "torchscript"), ("bert", "dynamo"), ("gpt2", "torchscript"), ("gpt2", "dynamo"),
    pytest.param("distilbert", "torchscript", marks=pytest.mark.slow),
    pytest.param("distilbert", "dynamo", marks=pytest.mark.slow),
    pytest.param("roberta", "torchscript", marks=pytest.mark.slow),
    pytest.param("roberta", "dynamo", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(kind, exporter) -> the ONNX file, exported once per module."""
    files = {}

    def get(kind: str, exporter: str):
        if (kind, exporter) not in files:
            folder = tmp_path_factory.mktemp(f"{kind}-{exporter}")  # dynamo writes weights beside the file
            export(kind, exporter, folder / f"{kind}.onnx")
            files[kind, exporter] = folder / f"{kind}.onnx"
        return files[kind, exporter]

    return get


def _matches_onnxruntime(path, artifact, sizes=SIZES) -> None:
    runner = thin_runtime.Runner(artifact)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, seq in sizes:
        feeds = _feeds(batch, seq)
        want = session.run(None, feeds)
        got = list(runner.run(feeds).values())
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (batch, seq)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"batch {batch}, seq {seq}")


@pytest.mark.parametrize("kind,exporter", CASES)
def test_export_compiles_with_no_flags_and_stays_symbolic(kind, exporter, exported, tmp_path):
    path = exported(kind, exporter)
    out = tmp_path / "art"
    if (kind, exporter) == ("bert", "torchscript"):  # the README's first command, as the user runs it
        proc = run_mlc("compile", path, "--target", "x86", "-o", out)
        assert proc.returncode == 0, proc.stderr
    else:
        assert api.compile(str(path), target="x86", output=out, isolate=False).check.passed
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["shape"] for i in manifest["inputs"]] == [["batch", "seq"]] * 2
    assert manifest["outputs"][0]["shape"] == ["batch", "seq", 64]
    _matches_onnxruntime(path, out)


def test_dynamic_range_on_a_torchscript_export(exported, tmp_path):
    path = exported("bert", "torchscript")
    result = api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False, dynamic=["seq=1..256"])
    assert result.check.passed
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert [i["shape"] for i in manifest["inputs"]] == [["batch", "seq"]] * 2
    assert manifest["dynamic_ranges"] == {"seq": [1, 256]}
    _matches_onnxruntime(path, tmp_path / "art", SIZES + ((1, 256),))


def _ceil_reshape(path) -> None:
    """Reshape to [-1, ceil(seq * 0.5), 16]: float math on a dim, which TVM's importer cannot follow."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def const(name, value, dtype=np.int64):
        return numpy_helper.from_array(np.array(value, dtype), name)

    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["seq"]),
             helper.make_node("Cast", ["seq"], ["seq_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["seq_f", "half"], ["half_f"]), helper.make_node("Ceil", ["half_f"], ["ceil_f"]),
             helper.make_node("Cast", ["ceil_f"], ["ceil"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["ceil", "axis0"], ["ceil_1d"]),
             helper.make_node("Concat", ["minus1", "ceil_1d", "sixteen"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None, 16])
    graph = helper.make_graph(nodes, "ceil_reshape", [x], [y],
                              [const("one", 1), const("half", 0.5, np.float32), const("axis0", [0]),
                               const("minus1", [-1]), const("sixteen", [16])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_a_dim_that_cannot_stay_symbolic_is_bound_to_the_reference_size_and_said(tmp_path):
    path = tmp_path / "ceil.onnx"
    _ceil_reshape(path)
    result = api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False)
    assert result.check.passed
    assert [n for n in result.notes if n.startswith("compiled for batch=2, seq=16 (the reference sizes)")]
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == [2, 16, 8]
    record = next(p for p in manifest["compile"]["passes"] if p["name"] == "bind_symbolic_dims")
    assert record["reason"].startswith("batch=2, seq=16: TVM's importer could not keep them symbolic")


def test_shape_arithmetic_in_int32_stays_symbolic(tmp_path):
    """tf2onnx-style: Reshape(x, Cast(Concat(-1, Shape(x)[1] * 8) in int32)) keeps seq symbolic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def const(name, value, dtype=np.int64):
        return numpy_helper.from_array(np.array(value, dtype), name)

    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Cast", ["shape"], ["shape32"], to=TensorProto.INT32),
             helper.make_node("Gather", ["shape32", "one"], ["seq"]),
             helper.make_node("Mul", ["seq", "eight"], ["width"]),
             helper.make_node("Unsqueeze", ["width", "axis0"], ["width_1d"]),
             helper.make_node("Concat", ["minus1", "width_1d"], ["target32"], axis=0),
             helper.make_node("Cast", ["target32"], ["target"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    graph = helper.make_graph(nodes, "int32_shape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None])],
                              [const("one", 1), const("eight", 8, np.int32), const("axis0", [0]),
                               const("minus1", [-1], np.int32)])
    path = tmp_path / "int32.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    result = api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False)
    assert result.check.passed
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == ["batch", "seq", 8]
    batch, width = manifest["outputs"][0]["shape"]
    assert batch == "batch" and "seq" in width  # an expression of seq (printed by TVM), not a number
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    np.testing.assert_array_equal(thin_runtime.Runner(tmp_path / "art").run({"x": x})["y"], x.reshape(3, 40))


@pytest.mark.parametrize("target", ["graviton3", "cuda-t4"])
def test_export_stays_symbolic_for_arm_and_cuda(target, exported, tmp_path):
    """The same export for ARM (cross-compiled, checked under qemu) and CUDA (built; no GPU here to run it)."""
    import shutil

    from mlc.runtime import runner

    if target == "graviton3" and not (shutil.which("aarch64-linux-gnu-g++") and runner.emulator_command("aarch64")):
        pytest.skip("apt-get install g++-aarch64-linux-gnu qemu-user")
    out = tmp_path / "art"
    proc = run_mlc("compile", exported("bert", "torchscript"), "--target", target, "-o", out)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["shape"] for i in manifest["inputs"]] == [["batch", "seq"]] * 2
    assert manifest["outputs"][0]["shape"] == ["batch", "seq", 64]
    if target == "graviton3":
        assert "pass" in proc.stdout
    else:
        assert "__global__" in (out / "kernels" / "cuda.cu").read_text()
