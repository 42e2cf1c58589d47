"""ONNX frontend: load and validate a model file, describe its inputs, and compute the reference
outputs with ONNX Runtime on fixed seeded inputs."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import ml_dtypes
import numpy as np
import onnx
import onnx.external_data_helper
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from mlc.errors import InputError, UnsupportedModelError
from mlc.frontends.onnx_indices import index_ranges
from mlc.frontends.options import MAX_DIM

REFERENCE_SEED = 0
# The reference run must fit in memory beside the model; larger inputs are almost always a typo.
MAX_REFERENCE_BYTES = 2 << 30
# Sizes given to symbolic dims when making reference inputs, unless the user fixed them.
DEFAULT_BATCH = 2
DEFAULT_OTHER_DIM = 16


@dataclass
class InputSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: list  # int or symbolic name per axis
    value_range: Optional[tuple[int, int]] = None  # inclusive, for inputs that index a table
    divisor: bool = False  # an integer Div/Mod divisor: the reference inputs avoid 0 (it traps in compiled code)
    index_limit: Optional[int] = None  # indexes an input's axis of this size: the reference inputs stay below it
    # An integer input that sets a shape, axes or a count (an op's parameter, not its data), e.g. "the shape of Expand
    # 'e'", and how seeded values are made valid ("ones", "zeros", "sizes", "axes:RANK", "expand:INPUT" or
    # "expand:3x1" (the data's shape); None: no value is known valid)
    parameter: Optional[str] = None
    fill: Optional[str] = None


@dataclass
class Reference:
    """What the source model computes on fixed inputs; the artifact is checked against it."""

    producer: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    seed: int = REFERENCE_SEED


def load(path: str | Path, weights_dir: Optional[Path] = None) -> onnx.ModelProto:
    """The model at `path`, checked. With `weights_dir`, its weights stay in their files: each is an external-data
    reference relative to `weights_dir` (mlc.frontends.onnx_weights), read where a pass needs its value."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"model file not found: {path}")
    if path.is_dir():
        raise InputError(f"{path} is a folder but not a TensorFlow SavedModel (no saved_model.pb in it); pass a model "
                         "file (.onnx, .pt2, .pt, .keras, .h5), a SavedModel folder or a Paddle jit.save prefix")
    if weights_dir is not None:
        light = _load_light(path, Path(weights_dir))
        if light is not None:
            return light
    try:
        # onnx.load, keeping the file's bytes for the checker, which otherwise serialises the model again (2 s on
        # bert-base)
        serialized = path.read_bytes()
        model = onnx.load_model_from_string(serialized)
        if _has_external_data(model.graph):
            # the checker reads the file with its weights' data (a model over 2 GB cannot be serialised again)
            serialized = str(path)
            _check_weight_files(model, path)
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
    except onnx.checker.ValidationError as e:  # a weight file that a subgraph's tensor names is missing
        raise InputError(f"cannot read the weights of {path}: {_first_line(e)}") from None
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise InputError(f"{path} is not an ONNX model (cannot parse it: {_first_line(e)}); "
                         "pass a valid .onnx file") from None
    validate(model, str(path), serialized)
    return model


def load_graph(path: str | Path) -> onnx.ModelProto:
    """The model at `path`, checked, without its weights' data: what its inputs and outputs are (an export checked
    in the process that holds the framework's model, which holds the weights already)."""
    with tempfile.TemporaryDirectory(prefix="mlc-graph-") as links:
        return load(path, weights_dir=Path(links))


def _load_light(path: Path, weights_dir: Path) -> Optional[onnx.ModelProto]:
    """The model with its weights left in their files, checked; None where that fails to parse (onnx.load decides
    whether the file is a model)."""
    from mlc.frontends import onnx_weights

    try:
        model = onnx_weights.load_light(path, weights_dir)
    except (DecodeError, ValueError, IndexError, RuntimeError, OSError):
        return None
    # The checker reads a model's external data from the model's folder: it checks this copy, beside the links.
    checked = weights_dir / f"{path.stem}.checked.onnx"
    checked.write_bytes(model.SerializeToString())
    try:
        validate(model, str(path), str(checked))
    finally:
        checked.unlink()
    return model


