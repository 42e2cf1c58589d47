"""A model with string values, split into the numeric part TVM compiles and the string ops the artifact runs on the
host (mlc.runtime.host_ops) before and after it: TVM has no string type. A string op between two numeric parts is
refused in one line.

With no numeric op at all, the compiled part is one constant that the runtime never reads (NO_COMPUTE): the
artifact keeps its one shape, a compiled library and a thin runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mlc.errors import UnsupportedModelError
from mlc.runtime import host_ops

NO_COMPUTE = "mlc_no_compute"  # the compiled part's one output when every op runs on the host


@dataclass
class Split:
    core: onnx.ModelProto  # what TVM compiles: its inputs are the model's numeric inputs and the host's results
    program: dict  # the host's: "before" and "after" nodes and "constants" (mlc.runtime.host_ops)


def _inferred(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Every value's declared or inferred type, by name."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - inference is a help: the declared types still count
        inferred = model.graph
    graph = model.graph
    return {v.name: v for v in [*inferred.value_info, *inferred.input, *inferred.output, *graph.input, *graph.output]}


def string_values(model: onnx.ModelProto, types: dict[str, onnx.ValueInfoProto]) -> set[str]:
    """The names of the model's string tensors (`types`: _inferred's), and those of the ops that make strings
    where inference left them untyped."""
    names = {name for name, v in types.items() if v.type.WhichOneof("value") == "tensor_type"
             and v.type.tensor_type.elem_type == TensorProto.STRING}
    names |= {t.name for t in model.graph.initializer if t.data_type == TensorProto.STRING}
    for node in model.graph.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type in ("StringConcat", "StringNormalizer", "StringSplit") or \
                (node.op_type == "Cast" and to == TensorProto.STRING):
            names.add(node.output[0])
    return names


# Ops that make or take strings, for a quick look before shape inference (which copies the whole model)
_STRING_OPS = {"StringConcat", "StringSplit", "StringNormalizer", "RegexFullMatch", "LabelEncoder"}


def has_strings(model: onnx.ModelProto) -> bool:
    """Whether the model may compute on strings: string graph inputs, outputs or constants, a string op, a Cast to
    strings. Cheap; split() decides."""
    graph = model.graph
    declared = [v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]
                if v.type.WhichOneof("value") == "tensor_type"]
    return (TensorProto.STRING in declared or any(t.data_type == TensorProto.STRING for t in graph.initializer)
            or any(n.op_type in _STRING_OPS or any(a.name == "to" and a.i == TensorProto.STRING for a in n.attribute)
                   or any(a.t.data_type == TensorProto.STRING for a in n.attribute if a.type == a.TENSOR)
                   for n in graph.node))


def split(model: onnx.ModelProto) -> Optional[Split]:
    """None for a model without strings; else its numeric part and the host program (see the module)."""
    types = _inferred(model)
    strings = string_values(model, types)
    if not strings:
        return None
    graph = model.graph
    host = [n for n in graph.node if any(name in strings for name in [*n.input, *n.output] if name)]
    unknown = sorted({n.op_type for n in host if n.op_type not in host_ops.OPS})
    if unknown:
        raise UnsupportedModelError(f"the model computes on strings with {', '.join(unknown)}, which mlc's host "
                                    f"runtime does not implement (it runs {', '.join(sorted(host_ops.OPS))}); TVM "
                                    "compiles numbers only: keep that string processing outside the model")
    host_ids = {id(n) for n in host}
    tainted: set[str] = set()  # values downstream of a numeric op
    before, after, core_nodes = [], [], []
    for node in graph.node:
        downstream = any(name in tainted for name in node.input)
        if id(node) not in host_ids:
            core_nodes.append(node)
            tainted.update(node.output)
        elif downstream:
            after.append(node)
            tainted.update(node.output)
        else:
            before.append(node)
    _refuse_sandwich(core_nodes, after)
    return Split(_core(model, types, core_nodes, before), _program(model, before, after))


def _refuse_sandwich(core_nodes: list, after: list) -> None:
    after_outputs = {name: node for node in after for name in node.output}
    for node in core_nodes:
        source = next((after_outputs[name] for name in node.input if name in after_outputs), None)
        if source is not None:
            raise UnsupportedModelError(
                f"{node.op_type} '{node.name or node.output[0]}' computes on the result of {source.op_type} "
                f"'{source.name or source.output[0]}', a string op that itself reads a numeric result: mlc runs "
                "string ops on the host only before or after the compiled numeric part")


def _core(model: onnx.ModelProto, types: dict[str, onnx.ValueInfoProto], core_nodes: list, before: list
          ) -> onnx.ModelProto:
    """The numeric part as a model: its inputs are the graph inputs and host results it reads, its outputs what
    the host's later ops or the model's outputs take from it."""
    graph = model.graph
    produced = {name for node in core_nodes for name in node.output}
    read = {name for node in core_nodes for name in node.input if name}
    weights = {t.name: t for t in graph.initializer}
    inputs = [v for v in graph.input if v.name in read and v.name not in weights]
    inputs += [_typed(types, name) for node in before for name in node.output if name in read]
    core_ids = {id(node) for node in core_nodes}
    wanted = [name for node in graph.node if id(node) not in core_ids for name in node.input]
    outputs = [_typed(types, name) for name in dict.fromkeys(wanted + [o.name for o in graph.output])
               if name in produced]
    nodes = list(core_nodes)
    if not nodes:
        nodes = [helper.make_node("Constant", [], [NO_COMPUTE], value=numpy_helper.from_array(
            np.zeros((1,), np.float32)))]
        outputs = [helper.make_tensor_value_info(NO_COMPUTE, TensorProto.FLOAT, [1])]
    core_graph = helper.make_graph(nodes, f"{graph.name}_numeric", inputs, outputs,
                                   [weights[n] for n in sorted(read) if n in weights])
    opsets = list(model.opset_import)
    if not any(o.domain in ("", "ai.onnx") for o in opsets):  # an ai.onnx.ml-only model: NO_COMPUTE's Constant
        opsets.append(helper.make_opsetid("", 13))
    return helper.make_model(core_graph, opset_imports=opsets, ir_version=model.ir_version)


def _typed(types: dict[str, onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto:
    """A value between the host's ops and the compiled part: its type must be known (TVM compiles static types)."""
    if name not in types:
        raise UnsupportedModelError(f"ONNX's shape inference cannot tell the type of '{name}', which passes between "
                                    "the model's string ops and its numeric part; declare it in the graph's value_info")
    return types[name]


def _program(model: onnx.ModelProto, before: list, after: list) -> dict:
    host = before + after
    read = {name for node in host for name in node.input}
    constants = {t.name: _tensor_record(numpy_helper.to_array(t)) for t in model.graph.initializer if t.name in read}
    return {"before": [_node_record(n) for n in before], "after": [_node_record(n) for n in after],
            "constants": constants}


def _tensor_record(array: np.ndarray) -> dict:
    if host_ops.is_strings(array):
        return {"dtype": "string", "shape": list(array.shape), "values": host_ops.as_strings(array).ravel().tolist()}
    return {"dtype": str(array.dtype), "shape": list(array.shape), "values": array.ravel().tolist()}


def _node_record(node: onnx.NodeProto) -> dict:
    attrs: dict[str, Any] = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        if isinstance(value, TensorProto):
            value = _tensor_record(numpy_helper.to_array(value))
        elif isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, list):
            value = [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
        if attribute.name == "to":  # Cast: the numpy dtype's name
            value = "string" if value == TensorProto.STRING else str(helper.tensor_dtype_to_np_dtype(value))
        attrs[attribute.name] = value
    return {"op": node.op_type, "inputs": list(node.input), "outputs": list(node.output), "attrs": attrs}
