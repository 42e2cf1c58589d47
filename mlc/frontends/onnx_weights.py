"""An ONNX model's weights left in their files: the graph is loaded without them, each weight an ONNX external-data
reference, and read one at a time by whatever needs its value. The compile's passes and its TVM import hold a
model's weights once (TVM's copy) instead of three to four times over (the file's bytes, the parsed model, the
checker's copy, each pass's copy).

A model file with its weights inside is not parsed whole: its protobuf fields are walked (wire format) and each
large raw_data is left where it is, the tensor pointing at its offset in the file."""

from __future__ import annotations

import contextlib
import contextvars
import mmap
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
import onnx.external_data_helper
from onnx import TensorProto, helper, numpy_helper

# A tensor above this many bytes of raw data is left in its file (smaller ones are shape values, read everywhere).
WEIGHT_BYTES = 4096
FOLDED = "folded.data"  # in the weights' folder: the weights the passes make

# Element types whose raw bytes are their numpy values (the others, e.g. bfloat16 or int4, numpy_helper converts).
_RAW_AS_NUMPY = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.INT8,
                 TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16,
                 TensorProto.UINT32, TensorProto.UINT64)

# Field numbers of onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_LEN = 2  # wire type of bytes, strings and messages

_WEIGHTS_DIR: contextvars.ContextVar[Optional[Path]] = contextvars.ContextVar("weights_dir", default=None)


# --- loading without the weights

def load_light(path: Path, workdir: Path) -> onnx.ModelProto:
    """The model at `path` with each initializer of over WEIGHT_BYTES an external-data reference, relative to
    `workdir`, where a link to each file holding weights is made (ONNX locations cannot leave the model's folder)."""
    links: dict[Path, str] = {}

    def link(target: Path) -> str:
        target = target.resolve()
        if target not in links:
            links[target] = _link(target, workdir)
        return links[target]

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        view = memoryview(data)
        try:
            light = _model_without_weights(view, lambda: link(Path(path)))
        except (ValueError, IndexError) as e:  # its traceback holds views of the map: the map closes without them
            light, problem = None, f"{type(e).__name__}: {e}"
        view.release()
    if light is None:
        raise ValueError(f"not a protobuf message ({problem})")
    model = onnx.load_model_from_string(light)
    inside = links.get(Path(path).resolve())  # the link to the model file itself, where its weights were inside
    for tensor in model.graph.initializer:
        location = onnx.external_data_helper.ExternalDataInfo(tensor).location if is_external(tensor) else None
        if location not in (None, inside):  # a weight the model kept in a file of its own, beside it
            _set_location(tensor, link(Path(path).parent / location))
    for tensor in _attribute_tensors(model.graph):  # Constant nodes' and subgraphs' tensors: small, read now
        if is_external(tensor):
            tensor.CopyFrom(loaded(tensor, Path(path).parent))
    return model


def _link(target: Path, workdir: Path) -> str:
    """The name of a link in `workdir` to `target`: one made before (the model loaded again), else a new one, its
    target's size and time recorded (changed_files)."""
    for k in range(1 << 16):
        name = f"weights-{k}{target.suffix}"
        link = workdir / name
        if not link.is_symlink():
            os.symlink(target, link)
            (workdir / f"{name}.stamp").write_text(_stamp(target))
            return name
        if link.resolve() == target:
            return name
    raise OSError(f"too many links to weight files in {workdir}")


def _stamp(path: Path) -> str:
    info = path.stat()
    return f"{info.st_size} {info.st_mtime_ns}"


def changed_files(workdir: Path) -> list[str]:
    """The files holding weights that changed since load_light linked them into `workdir` (the compile read some
    weights before and some after)."""
    changed = []
    for stamp in sorted(Path(workdir).glob("weights-*.stamp")):
        target = stamp.with_suffix("").resolve()
        if not target.exists() or _stamp(target) != stamp.read_text():
            changed.append(str(target))
    return changed


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node's attributes hold (If's branches, Loop's and Scan's bodies)."""
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def names_read(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of `graph`, or of a subgraph at any depth (bodies read outer names), takes as input."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for body in subgraphs(node):
            names |= names_read(body)
    return names


def _attribute_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """The tensors of the nodes' attributes, and of subgraphs (their initializers too)."""
    for node in graph.node:
        for a in node.attribute:
            yield from ([a.t] if a.HasField("t") else []) + list(a.tensors)
        for g in subgraphs(node):
            yield from g.initializer
            yield from _attribute_tensors(g)