def _check_weight_files(model: onnx.ModelProto, path: Path) -> None:
    """The files an external-data model keeps its weights in are beside it: name a missing one (a user's mistake)."""
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            location = onnx.external_data_helper.ExternalDataInfo(tensor).location
            if not (path.parent / location).is_file():
                raise InputError(f"{path} keeps weights ({tensor.name}) in a file that is missing: "
                                 f"{path.parent / location}; copy it next to the model")


def _has_external_data(graph: onnx.GraphProto) -> bool:
    tensors = list(graph.initializer)
    for node in graph.node:
        for a in node.attribute:
            tensors += ([a.t] if a.HasField("t") else []) + list(a.tensors)
            if any(_has_external_data(g) for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)):
                return True
    return any(t.data_location == TensorProto.EXTERNAL for t in tensors)


def validate(model: onnx.ModelProto, where: str, serialized: Optional[bytes | str] = None) -> None:
    """Checks that give the user a clear error; `serialized`: the model's bytes, or its file's path, when at hand
    (the checker's input)."""
    given = {v.name for v in model.graph.input} | {t.name for t in model.graph.initializer}
    if not model.graph.node and not (model.graph.output and all(o.name in given for o in model.graph.output)):
        # A graph of no nodes is valid where each output is an input or a weight (a constant-only model).
        raise InputError(f"{where} has an empty graph (no nodes); export the model again")
    if not model.graph.output:
        raise InputError(f"{where} declares no graph outputs; export the model again")
    _check_opsets(model, where)
    _check_dataflow(model, where)
    try:
        onnx.checker.check_model(serialized if serialized is not None else model)
    except (onnx.checker.ValidationError, ValueError) as e:
        raise InputError(f"{where} is not a valid ONNX model: {_first_line(e)}") from None
    for spec in input_specs(model, tensors_only=True):
        if any(isinstance(d, int) and d > MAX_DIM for d in spec.shape):
            raise InputError(f"input '{spec.name}' of {where} has an absurd dimension {spec.shape}")


def _check_opsets(model: onnx.ModelProto, where: str) -> None:
    newest = onnx.defs.onnx_opset_version()
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > newest:
            raise InputError(f"{where} uses ONNX opset {opset.version}, newer than any this installation knows "
                             f"(up to {newest}); export it again with opset {newest} or lower")


def _check_dataflow(model: onnx.ModelProto, where: str) -> None:
    """Every node input is a graph input, an initializer or an earlier node's output (which also
    rules out cycles); said in terms of the nodes, unlike the checker's message."""
    available = {v.name for v in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    producer = {out: node.name or f"#{i}" for i, node in enumerate(model.graph.node) for out in node.output}
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            if name in available:
                continue
            user = node.name or f"#{index}"
            if name in producer:
                raise InputError(f"{where}: node {user} uses '{name}' before node {producer[name]} computes it "
                                 "(the graph has a cycle or is not topologically sorted)")
            raise InputError(f"{where}: node {user} uses '{name}', which no node, graph input or initializer "
                             "provides (a missing initializer?); export the model again")
        available.update(node.output)
    missing = [o.name for o in model.graph.output if o.name not in available]
    if missing:
        raise InputError(f"{where}: graph output(s) {', '.join(missing)} are not computed by any node")


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def _dtype_name(elem_type: int) -> str:
    if elem_type == TensorProto.BFLOAT16:  # onnx 1.17 maps it to float32; fed as ml_dtypes.bfloat16, as ORT's users do
        return "bfloat16"
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError):
        return TensorProto.DataType.Name(elem_type).lower()


def input_specs(model: onnx.ModelProto, tensors_only: bool = False) -> list[InputSpec]:
    """The graph inputs that are fed at run time (initializers listed as inputs are weights); `tensors_only`: leave
    out sequences and optionals (mlc.frontends.onnx_values makes them tensors) instead of refusing them."""
    weights = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            if tensors_only:
                continue
            raise UnsupportedModelError(f"input '{value.name}' is a {value.type.WhichOneof('value')[:-5]}; mlc "
                                        "compiles tensors, and sequences and optionals as tensors")
        shape: list = []
        for axis, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value"):
                shape.append(int(dim.dim_value))
            else:
                shape.append(_sanitize_dim(dim.dim_param) if dim.dim_param
                             else f"{_sanitize_dim(value.name)}_dim{axis}")
        specs.append(InputSpec(value.name, _dtype_name(tensor.elem_type), shape))
    _attach_index_ranges(model, specs)
    return specs


