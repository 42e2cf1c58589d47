"""The static_control_flow pass: If with a known condition, Loop with a constant trip count and Scan over static
lengths become plain nodes, and ONNX Runtime computes the same outputs before and after."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mlc.passes.control_flow import static_control_flow


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _value(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_if_on_a_static_rank_loop_and_scan_are_unrolled():
    # If: rank(x) == 2 (from Shape of a static input) picks x * 2, else an Unsqueeze that would not fit.
    then_branch = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["doubled"])], "then", [],
                                    [_value("doubled", [2, 3])])
    else_branch = helper.make_graph([helper.make_node("Reshape", ["x", "bad_shape"], ["reshaped"])], "else", [],
                                    [_value("reshaped", [2, 3])])
    # Loop: 3 trips, state s += x, scan output the state at each trip.
    loop_body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["s_in", "x"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["scan_out"])], "loop_body",
        [_value("i", [], TensorProto.INT64), _value("cond_in", [], TensorProto.BOOL), _value("s_in", [2, 3])],
        [_value("cond_out", [], TensorProto.BOOL), _value("s_out", [2, 3]), _value("scan_out", [2, 3])])
    # Scan over x's rows in reverse: running sum, and each row times the sum.
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "row"], ["acc_out"]), helper.make_node("Mul", ["acc_out", "row"], ["y"])],
        "scan_body", [_value("acc_in", [3]), _value("row", [3])], [_value("acc_out", [3]), _value("y", [3])])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Size", ["shape"], ["rank"]),
        helper.make_node("Equal", ["rank", "two_i"], ["is_2d"]),
        helper.make_node("If", ["is_2d"], ["branch"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Loop", ["trips", "true", "x"], ["final", "states"], body=loop_body),
        helper.make_node("Scan", ["zeros", "x"], ["acc", "ys"], body=scan_body, num_scan_inputs=1,
                         scan_input_directions=[1]),
    ]
    weights = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
               numpy_helper.from_array(np.array(2, np.int64), "two_i"),
               numpy_helper.from_array(np.array([6, 1, 1], np.int64), "bad_shape"),
               numpy_helper.from_array(np.array(3, np.int64), "trips"),
               numpy_helper.from_array(np.array(True), "true"),
               numpy_helper.from_array(np.zeros(3, np.float32), "zeros")]
    outputs = [_value("branch", [2, 3]), _value("final", [2, 3]), _value("states", [3, 2, 3]), _value("acc", [3]),
               _value("ys", [2, 3])]
    graph = helper.make_graph(nodes, "g", [_value("x", [2, 3])], outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten = static_control_flow(model, {})
    assert not {n.op_type for n in rewritten.graph.node} & {"If", "Loop", "Scan"}
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    for before, after in zip(_run(model, feeds), _run(rewritten, feeds)):
        np.testing.assert_allclose(after, before, rtol=1e-6)


def test_a_loop_with_a_run_time_trip_count_stays():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["s_in", "s_in"], ["s_out"])],
        "body", [_value("i", [], TensorProto.INT64), _value("cond_in", [], TensorProto.BOOL), _value("s_in", [2])],
        [_value("cond_out", [], TensorProto.BOOL), _value("s_out", [2])])
    graph = helper.make_graph([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], "g",
                              [_value("n", [], TensorProto.INT64), _value("x", [2])], [_value("y", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert [n.op_type for n in static_control_flow(model, {}).graph.node] == ["Loop"]