def _set_location(tensor: TensorProto, location: str) -> None:
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(data: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, start of the field's key, start and end of its value) of a message's fields."""
    pos = start
    while pos < end:
        key_start = pos
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, value_end = _varint(data, pos)
        elif wire == 1:
            value_end = pos + 8
        elif wire == _LEN:
            length, pos = _varint(data, pos)
            value_end = pos + length
        elif wire == 5:
            value_end = pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire} (groups) in an ONNX model")
        if value_end > end:
            raise ValueError("truncated protobuf field")
        yield field, wire, key_start, pos, value_end
        pos = value_end


def _submessage(field: int, body: bytes) -> bytes:
    return _encode_varint(field << 3 | _LEN) + _encode_varint(len(body)) + body


def _model_without_weights(data: memoryview, location) -> bytes:
    def graph(start: int, end: int) -> bytes:
        return _rewritten(data, start, end, _GRAPH_INITIALIZER,
                          lambda s, e: _tensor_without_data(data, s, e, location))

    return _rewritten(data, 0, len(data), _MODEL_GRAPH, graph)


def _rewritten(data: memoryview, start: int, end: int, number: int, rewrite) -> bytes:
    """The message in data[start:end] with each submessage field `number` replaced by rewrite(its start, its end)."""
    out = bytearray()
    for field, wire, key, value_start, value_end in _fields(data, start, end):
        if field == number and wire == _LEN:
            out += _submessage(field, rewrite(value_start, value_end))
        else:
            out += data[key:value_end]
    return bytes(out)


def _tensor_without_data(data: memoryview, start: int, end: int, location) -> bytes:
    out = bytearray()
    raw = None
    for field, wire, key, value_start, value_end in _fields(data, start, end):
        if field == _TENSOR_RAW_DATA and wire == _LEN and value_end - value_start > WEIGHT_BYTES:
            raw = (value_start, value_end - value_start)  # the last one counts, as in protobuf
        else:
            out += data[key:value_end]
    if raw is None:
        return bytes(out)
    return bytes(out) + point_at(TensorProto(), location(), *raw).SerializeToString()


def point_at(tensor: TensorProto, location: str, offset: int, length: int) -> TensorProto:
    """`tensor` made an external-data reference to `length` bytes at `offset` in file `location`."""
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))
    return tensor


def copy_model(source: Path, target: Path) -> list[Path]:
    """The ONNX file `source` written as `target` with the weights it keeps in files beside it (however many)
    copied into one file, TARGET.data, which target's references name; the files written. A model with no external
    data is copied as it is. Weights stream from file to file a block at a time: a 5 GB model is never in memory."""
    model = onnx.load(str(source), load_external_data=False)
    external = [t for t in model.graph.initializer if is_external(t)]
    inlined = [t for t in _attribute_tensors(model.graph) if is_external(t)]
    for tensor in inlined:  # Constant nodes' and subgraphs' tensors: small, put in the message
        tensor.CopyFrom(loaded(tensor, Path(source).parent))
    if not external and not inlined:
        shutil.copyfile(source, target)
        return [Path(target)]
    data_path = Path(target).with_name(Path(target).name + ".data")
    with open(data_path, "wb") as data:
        for tensor in external:
            info = onnx.external_data_helper.ExternalDataInfo(tensor)
            with open(Path(source).parent / info.location, "rb") as weights:
                weights.seek(int(info.offset or 0))
                offset = data.tell()
                length = _copy_bytes(weights, data, None if info.length is None else int(info.length))
            del tensor.external_data[:]
            point_at(tensor, data_path.name, offset, length)
    onnx.save(model, str(target))
    return [data_path, Path(target)]


def _copy_bytes(source, target, length: Optional[int], block: int = 64 << 20) -> int:
    """Copies `length` bytes (None: to the end) from file `source` to file `target`; the count copied."""
    copied = 0
    while length is None or copied < length:
        chunk = source.read(block if length is None else min(block, length - copied))
        if not chunk:
            break
        target.write(chunk)
        copied += len(chunk)
    if length is not None and copied < length:
        raise ValueError(f"a weight file ends {length - copied} bytes early")
    return copied


# --- reading the weights

@contextlib.contextmanager
def weights_in(folder: Optional[Path]) -> Iterator[None]:
    """Within: external-data references are relative to `folder` (array() and constant values read there)."""
    token = _WEIGHTS_DIR.set(Path(folder) if folder is not None else None)
    try:
        yield
    finally:
        _WEIGHTS_DIR.reset(token)


def folder() -> Optional[Path]:
    """weights_in's folder (None outside it)."""
    return _WEIGHTS_DIR.get()


def new_weight(name: str, value: np.ndarray) -> TensorProto:
    """A weight a pass computed, appended to FOLDED in weights_in's folder and referenced there: its bytes never go
    through a message."""
    value = np.ascontiguousarray(value)
    with open(_folder(name) / FOLDED, "ab") as data:
        offset = data.tell()
        value.tofile(data)
    tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype), dims=value.shape)
    return point_at(tensor, FOLDED, offset, value.nbytes)


