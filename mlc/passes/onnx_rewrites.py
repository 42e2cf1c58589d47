"""ONNX rewrites for node forms TVM's importer converts wrongly (found by benchmarks/onnx_node_tests)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mlc.frontends.onnx_weights import Values

# The value a reduction over no elements has (ONNX: the reduction's identity).
EMPTY_REDUCTION = {"ReduceSum": 0.0, "ReduceSumSquare": 0.0, "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceProd": 1.0,
                   "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf}


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for v in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        t = v.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[v.name] = [d.dim_value for d in t.shape.dim]
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    return shapes


def _extreme(value: float, dtype: np.dtype):
    """`value` in `dtype`: ±inf become the integer type's limits."""
    if np.isinf(value) and dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.max if value > 0 else info.min
    return value


def reduce_empty_sets(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """A reduction over an axis of size 0 -> a constant of its identity (0 for sums, 1 for products, -inf
    for max and log-sums, +inf for min). TVM reduces the empty axis into uninitialised memory."""
    if not any(n.op_type in EMPTY_REDUCTION for n in model.graph.node):
        return model
    shapes = _static_shapes(model)
    constants = Values(model.graph.initializer)
    elem_types = {v.name: v.type.tensor_type.elem_type for v in
                  list(model.graph.input) + list(onnx.shape_inference.infer_shapes(model).graph.value_info)}
    elem_types.update({t.name: t.data_type for t in model.graph.initializer})
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    nodes, changed = [], False
    for node in model.graph.node:
        shape = shapes.get(node.input[0]) if node.input else None
        if node.op_type not in EMPTY_REDUCTION or shape is None or node.input[0] not in elem_types:
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axes_from_input = node.op_type == "ReduceSum" and opset >= 13 or opset >= 18
        if axes_from_input and len(node.input) > 1 and node.input[1]:
            if node.input[1] not in constants:
                nodes.append(node)
                continue
            axes = [int(a) for a in constants[node.input[1]].reshape(-1)]
        else:
            axes = list(attrs.get("axes", []))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                nodes.append(node)
                continue
            axes = list(range(len(shape)))
        axes = sorted(a + len(shape) if a < 0 else a for a in axes)
        if not any(shape[a] == 0 for a in axes):
            nodes.append(node)
            continue
        keep = attrs.get("keepdims", 1)
        out_shape = [1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_types[node.input[0]]))
        value = np.full(out_shape, _extreme(EMPTY_REDUCTION[node.op_type], dtype), dtype=dtype)
        nodes.append(helper.make_node("Constant", [], [node.output[0]], name=node.name or None,
                                      value=numpy_helper.from_array(value)))
        changed = True
    if not changed:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
