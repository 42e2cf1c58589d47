"""`mlc debug` localises the first diverging node. Faults are injected here, in the tests, by
patching TVM's ONNX converters in-process (isolate=False), never in the product."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import mlc.api as api
from helpers import assert_clean_error, run_mlc
from mlc.models import ZOO


@pytest.fixture
def patch_converter(monkeypatch):
    """Replace one TVM ONNX converter's implementation for the duration of a test."""
    from tvm.relax.frontend.onnx import onnx_frontend

    def patch(op: str, version: str, impl):
        monkeypatch.setattr(getattr(onnx_frontend, op), version, classmethod(impl))

    return patch


def _first(model: onnx.ModelProto, op_type: str) -> str:
    return next(n.name for n in model.graph.node if n.op_type == op_type)


def test_healthy_model_reports_no_divergence():
    report = api.debug("zoo:transformer")
    assert not report.diverged and report.divergence.first is None
    assert report.method == "final-only" and report.builds == 1
    forced = api.debug("zoo:mlp", method="bisect")
    assert not forced.diverged and forced.divergence.first is None


@pytest.mark.parametrize("method", ["auto", "bisect"])
def test_perturbed_op_is_localised(patch_converter, method, tmp_path):
    from tvm import relax

    patch_converter("Erf", "_impl_v13",
                    lambda cls, bb, inputs, attr, params: relax.op.add(relax.op.erf(inputs[0]),
                                                                       relax.const(0.05, "float32")))
    report = api.debug("zoo:transformer", method=method, isolate=False, extract=tmp_path / "repro")
    first = report.divergence.first
    assert report.diverged and report.method == ("exposed" if method == "auto" else "bisect")
    assert (first.node_name, first.op_type) == (_first(ZOO["transformer"].build(), "Erf"), "Erf")
    assert 0.04 < first.stats.max_abs_error < 0.06
    (node_input,) = first.inputs
    assert node_input["passed"] and node_input["max_abs_error"] < 1e-4  # its input was still right
    if method == "bisect":
        assert report.builds < 12  # log2 of ~75 values, plus the first and last builds

    repro = tmp_path / "repro"
    extracted = onnx.load(repro / "model.onnx")
    assert [n.op_type for n in extracted.graph.node] == ["Erf"]
    with np.load(repro / "inputs.npz") as inputs, np.load(repro / "expected.npz") as expected:
        session = ort.InferenceSession(str(repro / "model.onnx"))
        got = session.run(None, {session.get_inputs()[0].name: inputs["in_0"]})[0]
        np.testing.assert_allclose(got, expected["out_0"], rtol=1e-6)
    details = json.loads((repro / "report.json").read_text())
    assert details["node"]["op_type"] == "Erf" and details["isolated_node_matches"] is False


def test_first_nan_is_reported(patch_converter):
    from tvm import relax

    # sqrt of a negative number: NaN appears at the first Relu and flows downstream.
    patch_converter("Relu", "_impl_v13", lambda cls, bb, inputs, attr, params: relax.op.sqrt(inputs[0]))
    report = api.debug("zoo:mlp", isolate=False)
    relu = _first(ZOO["mlp"].build(), "Relu")
    assert report.divergence.first.node_name == relu
    assert report.divergence.first_nonfinite.node_name == relu
    assert report.divergence.first.stats.nonfinite_mismatch > 0


def test_wrong_clean_up_pass_is_blamed_not_tvm(monkeypatch):
    from mlc.passes import onnx as onnx_passes

    real_folding = onnx_passes.constant_folding

    def broken_folding(model, config):
        model = real_folding(model, config)
        weight = model.graph.initializer[0]
        weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * 1.5, weight.name))
        return model

    monkeypatch.setattr(onnx_passes, "constant_folding", broken_folding)
    report = api.debug("zoo:mlp")
    assert report.diverged and not report.cleanup.passed and not report.final.passed
    assert report.divergence.first is None and report.method == "final-only"  # TVM matches what it was given


