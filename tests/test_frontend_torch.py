"""PyTorch frontend: zoo models, file.py:factory, torch.export programs and TorchScript files,
exported to ONNX and checked against torch's eager outputs (conversion and compilation apart)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mlc.api as api
from mlc.errors import ExitCode, MissingDependencyError
from helpers import assert_clean_error, run_mlc

torch = pytest.importorskip("torch")

POOL_FACTORY = '''
import torch


class MeanPool(torch.nn.Module):
    """Averages over the sequence with a Python int: a trace turns the length into a constant."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.proj(x).sum(dim=1) / int(x.shape[1])


def make():
    torch.manual_seed(0)
    return MeanPool(), (torch.randn(1, 8, 16),), {"x": ["batch", "seq", 16]}


def two_inputs():
    torch.manual_seed(0)

    class Gate(torch.nn.Module):
        def forward(self, features, scale):
            return torch.sigmoid(features) * scale, features.sum(dim=-1)

    return Gate(), (torch.randn(2, 4), torch.randn(2, 4))


def stacked_lstm():
    """Two LSTM layers: with a dynamic batch, torch.export reshapes between them with a shape it
    computes at run time; a 37-wide head (not a multiple of the vector width)."""
    torch.manual_seed(0)

    class Stacked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(16, 37)

        def forward(self, x):
            return self.head(self.lstm(x)[0])

    return Stacked(), (torch.randn(1, 6, 8),), {"x": ["batch", 6, 8]}


class Swapped(torch.nn.Module):
    """forward's order is not the dict's: inputs must be bound by name."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)

    def forward(self, b, a, mask=None, c=None):
        return self.proj(a) - b if c is None else self.proj(a) - b * c


def by_name():
    torch.manual_seed(0)
    return Swapped(), {"a": torch.randn(2, 6), "b": torch.randn(2, 6)}


def skips_a_parameter():
    torch.manual_seed(0)
    return Swapped(), {"c": torch.randn(2, 6), "a": torch.randn(2, 6), "b": torch.randn(2, 6)}


def unknown_name():
    return Swapped(), {"a": torch.randn(2, 6), "z": torch.randn(2, 6)}


def bf16_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).bfloat16().eval()
    return model, (torch.randn(2, 16).bfloat16(),)


def broken():
    raise RuntimeError("weights missing")


def not_a_module():
    return 42, (torch.randn(1),)
'''


@pytest.fixture(scope="module")
def factory_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("factory") / "models.py"
    path.write_text(POOL_FACTORY)
    return path


def _manifest(artifact: Path) -> dict:
    return json.loads((artifact / "manifest.json").read_text())


def test_zoo_bert_tiny_is_checked_against_torch_eager(tmp_path):
    result = api.compile("zoo:bert-tiny", target="x86", output=tmp_path / "bert")
    assert result.check.passed, result.check.to_json()
    assert result.check.reference.startswith("torch ") and result.check.reference.endswith(" eager")
    assert result.check.conversion is not None and result.check.conversion.passed
    source = result.manifest.source
    assert (source.format, source.name) == ("torch", "bert-tiny")
    assert "dynamo" in source.exporter and set(source.dynamic) == {"batch", "seq"}
    # The eager reference is torch's, not ONNX Runtime's: re-run the model in torch and compare.
    from mlc.models import torch_models

    model = torch_models.bert_tiny()
    feeds = api.read_npz(result.path / "reference/inputs.npz")
    eager = model.eager([feeds["input_ids"], feeds["attention_mask"]])
    stored = api.read_npz(result.path / "reference/outputs.npz")
    np.testing.assert_array_equal(stored["last_hidden_state"], eager[0])
    # `mlc check` reports the conversion step and the compilation step separately.
    proc = run_mlc("check", result.path)
    assert proc.returncode == 0, proc.stderr
    assert "conversion: ONNX Runtime on the export vs torch" in proc.stdout
    assert "compilation: the artifact vs torch" in proc.stdout
    as_json = json.loads(run_mlc("check", result.path, "--json", check=True).stdout)
    assert as_json["conversion"]["passed"] and as_json["reference"].endswith("eager")


def test_factory_compiles_and_records_recipe(factory_file, tmp_path):
    result = api.compile(f"{factory_file}:two_inputs", target="x86", output=tmp_path / "gate")
    assert result.check.passed
    m = _manifest(result.path)
    assert [i["name"] for i in m["inputs"]] == ["features", "scale"]  # forward()'s parameter names
    assert [o["name"] for o in m["outputs"]] == ["output_0", "output_1"]
    assert "--framework torch" in m["compile"]["recipe"]


@pytest.mark.parametrize("factory, names", [("by_name", ["b", "a"]), ("skips_a_parameter", ["b", "a", "c"])])
def test_dict_examples_are_bound_by_name(factory, names, factory_file, tmp_path):
    """A dict of example inputs is passed by name, not in the dict's order (the eager reference made the same
    swap, so the check passed); the ONNX inputs are forward()'s, in its order, even where the dict skips one."""
    import onnxruntime as ort

    out = tmp_path / "model.onnx"
    assert api.export(f"{factory_file}:{factory}", out).conversion.passed
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == names
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 6)).astype(np.float32) for n in names}
    import importlib.util

    spec = importlib.util.spec_from_file_location("factories", factory_file)
    factories = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(factories)
    model = getattr(factories, factory)()[0]
    expected = model(**{n: torch.from_numpy(v) for n, v in feeds.items()}).detach().numpy()
    np.testing.assert_allclose(session.run(None, feeds)[0], expected, rtol=1e-5, atol=1e-5)


