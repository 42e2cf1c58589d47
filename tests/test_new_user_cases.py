"""Twenty more cases a new user tries (issue #41, last paragraph), each with small models built in code.

| # | case | before | now |
|---|---|---|---|
| 1 | names `input:0`, `out/put 0` | ok: compile, run, run.py -o | same (regression) |
| 2 | int64/uint8/bool inputs; a float64 .npz for float32 | ok; one-line dtype error | same |
| 3 | a 0-d output, `mlc run` | `y: shape  float32` (blank) | `y: shape scalar float32` |
| 4 | no inputs (Relu of a weight) | summary `inputs: ` and `kernels: ` blank | `inputs: none`, no kernels line |
| 5 | no-node ONNX: output = weight / = input | exit 1 "empty graph; export again" | compiles and runs |
| 6 | `.pt2` with no inputs (`ones(3) * 2`) | exit 1 "/tmp/mlc-…/model.onnx has an empty graph" | compiles |
| 7 | an input of shape 0x3 | ok | same |
| 8 | 40 outputs | ok | same |
| 9 | a graph input that is also an output | ok | same |
| 10 | `my models/ü/mödel v2.onnx`, default -o | ok: artifacts/mödel v2-x86 | same |
| 11 | -o = the model's own non-empty folder | ok: exit 1, model kept | same |
| 12 | `mlc run ART --threads 100000`, run.py too | SIGABRT, exit 134 (1000: spins for minutes) | exit 1, one line |
| 13 | `mlc run ART -i my.npz -o ART/reference/outputs.npz` | exit 0; artifact broken (sha256) | exit 1, intact |
| 14 | torch fp16 module returning `x.sum()` (dynamo) | exit 3: export left it float32 | cast back to float16 |
| 15 | a torch.save checkpoint as the model | exit 1, torch's text cut mid-sentence | "is a torch.save checkpoint" |
| 16 | `-t x86_64` | ok: "did you mean 'x86'?" | same |
| 17 | `mlc check ART --atol -1` | ok: exit 1 | same |
| 18 | `--dynamic b=1..4`, run at batch 9 | ok: names the range and the fix | same |
| 19 | TorchScript model returning a dict | exit 1 "prim::DictConstruct … not supported" | plus what to do |
| 20 | `-o afile/sub`, afile a file | after the work: "cannot write to afile: File exists" | at once: "… is a file" |
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mlc.api as api
from mlc.runtime.runner import save_npz
from helpers import assert_clean_error, run_mlc


def _save(graph, path):
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def odd_artifact(tmp_path_factory):
    """One compile for cases 1-3 and 7-9: odd names, int/uint8/bool inputs, a scalar output, a 0x3 input, a graph
    input returned as an output, and 40 outputs."""
    folder = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")]
    weights += [numpy_helper.from_array(np.array(float(i), np.float32), f"k{i}") for i in range(40)]
    nodes = [
        helper.make_node("MatMul", ["input:0", "w"], ["out/put 0"]),
        helper.make_node("Cast", ["a"], ["af"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["u"], ["uf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["af", "uf"], ["s"]),
        helper.make_node("Where", ["m", "s", "af"], ["picked"]),
        helper.make_node("ReduceSum", ["picked"], ["total"], keepdims=0),
        helper.make_node("Relu", ["e"], ["e_out"]),
        *[helper.make_node("Mul", ["af", f"k{i}"], [f"y{i}"]) for i in range(40)],
    ]
    value = helper.make_tensor_value_info
    inputs = [value("input:0", TensorProto.FLOAT, [2, 4]), value("a", TensorProto.INT64, [3]),
              value("u", TensorProto.UINT8, [3]), value("m", TensorProto.BOOL, [3]),
              value("e", TensorProto.FLOAT, [0, 3])]
    outputs = [value("out/put 0", TensorProto.FLOAT, [2, 3]), value("picked", TensorProto.FLOAT, [3]),
               value("total", TensorProto.FLOAT, []), value("e_out", TensorProto.FLOAT, [0, 3]),
               value("a", TensorProto.INT64, [3]), *[value(f"y{i}", TensorProto.FLOAT, [3]) for i in range(40)]]
    model = _save(helper.make_graph(nodes, "odd", inputs, outputs, weights), folder / "odd.onnx")
    result = api.compile(str(model), target="x86", output=folder / "odd-x86")
    assert result.check.passed
    return result.path


def _run_outputs(artifact, tmp_path, *extra):
    out = tmp_path / "out.npz"
    proc = run_mlc("run", artifact, "--repeat", "1", "-o", out, *extra, check=True)
    with np.load(out) as data:
        return proc, dict(data)


def test_odd_tensor_names_round_trip(odd_artifact, tmp_path):
    """Case 1: names with ':' and '/' and a space, through `mlc run` and run.py."""
    _, outputs = _run_outputs(odd_artifact, tmp_path)
    assert outputs["out/put 0"].shape == (2, 3)
    out = tmp_path / "runpy.npz"
    subprocess.run([sys.executable, odd_artifact / "run.py", "--repeat", "1", "-o", out], check=True,
                   capture_output=True)
    with np.load(out) as data:
        np.testing.assert_array_equal(data["out/put 0"], outputs["out/put 0"])


def test_integer_and_bool_inputs_and_a_wrong_dtype(odd_artifact, tmp_path):
    """Case 2: int64/uint8/bool inputs run; a float64 array for the float32 input is one clean error."""
    feeds = dict(np.load(odd_artifact / "reference/inputs.npz"))
    assert {k: str(v.dtype) for k, v in feeds.items() if k in "aum"} == {"a": "int64", "u": "uint8", "m": "bool"}
    feeds["input:0"] = feeds["input:0"].astype(np.float64)
    wrong = tmp_path / "wrong.npz"
    save_npz(wrong, feeds)  # np.savez takes names as keywords
    assert_clean_error(run_mlc("run", odd_artifact, "-i", wrong), 1, "expects dtype float32, got float64")


def test_scalar_output_is_listed_as_scalar(odd_artifact, tmp_path):
    """Case 3: `mlc run` lists a 0-d output as "scalar", not with an empty shape."""
    proc, outputs = _run_outputs(odd_artifact, tmp_path)
    assert outputs["total"].shape == ()
    assert "total: shape scalar float32" in proc.stdout, proc.stdout


def test_zero_sized_dim(odd_artifact, tmp_path):
    """Case 7: an input and output of shape 0x3."""
    _, outputs = _run_outputs(odd_artifact, tmp_path)
    assert outputs["e_out"].shape == (0, 3)


def test_many_outputs(odd_artifact, tmp_path):
    """Case 8: 40 outputs, each with its own value."""
    _, outputs = _run_outputs(odd_artifact, tmp_path)
    a = np.load(odd_artifact / "reference/inputs.npz")["a"].astype(np.float32)
    for i in range(40):
        np.testing.assert_allclose(outputs[f"y{i}"], a * i)


def test_graph_input_returned_as_output(odd_artifact, tmp_path):
    """Case 9: an input that is also a graph output comes back unchanged."""
    _, outputs = _run_outputs(odd_artifact, tmp_path)
    np.testing.assert_array_equal(outputs["a"], np.load(odd_artifact / "reference/inputs.npz")["a"])


def test_model_without_inputs_summary(tmp_path):
    """Case 4: a model with no inputs says so, and prints no blank "kernels:" line."""
    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) - 3, "c")
    graph = helper.make_graph([helper.make_node("Relu", ["c"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [weight])
    proc = run_mlc("compile", _save(graph, tmp_path / "noinputs.onnx"), "-o", tmp_path / "art", check=True)
    assert "inputs: none)" in proc.stdout, proc.stdout
    assert not any(line.strip() == "kernels:" for line in proc.stdout.splitlines()), proc.stdout


@pytest.mark.parametrize("kind", ["weight", "input"])
def test_graph_of_no_nodes(tmp_path, kind):
    """Case 5: a valid ONNX graph with no nodes, its output a weight (a constant model) or an input."""
    value = helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])
    if kind == "weight":
        graph = helper.make_graph([], "g", [], [value], [numpy_helper.from_array(np.ones((2, 3), np.float32), "c")])
    else:
        graph = helper.make_graph([], "g", [value], [value])
    artifact = api.compile(str(_save(graph, tmp_path / "m.onnx")), target="x86", output=tmp_path / "art").path
    feeds = {} if kind == "weight" else {"c": np.full((2, 3), 7, np.float32)}
    expected = np.ones((2, 3), np.float32) if kind == "weight" else feeds["c"]
    np.testing.assert_array_equal(api.run(artifact, feeds, repeat=0).outputs["c"], expected)


def test_graph_that_names_no_output_is_still_empty(tmp_path):
    """Case 5's limit: no nodes and an output nothing produces is still refused as an empty graph."""
    graph = helper.make_graph([], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    assert_clean_error(run_mlc("compile", _save(graph, tmp_path / "m.onnx")), 1, "empty graph")


@pytest.mark.slow  # 12 s; the fix it needs is case 5's, tested there in seconds
def test_pt2_without_inputs(tmp_path):
    """Case 6: a torch.export program with no inputs (its output a constant) compiles, naming no temp file."""
    torch = pytest.importorskip("torch")

    class Constant(torch.nn.Module):
        def forward(self):
            return torch.ones(3) * 2

    path = tmp_path / "noinput.pt2"
    torch.export.save(torch.export.export(Constant(), ()), str(path))
    proc = run_mlc("compile", path, "-o", tmp_path / "art", check=True)
    assert "inputs: none" in proc.stdout
    np.testing.assert_array_equal(api.run(tmp_path / "art", {}, repeat=0).outputs["output"], [2, 2, 2])


def test_unicode_path_with_spaces_and_default_output(mlp_model, tmp_path):
    """Case 10: `my models/ü/mödel v2.onnx` compiles into artifacts/mödel v2-x86 under the working folder."""
    folder = tmp_path / "my models" / "ü"
    folder.mkdir(parents=True)
    shutil.copy(mlp_model, folder / "mödel v2.onnx")
    run_mlc("compile", "my models/ü/mödel v2.onnx", cwd=tmp_path, check=True)
    run_mlc("check", "artifacts/mödel v2-x86", cwd=tmp_path, check=True)


def test_output_into_the_models_own_folder(mlp_model, tmp_path):
    """Case 11: `-o` the non-empty folder that holds the model is refused; the model stays."""
    model = tmp_path / "m.onnx"
    shutil.copy(mlp_model, model)
    assert_clean_error(run_mlc("compile", model, "-o", tmp_path), 1, "mlc replaces only what it wrote")
    assert model.read_bytes() == mlp_model.read_bytes()


def test_more_threads_than_cpus(mlp_artifact):
    """Case 12: --threads 100000 aborted the process inside TVM's pool (exit 134); now one line, exit 1."""
    assert_clean_error(run_mlc("run", mlp_artifact, "--threads", "100000"), 1, "--threads must be between 1 and")
    proc = subprocess.run([sys.executable, mlp_artifact / "run.py", "--threads", "100000"], capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "--threads must be between 1 and" in proc.stderr, proc.stderr


def test_run_outputs_over_the_artifacts_own_file(mlp_artifact, tmp_path):
    """Case 13: `-o ART/reference/outputs.npz` on other inputs overwrote the reference and broke the artifact."""
    artifact = tmp_path / "art"
    shutil.copytree(mlp_artifact, artifact)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones((3, 16), np.float32))
    for target in (artifact / "reference/outputs.npz", artifact / "manifest.json"):
        assert_clean_error(run_mlc("run", artifact, "-i", inputs, "-o", target, "--repeat", "1"), 1,
                           "is a file of the artifact")
    proc = subprocess.run([sys.executable, artifact / "run.py", "-i", inputs, "-o", artifact / "model.so"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "is a file of the artifact" in proc.stderr, proc.stderr
    run_mlc("check", artifact, check=True)
    run_mlc("run", artifact, "-i", inputs, "-o", artifact / "mine.npz", "--repeat", "1", check=True)  # a new file


def test_fp16_module_returning_a_sum(tmp_path):
    """Case 14: torch's dynamo export sums an fp16 tensor in fp32 and leaves the output fp32: cast back."""
    pytest.importorskip("torch")
    source = tmp_path / "half.py"
    source.write_text(
        "import torch\n"
        "class N(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.l = torch.nn.Linear(4, 3)\n"
        "    def forward(self, x):\n"
        "        return self.l(x).sum(), self.l(x)\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return N().eval().half(), (torch.randn(2, 4).half(),)\n")
    result = api.compile(f"{source}:make", target="x86", output=tmp_path / "art", exporter="dynamo")
    assert result.check.passed
    assert [o.dtype for o in result.manifest.outputs] == ["float16", "float16"]


def test_cast_outputs_keeps_other_outputs(tmp_path):
    """Case 14's helper on its own: only float outputs of another float type are cast; ints and matches stay."""
    from mlc.frontends.onnx_export import cast_outputs

    nodes = [helper.make_node("Cast", ["x"], ["wide"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["wide"], ["total"], keepdims=0),
             helper.make_node("ArgMax", ["x"], ["index"], axis=0, keepdims=0)]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT16, [3])],
                              [value("total", TensorProto.FLOAT, []), value("index", TensorProto.INT64, []),
                               value("x", TensorProto.FLOAT16, [3])])
    path = _save(graph, tmp_path / "m.onnx")
    wanted = {"total": np.dtype(np.float16), "index": np.dtype(np.int32), "x": np.dtype(np.float16)}
    assert cast_outputs(path, wanted) == ["total"]
    import onnxruntime as ort
    x = np.array([1, 2, 3], np.float16)
    total, index, same = ort.InferenceSession(str(path)).run(None, {"x": x})
    assert total.dtype == np.float16 and total == 6 and index.dtype == np.int64 and same.dtype == np.float16


@pytest.mark.parametrize("what", ["state_dict", "module"])
def test_torch_save_checkpoint(tmp_path, what):
    """Case 15: a torch.save file is named as a checkpoint, in one whole sentence."""
    torch = pytest.importorskip("torch")
    module = torch.nn.Linear(4, 3)
    path = tmp_path / "weights.pt"
    torch.save(module.state_dict() if what == "state_dict" else module, str(path))
    proc = run_mlc("compile", path, "--input-shape", "x:1x4")
    assert_clean_error(proc, 1, "is a torch.save checkpoint", "file.py:factory")
    assert "miniz" not in proc.stderr


def test_target_spelled_like_an_arch(mlp_model):
    """Case 16: `-t x86_64` suggests x86."""
    assert_clean_error(run_mlc("compile", mlp_model, "-t", "x86_64"), 1, "did you mean 'x86'")


def test_check_with_a_negative_atol(mlp_artifact):
    """Case 17: `mlc check --atol -1` is a clean user error."""
    assert_clean_error(run_mlc("check", mlp_artifact, "--atol", "-1"), 1, "--atol must be a finite number >= 0")


def test_dynamic_range_exceeded_at_run(mlp_model, tmp_path):
    """Case 18: a batch outside `--dynamic batch=1..4` names the range and the fix."""
    artifact = api.compile(str(mlp_model), target="x86", output=tmp_path / "art", dynamic=["batch=1..4"]).path
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones((9, 16), np.float32))
    assert_clean_error(run_mlc("run", artifact, "-i", inputs), 1, "outside the compiled range 1..4",
                       "--dynamic batch=1..9")