def test_debug_cli_on_an_artifact(tmp_path):
    art = tmp_path / "mlp"
    run_mlc("compile", "zoo:mlp", "-o", art, "--input-shape", "x:3x64", check=True)
    proc = run_mlc("debug", art, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["diverged"] is False and report["target"] == "x86" and report["first_divergence"] is None
    assert report["final"]["outputs"][0]["shape"] == [3, 10]  # the artifact's shapes and inputs were reused
    assert "no divergence" in run_mlc("debug", art).stdout


def test_debug_errors(tmp_path):
    assert_clean_error(run_mlc("debug", "zoo:mlp", "--method", "guess"), 1, "unknown method 'guess'")
    assert_clean_error(run_mlc("debug", tmp_path / "missing.onnx"), 1, "model file not found")
    model = tmp_path / "m.onnx"
    onnx.save(ZOO["mlp"].build(), model)
    art = tmp_path / "art"
    run_mlc("compile", model, "-o", art, check=True)
    model.unlink()
    assert_clean_error(run_mlc("debug", art), 1, "which is not there any more")


def test_fault_in_a_node_reading_a_graph_input_is_extracted(patch_converter, tmp_path):
    from tvm import relax

    patch_converter("MatMul", "_impl_v13",
                    lambda cls, bb, inputs, attr, params: relax.op.add(relax.op.matmul(inputs[0], inputs[1]),
                                                                       relax.const(1.0, "float32")))
    report = api.debug("zoo:mlp", isolate=False, extract=tmp_path / "repro")
    first = report.divergence.first
    assert first.op_type == "MatMul" and first.inputs[0]["name"] == "x" and first.inputs[0]["shape"] == [2, 64]
    assert (tmp_path / "repro" / "model.onnx").is_file()


def test_debug_refuses_targets_it_cannot_run():
    assert_clean_error(run_mlc("debug", "zoo:mlp", "--target", "rpi4"), 1, "debug with --target x86")


def test_debug_builds_what_compile_builds(monkeypatch, tmp_path):
    """A model compile cannot build is not "no divergence" in debug: both take the same build path (passes and
    mlc's CPU schedules), so a failure injected into that path stops both."""
    from mlc.compiler import schedules
    from mlc.errors import CompilerError

    def broken(*args, **kwargs):
        raise RuntimeError("injected schedule build failure")

    monkeypatch.setattr(schedules, "build", broken)
    with pytest.raises(CompilerError, match="injected schedule build failure"):
        api.compile("zoo:mlp", output=tmp_path / "art", isolate=False)
    with pytest.raises(CompilerError, match="injected schedule build failure"):
        api.debug("zoo:mlp", isolate=False)


def test_an_error_that_only_a_prefix_build_shows_is_still_reported():
    """A fusion-dependent fault (ResNet50V2's 1x1 pool epilogue): wrong when the value is the prefix build's only
    output, right once its inputs are outputs too. The bisection's culprit is reported, not "no divergence"."""
    from onnx import TensorProto, helper

    from mlc.check import localize
    from mlc.pipeline.debug import _bisect

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="first"), helper.make_node("Neg", ["a"], ["b"], name="bad"),
             helper.make_node("Abs", ["b"], ["y"], name="last")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph)
    x = np.array([-1, 2, -3, 4], np.float32)
    reference = {"x": x, "a": np.maximum(x, 0), "b": -np.maximum(x, 0), "y": np.maximum(x, 0)}

    def tvm_values(graph, tag, what):
        wanted = [o.name for o in graph.graph.output]
        wrong = {"b"} if wanted == ["b"] or "b" in wanted and "a" not in wanted else set()
        wrong |= {"y"} if wanted == ["y"] else set()
        return {n: reference[n] + (1 if n in wrong else 0) for n in wanted}

    divergence, builds = _bisect(model, localize.computed_values(model), reference, tvm_values, None, None)
    assert divergence.first is not None and divergence.first.node_name == "bad", divergence
    assert builds >= 2
