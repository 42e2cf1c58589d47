"""Graph inputs and outputs that are not tensors (ONNX sequences and optionals), as tensors: an artifact takes and
gives tensors only, and TVM compiles a sequence as a tuple of static length.

- A sequence input `x` becomes the inputs `x[0]` .. `x[N-1]`, gathered by SequenceConstruct; N is the count the
  samples (--inputs) give, fixed at compile time as a tensor's shape is.
- An optional input is its value where the samples give one, else an empty Optional (the artifact then takes none).
- A sequence output `y` becomes the outputs `y[0]` .. `y[N-1]` (N from an ONNX Runtime run on the reference inputs);
  an optional output, its value (an empty one cannot be given as a tensor: a one-line error).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper

from mlc.errors import InputError, UnsupportedModelError

_ITEM = re.compile(r"^(?P<name>.*)\[(?P<index>\d+)\]$")


def item_name(name: str, index: int) -> str:
    """The tensor that holds item `index` of the sequence `name` (an input's key in an .npz, an output's name)."""
    return f"{name}[{index}]"


def is_empty_sequence(key: str) -> bool:
    """An .npz key `x[]`: the sequence input x given empty (it has no items to key)."""
    return key.endswith("[]")


def refuse_strings(model: onnx.ModelProto) -> None:
    """A string graph input or output is a one-line error where mlc.pipeline.strings does not split the string ops
    off (every command but `mlc compile` of an ONNX file): TVM has no string type (its import fails on dtype
    `object`)."""
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for value in values:
            type_ = value.type
            while type_.WhichOneof("value") in ("sequence_type", "optional_type"):
                type_ = getattr(type_, type_.WhichOneof("value")).elem_type
            if type_.WhichOneof("value") == "tensor_type" and type_.tensor_type.elem_type == TensorProto.STRING:
                raise UnsupportedModelError(f"{kind} '{value.name}' holds strings, and TVM compiles numbers only: "
                                            "`mlc compile MODEL.onnx` runs an ONNX model's string ops on the host "
                                            "around the compiled part; other commands, and framework models, take "
                                            "numeric models only")


def non_tensor(values) -> list[onnx.ValueInfoProto]:
    return [v for v in values if v.type.WhichOneof("value") != "tensor_type"]


def inputs_as_tensors(model: onnx.ModelProto, samples: Optional[Mapping[str, np.ndarray]], said: list[str]
                      ) -> onnx.ModelProto:
    """`model` with each sequence or optional graph input made tensors, from the samples (--inputs); what was made
    of each is appended to `said`."""
    weights = {t.name for t in model.graph.initializer}
    values = [v for v in non_tensor(model.graph.input) if v.name not in weights]
    if not values:
        return model
    samples = samples or {}
    model = _copy(model)
    graph = model.graph
    nodes, renamed = [], {}
    for value in values:
        index = [i for i, v in enumerate(graph.input) if v.name == value.name][0]
        inputs, made, how = _as_tensors(value, samples)
        said.append(f"input '{value.name}' {how}")
        graph.input.remove(graph.input[index])
        for offset, tensor in enumerate(inputs):
            graph.input.insert(index + offset, tensor)
        nodes += made
        if made and made[-1].output[0] != value.name:  # the value is computed under another name
            renamed[value.name] = made[-1].output[0]
    _rename_uses(graph, renamed)
    nodes += graph.node
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _as_tensors(value: onnx.ValueInfoProto, samples: Mapping[str, np.ndarray]
                ) -> tuple[list[onnx.ValueInfoProto], list[onnx.NodeProto], str]:
    """The tensor inputs that stand for `value`, the nodes that make `value` (its name) from them, and what it is
    compiled as."""
    name, kind = value.name, value.type.WhichOneof("value")
    if kind == "sequence_type":
        inputs, nodes = _sequence(name, value.type.sequence_type.elem_type, samples, name)
        return inputs, nodes, f"is a sequence, compiled for {_items(name, len(inputs))}"
    if kind != "optional_type":
        raise UnsupportedModelError(f"input '{name}' is a {kind.replace('_type', '')}; mlc compiles tensors, "
                                    "sequences and optionals")
    element = value.type.optional_type.elem_type
    given = name in samples or item_name(name, 0) in samples or _empty(name) in samples
    if not given:  # absent: an empty Optional of its type
        return [], [helper.make_node("Optional", [], [name], type=element)], \
            "is an optional, compiled empty (--inputs gives it no value): the artifact takes none"
    if element.WhichOneof("value") == "sequence_type":
        inputs, nodes = _sequence(name, element.sequence_type.elem_type, samples, f"{name}.value")
        how = f"is an optional sequence, compiled holding {_items(name, len(inputs))}"
    else:
        inputs, nodes = [_tensor_input(name, element.tensor_type.elem_type, samples[name])], []
        how = "is an optional, compiled holding a value (a tensor input)"
    inner = nodes[-1].output[0] if nodes else name
    return inputs, nodes + [helper.make_node("Optional", [inner], [f"{name}.optional"])], how


def _items(name: str, count: int) -> str:
    return f"{count} item(s), {item_name(name, 0)} .. {item_name(name, count - 1)}" if count else "no items"


def _sequence(name: str, element: onnx.TypeProto, samples: Mapping[str, np.ndarray], output: str):
    count = _sequence_length(name, samples)
    if element.WhichOneof("value") != "tensor_type":
        raise UnsupportedModelError(f"input '{name}' is a sequence of {element.WhichOneof('value')}s; mlc compiles "
                                    "sequences of tensors")
    elem_type = element.tensor_type.elem_type
    inputs = [_tensor_input(item_name(name, i), elem_type, samples[item_name(name, i)]) for i in range(count)]
    if not count:
        return [], [helper.make_node("SequenceEmpty", [], [output], dtype=elem_type)]
    return inputs, [helper.make_node("SequenceConstruct", [i.name for i in inputs], [output])]


def _sequence_length(name: str, samples: Mapping[str, np.ndarray]) -> int:
    """N where the samples hold name[0] .. name[N-1] (an empty sequence: a key `name[]`)."""
    indices = sorted(int(m["index"]) for m in map(_ITEM.match, samples) if m and m["name"] == name)
    if indices != list(range(len(indices))):
        raise UnsupportedModelError(f"input '{name}' is a sequence: --inputs holds items {indices} of it; give "
                                    f"'{item_name(name, 0)}', '{item_name(name, 1)}', ... without gaps")
    if not indices and _empty(name) not in samples:
        raise UnsupportedModelError(f"input '{name}' is a sequence of tensors, compiled for a fixed count: give its "
                                    f"items with --inputs FILE.npz as '{item_name(name, 0)}', "
                                    f"'{item_name(name, 1)}', ... (an empty one as '{_empty(name)}')")
    return len(indices)


def _empty(name: str) -> str:
    return f"{name}[]"


def _tensor_input(name: str, elem_type: int, sample: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(np.shape(sample)))


def outputs_as_tensors(model: onnx.ModelProto, got: Mapping[str, Any], said: list[str]) -> onnx.ModelProto:
    """`model` with each sequence or optional graph output made tensors; `got`: ONNX Runtime's outputs of `model` on
    the reference inputs (`probe`: lists for sequences, None for an empty optional), which give each sequence its
    count. What was made of each is appended to `said`."""
    model = _copy(model)
    graph = model.graph
    nodes, outputs, renamed = [], [], {}
    for value in graph.output:
        if value.type.WhichOneof("value") == "tensor_type":
            outputs.append(value)
            continue
        made, tensors, inner = _output_tensors(value, got.get(value.name))
        said.append(f"output '{value.name}' is " + ("an optional, given as its value" if tensors[0].name == value.name
                                                     else f"a sequence, given as {_items(value.name, len(tensors))}"))
        renamed.update(inner)
        nodes += made
        outputs += tensors
    _rename_outputs(graph, renamed)
    del graph.output[:]
    graph.output.extend(outputs)
    graph.node.extend(nodes)
    return model


def _output_tensors(value: onnx.ValueInfoProto, got: Any):
    """The nodes that read `value` out as tensors, those outputs, and {value's name: the name it is computed as}."""
    name, type_ = value.name, value.type
    renamed = {}
    if type_.WhichOneof("value") == "optional_type":
        if got is None:
            raise UnsupportedModelError(f"output '{name}' is an empty optional on the reference inputs; an artifact "
                                        "gives tensors: compile with inputs for which it holds a value")
        renamed[name] = f"{name}.optional"
        type_ = type_.optional_type.elem_type
        source = f"{name}.value" if type_.WhichOneof("value") == "sequence_type" else name
        nodes = [helper.make_node("OptionalGetElement", [renamed[name]], [source])]
    else:
        source, nodes = name, []
    if type_.WhichOneof("value") == "tensor_type":
        return nodes, [helper.make_tensor_value_info(name, type_.tensor_type.elem_type, None)], renamed
    elem_type = type_.sequence_type.elem_type.tensor_type.elem_type
    tensors = []
    for i in range(len(got)):
        index = f"{name}.index{i}"
        position = helper.make_tensor(index, TensorProto.INT64, [], [i])
        nodes += [helper.make_node("Constant", [], [index], value=position),
                  helper.make_node("SequenceAt", [source, index], [item_name(name, i)])]
        tensors.append(helper.make_tensor_value_info(item_name(name, i), elem_type, None))
    if not tensors:
        raise UnsupportedModelError(f"output '{name}' is an empty sequence on the reference inputs; an artifact "
                                    "gives tensors: compile with inputs for which it holds some")
    return nodes, tensors, renamed


def _rename_uses(graph: onnx.GraphProto, renamed: Mapping[str, str]) -> None:
    """Every read of a renamed value, subgraphs included (an If or Loop body reads outer values by name)."""
    if not renamed:
        return
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _rename_uses(sub, renamed)
    for value in [*graph.output, *graph.value_info]:
        if value.name in renamed:
            value.name = renamed[value.name]


def _rename_outputs(graph: onnx.GraphProto, renamed: Mapping[str, str]) -> None:
    """The producers of the renamed graph outputs, and their readers, use the new names."""
    if not renamed:
        return
    for node in graph.node:
        node.output[:] = [renamed.get(n, n) for n in node.output]
        node.input[:] = [renamed.get(n, n) for n in node.input]
    for value in graph.value_info:
        if value.name in renamed:
            value.name = renamed[value.name]
    for value in graph.input:  # an output that is an input as given
        if value.name in renamed:
            graph.node.append(helper.make_node("Identity", [value.name], [renamed[value.name]]))


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def probe(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """ONNX Runtime's outputs of the model at `path` on `feeds`, as it gives them (lists for sequences)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, {k: np.asarray(v) for k, v in feeds.items()})))
    except Exception as e:  # onnxruntime raises its own untyped exceptions
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise InputError(f"ONNX Runtime cannot run {path.name} on the reference inputs, which give its sequence "
                         f"and optional outputs their counts: {reason}; give the model's inputs with --inputs "
                         "FILE.npz") from None
