"""References for models ONNX Runtime cannot run: an old opset goes through onnx's version converter,
an op or type ORT lacks through onnx's reference evaluator; the manifest and the check name which."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mlc.api as api
from mlc.errors import InputError
from mlc.frontends import onnx as onnx_frontend


def _opset6_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """BatchNormalization-6, AveragePool-1, Gemm-6 and Mul-6 (broadcast=1), as old model zoos have them:
    IR 3, weights listed as graph inputs too."""
    rng = np.random.default_rng(1)
    weights = {"s": rng.standard_normal(3), "b": rng.standard_normal(3), "m": rng.standard_normal(3),
               "v": np.abs(rng.standard_normal(3)) + 0.5, "w": rng.standard_normal((4, 48)),
               "c": rng.standard_normal(4)}
    weights = {k: v.astype(np.float32) for k, v in weights.items()}
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"], is_test=1, epsilon=1e-5),
             helper.make_node("AveragePool", ["bn"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w", "c"], ["g"], transB=1, broadcast=1),
             helper.make_node("Mul", ["g", "c"], ["y"], broadcast=1)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    inputs += [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "old", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)], ir_version=3)
    return model, weights


def _expected_opset6(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    c = lambda a: a.reshape(1, 3, 1, 1)  # noqa: E731
    bn = (x - c(w["m"])) / np.sqrt(c(w["v"]) + 1e-5) * c(w["s"]) + c(w["b"])
    pooled = bn.reshape(1, 3, 4, 2, 4, 2).mean(axis=(3, 5))
    return (pooled.reshape(1, 48) @ w["w"].T + w["c"]) * w["c"]


def _relu_int16_model() -> onnx.ModelProto:
    """Relu on int16: ONNX Runtime has no kernel for it; onnx's reference evaluator and TVM have."""
    a = helper.make_tensor_value_info("a", TensorProto.INT16, [2, 5])
    graph = helper.make_graph([helper.make_node("Relu", ["a"], ["y"])], "relu16", [a],
                              [helper.make_tensor_value_info("y", TensorProto.INT16, [2, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_old_opset_runs_on_its_conversion(tmp_path):
    model, weights = _opset6_model()
    path = tmp_path / "old.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = onnx_frontend.onnxruntime_reference(path, {"x": x})
    assert ref.producer.endswith("on the opset-13 conversion"), ref.producer
    np.testing.assert_allclose(ref.outputs["y"], _expected_opset6(x, weights), rtol=1e-4, atol=1e-5)


def test_op_onnxruntime_lacks_uses_reference_evaluator(tmp_path):
    path = tmp_path / "relu16.onnx"
    onnx.save(_relu_int16_model(), str(path))
    feeds = {"a": np.random.default_rng(3).integers(-300, 300, (2, 5)).astype(np.int16)}
    ref = onnx_frontend.onnxruntime_reference(path, feeds)
    assert ref.producer.endswith("reference evaluator"), ref.producer
    assert ref.outputs["y"].dtype == np.int16
    np.testing.assert_array_equal(ref.outputs["y"], np.maximum(feeds["a"], 0))


def test_no_reference_names_both_failures(tmp_path):
    """Neither ORT nor the evaluator can run a Reshape to an impossible shape: one InputError naming both."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    shape = numpy_helper.from_array(np.array([4, 4], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "bad", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    with pytest.raises(InputError, match="ONNX Runtime cannot run bad.onnx.*nor can onnx's reference evaluator"):
        onnx_frontend.onnxruntime_reference(path, {"x": np.zeros((2, 3), np.float32)})


@pytest.mark.parametrize("build, producer", [(lambda: _opset6_model()[0], "opset-13 conversion"),
                                             (_relu_int16_model, "reference evaluator")])
def test_compile_records_the_reference_used(tmp_path, build, producer):
    path = tmp_path / "model.onnx"
    onnx.save(build(), str(path))
    result = api.compile(str(path), output=tmp_path / "art", isolate=False)
    assert result.check and result.check.passed, result.check
    assert producer in result.check.reference
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert producer in manifest["reference"]["producer"]
