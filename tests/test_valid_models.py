"""Valid models that used to end in exit 70 or lose a NaN (issues #19, #20): each compiles through the
real CLI and passes its check."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import run_mlc


def _save(path: Path, nodes, inputs, outputs, initializers=()) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _float(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _compile(model, out: Path, *extra: str):
    proc = run_mlc("compile", model, "--target", "x86", "-o", out, *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]  # a failed check exits 3
    assert "pass" in proc.stdout, proc.stdout
    return proc


@pytest.mark.parametrize("op", ["CumSum", "TopK", "NonMaxSuppression"])
def test_scan_and_sort_kernels_build_and_run(tmp_path: Path, op: str) -> None:
    """TVM's cumsum and topk kernels are one opaque block, which SplitLayoutRewritePreproc (weight
    packing) rejected; topk, and the argsort inside NonMaxSuppression, called a packed function the
    artifact's runtime lacks (the check, run by the artifact's runtime, failed with exit 70)."""
    if op == "CumSum":
        nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"])]
        consts = [numpy_helper.from_array(np.array(-1, np.int64), "axis")]
        outputs = [_float("y", [1, 4, 8, 8])]
    elif op == "NonMaxSuppression":
        nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["selected"])]
        consts = [numpy_helper.from_array(np.array([3], np.int64), "limit"),
                  numpy_helper.from_array(np.array([0.5], np.float32), "iou")]
        outputs = [helper.make_tensor_value_info("selected", TensorProto.INT64, ["n", 3])]
        model = _save(tmp_path / "nms.onnx", nodes, [_float("boxes", [1, 6, 4]), _float("scores", [1, 2, 6])],
                      outputs, consts)
        proc = _compile(model, tmp_path / "art")
        assert "selected" in proc.stdout and "pass" in proc.stdout, proc.stdout
        return
    else:
        nodes = [helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1)]
        consts = [numpy_helper.from_array(np.array([3], np.int64), "k")]
        outputs = [_float("y", [1, 4, 8, 3]), helper.make_tensor_value_info("i", TensorProto.INT64, [1, 4, 8, 3])]
    model = _save(tmp_path / f"{op}.onnx", nodes, [_float("x", [1, 4, 8, 8])], outputs, consts)
    proc = _compile(model, tmp_path / "art")
    assert proc.stdout.count("pass") >= len(outputs), proc.stdout


def test_dynamo_multihead_attention(tmp_path: Path) -> None:
    """torch's dynamo exporter writes Squeeze(axis=-2); TVM's ConvertLayout ran out of memory on it."""
    factory = tmp_path / "mha.py"
    factory.write_text(textwrap.dedent("""
        import torch

        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)

            def forward(self, x):
                return self.mha(x, x, x, need_weights=False)[0]

        def make():
            torch.manual_seed(0)
            return Attention().eval(), (torch.randn(1, 4, 8),)
    """))
    proc = _compile(f"{factory}:make", tmp_path / "art", "-O0")
    assert "pass" in proc.stdout and "skipped" not in proc.stderr, proc.stderr


def test_nan_propagates_like_onnxruntime(tmp_path: Path) -> None:
    """Relu -> Softmax, clip, a conv's fused relu and the fast-math polynomials (-O2) keep NaN where ONNX
    Runtime does."""
    import onnxruntime as ort

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["s"], axis=-1),
             helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Sigmoid", ["x"], ["g"]),
             helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Exp", ["x"], ["x_exp"]),
             helper.make_node("HardSigmoid", ["x"], ["h"]),  # a relax clip
             helper.make_node("Clip", ["x", "lo", "hi"], ["cl"]), helper.make_node("Max", ["x", "zero"], ["mx"]),
             helper.make_node("Reshape", ["x", "image"], ["xi"]),  # conv + bias + relu: one fused kernel
             helper.make_node("Conv", ["xi", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["cr"])]
    rng = np.random.default_rng(1)
    consts = [numpy_helper.from_array(np.array([1, 4, 4, 4], np.int64), "image"),
              numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w"),
              numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
              numpy_helper.from_array(np.float32(-0.5), "lo"), numpy_helper.from_array(np.float32(0.5), "hi"),
              numpy_helper.from_array(np.zeros(16, np.float32), "zero")]
    names = ["s", "t", "g", "e", "x_exp", "h", "cl", "mx", "cr"]
    model = _save(tmp_path / "nan.onnx", nodes, [_float("x", [4, 16])],
                  [_float(n, [4, 16]) for n in names[:-1]] + [_float("cr", [1, 8, 4, 4])], consts)
    _compile(model, tmp_path / "art")
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    x[0, 3], x[2, 5] = np.nan, np.nan
    np.savez(tmp_path / "in.npz", x=x)
    proc = run_mlc("run", tmp_path / "art", "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz", "--repeat", "0")
    assert proc.returncode == 0, proc.stderr
    expected = ort.InferenceSession(str(model)).run(None, {"x": x})
    with np.load(tmp_path / "out.npz") as got:
        for name, want in zip(names, expected):
            np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(want), err_msg=name)
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=name)
    assert np.isnan(expected[0][0]).all()  # the softmax row holding the NaN is all NaN


def test_failing_layout_conversion_is_skipped_with_a_warning(monkeypatch, tmp_path: Path) -> None:
    """Layout conversion is optional: where TVM's ConvertLayout fails (it did with "Invalid SLayout" on ONNX Max's
    stack + max, which now imports pairwise), the model builds in its own layout, the check passes and a warning
    names the step. The failure is injected in-process (isolate=False)."""
    from tvm import relax

    from mlc import api

    def broken(layouts):
        def apply(mod):
            raise RuntimeError("Invalid SLayout: can't find S in source layout ABCDE (injected)")
        return apply

    monkeypatch.setattr(relax.transform, "ConvertLayout", broken)
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    model = _save(tmp_path / "conv.onnx", [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                  [_float("x", [1, 4, 8, 8])], [_float("y", [1, 8, 8, 8])], [weight])
    result = api.compile(str(model), output=tmp_path / "art", isolate=False)
    assert result.check.passed
    assert any("layout conversion (conv2d to NHWC) skipped" in n and "Invalid SLayout" in n for n in result.notes)


def test_build_retries_without_optional_steps(monkeypatch) -> None:
    """The worker's build ladder: a failure with mlc's default schedules is retried without them, then
    without the Relax passes (the module imported again); the note names the step and TVM's reason; a failure of
    every try raises."""
    from mlc.compiler import worker
    from mlc.compiler.contract import CompileRequest, Note, NoteKind, ScheduleRequest

    calls, passes_fail = [], []

    def fake_build(mod, request, default_schedules, notes, use_db=True, cuda_graphs=False):
        calls.append((mod, default_schedules))
        if default_schedules or mod == "passed" and passes_fail:
            raise RuntimeError("Traceback:\n  File x\nInternalError: Check failed: rule blew up")
        return f"exe({mod})", {"default": []}, []

    monkeypatch.setattr(worker, "_build", fake_build)
    request = CompileRequest(onnx="m.onnx", target={}, schedules=ScheduleRequest(db=None, default=True))
    imported = lambda: "imported"  # noqa: E731 - the module without the passes, made only when needed

    def passed(mod: str, applied: bool = True):
        return worker._Passed(mod, [], [], "fp32", None, applied, imported, None)

    first = passed("passed")
    assert worker._build_with_fallbacks(first, request)[0] == "exe(passed)"
    assert calls == [("passed", True), ("passed", False)]
    assert first.notes == [Note(NoteKind.FALLBACK, "built without mlc's default CPU schedules: TVM failed with them: "
                                                   "InternalError: Check failed: rule blew up")]
    assert first.left_out == ["default_schedules"]
    calls.clear()
    passes_fail.append(True)
    second = passed("passed")
    built = worker._build_with_fallbacks(second, request)
    assert built[0] == "exe(imported)"
    assert calls[-1] == ("imported", False)
    assert "the Relax passes and mlc's default CPU schedules" in second.notes[0].text
    assert second.left_out == ["relax_passes", "default_schedules"]
    monkeypatch.setattr(worker, "_build", lambda *a: (_ for _ in ()).throw(ValueError("mandatory")))
    with pytest.raises(ValueError, match="mandatory"):
        worker._build_with_fallbacks(passed("imported", applied=False), request)


def _nonzero_and_unique(path: Path) -> Path:
    nodes = [helper.make_node("NonZero", ["x"], ["where"]),
             helper.make_node("Unique", ["x"], ["values", "first", "inverse", "counts"], sorted=0)]
    int64 = [helper.make_tensor_value_info(name, TensorProto.INT64, shape)
             for name, shape in (("where", [2, "n"]), ("first", ["u"]), ("inverse", [12]), ("counts", ["u"]))]
    outputs = [int64[0], _float("values", ["u"]), *int64[1:]]
    return _save(path, nodes, [_float("x", [3, 4])], outputs)


def test_value_dependent_ops_run_in_the_artifacts_runtime(tmp_path: Path) -> None:
    """NonZero and Unique compile into calls to relax.run.nonzero/unique, numpy functions TVM's compiler package
    registers: the artifact's own runtime now provides them (the check used to end in exit 70), and the native
    runner, which cannot, refuses the artifact in one line."""
    from mlc.runtime.runner import ArtifactError, NativeRunner

    out = tmp_path / "art"
    proc = _compile(_nonzero_and_unique(tmp_path / "m.onnx"), out)
    assert proc.stdout.count("pass") >= 5, proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runtime"]["host_functions"] == ["relax.run.nonzero", "relax.run.unique"]
    x = np.array([[0, 2, 2, 1], [0, 0, 3, 1], [5, 2, 0, 0]], np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    proc = run_mlc("run", out, "-i", tmp_path / "x.npz", "-o", tmp_path / "y.npz")  # no tvm in that process
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "y.npz") as y:
        where, values, first, inverse, counts = (y[name] for name in ("where", "values", "first", "inverse", "counts"))
    expected_values, expected_first = [0, 2, 1, 3, 5], [0, 1, 3, 6, 8]
    np.testing.assert_array_equal(where, np.stack(np.nonzero(x)))
    np.testing.assert_array_equal(values, expected_values)  # first-occurrence order (sorted=0)
    np.testing.assert_array_equal(first, expected_first)
    np.testing.assert_array_equal(np.asarray(expected_values)[inverse], x.reshape(-1))
    np.testing.assert_array_equal(counts, [int((x == v).sum()) for v in expected_values])
    with pytest.raises(ArtifactError, match="relax.run.nonzero, relax.run.unique, which the Python runtime provides"):
        NativeRunner(out)
    # The thin runtime in a process that imports tvm afterwards (pytest's did): TVM registers the same names at
    # import and failed when they were taken; the inverse indices stay ONNX's flat ones, not TVM's N-D.
    script = ("import sys, numpy as np; from mlc.runtime.runner import Runner; "
              "y = Runner(sys.argv[1]).run({'x': np.ones((3, 4), np.float32)}); import tvm.relax; "
              "print(y['inverse'].shape)")
    proc = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "(12,)", proc.stderr[-1500:]


def test_packed_function_no_runtime_has_is_a_user_error(monkeypatch, tmp_path: Path) -> None:
    from mlc import api
    from mlc.errors import MlcError
    from mlc.runtime import runner

    monkeypatch.setattr(runner, "HOST_FUNCTIONS", {})
    with pytest.raises(MlcError, match="call to relax.run.nonzero, a function of TVM's compiler") as error:
        api.compile(str(_nonzero_and_unique(tmp_path / "m.onnx")), target="x86", output=tmp_path / "art")
    assert int(error.value.exit_code) == 1 and not (tmp_path / "art").exists()