def _sanitize_dim(name: str) -> str:
    return re.sub(r"\W", "_", name) or "dim"


# Ops through which token ids keep their meaning on the way to a Gather, where `index_ranges` cannot follow the
# arithmetic (an operand from another input): casts and reshapes, and the negative-index wrap Keras exports.
_INDEX_PRESERVING = {"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Where", "Add", "Mul", "Mod",
                     "Clip", "Max", "Min"}


def _attach_index_ranges(model: onnx.ModelProto, specs: list[InputSpec]) -> None:
    """Integer inputs that are Gather indices into a constant table get that table's range."""
    tables = {init.name: list(init.dims) for init in model.graph.initializer}
    aliases = {s.name: s.name for s in specs}  # value name -> the graph input its values come from
    for node in model.graph.node:  # topological order
        if node.op_type in _INDEX_PRESERVING and node.output:
            source = next((aliases[i] for i in node.input if i in aliases), None)
            if source is not None:
                aliases[node.output[0]] = source
    by_name = {s.name: s for s in specs}
    for node in model.graph.node:
        # Integer divisors: a zero in the reference inputs would trap (SIGFPE) in the compiled code.
        if node.op_type in ("Div", "Mod") and len(node.input) > 1 and node.input[1] in by_name:
            spec = by_name[node.input[1]]
            spec.divisor = np.dtype(spec.dtype).kind in "iu"
    _attach_index_limits(model, by_name)
    _attach_parameters(model, by_name)
    integers = [s.name for s in specs if np.dtype(s.dtype).kind in "iu"]
    followed = index_ranges(model, integers)
    for name, interval in followed.items():
        by_name[name].value_range = interval
    for node in model.graph.node:  # what the arithmetic could not follow: the table's rows, as if indexed directly
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[1] not in aliases:
            continue
        table = tables.get(node.input[0])
        spec = by_name[aliases[node.input[1]]]
        if not table or spec.name in followed or spec.name not in integers:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        hi = table[axis] - 1
        spec.value_range = (0, hi if spec.value_range is None else min(hi, spec.value_range[1]))


# Ops whose input 1 indexes input 0 (ScatterND and GatherND index its leading axes).
_INDEXING = {"Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements", "ScatterND"}


def _attach_index_limits(model: onnx.ModelProto, by_name: dict[str, InputSpec]) -> None:
    """Integer inputs that index another input's axis get that axis' size as a limit for the reference
    inputs (not enforced at run time, unlike a table's range: negative indices are valid ONNX)."""
    shapes = {name: [d for d in spec.shape] for name, spec in by_name.items()}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type not in _INDEXING or len(node.input) < 2 or node.input[1] not in by_name:
            continue
        data, spec = shapes.get(node.input[0]), by_name[node.input[1]]
        if not data or np.dtype(spec.dtype).kind not in "iu":
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        dims = data if node.op_type.endswith("ND") else [data[axis]] if -len(data) <= axis < len(data) else []
        sizes = [d for d in dims if isinstance(d, int)]
        if sizes:
            spec.index_limit = min(sizes + ([spec.index_limit] if spec.index_limit else []))


_REDUCE_OPS = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
               "ReduceProd", "ReduceSum", "ReduceSumSquare")
