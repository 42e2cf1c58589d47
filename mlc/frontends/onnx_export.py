"""Tidying an ONNX file a framework exporter just wrote, so every frontend hands the worker the same
thing: inputs named and shaped as declared, readable output names, an IR version ONNX Runtime reads."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mlc.frontends.base import InputDecl
from mlc.frontends.onnx_weights import names_read
from mlc.errors import UnsupportedModelError

OPSET = 17
MAX_IR_VERSION = 8  # ONNX Runtime 1.31 and TVM read IR 8; exporters may write newer


def example_sizes_for(inputs: Sequence[InputDecl], given: Optional[dict[str, int]], batch: int = 1,
                      other: int = 8) -> dict[str, int]:
    """`given`, plus a trace size for every other symbolic dim: `batch` on axis 0, `other` elsewhere."""
    sizes = dict(given or {})
    for decl in inputs:
        for axis, dim in enumerate(decl.dims):
            if isinstance(dim, str):
                sizes.setdefault(dim, batch if axis == 0 else other)
    return sizes


IMAGE_SIZE = 224  # ImageNet's: what the reference runs an image input at when the model leaves its size open
IMAGE_CHANNELS = (1, 3, 4)  # grey, RGB, RGBA


def image_sizes(specs: Sequence) -> dict[str, int]:
    """{dim: IMAGE_SIZE} for the symbolic height and width of image-shaped float inputs: rank 4 with 1, 3 or 4
    channels on axis 3 (NHWC) or axis 1 (NCHW) and both spatial dims symbolic, as Keras saves an application built
    without an input size (MobileNetV3: (None, None, None, 3)). A convolutional network downsamples by up to 32, so
    the generic reference size of 16 leaves it nothing to pool (NaN, or a convolution larger than its input)."""
    sizes: dict[str, int] = {}
    for spec in specs:
        shape = list(spec.shape)
        if len(shape) != 4 or np.dtype(spec.dtype).kind != "f":
            continue
        for channel, spatial in ((3, (1, 2)), (1, (2, 3))):
            if shape[channel] in IMAGE_CHANNELS and all(isinstance(shape[a], str) for a in spatial):
                sizes.update({shape[a]: IMAGE_SIZE for a in spatial})
                break
    return sizes


def trace_shape(decl: InputDecl, dynamic: set[str], sizes: dict[str, int]) -> list[Optional[int]]:
    """The shape an exporter traces: None for a dynamic dim, else its fixed or example size."""
    return [None if isinstance(d, str) and d in dynamic else sizes[d] if isinstance(d, str) else d for d in decl.dims]


def finalize(path: Path, inputs: Sequence[InputDecl], dynamic: set[str], example_sizes: dict[str, int],
             output_names: Optional[Sequence[str]] = None, constants: Optional[dict[str, np.ndarray]] = None) -> None:
    """Rewrite `path` in place: declared dims in `dynamic` symbolic under their own names, the others
    fixed (exporters name dynamic dims `unk__12`, `p2o.DynamicDimension.0`...); graph inputs named in
    `constants` (values the framework captured, which the exporter left as inputs) folded in as weights."""
    model = onnx.load(str(path))
    # Exporters keep ops they cannot convert under the framework's name (tf2onnx: 'Erfc') and go on.
    unknown = sorted({n.op_type for n in model.graph.node if not onnx.defs.has(n.op_type, n.domain)})
    if unknown:
        raise UnsupportedModelError(f"the exporter could not convert op(s) {', '.join(unknown)} to ONNX; "
                                    "rewrite them with supported ops (e.g. exact GELU as x*0.5*(1+erf(x/sqrt(2))))")
    inputs_to_initializers(model, constants or {})
    add_dropped_inputs(model, inputs, dynamic, example_sizes)
    graph_inputs = {v.name: v for v in model.graph.input}
    for decl in inputs:
        dims = graph_inputs[decl.name].type.tensor_type.shape.dim
        for dim, want in zip(dims, decl.dims):
            dim.Clear()
            if isinstance(want, str) and want in dynamic:
                dim.dim_param = want
            else:
                dim.dim_value = want if isinstance(want, int) else example_sizes[want]
    _constants_to_initializers(model)
    if output_names:
        rename_outputs(model, output_names)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    onnx.save(model, str(path))


def add_dropped_inputs(model: onnx.ModelProto, inputs: Sequence[InputDecl], dynamic: set[str],
                       example_sizes: dict[str, int]) -> bool:
    """Declared inputs an exporter left out because the model ignores them (an attention mask it does not use)
    become graph inputs again, in the declared order: callers pass them. True when the model changed."""
    present = {v.name for v in model.graph.input}
    dropped = [d for d in inputs if d.name not in present]
    for decl in dropped:
        shape = [d if isinstance(d, int) or d in dynamic else example_sizes[d] for d in decl.dims]
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(decl.dtype))
        model.graph.input.append(helper.make_tensor_value_info(decl.name, elem, shape))
    if dropped:
        order = {d.name: i for i, d in enumerate(inputs)}
        ordered = sorted(model.graph.input, key=lambda v: order.get(v.name, len(order)))
        del model.graph.input[:]
        model.graph.input.extend(ordered)
    return bool(dropped)


def inputs_to_initializers(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> None:
    """The graph inputs named in `values` become initializers holding those values (dropped where no node reads
    them: a Keras dropout layer's seed state)."""
    used = names_read(model.graph)
    folded = [v.name for v in model.graph.input if v.name in values and v.name in used]
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(values[n]), n) for n in folded)
    kept = [v for v in model.graph.input if v.name not in values]
    del model.graph.input[:]
    model.graph.input.extend(kept)


def _constants_to_initializers(model: onnx.ModelProto) -> None:
    """paddle2onnx writes weights as Constant nodes; as initializers mlc sees them as weights (e.g.
    the embedding table whose size bounds the token ids it feeds)."""
    graph_outputs = {o.name for o in model.graph.output}
    keep = []
    for node in model.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) if node.op_type == "Constant" else None
        if value is None or len(node.attribute) != 1 or node.output[0] in graph_outputs:
            keep.append(node)
            continue
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
        tensor.name = node.output[0]
        model.graph.initializer.append(tensor)
    del model.graph.node[:]
    model.graph.node.extend(keep)


def unnamed_outputs(count: int) -> list[str]:
    """Names of the outputs a model does not name itself (a bare tensor, a tuple), the same on every route."""
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def rename_outputs(model: onnx.ModelProto, names: Sequence[str]) -> None:
    """Give the graph outputs `names` (same order), e.g. 'logits' for tf2onnx's 'Identity:0'."""
    if len(names) != len(model.graph.output) or len(set(names)) != len(names):
        return  # the framework's own names do not fit; keep the exporter's
    taken = {v for n in model.graph.node for v in n.output} | {v.name for v in model.graph.input}
    mapping = {o.name: new for o, new in zip(model.graph.output, names) if o.name != new}
    produced = {v for n in model.graph.node for v in n.output}
    if any(new in taken for new in mapping.values()) or any(old not in produced for old in mapping):
        return  # a clash, or an output that is a graph input / initializer itself
    for node in model.graph.node:
        node.input[:] = [mapping.get(v, v) for v in node.input]
        node.output[:] = [mapping.get(v, v) for v in node.output]
    for value in list(model.graph.output) + list(model.graph.value_info):
        value.name = mapping.get(value.name, value.name)


FLOAT_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def cast_outputs(path: Path, dtypes: dict[str, np.dtype]) -> list[str]:
    """Float outputs of the export at `path` whose dtype differs from the framework's (`dtypes`, by output name)
    cast back to it in place: torch's dynamo exporter sums an fp16 tensor in fp32 and leaves the result fp32.
    Returns the outputs it cast."""
    model = onnx.load(str(path), load_external_data=False)  # weights stay in their files, beside the model
    wanted = {}
    for output in model.graph.output:
        have, dtype = output.type.tensor_type.elem_type, dtypes.get(output.name)
        try:
            want = helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype is not None else have
        except (KeyError, TypeError, ValueError):
            continue
        if have != want and have in FLOAT_TYPES and want in FLOAT_TYPES:
            wanted[output.name] = want
    produced = {v for n in model.graph.node for v in n.output}
    wanted = {name: want for name, want in wanted.items() if name in produced}  # not an input or weight itself
    if not wanted:
        return []
    taken = produced | {v.name for v in model.graph.input} | {t.name for t in model.graph.initializer}
    for name, want in wanted.items():
        inner = next(f"{name}_{i}" for i in range(len(taken) + 1) if f"{name}_{i}" not in taken)
        taken.add(inner)
        for node in model.graph.node:
            node.input[:] = [inner if v == name else v for v in node.input]
            node.output[:] = [inner if v == name else v for v in node.output]
        for value in model.graph.value_info:
            value.name = inner if value.name == name else value.name
        model.graph.node.append(helper.make_node("Cast", [inner], [name], to=want, name=f"{name}_cast_to_framework"))
        next(o for o in model.graph.output if o.name == name).type.tensor_type.elem_type = want
    onnx.save(model, str(path))
    return sorted(wanted)