def test_torchscript_returning_a_dict(tmp_path):
    """Case 19: a TorchScript model that returns a dict: the error says what to do instead."""
    torch = pytest.importorskip("torch")

    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(4, 3)

        def forward(self, x):
            return {"logits": self.l(x)}

    path = tmp_path / "dict.pt"
    torch.jit.trace(Heads().eval(), (torch.randn(2, 4),), strict=False).save(str(path))
    proc = run_mlc("compile", path, "--input-shape", "x:2x4", "--exporter", "torchscript")
    assert_clean_error(proc, 1, "returns a dict", "file.py:factory")


def test_output_under_a_file(mlp_model, tmp_path):
    """Case 20: `-o afile/sub` where afile is a file: refused before any work, naming the file."""
    blocker = tmp_path / "afile"
    blocker.write_text("mine\n")
    proc = run_mlc("compile", mlp_model, "-o", blocker / "sub")
    assert_clean_error(proc, 1, "which is a file, not a folder")
    assert "Loading" not in proc.stderr + proc.stdout
    assert blocker.read_text() == "mine\n"


def test_export_onto_its_own_source(mlp_model, tmp_path):
    """`mlc export m.onnx -o m.onnx` rewrote the user's file in place; now refused, the file untouched."""
    model = tmp_path / "m.onnx"
    shutil.copy(mlp_model, model)
    assert_clean_error(run_mlc("export", model, "-o", model), 1, "is the model being exported")
    assert model.read_bytes() == mlp_model.read_bytes()
    # Somewhere nothing can be written: one line naming it, not an internal error (exit 70)
    assert_clean_error(run_mlc("export", model, "-o", "/proc/mlc-export.onnx"), 1, "cannot write to /proc")


def test_export_keeps_weights_kept_beside_the_model(tmp_path):
    """A model whose weights are ONNX external data (any export over 2 GB: Llama-3.2-1B's) was written without
    them: `-o out.onnx` named weight files that were left behind in a deleted scratch folder. Now they go with it,
    into OUT.data, and the export computes what the source does."""
    weight = np.arange(6000, dtype=np.float32).reshape(100, 60) / 6000
    bias = np.full(60, 3, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 100])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 60])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    source = tmp_path / "src" / "model.onnx"
    source.parent.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source),
              save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)  # two weight files
    out = tmp_path / "out" / "exported.onnx"
    proc = run_mlc("export", source, "-o", out)
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(source.parent)
    assert sorted(p.name for p in out.parent.iterdir()) == ["exported.onnx", "exported.onnx.data"]
    import onnxruntime as ort

    x = np.random.default_rng(0).normal(size=(2, 100)).astype(np.float32)
    (z,) = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(z, x @ weight + bias, rtol=1e-5)
