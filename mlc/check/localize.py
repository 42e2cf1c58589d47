"""Localising where accuracy is lost: ONNX graph surgery and the node-by-node comparison.

Two ways to get the compiled model's intermediate values (the caller compiles and runs them):
- expose every node output as a graph output and compile once (fast; changes fusion, so a
  bug that only shows inside a fused kernel can hide), or
- bisect over the topological order with prefix models that end at one value (log2(N) builds,
  each compiled as the real graph up to that point).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Optional

import numpy as np
import onnx
from onnx import helper

from mlc.check.compare import OutputStats, compare_one, tolerance_for


@dataclass(frozen=True)
class Value:
    """A tensor computed by the graph: which node makes it, and where it sits in the order."""

    position: int  # index in the topological order of compared values
    name: str
    node_index: int
    node_name: str
    op_type: str


@dataclass
class NodeReport:
    position: int
    node_name: str
    op_type: str
    value: str
    inputs: list[dict]  # name, shape, dtype, and its error where it was compared
    stats: OutputStats

    def to_json(self) -> dict:
        data = asdict(self)
        data["stats"] = asdict(self.stats)
        return data


@dataclass
class Divergence:
    first: Optional[NodeReport] = None  # first value outside tolerance
    first_nonfinite: Optional[NodeReport] = None  # first value where NaN/Inf appears but not in the reference
    preceding: list[NodeReport] = field(default_factory=list)  # the compared values just before `first`


def computed_values(model: onnx.ModelProto) -> list[Value]:
    """Every node output, in the graph's (topological) order."""
    values = []
    for index, node in enumerate(model.graph.node):
        for name in node.output:
            if name:
                values.append(Value(len(values), name, index, node.name or f"#{index}", node.op_type))
    return values


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    infos = {v.name: v for v in model.graph.value_info}
    infos.update({v.name: v for v in model.graph.output})
    return infos


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs are exactly `names`, keeping only the nodes needed."""
    infos = _value_infos(model)
    needed: set[str] = set(names)
    keep = []
    for node in reversed(model.graph.node):
        if any(out in needed for out in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(reversed(keep))
    del out.graph.output[:]
    out.graph.output.extend(infos.get(n, helper.make_empty_tensor_value_info(n)) for n in names)
    used = {i for node in keep for i in node.input}
    weights = [init for init in out.graph.initializer if init.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(weights)
    graph_inputs = [v for v in out.graph.input if v.name in needed or v.name in names]
    del out.graph.input[:]
    out.graph.input.extend(graph_inputs)
    return out


def single_node_model(model: onnx.ModelProto, node_index: int, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The one node at `node_index` as a model: its non-constant inputs become graph inputs,
    typed from `values` (their reference arrays), so it can be run and reported on its own."""
    node = model.graph.node[node_index]
    weights = {init.name: init for init in model.graph.initializer}
    inputs, inits = [], []
    for name in dict.fromkeys(i for i in node.input if i):
        if name in weights:
            inits.append(weights[name])
        else:
            array = values[name]
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                                        list(array.shape)))
    outputs = []
    for name in (o for o in node.output if o):
        array = values.get(name)
        if array is not None:
            outputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                                         list(array.shape)))
        else:
            outputs.append(helper.make_empty_tensor_value_info(name))
    graph = helper.make_graph([node], f"{model.graph.name or 'model'}_{node.op_type}_{node_index}", inputs, outputs,
                              inits)
    extracted = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return extracted


def _node_inputs(model: onnx.ModelProto, value: Value, reference: Mapping[str, np.ndarray],
                 stats: Mapping[str, OutputStats]) -> list[dict]:
    weights = {init.name for init in model.graph.initializer}
    rows = []
    for name in model.graph.node[value.node_index].input:
        if not name:
            continue
        ref = reference.get(name)
        row = {"name": name, "constant": name in weights,
               "shape": list(ref.shape) if ref is not None else None,
               "dtype": str(ref.dtype) if ref is not None else None}
        if name in stats:
            row["max_abs_error"] = stats[name].max_abs_error
            row["passed"] = stats[name].passed
        rows.append(row)
    return rows


def _nonfinite_appears(reference: np.ndarray, actual: np.ndarray) -> bool:
    if actual.dtype.kind != "f" or actual.shape != reference.shape:
        return False
    return bool(np.any(~np.isfinite(actual) & np.isfinite(reference.astype(np.float64))))


def scan(model: onnx.ModelProto, values: list[Value], reference: Mapping[str, np.ndarray],
         actual: Mapping[str, np.ndarray], atol: Optional[float], rtol: Optional[float],
         context: int = 5) -> Divergence:
    """Compare values in topological order; report the first outside tolerance and the first
    where NaN/Inf appears, with the inputs of that node and the values compared just before it."""
    result = Divergence()
    stats: dict[str, OutputStats] = {}
    compared: list[tuple[Value, OutputStats]] = []
    for value in values:
        if value.name not in actual or value.name not in reference:
            continue
        ref, act = reference[value.name], np.asarray(actual[value.name])
        s = compare_one(value.name, ref, act, tolerance_for(str(ref.dtype), atol, rtol))
        stats[value.name] = s
        if result.first_nonfinite is None and _nonfinite_appears(ref, act):
            result.first_nonfinite = _report(model, value, s, reference, stats)
        if result.first is None and not s.passed:
            result.first = _report(model, value, s, reference, stats)
            result.preceding = [_report(model, v, vs, reference, stats) for v, vs in compared[-context:]]
        compared.append((value, s))
        if result.first is not None and result.first_nonfinite is not None:
            break
    return result


def _report(model, value: Value, s: OutputStats, reference, stats) -> NodeReport:
    return NodeReport(value.position, value.node_name, value.op_type, value.name,
                      _node_inputs(model, value, reference, stats), s)


def bisect(count: int, diverges: Callable[[int], bool]) -> int:
    """Smallest position in [0, count) for which `diverges` holds, given that the last one does
    (errors propagate downstream, so divergence is taken as monotone in the order)."""
    lo, hi = 0, count - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if diverges(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi
