"""ONNX converters TVM 0.27's importer lacks or limits (#19, found by benchmarks/onnx_node_tests): each is written
in Relax ops from the ONNX definition. mlc.compiler.tvm_patches adds `converters()` to the importer's table; `ADDED`
names the op types it has no converter for at all (importer.supported_ops() counts them). Also the ONNX rounding
(round_half_even) the converters and tvm_patches share."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from mlc.compiler.mutators import static_shape

ADDED = frozenset({"ReverseSequence", "Det", "DFT", "ConvInteger", "QLinearConv", "Col2Im", "DeformConv",
                   "TfIdfVectorizer"})
ML_DOMAIN = "ai.onnx.ml"
ML_ADDED = frozenset({"ArrayFeatureExtractor", "Binarizer", "TreeEnsemble"})  # ops of the ai.onnx.ml domain
ML_OPS = frozenset((ML_DOMAIN, op) for op in ML_ADDED)


def _dtype(x) -> str:
    return str(x.ty.dtype)


def _constant(x, params) -> Optional[np.ndarray]:
    """The value of `x` when it is known at import (an initializer or a folded constant)."""
    import tvm
    from tvm.relax.frontend.onnx import onnx_frontend

    if x is None:
        return None
    value = onnx_frontend.get_constant(x, params)
    return value.value.numpy() if isinstance(value, tvm.ir.GenericConst) else None


def _array(value: np.ndarray):
    """A constant of the array's own type (relax.const alone narrows int64 and float64 to 32 bits)."""
    from tvm import relax

    return relax.const(value, str(value.dtype))


