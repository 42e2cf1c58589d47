"""mlc's ONNX converters (mlc/compiler/onnx_ops.py) and the importer's shape outputs on cases the shipped node
tests leave out, each compiled for x86 and compared with ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlc import api

RNG = np.random.default_rng(0)


def _compiled_matches_onnxruntime(model, feed_sets, tmp_path, rtol=1e-5):
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False)
    runner = api.open_runner(tmp_path / "art")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for feeds in feed_sets:
        got = runner.run(feeds)
        for name, expected in zip(names, session.run(names, feeds)):
            assert got[name].shape == expected.shape and got[name].dtype == expected.dtype, name
            np.testing.assert_allclose(got[name], expected, rtol=rtol, err_msg=name)


def test_shape_values_returned_with_a_symbolic_batch(tmp_path):
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["batch"]),
             helper.make_node("Size", ["x"], ["size"]), helper.make_node("Shape", ["x"], ["tail"], start=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 4])],
                              [helper.make_tensor_value_info("shape", TensorProto.INT64, [3]),
                               helper.make_tensor_value_info("batch", TensorProto.INT64, []),
                               helper.make_tensor_value_info("size", TensorProto.INT64, []),
                               helper.make_tensor_value_info("tail", TensorProto.INT64, [2])],
                              [numpy_helper.from_array(np.array(0, np.int64), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _compiled_matches_onnxruntime(model, [{"x": np.zeros((b, 3, 4), np.float32)} for b in (2, 5)], tmp_path)


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_modes_missing_values_and_aggregates(aggregate, tmp_path):
    # tree 0: f0 <= 0.5 ? (f1 > 0.1 ? leaf1 : leaf2) : leaf0; tree 1: f1 != 0 ? leaf3 : (f0 < -1 ? leaf4 : leaf5)
    node = helper.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain="ai.onnx.ml", nodes_featureids=[0, 1, 1, 0],
        nodes_splits=numpy_helper.from_array(np.array([0.5, 0.1, 0.0, -1.0], np.float32)),
        nodes_modes=numpy_helper.from_array(np.array([0, 3, 5, 1], np.uint8)), nodes_truenodeids=[1, 1, 3, 4],
        nodes_trueleafs=[0, 1, 1, 1], nodes_falsenodeids=[0, 2, 3, 5], nodes_falseleafs=[1, 1, 0, 1],
        nodes_missing_value_tracks_true=[1, 0, 0, 1], leaf_targetids=[0, 1, 2, 0, 1, 2],
        leaf_weights=numpy_helper.from_array(np.arange(1, 7, dtype=np.float32)), tree_roots=[0, 2], n_targets=3,
        aggregate_function=aggregate)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [6, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [6, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)])
    x = np.array([[0.2, 0.3], [0.9, 0.0], [np.nan, 0.05], [-2, np.nan], [0.5, 0.1], [-1.5, 0.0]], np.float32)
    _compiled_matches_onnxruntime(model, [{"X": x}], tmp_path)


def test_max_pool_indices_3d_dilated_ceil_mode(tmp_path):
    node = helper.make_node("MaxPool", ["x"], ["y", "indices"], kernel_shape=[2, 3, 2], strides=[2, 1, 2],
                            dilations=[1, 2, 1], ceil_mode=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 6, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("indices", TensorProto.INT64, None)])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]))
    _compiled_matches_onnxruntime(model, [{"x": RNG.standard_normal((1, 2, 5, 6, 7)).astype(np.float32)}], tmp_path)