# (op, input slot) -> (what the value sets, how seeded values are made valid; None: no value is valid for every model,
# the user gives one with --inputs). Seeded noise there made invalid models (axis 2 of a 1-D tensor, Expand to 0x0x0).
PARAMETER_SLOTS: dict[tuple[str, int], tuple[str, Optional[str]]] = {
    ("Expand", 1): ("the shape of", "expand"),  # the data's own shape (TVM's Expand ignores broadcasting of 1s)
    ("ConstantOfShape", 0): ("the output shape of", "sizes"),
    ("Tile", 1): ("the repeats of", "sizes"),
    ("OneHot", 1): ("the depth of", "sizes"),
    ("TopK", 1): ("k of", "ones"),
    ("Pad", 1): ("the pads of", "zeros"),
    ("CumSum", 1): ("the axis of", "axes"),
    **{(op, 1): ("the axes of", "axes") for op in _REDUCE_OPS},
    ("Reshape", 1): ("the shape of", None), ("Squeeze", 1): ("the axes of", None),
    ("Unsqueeze", 1): ("the axes of", None), ("Split", 1): ("the split sizes of", None),
    ("Resize", 3): ("the sizes of", None), ("Col2Im", 1): ("the image shape of", None),
    ("Col2Im", 2): ("the block shape of", None), ("Pad", 3): ("the axes of", None),
    **{("Slice", i): (f"the {what} of", None) for i, what in enumerate(("starts", "ends", "axes", "steps"), 1)},
    **{("Range", i): (f"the {what} of", None) for i, what in enumerate(("start", "limit", "delta"))},
    # a sequence compiles as a tuple of static length: which item, and where, is known at compile time
    ("SplitToSequence", 1): ("the split sizes of", None), ("SequenceInsert", 2): ("the position of", None),
    ("SequenceAt", 1): ("the position of", None), ("SequenceErase", 1): ("the position of", None),
}


def _attach_parameters(model: onnx.ModelProto, by_name: dict[str, InputSpec]) -> None:
    """Integer inputs read in a parameter slot (PARAMETER_SLOTS) get what they set and a way to make valid values."""
    ranks = {name: len(spec.shape) for name, spec in by_name.items()}
    ranks.update({t.name: len(t.dims) for t in model.graph.initializer})
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        for slot, name in enumerate(node.input):
            role = PARAMETER_SLOTS.get((node.op_type, slot))
            spec = by_name.get(name)
            if role is None or spec is None or np.dtype(spec.dtype).kind not in "iu" or spec.parameter:
                continue
            what, fill = role
            spec.parameter = f"{what} {node.op_type}" + (f" {node.name!r}" if node.name else "")
            if fill == "axes":  # distinct axes of the data, when its rank is known here
                rank = ranks.get(node.input[0]) if node.input else None
                fill = f"axes:{rank}" if rank else None
            elif fill == "expand":  # the data's shape: a graph input's (its reference shape) or a weight's
                data = node.input[0]
                dims = next((list(t.dims) for t in model.graph.initializer if t.name == data), None)
                if data in by_name:
                    fill = f"expand:{data}"
                elif dims is not None:
                    fill = "expand:" + "x".join(map(str, dims))
                else:  # computed data: ones are valid for ONNX, though TVM may not broadcast them
                    fill = "ones"
            spec.fill = fill


def parameter_hint(specs: list[InputSpec]) -> str:
    """"input 'shape' sets the shape of Reshape 'r'" for each parameter input among `specs`, or ""."""
    return "; ".join(f"input '{s.name}' sets {s.parameter}" for s in specs if s.parameter)


def check_samples(specs: list[InputSpec], data: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """The user's sample inputs (`where`: "--inputs FILE"), checked against the model's inputs: the same names, each
    of the input's dtype and rank, the model's fixed dims, and one size per symbolic dim name."""
    names = [s.name for s in specs]
    missing = [n for n in names if n not in data]
    extra = sorted(set(data) - set(names))
    if missing or extra:
        parts = ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has {', '.join(extra)}, which the model "
                                                                           "does not take"] if extra else [])
        raise InputError(f"{where}: the file {' and '.join(parts)}; the model's inputs are: {', '.join(names)} "
                         "(save one array per input name with numpy.savez)")
    sizes: dict[str, tuple[int, str]] = {}
    samples = {}
    for spec in specs:
        value = np.asarray(data[spec.name])
        if value.dtype != np.dtype(ml_dtypes.bfloat16 if spec.dtype == "bfloat16" else spec.dtype):
            raise InputError(f"{where}: input '{spec.name}' is {value.dtype} in the file, the model takes "
                             f"{spec.dtype}; save it as {spec.dtype}")
        if value.ndim != len(spec.shape):
            raise InputError(f"{where}: input '{spec.name}' has shape {list(value.shape)} (rank {value.ndim}), "
                             f"the model takes rank {len(spec.shape)} {_fmt(spec.shape)}")
        for axis, (dim, size) in enumerate(zip(spec.shape, value.shape)):
            if isinstance(dim, int) and dim != size:
                raise InputError(f"{where}: input '{spec.name}' has shape {list(value.shape)}, the model fixes axis "
                                 f"{axis} at {dim} {_fmt(spec.shape)}")
            if isinstance(dim, str):
                seen = sizes.setdefault(dim, (size, spec.name))
                if seen[0] != size:
                    raise InputError(f"{where}: dim {dim!r} is {seen[0]} in '{seen[1]}' but {size} in "
                                     f"'{spec.name}'; the model gives both the same size")
        samples[spec.name] = value
    return samples