def test_one_example_input_may_have_a_name_of_its_own():
    """A single example under a name forward() does not use (torchvision's forward(x) fed {"images": ...}): there is
    only one place it can go, and the artifact's input keeps the user's name. Several such names are refused."""
    from mlc.errors import InputError
    from mlc.frontends.torch import _bind_by_name

    net = torch.nn.Linear(3, 3)
    images = torch.zeros(1, 3)
    assert _bind_by_name(net, {"images": images}, ["input"], False, "f.py:net")[1:] == (["images"], [images])
    with pytest.raises(InputError, match="gives example input.s. 'a', 'b', which forward.. does not take"):
        _bind_by_name(net, {"a": images, "b": images}, ["input", "other"], False, "f.py:net")


def test_bf16_model_runs_eagerly_and_in_onnx_runtime(factory_file, tmp_path):
    """`m.bfloat16()`: the eager reference is fed and gives bf16 (torch's numpy() has none), and ONNX Runtime, with
    no bf16 Gemm, checks the export on a float32 copy of its graph."""
    report = api.export(f"{factory_file}:bf16_weights", tmp_path / "bf16.onnx")
    assert report.conversion.passed and [o.dtype for o in report.conversion.outputs] == ["bfloat16"]


def test_torchscript_trace_is_caught_at_a_new_sequence_length(factory_file, tmp_path):
    """Traced at seq 8, compiled with seq symbolic and checked at seq 16: the TorchScript export divides by 8 for
    ever. ONNX Runtime agrees with TVM, so only the eager reference shows it — and the check must fail."""
    proc = run_mlc("compile", f"{factory_file}:make", "--exporter", "torchscript", "--dynamic", "seq",
                   "-o", tmp_path / "pool")
    assert_clean_error(proc, ExitCode.ACCURACY, "the error comes before TVM", "try another --exporter")
    assert "conversion: ONNX Runtime on the export" in proc.stdout and "FAIL" in proc.stdout
    # The dynamo exporter (the default) gets the same model right: it fixes seq at the example's size, and says so.
    result = api.compile(f"{factory_file}:make", target="x86", output=tmp_path / "pool-dynamo")
    assert result.check.passed and "fixed the dynamic dim(s) seq" in result.manifest.source.exporter


