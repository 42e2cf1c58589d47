"""Which values of an integer input keep a Gather into a constant table inside the table.

TVM compiles Gather as an unchecked `take`: an index past the table reads other memory. So the runtime refuses inputs
outside a range, and that range must hold the inputs whose index lands in the table after what the graph does to them
first (`ids + 1` after a LabelEncoder's -1 for unknown words; Keras's wrap, Where(ids < 0, ids + vocab, ids)). It is
found by running that arithmetic with numpy on every candidate value.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _extreme(reduce: np.ufunc) -> Callable[..., np.ndarray]:
    return lambda *arrays: reduce.reduce(np.broadcast_arrays(*arrays))


# Elementwise ops an index may pass through, on numpy arrays.
_ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Neg": np.negative, "Abs": np.abs,
    "Max": _extreme(np.maximum), "Min": _extreme(np.minimum), "Where": np.where,
    "Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater, "GreaterOrEqual": np.greater_equal,
    "Equal": np.equal, "Not": np.logical_not, "And": np.logical_and, "Or": np.logical_or,
}
_VALUES_KEPT = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}  # move values, change none
_SHAPE_ONLY = {"Shape", "Size"}  # read no values
# Candidates: every value within this many of the longest table's lengths of zero, at most this many in all.
_SPAN_TABLES, _MAX_CANDIDATES = 2, 1 << 21
_MAX_CONSTANT = 8  # entries of a constant operand (each candidate is tried against every entry)


def index_ranges(model: onnx.ModelProto, inputs: list[str]) -> dict[str, tuple[int, int]]:
    """For each input whose values reach the index of a Gather into an initializer through the ops above only: the
    interval of values (inclusive) for which every such Gather indexes rows 0..n-1 (a negative index, which the
    importer wraps, is not relied on). The interval is the run of valid values holding 0, else the first one above
    0. Inputs the arithmetic cannot follow (another input's values, other ops) or with no valid value are left out."""
    tables = {t.name: list(t.dims) for t in model.graph.initializer}
    longest = max((dims[0] for dims in tables.values() if dims), default=0)
    reach = min(_SPAN_TABLES * max(longest, 1), _MAX_CANDIDATES // 2)
    candidates = np.arange(-reach, reach, dtype=np.int64)
    constants = _constants(model)
    ranges = {}
    for name in inputs:
        valid = _valid(model, name, candidates, constants, tables)
        if valid is not None and valid.any():
            ranges[name] = _interval(candidates, valid)
    return ranges


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    found = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
             if np.prod(t.dims) <= _MAX_CONSTANT and t.data_location != onnx.TensorProto.EXTERNAL}
    for node in model.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) if node.op_type == "Constant" else None
        if value is not None and np.prod(value.dims) <= _MAX_CONSTANT:
            found[node.output[0]] = numpy_helper.to_array(value)
    return found


def _valid(model: onnx.ModelProto, name: str, candidates: np.ndarray, constants: dict[str, np.ndarray],
           tables: dict[str, list[int]]) -> Optional[np.ndarray]:
    """Per candidate value of input `name`: whether every Gather its values reach indexes inside its table; None
    where they reach none, or reach one through an op not followed here."""
    values = {name: candidates.reshape(-1, 1)}  # candidates down axis 0; a constant's entries along axis 1
    valid, reached = np.ones(len(candidates), bool), False
    for node in model.graph.node:  # topological order
        if node.op_type in _SHAPE_ONLY or not any(i in values for i in node.input):
            continue
        if node.op_type == "Gather" and node.input[0] in tables and node.input[1] in values:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            rows = tables[node.input[0]][axis]
            index = values[node.input[1]]
            valid &= ((index >= 0) & (index < rows)).reshape(len(candidates), -1).all(axis=1)
            reached = True
            continue
        result = _evaluate(node, values, constants)
        if result is not None:
            values[node.output[0]] = result
        elif _reaches_gather(model, node.output, tables):
            return None
    return valid if reached else None


def _evaluate(node: onnx.NodeProto, values: dict[str, np.ndarray],
              constants: dict[str, np.ndarray]) -> Optional[np.ndarray]:
    """The node's output over the candidates, or None when it is not elementwise arithmetic on them and constants."""
    if node.op_type in _VALUES_KEPT:
        return values.get(node.input[0])
    args = []
    for name in node.input:
        if name in values:
            args.append(values[name])
        elif name in constants:
            constant = constants[name]
            args.append(constant.reshape(1, -1) if constant.size > 1 else constant.reshape(()))
        elif name:
            return None
        else:
            args.append(None)  # an optional input left out
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    try:
        with np.errstate(all="ignore"):
            if node.op_type == "Cast":
                return args[0].astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))
            if node.op_type == "Mod":
                return (np.fmod if attrs.get("fmod") else np.mod)(*args)
            if node.op_type == "Clip":
                low = args[1] if len(args) > 1 and args[1] is not None else attrs.get("min", -np.inf)
                high = args[2] if len(args) > 2 and args[2] is not None else attrs.get("max", np.inf)
                return np.clip(args[0], low, high).astype(args[0].dtype)
            operation = _ELEMENTWISE.get(node.op_type)
            return operation(*args) if operation and all(a is not None for a in args) else None
    except (ValueError, TypeError, KeyError):  # entries that do not broadcast, a dtype numpy lacks
        return None


def _reaches_gather(model: onnx.ModelProto, names, tables: dict[str, list[int]]) -> bool:
    """Whether these values flow on, through any ops, to the index of a Gather into an initializer."""
    flowing = set(names)
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[0] in tables and node.input[1] in flowing:
            return True
        if node.op_type not in _SHAPE_ONLY and flowing.intersection(node.input):
            flowing.update(node.output)
    return False


def _interval(candidates: np.ndarray, valid: np.ndarray) -> tuple[int, int]:
    """The run of valid candidates that holds 0, else the first above 0, else the last below it."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], valid.astype(np.int8), [0]))))
    runs = [(int(candidates[a]), int(candidates[b - 1])) for a, b in zip(edges[::2], edges[1::2])]
    return next((run for run in runs if run[1] >= 0), runs[-1])