def freeze_inputs(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` whose inputs named in `values` are initializers holding those values (--freeze)."""
    if not values:
        return model
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    kept = [v for v in frozen.graph.input if v.name not in values]
    del frozen.graph.input[:]
    frozen.graph.input.extend(kept)
    frozen.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in values.items())
    return frozen


def parse_input_shape(text: str) -> tuple[Optional[str], list[int]]:
    """'input_ids:1x128' -> ('input_ids', [1, 128]); '1x3x224x224' -> (None, [...])."""
    name, _, dims = text.rpartition(":")
    if not re.fullmatch(r"\d+(x\d+)*", dims.strip()):
        raise InputError(f"--input-shape {text!r} is malformed; write NAME:DIMxDIM..., e.g. input_ids:1x128")
    shape = [int(d) for d in dims.strip().split("x")]
    if any(d <= 0 or d > MAX_DIM for d in shape):
        raise InputError(f"--input-shape {text!r} has a dimension outside 1..{MAX_DIM}")
    return (name.strip() or None), shape


def resolve_input_shapes(specs: list[InputSpec], texts: list[str]) -> dict[str, list[int]]:
    """Parse --input-shape values against the model's inputs; every mismatch is an InputError."""
    shapes: dict[str, list[int]] = {}
    names = [s.name for s in specs]
    for text in texts:
        name, shape = parse_input_shape(text)
        if name is None:
            if len(specs) != 1:
                raise InputError(f"--input-shape {text!r} has no input name and the model has {len(specs)} inputs: "
                                 f"{', '.join(names)}")
            name = names[0]
        spec = next((s for s in specs if s.name == name), None)
        if spec is None:
            raise InputError(f"--input-shape names unknown input {name!r}; the model's inputs are: {', '.join(names)}")
        if len(shape) != len(spec.shape):
            raise InputError(f"--input-shape {name}: rank {len(shape)} given, the model expects {_fmt(spec.shape)}")
        for want, got in zip(spec.shape, shape):
            if isinstance(want, int) and want != got:
                raise InputError(f"--input-shape {name}: {'x'.join(map(str, shape))} conflicts with the model's "
                                 f"fixed shape {_fmt(spec.shape)}")
        shapes[name] = shape
    return shapes


def _fmt(shape: list) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int | str]]) -> onnx.ModelProto:
    """A copy of `model` whose named inputs have the given shapes (a str keeps the dim symbolic)."""
    if not shapes:
        return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                dim.Clear()
                if isinstance(size, str):
                    dim.dim_param = size
                else:
                    dim.dim_value = size
    # Intermediate shapes were inferred for the old input shapes; infer them again.
    del fixed.graph.value_info[:]
    return fixed


def concrete_shapes(specs: list[InputSpec], fixed: dict[str, list[int]],
                    sizes: Optional[dict[str, int]] = None) -> dict[str, list[int]]:
    """A concrete shape per input for the reference run; the same symbolic name gets one size: from `sizes`,
    else batch 2 on axis 0 and 16 elsewhere."""
    sizes = dict(sizes or {})
    shapes = {}
    for spec in specs:
        if spec.name in fixed:
            shapes[spec.name] = fixed[spec.name]
            continue
        shape = []
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, str):
                dim = sizes.setdefault(dim, DEFAULT_BATCH if axis == 0 else DEFAULT_OTHER_DIM)
            shape.append(dim)
        shapes[spec.name] = shape
    return shapes


def make_inputs(specs: list[InputSpec], shapes: dict[str, list[int]],
                seed: int = REFERENCE_SEED) -> dict[str, np.ndarray]:
    """Seeded inputs of the right dtype; masks are ones, table indices stay inside the table."""
    total = sum(int(np.prod(shapes[s.name], dtype=np.float64)) * np.dtype(s.dtype).itemsize for s in specs)
    if total > MAX_REFERENCE_BYTES:
        described = ", ".join(f"{s.name} {'x'.join(map(str, shapes[s.name]))}" for s in specs)
        raise InputError(f"the reference inputs would take {total / 2**30:.1f} GiB ({described}); "
                         "choose smaller shapes with --input-shape")
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape, dtype = shapes[spec.name], np.dtype(spec.dtype)
        if dtype.kind == "f" or dtype == ml_dtypes.bfloat16:
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            value = rng.random(shape) < 0.5
        elif spec.fill in ("ones", "zeros"):
            value = (np.ones if spec.fill == "ones" else np.zeros)(shape, dtype)
        elif spec.fill == "sizes":
            value = rng.integers(1, 4, size=shape).astype(dtype)
        elif spec.fill and spec.fill.startswith("expand:") and len(shape) == 1:  # right-aligned, 1s before
            source = spec.fill[7:]
            dims = shapes.get(source) or ([int(d) for d in source.split("x")] if re.fullmatch(r"\d+(x\d+)*", source)
                                          else [])  # a frozen data input: ones
            value = np.array(([1] * shape[0] + list(dims))[-shape[0]:] if shape[0] else [], dtype)
        elif spec.fill and spec.fill.startswith("axes:"):  # distinct where there are no more axes than the rank
            value = (np.arange(int(np.prod(shape))) % int(spec.fill[5:])).reshape(shape).astype(dtype)
        elif "mask" in spec.name.lower():
            value = np.ones(shape, dtype)
        else:
            lo, hi = spec.value_range if spec.value_range else (int(spec.divisor), 3)
            lo = max(lo, 0) if hi >= 0 else lo  # ids as a framework's eager run takes them (TF refuses negatives)
            if spec.index_limit:
                hi = min(hi, spec.index_limit - 1)
            value = rng.integers(lo, max(lo, hi) + 1, size=shape).astype(dtype)
        feeds[spec.name] = value
    return feeds


# Old opsets (< 7) have no ONNX Runtime kernels; onnx's version converter upgrades them to this one.
CONVERSION_OPSET = 13


def onnxruntime_reference(path: Path, inputs: dict[str, np.ndarray], fallbacks: bool = True) -> Reference:
    """Run the model as given by the user with ONNX Runtime on `inputs`. When ONNX Runtime cannot
    (an old opset, an op or type it lacks), run it on onnx's opset-13 conversion, or else with onnx's
    reference evaluator; `Reference.producer` names which one computed the outputs. `fallbacks=False`: ONNX
    Runtime alone (a probe: does the model run on these inputs)."""
    try:
        return _run_onnxruntime(str(path), inputs, "")
    except Exception as e:  # onnxruntime raises its own untyped exceptions
        ort_error = _first_line(e)
    if not fallbacks:
        raise InputError(f"ONNX Runtime cannot run {path.name} on these inputs: {ort_error}")
    try:  # ORT's graph optimizer can fail where running the graph works (an If branch not taken, folded)
        return _run_onnxruntime(str(path), inputs, " without graph optimizations", optimize=False)
    except Exception:  # the first error is the one to show
        pass
    try:
        model = onnx.load(str(path))
    except Exception:  # ORT's message is the one to show
        model = None
    if model is not None:
        converted = _upgraded(model)
        if converted is not None:
            try:
                return _run_onnxruntime(converted.SerializeToString(), inputs,
                                        f" on the opset-{CONVERSION_OPSET} conversion")
            except Exception:  # fall through to the reference evaluator
                pass
        if _has_bfloat16(model):  # ORT's CPU kernels and onnx's evaluator lack most bf16 ops
            try:
                return _float32_twin_reference(model, inputs)
            except Exception:  # fall through to the reference evaluator
                pass
        try:
            return _reference_evaluator(model, inputs)
        except Exception as e:  # onnx's evaluator raises anything numpy raises
            raise InputError(f"ONNX Runtime cannot run {path.name} on the reference inputs: {ort_error}; "
                             f"nor can onnx's reference evaluator: {_first_line(e)}") from None
    raise InputError(f"ONNX Runtime cannot run {path.name} on the reference inputs: {ort_error}")


def _run_onnxruntime(model: str | bytes, inputs: dict[str, np.ndarray], how: str, optimize: bool = True) -> Reference:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # failures are reported by the exception, not printed on the terminal
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    if any(np.asarray(v).dtype == ml_dtypes.bfloat16 for v in inputs.values()):  # ORT's numpy binding has no bf16
        values = [_from_ort(v) for v in session.run_with_ort_values(names, {k: _to_ort(v) for k, v in inputs.items()})]
    else:
        values = session.run(names, inputs)
    outputs = {name: np.asarray(v) for name, v in zip(names, values)}
    return Reference(producer=f"onnxruntime {ort.__version__}{how}", inputs=inputs, outputs=outputs)


def _to_ort(value: np.ndarray):
    import onnxruntime as ort

    value = np.ascontiguousarray(value)
    if value.dtype != ml_dtypes.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy(value)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(value.view(np.uint16), TensorProto.BFLOAT16)


def _from_ort(value) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    import ctypes  # ORT's numpy() has no bf16: copy its bits

    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    bits = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(value.data_ptr())) if count else \
        np.empty(0, np.uint16)
    return bits.copy().view(ml_dtypes.bfloat16).reshape(shape)


def _has_bfloat16(model: onnx.ModelProto) -> bool:
    graph = model.graph
    return any(v.type.tensor_type.elem_type == TensorProto.BFLOAT16
               for v in [*graph.input, *graph.output, *graph.value_info]) \
        or any(t.data_type == TensorProto.BFLOAT16 for t in graph.initializer)


def _bf16_to_float32(tensor: TensorProto) -> TensorProto:
    from mlc.frontends.onnx_weights import bfloat16_array

    return numpy_helper.from_array(bfloat16_array(tensor).astype(np.float32), tensor.name)


def _float32_twin_reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> Reference:
    """ONNX Runtime on the graph with bfloat16 computed in float32 (weights, casts, values), its bf16 outputs
    rounded to bf16: the reference for a bf16 graph ORT has no kernels for (within bf16's tolerance)."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.BFLOAT16:
            graph.initializer[i].CopyFrom(_bf16_to_float32(tensor))
    bf16_outputs = {o.name for o in graph.output if o.type.tensor_type.elem_type == TensorProto.BFLOAT16}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    for node in graph.node:
        for attr in node.attribute:
            if attr.name == "to" and attr.i == TensorProto.BFLOAT16:
                attr.i = TensorProto.FLOAT
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.BFLOAT16:
                attr.t.CopyFrom(_bf16_to_float32(attr.t))
    feeds = {k: v.astype(np.float32) if v.dtype == ml_dtypes.bfloat16 else v for k, v in inputs.items()}
    reference = _run_onnxruntime(twin.SerializeToString(), feeds, " on a float32 copy of the bf16 graph")
    reference.inputs = inputs
    reference.outputs = {k: v.astype(ml_dtypes.bfloat16) if k in bf16_outputs else v
                         for k, v in reference.outputs.items()}
    return reference


def _upgraded(model: onnx.ModelProto) -> Optional[onnx.ModelProto]:
    """The model converted to CONVERSION_OPSET, or None if it is already that new or cannot be converted."""
    from onnx import version_converter

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= CONVERSION_OPSET:
        return None
    try:
        return version_converter.convert_version(model, CONVERSION_OPSET)
    except Exception:  # the converter raises RuntimeError or its C++ errors
        return None


def _reference_evaluator(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> Reference:
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in model.graph.output]
    values = ReferenceEvaluator(model).run(None, dict(inputs))
    outputs = {name: np.asarray(v) for name, v in zip(names, values)}
    return Reference(producer=f"onnx {onnx.__version__} reference evaluator", inputs=inputs, outputs=outputs)