def test_export_command_writes_onnx_and_compares(factory_file, tmp_path):
    out = tmp_path / "gate.onnx"
    proc = run_mlc("export", f"{factory_file}:two_inputs", "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["conversion"]["passed"] and report["source"]["format"] == "torch"
    import onnx

    assert [i.name for i in onnx.load(str(out)).graph.input] == ["features", "scale"]
    # The exported file compiles as a plain ONNX model (checked against ONNX Runtime then).
    assert api.compile(str(out), target="x86", output=tmp_path / "from-onnx").check.passed


def test_exported_program_and_torchscript_files(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten()).eval()
    example = (torch.randn(4, 3, 8, 8),)
    pt2 = tmp_path / "conv.pt2"
    batch = torch.export.Dim("batch", min=1, max=64)
    torch.export.save(torch.export.export(model, example, dynamic_shapes=({0: batch},)), str(pt2))
    result = api.compile(str(pt2), target="x86", output=tmp_path / "pt2")
    assert result.check.passed and result.manifest.source.format == "torch"
    assert "ExportedProgram" in result.manifest.source.exporter
    # The program's dynamic batch stays dynamic, in its range, named as --dynamic knows it; the example's size is
    # the reference's (torch.export.save keeps no Dim names: axis 0 is `batch`, as in a factory).
    assert result.manifest.inputs[0].shape == ["batch", 3, 8, 8]
    assert result.manifest.dynamic_ranges == {"batch": (1, 64)}
    assert api.read_npz(result.path / "reference/inputs.npz")["input"].shape == (4, 3, 8, 8)

    scripted = tmp_path / "conv.pt"
    torch.jit.save(torch.jit.trace(model, example), str(scripted))
    proc = run_mlc("compile", scripted, "-o", tmp_path / "ts")
    assert_clean_error(proc, ExitCode.USER_ERROR, "does not record input shapes", "--input-shape")
    result = api.compile(str(scripted), target="x86", output=tmp_path / "ts", input_shapes=["1x3x8x8"])
    assert result.check.passed and result.manifest.inputs[0].shape == [1, 3, 8, 8]


@pytest.mark.parametrize("spec, fragments", [
    ("{factory}:broken", ["broken() raised RuntimeError: weights missing"]),
    ("{factory}:not_a_module", ["torch.nn.Module was expected"]),
    ("{factory}:missing", ["has no function 'missing'"]),
    ("{factory}:unknown_name", ["example input(s) 'z', which forward() does not take", "b, a, mask, c"]),
    ("{garbage}.pt2", ["is not a torch.export program"]),
    ("{garbage}.pt", ["is not a TorchScript file"]),
    ("{garbage}.bin", ["unrecognised model format"]),
])
def test_bad_torch_sources_are_clean_errors(spec, fragments, factory_file, tmp_path):
    garbage = tmp_path / "model"
    for suffix in (".pt2", ".pt", ".bin"):
        garbage.with_suffix(suffix).write_bytes(b"PK\x03\x04 not really a zip" * 10)
    proc = run_mlc("compile", spec.format(factory=factory_file, garbage=garbage), "-o", tmp_path / "out")
    assert_clean_error(proc, ExitCode.USER_ERROR, *fragments)
    assert not (tmp_path / "out").exists()


def test_bad_framework_options(tmp_path):
    cases = [
        (["zoo:resnet50", "--framework", "paddle"], "zoo:resnet50 is not built for paddle"),
        (["zoo:cnn", "--framework", "caffe"], "unknown framework 'caffe'"),
        (["zoo:mlp", "--framework", "torch", "--dynamic", "seq"], "its dims that can be dynamic are: batch"),
        (["zoo:mlp", "--framework", "torch", "--dynamic", "batch=9..2"], "1 <= MIN <= MAX"),
        (["zoo:mlp", "--framework", "torch", "--exporter", "magic"], "unknown exporter 'magic'"),
    ]
    for args, fragment in cases:
        assert_clean_error(run_mlc("compile", *args, "-o", tmp_path / "out"), ExitCode.USER_ERROR, fragment)


def test_missing_framework_is_exit_4(monkeypatch, tmp_path):
    from mlc.frontends import base

    real = base.importlib.util.find_spec
    monkeypatch.setattr(base.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(MissingDependencyError, match=r"PyTorch is not installed.*pip install 'mlc\[torch\]'"):
        api.compile("zoo:mlp", target="x86", framework="torch", output=tmp_path / "out")


@pytest.mark.parametrize("name", ["cnn", "lstm"])
def test_torch_zoo_cnn_and_lstm_match_eager(name, tmp_path):
    """With bert-tiny above: a CNN (BatchNorm folded), an LSTM (lowered: TVM has no LSTM converter)."""
    result = api.compile(f"zoo:{name}", target="x86", framework="torch", output=tmp_path / name)
    assert result.check.passed and result.check.conversion.passed, result.check.to_json()
    if name == "lstm":
        assert any(r.name == "lower_rnn" and r.status == "applied" for r in result.manifest.compile.passes)
        proc = run_mlc("compile", "zoo:lstm", "--disable-pass", "lower_rnn", "-o", tmp_path / "no-lowering")
        assert_clean_error(proc, ExitCode.USER_ERROR, "LSTM")


def test_stacked_lstm_with_dynamic_batch_is_lowered_and_matches_eager(factory_file, tmp_path):
    """The second LSTM's input length is only known through a Reshape whose target torch.export
    computes from Shape: lower_rnn must still find it (ONNX's own shape inference loses it)."""
    result = api.compile(f"{factory_file}:stacked_lstm", target="x86", output=tmp_path / "stacked",
                         input_shapes=["x:3x6x8"])
    assert result.check.passed, result.check.to_json()
    assert any(r.name == "lower_rnn" and r.status == "applied" for r in result.manifest.compile.passes)


def test_lstm_lm_lowers_with_its_weights_left_in_their_file(tmp_path):
    """The pipeline leaves weights over 4 KB in their file. ONNX Runtime's shape inference finds the second LSTM's
    sequence length behind the dynamo export's Shape -> Reshape chain, and failed on zoo:lstm-lm when it tried to
    read those weights: lower_rnn then refused, and the model did not compile."""
    import onnx

    from mlc.frontends import onnx_weights
    from mlc.passes import rnn

    out = tmp_path / "lstm-lm.onnx"
    proc = run_mlc("export", "zoo:lstm-lm", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert onnx.load(str(out), load_external_data=False).graph.input[0].type.tensor_type.shape.dim[0].dim_param
    (tmp_path / "work").mkdir()
    model = onnx_weights.load_light(out, tmp_path / "work")
    assert any(onnx_weights.is_external(t) for t in model.graph.initializer)
    with onnx_weights.weights_in(tmp_path / "work"):
        lowered = rnn.lower_rnn(model, {})
    assert "LSTM" not in {n.op_type for n in lowered.graph.node}


def test_dynamo_keeps_size_one_dims_dynamic_and_names_the_ones_it_fixes(factory_file, tmp_path):
    """torch.export fixes dims whose example size is 1 (zoo:lstm's example batch is 1): the export
    must still take any batch. A dim the model computes with (int(x.shape[1])) is fixed: say so."""
    import onnx

    out = tmp_path / "lstm.onnx"
    proc = run_mlc("export", "zoo:lstm", "-f", "torch", "--dynamic", "batch", "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["source"]["exporter"].startswith("torch.onnx dynamo exporter")
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    proc = run_mlc("export", f"{factory_file}:make", "-o", tmp_path / "pool.onnx", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "it fixed the dynamic dim(s) seq" in json.loads(proc.stdout)["source"]["exporter"]