def _text(value, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def converters() -> dict:
    """op type -> mlc's converter class (tvm_patches adds them to TVM's table)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    base = onnx_frontend.OnnxOpConverter

    def converter(name: str, impl, wraps=None):
        """A converter class for op `name`: `impl(bb, inputs, attr, params, opset_impl)`, where opset_impl is
        TVM's own converter for the model's opset (when `wraps`, TVM's class, has one)."""

        def missing(*args):
            raise NotImplementedError(f"TVM has no {name} converter for this opset")

        class Converter(base):
            @classmethod
            def get_converter(cls, opset):
                try:  # mlc's conversions of OneHot, Det, ... need no TVM converter for the model's opset
                    tvm_impl = wraps.get_converter(opset) if wraps is not None else missing
                except NotImplementedError:
                    tvm_impl = missing
                return lambda bb, inputs, attr, params: impl(bb, inputs, attr, params, tvm_impl)

        Converter.__name__ = name
        return Converter

    return {
        "OneHot": converter("OneHot", _one_hot, onnx_frontend.OneHot),
        "EyeLike": converter("EyeLike", _eye_like, onnx_frontend.EyeLike),
        "Expand": converter("Expand", _expand, onnx_frontend.Expand),
        "Einsum": converter("Einsum", _einsum, onnx_frontend.Einsum),
        "Conv": converter("Conv", _conv1d_as_conv2d, onnx_frontend.Conv),
        "MaxPool": converter("MaxPool", _max_pool, onnx_frontend.MaxPool),
        "OptionalHasElement": converter("OptionalHasElement", _optional_has_element,
                                        onnx_frontend.OptionalHasElement),
        "SequenceInsert": converter("SequenceInsert", _scalar_position(2), onnx_frontend.SequenceInsert),
        "SequenceAt": converter("SequenceAt", _scalar_position(1), onnx_frontend.SequenceAt),
        "SequenceErase": converter("SequenceErase", _scalar_position(1), onnx_frontend.SequenceErase),
        "Unsqueeze": converter("Unsqueeze", _scalar_axes, onnx_frontend.Unsqueeze),
        "Squeeze": converter("Squeeze", _scalar_axes, onnx_frontend.Squeeze),
        "ReverseSequence": converter("ReverseSequence", _reverse_sequence),
        "Det": converter("Det", _det),
        "DFT": converter("DFT", _dft),
        "ConvInteger": converter("ConvInteger", _conv_integer),
        "MatMulInteger": converter("MatMulInteger", _matmul_integer, onnx_frontend.MatMulInteger),
        "QLinearConv": converter("QLinearConv", _qlinear_conv),
        "Col2Im": converter("Col2Im", _col2im),
        "DeformConv": converter("DeformConv", _deform_conv),
        "TfIdfVectorizer": converter("TfIdfVectorizer", _tfidf_vectorizer),
        "ArrayFeatureExtractor": converter("ArrayFeatureExtractor", _array_feature_extractor),
        "Binarizer": converter("Binarizer", _binarizer),
        "TreeEnsemble": converter("TreeEnsemble", _tree_ensemble),
    }


def round_half_even(x):
    """numpy's rint: round half to even (TVM's round rounds halves away from zero)."""
    from tvm import relax

    floor = relax.op.floor(x)
    diff = relax.op.subtract(x, floor)
    half = relax.const(0.5, "float64")
    up = relax.op.add(floor, relax.const(1.0, "float64"))
    floor_is_even = relax.op.equal(relax.op.floor_mod(floor, relax.const(2.0, "float64")), relax.const(0.0, "float64"))
    tie = relax.op.where(floor_is_even, floor, up)
    return relax.op.where(relax.op.less(diff, half), floor, relax.op.where(relax.op.greater(diff, half), up, tie))


# ---------------------------------------------------------------- ops TVM limits

def _one_hot(bb, inputs, attr, params, tvm_impl):
    """OneHot with values given at run time (TVM needs them constant): compare the indices (negative ones count
    from depth) with arange(depth) along `axis`, pick values[1] or values[0]."""
    from tvm import relax

    indices, depth, values = inputs
    depth_value = _constant(depth, params)
    if depth_value is None:
        raise NotImplementedError("OneHot needs a constant depth (the output shape depends on it)")
    depth_value = int(np.asarray(depth_value).reshape(-1)[0])
    rank = len(indices.ty.shape.values) + 1
    axis = attr.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    index = relax.op.astype(indices, "int64")
    depth_const = relax.const(depth_value, "int64")
    index = relax.op.where(relax.op.less(index, relax.const(0, "int64")), relax.op.add(index, depth_const), index)
    index = relax.op.expand_dims(index, axis)
    positions = _array(np.arange(depth_value, dtype=np.int64).reshape([-1] + [1] * (rank - 1 - axis)))
    hot = relax.op.equal(index, positions)
    off = relax.op.take(values, relax.const(0, "int64"), axis=0)
    on = relax.op.take(values, relax.const(1, "int64"), axis=0)
    return relax.op.where(hot, on, off)


def _eye_like(bb, inputs, attr, params, tvm_impl):
    """EyeLike whose dtype attribute differs from the input's type (TVM insists they agree): a constant."""
    from onnx import helper

    shape = static_shape(inputs[0])
    if shape is None or len(shape) != 2:
        return tvm_impl(bb, inputs, attr, params)
    dtype = helper.tensor_dtype_to_np_dtype(attr["dtype"]) if "dtype" in attr else np.dtype(_dtype(inputs[0]))
    return _array(np.eye(shape[0], shape[1], k=attr.get("k", 0), dtype=dtype))


def _scalar_axes(bb, inputs, attr, params, tvm_impl):
    """Unsqueeze/Squeeze with a scalar constant axes input (ONNX Runtime takes it; TVM iterates over it)."""
    axes = _constant(_optional_input(inputs, 1), params)
    if axes is not None and axes.ndim == 0:
        inputs = [inputs[0], _array(axes.reshape(1))]
    return tvm_impl(bb, inputs, attr, params)


def _scalar_position(slot: int):
    """A sequence op whose constant position (input `slot`) holds one element in a 1-D tensor: as a scalar (ONNX
    Runtime takes it; TVM converts the position with int(), which refuses a 1-D array)."""

    def convert(bb, inputs, attr, params, tvm_impl):
        position = _constant(_optional_input(inputs, slot), params)
        if position is not None and position.size == 1 and position.ndim:
            inputs = [*inputs[:slot], _array(position.reshape(())), *inputs[slot + 1:]]
        return tvm_impl(bb, inputs, attr, params)

    return convert


def _optional_has_element(bb, inputs, attr, params, tvm_impl):
    """OptionalHasElement of a left-out input: false (TVM insists on one input)."""
    from tvm import relax

    if len(inputs) == 0 or inputs[0] is None:
        return relax.const(False, "bool")
    return tvm_impl(bb, inputs, attr, params)


def _expand(bb, inputs, attr, params, tvm_impl):
    """Expand of an input with symbolic dims to a shape known at import: TVM 0.27 compares its shape lists with
    `==` ("Cannot use and / or / not operator to Expr"; AllenaiLongformerBase's window padding) or reads `.value`
    of each input dim. ONNX's bidirectional broadcast, right-aligned: a target 1 keeps the input's dim, an input 1
    takes the target's."""
    import tvm
    from tvm import relax

    data, shape = inputs[0], inputs[1]
    known = _constant(shape, params)
    if isinstance(shape, relax.ShapeExpr):
        target = list(shape.values)
    elif known is not None:
        target = [tvm.tirx.IntImm("int64", int(v)) for v in known.reshape(-1)]
    else:
        return tvm_impl(bb, inputs, attr, params)
    data_shape = list(data.ty.shape)
    rank = max(len(data_shape), len(target))
    data_shape = [tvm.tirx.IntImm("int64", 1)] * (rank - len(data_shape)) + data_shape
    target = [tvm.tirx.IntImm("int64", 1)] * (rank - len(target)) + target

    def one(dim) -> bool:
        return isinstance(dim, tvm.tirx.IntImm) and dim.value == 1

    out = [d if one(t) or (isinstance(t, tvm.tirx.IntImm) and t.value == -1) else t
           for d, t in zip(data_shape, target)]
    if len(out) == len(inputs[0].ty.shape) and all(a.same_as(b) for a, b in zip(out, data_shape)):
        return data
    pinned = [t if isinstance(t, tvm.tirx.IntImm) and not isinstance(d, tvm.tirx.IntImm) else d
              for d, t in zip(data_shape, out)][rank - len(inputs[0].ty.shape):]
    if any(not a.same_as(b) for a, b in zip(pinned, data.ty.shape)):
        # A symbolic input dim meeting a constant target: TVM's broadcast reads it as that constant (a 1 there at
        # run time would read past the input), so the run checks that it is: a clear error, not wrong values.
        data = bb.match_cast(data, relax.TensorType(pinned, _dtype(data)))
    return relax.op.broadcast_to(data, relax.ShapeExpr(out))


def _conv1d_as_conv2d(bb, inputs, attr, params, tvm_impl):
    """A 1-D Conv as a 2-D one over a height of 1: mlc's conv schedules (and layout, bf16 and int8 rewrites) are
    written for conv2d, and TVM's conv1d is an untiled loop nest (whisper's 384-channel conv ran 100x slower)."""
    from tvm import relax

    x, w = inputs[0], inputs[1]
    if len(x.ty.shape) != 3 or len(w.ty.shape) != 3:
        return tvm_impl(bb, inputs, attr, params)
    attr = dict(attr)
    if "kernel_shape" in attr:
        attr["kernel_shape"] = [1, *attr["kernel_shape"]]
    for key in ("strides", "dilations"):
        if key in attr:
            attr[key] = [1, *attr[key]]
    if "pads" in attr:
        attr["pads"] = [0, attr["pads"][0], 0, attr["pads"][1]]
    planar = type(inputs)(inputs)  # TVM's onnx_input: an absent bias reads as None
    planar[0], planar[1] = bb.emit(relax.op.expand_dims(x, 2)), bb.emit(relax.op.expand_dims(w, 2))
    return relax.op.squeeze(bb.normalize(tvm_impl(bb, planar, attr, params)), [2])


def _einsum_labels(equation: str, operands: int) -> Optional[tuple[list[str], str]]:
    """The operands' labels and the output's, or None when the equation has an ellipsis or a label repeated within
    one term (a diagonal): those stay with TVM's einsum."""
    equation = equation.replace(" ", "")
    terms, arrow, out = equation.partition("->")
    terms = terms.split(",")
    if "." in equation or len(terms) != operands:
        return None
    if not arrow:  # implicit output: the labels used once, in alphabetical order
        used = "".join(terms)
        out = "".join(sorted(c for c in set(used) if used.count(c) == 1))
    if any(len(set(t)) != len(t) for t in (*terms, out)):
        return None
    return terms, out


def _einsum(bb, inputs, attr, params, tvm_impl):
    """Einsum of two operands as one (batched) matmul between transposes and reshapes: TVM's einsum is a naive loop
    nest no schedule tiles (XLNet's attention scores, `ibnd,jbnd->bnij`, ran 400x slower than the same matmul).
    Labels in both operands and the output are the batch, in both operands only the contraction, in one operand and
    the output that side's rows or columns; a label in one operand only is summed first."""
    import tvm
    from tvm import relax

    parsed = _einsum_labels(_text(attr.get("equation"), ""), len(inputs))
    if parsed is None or len(inputs) != 2:
        return tvm_impl(bb, inputs, attr, params)
    (a_labels, b_labels), out = parsed
    dims = {}
    operands = []
    for x, labels, other in ((inputs[0], a_labels, b_labels), (inputs[1], b_labels, a_labels)):
        alone = [k for k, c in enumerate(labels) if c not in out and c not in other]
        if alone:
            x = bb.emit(relax.op.sum(x, axis=alone))
            labels = "".join(c for k, c in enumerate(labels) if k not in alone)
        dims.update(zip(labels, x.ty.shape.values))
        operands.append((x, labels))
    (a, a_labels), (b, b_labels) = operands
    batch = [c for c in out if c in a_labels and c in b_labels]
    rows = [c for c in out if c in a_labels and c not in b_labels]
    cols = [c for c in out if c in b_labels and c not in a_labels]
    inner = [c for c in a_labels if c in b_labels and c not in out]

    def size(labels):
        return functools.reduce(lambda p, c: p * dims[c], labels, tvm.tirx.IntImm("int64", 1))

    def arrange(x, labels, outer, inner):
        """x as [batch..., outer, inner], each group of labels merged into one dim."""
        order = batch + outer + inner
        if list(labels) != order:
            x = bb.emit(relax.op.permute_dims(x, [labels.index(c) for c in order]))
        if (len(outer), len(inner)) != (1, 1):
            x = bb.emit(relax.op.reshape(x, relax.ShapeExpr([dims[c] for c in batch] + [size(outer), size(inner)])))
        return x

    product = bb.emit(relax.op.matmul(arrange(a, a_labels, rows, inner), arrange(b, b_labels, inner, cols)))
    order = batch + rows + cols
    if (len(rows), len(cols)) != (1, 1):
        product = bb.emit(relax.op.reshape(product, relax.ShapeExpr([dims[c] for c in order])))
    if order != list(out):
        product = relax.op.permute_dims(product, [order.index(c) for c in out])
    return product


def _max_pool(bb, inputs, attr, params, tvm_impl):
    """MaxPool's Indices output (TVM computes Y only): the argmax over the window's elements, taken row-major
    (the first maximum wins, as in ONNX Runtime), as a flat index into X (column-major with storage_order 1)."""
    from tvm import relax

    y = bb.normalize(tvm_impl(bb, inputs, dict(attr), params))
    if attr["tvm_custom"]["num_outputs"] < 2:
        return y
    x = inputs[0]
    shape, out = static_shape(x), static_shape(y)
    if shape is None or out is None:
        raise NotImplementedError("MaxPool's Indices output needs static shapes")
    spatial, out_spatial = shape[2:], out[2:]
    rank = len(spatial)
    kernel = list(attr["kernel_shape"])
    strides = list(attr.get("strides", [1] * rank))
    dilations = list(attr.get("dilations", [1] * rank))
    pads = list(attr.get("pads", [0] * (2 * rank)))
    auto_pad = _text(attr.get("auto_pad"), "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        pads = [0] * (2 * rank)
        if auto_pad != "VALID":
            for i in range(rank):
                total = max((out_spatial[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i], 0)
                pads[i] = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
    dtype = _dtype(x)
    lowest = float("-inf") if dtype.startswith(("float", "bfloat")) else float(np.iinfo(dtype).min)
    before = pads[:rank]
    after = [max(0, (out_spatial[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i] - before[i])
             for i in range(rank)]
    padded = bb.normalize(relax.op.nn.pad(x, [0, 0, 0, 0] + [v for i in range(rank) for v in (before[i], after[i])],
                                          pad_value=lowest))
    offsets = list(itertools.product(*(range(k) for k in kernel)))
    windows = []
    for offset in offsets:
        begin = [offset[i] * dilations[i] for i in range(rank)]
        end = [begin[i] + (out_spatial[i] - 1) * strides[i] + 1 for i in range(rank)]
        windows.append(relax.op.strided_slice(padded, list(range(2, rank + 2)), begin, end, strides))
    best = bb.normalize(relax.op.argmax(relax.op.stack(windows, axis=0), axis=0))  # [N, C, *out]
    best = relax.op.astype(best, "int64")
    # the input position along each spatial axis: out_index * stride - pad + offset * dilation
    positions = []
    for i in range(rank):
        along = np.array([o[i] * dilations[i] for o in offsets], np.int64)
        start = np.arange(out_spatial[i], dtype=np.int64) * strides[i] - before[i]
        start = start.reshape([-1] + [1] * (rank - 1 - i))
        positions.append(relax.op.add(relax.op.take(_array(along), best, axis=0), _array(start)))
    order = range(rank) if attr.get("storage_order", 0) == 0 else reversed(range(rank))
    flat = None
    for i in order:
        flat = positions[i] if flat is None else relax.op.add(
            relax.op.multiply(flat, relax.const(spatial[i], "int64")), positions[i])
    plane = int(np.prod(spatial))
    channel = np.arange(shape[0] * shape[1], dtype=np.int64).reshape([shape[0], shape[1]] + [1] * rank) * plane
    return relax.Tuple([y, bb.normalize(relax.op.add(flat, _array(channel)))])


# ---------------------------------------------------------------- ops TVM lacks

def _reverse_sequence(bb, inputs, attr, params, tvm_impl):
    """ReverseSequence: along time_axis, position t of batch b reads sequence_lens[b] - 1 - t when
    t < sequence_lens[b], else t."""
    from tvm import relax

    x, lengths = inputs
    shape = x.ty.shape
    batch_axis, time_axis = attr.get("batch_axis", 1), attr.get("time_axis", 0)
    steps = shape.values[time_axis]
    time = relax.op.arange(0, steps, 1, dtype="int64")
    lengths = relax.op.astype(lengths, "int64")
    if batch_axis < time_axis:
        time, lengths = relax.op.expand_dims(time, 0), relax.op.expand_dims(lengths, 1)
    else:
        time, lengths = relax.op.expand_dims(time, 1), relax.op.expand_dims(lengths, 0)
    index = relax.op.where(relax.op.less(time, lengths),
                           relax.op.subtract(relax.op.subtract(lengths, relax.const(1, "int64")), time), time)
    rank = len(shape.values)
    index = relax.op.reshape(index, [shape.values[a] if a in (batch_axis, time_axis) else 1 for a in range(rank)])
    index = relax.op.broadcast_to(index, shape)
    return relax.op.gather_elements(x, index, axis=time_axis)


def _det(bb, inputs, attr, params, tvm_impl):
    """Det of [..., n, n] with n known: Gaussian elimination with partial pivoting, unrolled over n steps."""
    from tvm import relax

    x = inputs[0]
    shape = static_shape(x)
    if shape is None or shape[-1] != shape[-2]:
        raise NotImplementedError("Det needs static square matrices")
    n, dtype = shape[-1], _dtype(x)
    lead = shape[:-2]
    a = x
    det = None
    rows = np.arange(n, dtype=np.int64)
    for k in range(n):
        column = relax.op.strided_slice(a, [len(shape) - 1], [k], [k + 1])  # [..., n, 1]
        below = relax.op.strided_slice(column, [len(shape) - 2], [k], [n])
        pivot_row = relax.op.add(relax.op.astype(relax.op.argmax(relax.op.abs(below), axis=-2), "int64"),
                                 relax.const(k, "int64"))  # [..., 1]
        # swap rows k and pivot_row
        at_k = _array((rows == k).reshape(n, 1))
        at_pivot = relax.op.equal(_array(rows.reshape(n, 1)), relax.op.expand_dims(pivot_row, -1))
        order = relax.op.where(at_k, relax.op.expand_dims(pivot_row, -1),
                               relax.op.where(at_pivot, relax.const(k, "int64"), _array(rows.reshape(n, 1))))
        order = relax.op.broadcast_to(order, lead + [n, n])
        a = bb.normalize(relax.op.gather_elements(a, order, axis=-2))
        swapped = relax.op.not_equal(pivot_row, relax.const(k, "int64"))
        sign = relax.op.where(swapped, relax.const(-1.0, dtype), relax.const(1.0, dtype))  # [..., 1]
        pivot = relax.op.strided_slice(a, [len(shape) - 2, len(shape) - 1], [k, k], [k + 1, k + 1])  # [..., 1, 1]
        pivot = relax.op.squeeze(pivot, [-1])  # [..., 1]
        factor = relax.op.multiply(sign, pivot)
        det = factor if det is None else relax.op.multiply(det, factor)
        if k + 1 < n:
            safe = relax.op.where(relax.op.equal(pivot, relax.const(0.0, dtype)), relax.const(1.0, dtype), pivot)
            pivot_rows = relax.op.strided_slice(a, [len(shape) - 2], [k], [k + 1])  # [..., 1, n]
            lower = relax.op.strided_slice(a, [len(shape) - 2], [k + 1], [n])  # [..., n-k-1, n]
            ratios = relax.op.divide(relax.op.strided_slice(lower, [len(shape) - 1], [k], [k + 1]),
                                     relax.op.expand_dims(safe, -1))  # [..., n-k-1, 1]
            lower = relax.op.subtract(lower, relax.op.multiply(ratios, pivot_rows))
            upper = relax.op.strided_slice(a, [len(shape) - 2], [0], [k + 1])
            a = bb.normalize(relax.op.concat([upper, lower], axis=-2))
        det = bb.normalize(det)
    return relax.op.squeeze(det, [-1])


def _dft(bb, inputs, attr, params, tvm_impl):
    """DFT along one axis of a known length, as two matmuls with cosine and sine matrices (exact to fp32
    rounding, and fast at the lengths models use: FNet's hidden size and sequence). Real input [..., 1] or
    complex [..., 2]; onesided keeps the first L // 2 + 1 frequencies; dft_length L zero-pads or truncates."""
    from tvm import relax

    x = inputs[0]
    shape = static_shape(x)
    axis_input = _constant(_optional_input(inputs, 2), params)  # opset 20; opset 17 has the attribute
    axis = int(axis_input) if axis_input is not None else int(attr.get("axis", 1))
    if shape is None or shape[-1] not in (1, 2):
        raise NotImplementedError("DFT needs a static [..., 1 or 2] input")
    rank = len(shape)
    axis = axis + rank if axis < 0 else axis
    n = shape[axis]
    given = _constant(_optional_input(inputs, 1), params)
    if _optional_input(inputs, 1) is not None and given is None:
        raise NotImplementedError("DFT needs dft_length known at import")
    length = int(given) if given is not None else n
    inverse, onesided = int(attr.get("inverse", 0)), int(attr.get("onesided", 0))
    if onesided and shape[-1] == 2:
        raise NotImplementedError("DFT onesided needs a real input")
    k = length // 2 + 1 if onesided else length
    dtype = _dtype(x)
    rows, columns = np.arange(n)[:, None], np.arange(k)[None, :]
    theta = 2 * np.pi * (rows * columns % length) / length  # the remainder keeps large products exact
    scale, sign = (1.0 / length, 1.0) if inverse else (1.0, -1.0)
    kept = (rows < length).astype(np.float64)  # input rows past dft_length are cut off
    cos = _array((np.cos(theta) * kept * scale).astype(dtype))
    sin = _array((np.sin(theta) * kept * scale * sign).astype(dtype))  # e^{sign i theta} = cos + i sign sin

    # signal axis last, channels (re, im) dropped: [..., n]
    order = [d for d in range(rank - 1) if d != axis] + [axis]
    back = list(np.argsort(order)) + [rank - 1]

    def part(i):
        taken = relax.op.squeeze(relax.op.strided_slice(x, [rank - 1], [i], [i + 1]), [rank - 1])
        return relax.op.permute_dims(taken, order)

    re = part(0)
    out_re, out_im = relax.op.matmul(re, cos), relax.op.matmul(re, sin)
    if shape[-1] == 2:  # (re + i im)(cos + i sign sin)
        im = part(1)
        out_re = relax.op.subtract(out_re, relax.op.matmul(im, sin))
        out_im = relax.op.add(out_im, relax.op.matmul(im, cos))
    stacked = relax.op.stack([out_re, out_im], axis=rank - 1)  # [..., k, 2] with the signal axis at rank - 2
    return relax.op.permute_dims(stacked, [int(d) for d in back])


def _integer_conv(bb, x, x_zero, w, w_zero, attr):
    """(x - x_zero) conv (w - w_zero) in int32 (w_zero per output channel or one); padding adds zeros after the
    shift, which is padding x with its zero point."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    rank = len(w.ty.shape.values)
    x32 = relax.op.astype(x, "int32")
    w32 = relax.op.astype(w, "int32")
    if x_zero is not None:
        x32 = relax.op.subtract(x32, relax.op.astype(x_zero, "int32"))
    if w_zero is not None:
        zero = bb.normalize(relax.op.astype(w_zero, "int32"))
        if len(w_zero.ty.shape.values) == 1:
            zero = relax.op.reshape(zero, [-1] + [1] * (rank - 1))
        w32 = relax.op.subtract(w32, zero)
    x32, w32 = bb.normalize(x32), bb.normalize(w32)
    kept = {k: v for k, v in attr.items() if k != "tvm_custom"}
    kept["tvm_custom"] = attr.get("tvm_custom", {})
    return bb.normalize(onnx_frontend.Conv._impl_v11(bb, [x32, w32, None], kept, None))


def _optional_input(inputs, index):
    return inputs[index] if len(inputs) > index else None


def _int8_pair(x, w, x_zero, w_zero) -> bool:
    """8-bit operands with no zero points: the int8 kernel form (u8/s8 in, int32 out) that --quantize emits."""
    return x_zero is None and w_zero is None and {_dtype(x), _dtype(w)} <= {"uint8", "int8"}


def _matmul_integer(bb, inputs, attr, params, tvm_impl):
    """MatMulInteger without zero points as matmul(a, b, out_dtype=int32) on the 8-bit operands (TVM's widens
    both to int32 first, which no int8 dot-product schedule matches)."""
    from tvm import relax

    if _int8_pair(inputs[0], inputs[1], _optional_input(inputs, 2), _optional_input(inputs, 3)):
        return relax.op.matmul(inputs[0], inputs[1], out_dtype="int32")
    return tvm_impl(bb, inputs, attr, params)


def _conv_integer(bb, inputs, attr, params, tvm_impl):
    x, w = inputs[0], inputs[1]
    if _int8_pair(x, w, _optional_input(inputs, 2), _optional_input(inputs, 3)) and len(w.ty.shape.values) == 4 \
            and _text(attr.get("auto_pad"), "NOTSET") in ("NOTSET", "VALID"):
        from tvm import relax

        pads = [int(p) for p in attr.get("pads", [0] * 4)]
        return relax.op.nn.conv2d(x, w, strides=[int(s) for s in attr.get("strides", [1, 1])],
                                  padding=[pads[0], pads[1], pads[2], pads[3]],
                                  dilation=[int(d) for d in attr.get("dilations", [1, 1])],
                                  groups=int(attr.get("group", 1)), out_dtype="int32")
    return _integer_conv(bb, inputs[0], _optional_input(inputs, 2), inputs[1], _optional_input(inputs, 3), attr)


def _qlinear_conv(bb, inputs, attr, params, tvm_impl):
    """QLinearConv: the int32 convolution of the centred inputs (plus the int32 bias), scaled by
    x_scale * w_scale / y_scale (w_scale per output channel or one), plus y_zero_point, rounded half to even and
    saturated to y's type."""
    from tvm import relax

    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero = inputs[:8]
    bias = _optional_input(inputs, 8)
    acc = _integer_conv(bb, x, x_zero, w, w_zero, attr)
    rank = len(acc.ty.shape.values)
    if bias is not None:
        bias = bb.normalize(relax.op.astype(bias, "int32"))
        acc = relax.op.add(acc, relax.op.reshape(bias, [1, -1] + [1] * (rank - 2)))
    w_scale = bb.normalize(relax.op.astype(w_scale, "float64"))
    if len(inputs[4].ty.shape.values) == 1:
        w_scale = relax.op.reshape(w_scale, [1, -1] + [1] * (rank - 2))
    ratio = relax.op.divide(relax.op.multiply(relax.op.astype(x_scale, "float64"), w_scale),
                            relax.op.astype(y_scale, "float64"))
    out = _dtype(y_zero) if y_zero is not None else _dtype(x)
    scaled = relax.op.multiply(relax.op.astype(acc, "float64"), ratio)
    rounded = round_half_even(bb.normalize(scaled))
    if y_zero is not None:
        rounded = relax.op.add(rounded, relax.op.astype(y_zero, "float64"))
    info = np.iinfo(out)
    clipped = relax.op.minimum(relax.op.maximum(rounded, relax.const(float(info.min), "float64")),
                               relax.const(float(info.max), "float64"))
    return relax.op.astype(clipped, out)


def _col2im(bb, inputs, attr, params, tvm_impl):
    """Col2Im: [N, C*prod(block), L] -> [N, C, *image]. Each spatial axis maps (block offset k, block index l) to
    the image position k*dilation + l*stride - pad_begin; summing over them is a contraction with a 0/1 constant
    per axis, done one axis at a time."""
    from tvm import relax

    data, image, block = inputs
    image, block, shape = _constant(image, params), _constant(block, params), static_shape(data)
    if image is None or block is None or shape is None:
        raise NotImplementedError("Col2Im needs constant image_shape and block_shape and a static input shape")
    image, block = [int(v) for v in image], [int(v) for v in block]
    rank = len(image)
    dilations = list(attr.get("dilations", [1] * rank))
    strides = list(attr.get("strides", [1] * rank))
    pads = list(attr.get("pads", [0] * (2 * rank)))
    blocks = [(image[i] + pads[i] + pads[i + rank] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
              for i in range(rank)]
    n, channels = shape[0], shape[1] // int(np.prod(block))
    x = relax.op.reshape(data, [n, channels] + block + blocks)
    letters = iter("abcdefghijklmopqrstuvwxyz")
    ks, ls = [next(letters) for _ in range(rank)], [next(letters) for _ in range(rank)]
    labels = ["N", "C"] + ks + ls
    for i in range(rank):
        table = np.zeros((block[i], blocks[i], image[i]), np.dtype(_dtype(data)))
        for k in range(block[i]):
            for m in range(blocks[i]):
                position = k * dilations[i] + m * strides[i] - pads[i]
                if 0 <= position < image[i]:
                    table[k, m, position] = 1
        target = next(letters)
        result = [lab for lab in labels if lab not in (ks[i], ls[i])] + [target]
        x = bb.normalize(relax.op.einsum([x, _array(table)],
                                         f"{''.join(labels)},{ks[i]}{ls[i]}{target}->{''.join(result)}"))
        labels = result
    return x


def _deform_conv(bb, inputs, attr, params, tvm_impl):
    """DeformConv (2-D): each output position samples X bilinearly (zeros outside) at the kernel tap moved by its
    offset, scales by the mask, and the samples are contracted with W per group."""
    from tvm import relax

    x, w, offset = inputs[:3]
    bias, mask = _optional_input(inputs, 3), _optional_input(inputs, 4)
    shape, w_shape, o_shape = static_shape(x), static_shape(w), static_shape(offset)
    if shape is None or w_shape is None or o_shape is None or len(shape) != 4:
        raise NotImplementedError("DeformConv needs 2-D data with static shapes")
    n, c, h, wd = shape
    oc, _, kh, kw = w_shape
    oh, ow = o_shape[2:]
    group, offset_group = attr.get("group", 1), attr.get("offset_group", 1)
    sh, sw = attr.get("strides", [1, 1])
    dh, dw = attr.get("dilations", [1, 1])
    pads = attr.get("pads", [0, 0, 0, 0])
    taps, positions = kh * kw, kh * kw * oh * ow
    dtype = _dtype(x)
    offset = relax.op.reshape(offset, [n, offset_group, taps, 2, oh, ow])
    off_h = relax.op.squeeze(relax.op.strided_slice(offset, [3], [0], [1]), [3])  # [n, G, taps, oh, ow]
    off_w = relax.op.squeeze(relax.op.strided_slice(offset, [3], [1], [2]), [3])
    tap_h = np.repeat(np.arange(kh) * dh, kw).reshape(taps, 1, 1)
    tap_w = np.tile(np.arange(kw) * dw, kh).reshape(taps, 1, 1)
    base_h = (tap_h + (np.arange(oh) * sh - pads[0]).reshape(1, oh, 1)).astype(dtype)
    base_w = (tap_w + (np.arange(ow) * sw - pads[1]).reshape(1, 1, ow)).astype(dtype)
    py = bb.normalize(relax.op.add(off_h, _array(base_h)))
    px = bb.normalize(relax.op.add(off_w, _array(base_w)))
    y0, x0 = bb.normalize(relax.op.floor(py)), bb.normalize(relax.op.floor(px))
    ly, lx = relax.op.subtract(py, y0), relax.op.subtract(px, x0)
    one = relax.const(1.0, dtype)
    flat = bb.normalize(relax.op.reshape(x, [n, offset_group, c // offset_group, h * wd]))
    sampled = None
    for dy, dx in itertools.product((0, 1), (0, 1)):
        yy = bb.normalize(relax.op.astype(relax.op.add(y0, relax.const(float(dy), dtype)), "int64"))
        xx = bb.normalize(relax.op.astype(relax.op.add(x0, relax.const(float(dx), dtype)), "int64"))
        weight = relax.op.multiply(ly if dy else relax.op.subtract(one, ly), lx if dx else relax.op.subtract(one, lx))
        inside = relax.op.logical_and(
            relax.op.logical_and(relax.op.greater_equal(yy, relax.const(0, "int64")),
                                 relax.op.less(yy, relax.const(h, "int64"))),
            relax.op.logical_and(relax.op.greater_equal(xx, relax.const(0, "int64")),
                                 relax.op.less(xx, relax.const(wd, "int64"))))
        weight = relax.op.where(inside, weight, relax.const(0.0, dtype))
        index = relax.op.add(relax.op.multiply(relax.op.clip(yy, 0, h - 1), relax.const(wd, "int64")),
                             relax.op.clip(xx, 0, wd - 1))
        index = relax.op.broadcast_to(relax.op.reshape(index, [n, offset_group, 1, positions]),
                                      [n, offset_group, c // offset_group, positions])
        value = relax.op.gather_elements(flat, index, axis=3)
        term = relax.op.multiply(value, relax.op.reshape(weight, [n, offset_group, 1, positions]))
        sampled = bb.normalize(term if sampled is None else relax.op.add(sampled, term))
    if mask is not None:
        sampled = relax.op.multiply(sampled, relax.op.reshape(mask, [n, offset_group, 1, positions]))
    columns = relax.op.reshape(sampled, [n, group, (c // group) * taps, oh * ow])
    kernel = relax.op.reshape(w, [1, group, oc // group, (c // group) * taps])
    out = relax.op.reshape(relax.op.matmul(kernel, columns), [n, oc, oh, ow])
    if bias is not None:
        out = relax.op.add(out, relax.op.reshape(bias, [1, oc, 1, 1]))
    return out


def _tfidf_vectorizer(bb, inputs, attr, params, tvm_impl):
    """TfIdfVectorizer over integer tokens ([C] or [B, C]): per pool n-gram of length n, the windows that match it
    (n > 1: with each skip 0..max_skip_count; unigrams once), mapped to output columns by ngram_indexes, weighted
    as mode says (TF: counts, IDF: weight where seen, TFIDF: weight * count; a weight per pool n-gram, as ONNX
    Runtime reads them)."""
    from tvm import relax

    x = inputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) not in (1, 2) or "pool_int64s" not in attr:
        raise NotImplementedError("TfIdfVectorizer needs integer pools and a static [C] or [B, C] input")
    rows = x if len(shape) == 2 else relax.op.expand_dims(x, 0)
    batch, length = (shape if len(shape) == 2 else [1] + shape)
    pool = np.array(attr["pool_int64s"], np.int64)
    starts = list(attr["ngram_counts"]) + [len(pool)]
    indexes = list(attr["ngram_indexes"])
    size = max(indexes) + 1
    low, high, skips = attr["min_gram_length"], attr["max_gram_length"], attr["max_skip_count"]
    tokens = bb.normalize(relax.op.astype(rows, "int64"))
    counts, columns, ids_used = [], [], []
    ngram = 0
    for gram, (begin, end) in enumerate(zip(starts[:-1], starts[1:]), start=1):
        grams = pool[begin:end].reshape(-1, gram)
        ids = list(range(ngram, ngram + len(grams)))
        ngram += len(grams)
        if not (low <= gram <= high) or not len(grams):
            continue
        total = None
        for skip in ([0] if gram == 1 else range(skips + 1)):
            step = skip + 1
            windows = length - (gram - 1) * step
            if windows <= 0:
                continue
            match = None
            for t in range(gram):
                piece = relax.op.strided_slice(tokens, [1], [t * step], [t * step + windows])  # [B, windows]
                equal = relax.op.equal(relax.op.expand_dims(piece, -1), _array(grams[:, t]))  # [B, windows, J]
                match = equal if match is None else relax.op.logical_and(match, equal)
            found = relax.op.sum(relax.op.astype(match, "float32"), axis=1)  # [B, J]
            total = found if total is None else relax.op.add(total, found)
        if total is not None:
            counts.append(bb.normalize(total))
            columns.extend(indexes[i] for i in ids)
            ids_used.extend(ids)
    if not counts:
        out = relax.op.zeros([batch, size], "float32")
    else:
        found = relax.op.concat(counts, axis=1) if len(counts) > 1 else counts[0]  # [B, n-grams]
        mode = _text(attr.get("mode"), "TF")
        weights = attr.get("weights")
        if mode == "IDF":
            found = relax.op.astype(relax.op.greater(found, relax.const(0.0, "float32")), "float32")
        if mode != "TF" and weights:  # one weight per pool n-gram, in pool order
            found = relax.op.multiply(found, _array(np.array([weights[i] for i in ids_used], np.float32)))
        scatter = np.zeros((len(columns), size), np.float32)
        scatter[np.arange(len(columns)), columns] = 1
        out = relax.op.matmul(found, _array(scatter))
    return out if len(shape) == 2 else relax.op.squeeze(out, [0])


# ---------------------------------------------------------------- ai.onnx.ml

def _array_feature_extractor(bb, inputs, attr, params, tvm_impl):
    """ArrayFeatureExtractor: x[..., indices] (flattened indices; a 1-D x gives one row, as ONNX Runtime does)."""
    from tvm import relax

    x, indices = inputs
    rank = len(x.ty.shape.values)
    flat = relax.op.reshape(indices, [-1])
    out = relax.op.take(x, flat, axis=rank - 1)
    return relax.op.expand_dims(out, 0) if rank == 1 else out


def _binarizer(bb, inputs, attr, params, tvm_impl):
    from tvm import relax

    x = inputs[0]
    dtype = _dtype(x)
    above = relax.op.greater(x, relax.const(attr.get("threshold", 0.0), dtype))
    return relax.op.astype(above, dtype)


def _tensor_attr(attr, name, default=None):
    from onnx import TensorProto, numpy_helper

    value = attr.get(name)
    if value is None:
        return default
    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


@dataclass
class _TreeNodes:
    """TreeEnsemble's node arrays, indexed by node id."""
    feature: np.ndarray
    splits: np.ndarray
    modes: np.ndarray
    true_ids: np.ndarray
    false_ids: np.ndarray
    true_leaf: np.ndarray
    false_leaf: np.ndarray
    missing: np.ndarray  # NaN goes to the true branch


def _membership_table(attr, modes, n_nodes: int, dtype) -> np.ndarray:
    """Set members per MEMBER node (NaN-separated, in node order), padded with NaN: [nodes, largest set]."""
    members = _tensor_attr(attr, "membership_values")
    sets = [[] for _ in range(n_nodes)]
    if members is not None:
        chunks, current = [], []
        for v in members.astype(np.float64):
            if np.isnan(v):
                chunks.append(current)
                current = []
            else:
                current.append(v)
        for node, chunk in zip([i for i, m in enumerate(modes) if m == 6], chunks):
            sets[node] = chunk
    width = max([len(c) for c in sets] + [1])
    table = np.full((n_nodes, width), np.nan, dtype)
    for i, chunk in enumerate(sets):
        table[i, :len(chunk)] = chunk
    return table


def _tree_nodes(attr, dtype) -> _TreeNodes:
    feature = _tensor_attr(attr, "nodes_featureids").astype(np.int64)
    splits = _tensor_attr(attr, "nodes_splits").astype(dtype)
    modes = _tensor_attr(attr, "nodes_modes").astype(np.int64)
    true_ids = _tensor_attr(attr, "nodes_truenodeids").astype(np.int64)
    false_ids = _tensor_attr(attr, "nodes_falsenodeids").astype(np.int64)
    true_leaf = _tensor_attr(attr, "nodes_trueleafs").astype(bool)
    false_leaf = _tensor_attr(attr, "nodes_falseleafs").astype(bool)
    missing = _tensor_attr(attr, "nodes_missing_value_tracks_true", np.zeros(len(feature), np.int64)).astype(bool)
    return _TreeNodes(feature, splits, modes, true_ids, false_ids, true_leaf, false_leaf, missing)


def _tree_depths(nodes: _TreeNodes, roots) -> tuple[np.ndarray, int]:
    """(per tree: whether it is one leaf, both branches of its root naming it; the deepest tree's depth)."""
    true_ids, false_ids, true_leaf, false_leaf = nodes.true_ids, nodes.false_ids, nodes.true_leaf, nodes.false_leaf

    def depth(node: int, leaf: bool) -> int:
        if leaf:
            return 0
        return 1 + max(depth(int(true_ids[node]), bool(true_leaf[node])),
                       depth(int(false_ids[node]), bool(false_leaf[node])))

    degenerate = np.array([true_leaf[r] and false_leaf[r] and true_ids[r] == false_ids[r] for r in roots])
    return degenerate, max(depth(int(r), bool(d)) for r, d in zip(roots, degenerate))


def _tree_level(bb, x, nodes: _TreeNodes, table: np.ndarray, current, at_leaf):
    """Every tree one level down from node `current` ([batch, trees]); a sample at a leaf stays there.
    Returns (current, at_leaf)."""
    from tvm import relax

    value = bb.normalize(relax.op.gather_elements(x, relax.op.take(_array(nodes.feature), current, axis=0), axis=1))
    split = relax.op.take(_array(nodes.splits), current, axis=0)
    mode = relax.op.take(_array(nodes.modes), current, axis=0)
    member = relax.op.equal(relax.op.expand_dims(value, -1), relax.op.take(_array(table), current, axis=0))
    member = relax.op.greater(relax.op.sum(relax.op.astype(member, "int32"), axis=-1), relax.const(0, "int32"))
    outcomes = [relax.op.less_equal(value, split), relax.op.less(value, split),
                relax.op.greater_equal(value, split), relax.op.greater(value, split),
                relax.op.equal(value, split),
                relax.op.logical_or(relax.op.not_equal(value, split), relax.op.isnan(value)),  # NaN != v
                member]
    decided = outcomes[-1]
    for code in range(5, -1, -1):
        decided = relax.op.where(relax.op.equal(mode, relax.const(code, "int64")), outcomes[code], decided)
    nan_goes_true = relax.op.logical_and(relax.op.isnan(value), relax.op.take(_array(nodes.missing), current, axis=0))
    decided = bb.normalize(relax.op.logical_or(decided, nan_goes_true))
    following = relax.op.where(decided, relax.op.take(_array(nodes.true_ids), current, axis=0),
                               relax.op.take(_array(nodes.false_ids), current, axis=0))
    reaches_leaf = relax.op.where(decided, relax.op.take(_array(nodes.true_leaf), current, axis=0),
                                  relax.op.take(_array(nodes.false_leaf), current, axis=0))
    current = bb.normalize(relax.op.where(at_leaf, current, following))
    at_leaf = bb.normalize(relax.op.logical_or(at_leaf, reaches_leaf))
    return current, at_leaf


def _aggregate_leaves(bb, current, targets, weights, n_targets: int, trees: int, aggregate: int, dtype):
    """The leaves' weights per target: summed, averaged, or min/max-ed over the trees."""
    from tvm import relax

    leaf_weight = relax.op.expand_dims(relax.op.take(_array(weights), current, axis=0), -1)  # [B, T, 1]
    leaf_target = relax.op.expand_dims(relax.op.take(_array(targets), current, axis=0), -1)
    hits = bb.normalize(relax.op.equal(leaf_target, _array(np.arange(n_targets, dtype=np.int64))))  # [B, T, n]
    if aggregate in (0, 1):
        total = relax.op.sum(relax.op.where(hits, leaf_weight, relax.const(0.0, dtype)), axis=1)
        return relax.op.divide(total, relax.const(float(trees), dtype)) if aggregate == 0 else total
    info = np.finfo(dtype)  # MIN/MAX: a target no tree's leaf names is 0, as in ONNX Runtime
    bound = relax.const(float(info.max if aggregate == 2 else info.min), dtype)
    picked = relax.op.where(hits, leaf_weight, bound)
    extreme = relax.op.min(picked, axis=1) if aggregate == 2 else relax.op.max(picked, axis=1)
    named = relax.op.greater(relax.op.sum(relax.op.astype(hits, "int32"), axis=1), relax.const(0, "int32"))
    return relax.op.where(named, extreme, relax.const(0.0, dtype))


def _tree_ensemble(bb, inputs, attr, params, tvm_impl):
    """TreeEnsemble (ai.onnx.ml 5): every tree walked at once, one level per step for the deepest tree's depth
    (a sample at a leaf stays there); each comparison mode, NaN routing and set membership as ONNX defines them;
    leaf weights summed, averaged, or min/max-ed per target."""
    from tvm import relax

    x = inputs[0]
    dtype = _dtype(x)
    if int(attr.get("post_transform", 0)) != 0:
        raise NotImplementedError("TreeEnsemble's post_transform other than NONE")
    aggregate = int(attr.get("aggregate_function", 1))
    nodes = _tree_nodes(attr, dtype)
    targets = _tensor_attr(attr, "leaf_targetids").astype(np.int64)
    weights = _tensor_attr(attr, "leaf_weights").astype(dtype)
    roots = _tensor_attr(attr, "tree_roots").astype(np.int64)
    n_targets = int(attr["n_targets"])
    table = _membership_table(attr, nodes.modes, len(nodes.feature), dtype)
    degenerate, steps = _tree_depths(nodes, roots)
    batch = x.ty.shape.values[0]
    trees = len(roots)
    current = relax.op.broadcast_to(_array(np.where(degenerate, nodes.true_ids[roots], roots)[None, :]),
                                    [batch, trees])
    at_leaf = relax.op.broadcast_to(_array(degenerate[None, :]), [batch, trees])
    for _ in range(steps):
        current, at_leaf = _tree_level(bb, x, nodes, table, current, at_leaf)
    return _aggregate_leaves(bb, current, targets, weights, n_targets, trees, aggregate, dtype)