def is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def external_array(tensor: TensorProto, base_dir: Path) -> np.ndarray:
    """The value of a tensor kept as ONNX external data, read from its file alone. numpy_helper.to_array would load
    the bytes into the message, where they stay as long as the model does."""
    info = onnx.external_data_helper.ExternalDataInfo(tensor)
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if tensor.data_type in _RAW_AS_NUMPY:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        if info.length is None or int(info.length) == count * dtype.itemsize:
            data = np.fromfile(Path(base_dir) / info.location, dtype=dtype, count=count, offset=int(info.offset or 0))
            if data.size == count:
                return data.reshape(tuple(tensor.dims))
    return numpy_helper.to_array(loaded(tensor, base_dir))


def array(tensor: TensorProto) -> np.ndarray:
    """A tensor's value, read from its file when it is external (relative to weights_in's folder)."""
    if tensor.data_type == TensorProto.BFLOAT16:
        return bfloat16_array(loaded(tensor) if is_external(tensor) else tensor)
    return numpy_helper.to_array(tensor) if not is_external(tensor) else external_array(tensor, _folder(tensor.name))


def bfloat16_array(tensor: TensorProto) -> np.ndarray:
    """A BFLOAT16 tensor (its data in the message) as ml_dtypes.bfloat16: onnx 1.17's to_array reads raw_data as if
    it were int32_data (wrong values) and returns its own structured dtype, which TVM does not know."""
    import ml_dtypes

    if tensor.HasField("raw_data"):
        bits = np.frombuffer(tensor.raw_data, dtype="<u2")
    else:  # int32_data holds one bf16 per element, in its low 16 bits
        bits = np.asarray(tensor.int32_data, dtype=np.uint32).astype(np.uint16)
    return bits.astype(np.uint16).view(ml_dtypes.bfloat16).reshape(tuple(tensor.dims))


def _folder(name: str, given: Optional[Path] = None) -> Path:
    folder = given or _WEIGHTS_DIR.get()
    if folder is None:
        raise ValueError(f"the data of {name!r} is in an external file, and no folder was given to find it in")
    return Path(folder)


def loaded(tensor: TensorProto, base_dir: Optional[Path] = None) -> TensorProto:
    """The tensor with its data in the message (a copy when it was external)."""
    if not is_external(tensor):
        return tensor
    out = TensorProto()
    out.CopyFrom(tensor)
    onnx.external_data_helper.load_external_data_for_tensor(out, str(_folder(tensor.name, base_dir)))
    out.data_location = TensorProto.DEFAULT
    del out.external_data[:]
    return out


def materialized(model: onnx.ModelProto, base_dir: Optional[Path] = None) -> onnx.ModelProto:
    """`model` with every weight's data in it, for what reads a whole model (ONNX Runtime, the reference evaluator, a
    dump); `model` itself when it has no external data."""
    if not any(is_external(t) for t in model.graph.initializer):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    onnx.external_data_helper.load_external_data_for_model(out, str(_folder(model.graph.name, base_dir)))
    return out


class Values(Mapping):
    """Initializer values by name, each read when first asked for (a weight left in its file costs nothing until a
    pass reads it); values set by the caller join them."""

    def __init__(self, tensors, max_bytes: Optional[int] = None):
        self._tensors = {t.name: t for t in tensors if max_bytes is None or nbytes(t) <= max_bytes}
        self._values: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._values:
            self._values[name] = array(self._tensors[name])  # KeyError when it is neither
        return self._values[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._values[name] = value

    def __contains__(self, name) -> bool:
        return name in self._tensors or name in self._values

    def __iter__(self):
        return iter({**dict.fromkeys(self._tensors), **dict.fromkeys(self._values)})

    def __len__(self) -> int:
        return len(set(self._tensors) | set(self._values))


def nbytes(tensor: TensorProto) -> int:
    if tensor.data_type == TensorProto.STRING:
        return 0
    return int(np.prod(tensor.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
