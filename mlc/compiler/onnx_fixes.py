"""Converter overrides for ONNX node forms TVM 0.27 builds wrongly or not at all (#19, found by
benchmarks/onnx_node_tests): Split with empty parts; Resize and Upsample (see resize.py); Dropout's mask;
BatchNormalization in training mode; ConvTranspose's output_shape; blocked Quantize/DequantizeLinear; Cast to
float8 e4m3fn."""

from __future__ import annotations

import functools
from typing import Optional

import onnx

FLOAT8 = {onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
          onnx.TensorProto.FLOAT8E5M2FNUZ}


def apply() -> None:
    _split_with_empty_parts()
    _dropout_mask()
    _batch_norm_training()
    _conv_transpose_output_shape()
    _blocked_quantization()
    _cast_to_float8()
    from mlc.compiler import resize

    resize.override()


@functools.lru_cache(maxsize=1)
def _split_with_empty_parts() -> None:
    """Split whose constant sizes hold a 0: relax's split needs strictly increasing indices ("split_indices must
    be sorted" at build), so each part becomes a strided slice."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    split = onnx_frontend.Split

    def sizes_of(inputs, attr, params, version: int):
        if version < 13:
            return attr.get("split")
        if len(inputs) < 2 or inputs[1] is None:
            return None
        value = onnx_frontend.get_constant(inputs[1], params)
        return value.value.numpy().reshape(-1).tolist() if isinstance(value, tvm.ir.GenericConst) else None

    for version in (1, 13):
        original = getattr(split, f"_impl_v{version}").__func__

        def impl(cls, bb, inputs, attr, params, _original=original, _version=version):
            sizes = sizes_of(inputs, attr, params, _version)
            if not sizes or all(int(s) > 0 for s in sizes):
                return _original(cls, bb, inputs, attr, params)
            axis = attr.get("axis", 0)
            ends = np.cumsum([int(s) for s in sizes]).tolist()
            starts = [0] + ends[:-1]
            return relax.Tuple([bb.normalize(relax.op.strided_slice(inputs[0], [axis], [b], [e]))
                                for b, e in zip(starts, ends)])

        setattr(split, f"_impl_v{version}", classmethod(impl))


@functools.lru_cache(maxsize=1)
def _dropout_mask() -> None:
    """Dropout's mask output (TVM returns the data twice): all ones, bool from opset 10 (the input's type
    before). Training mode with a ratio above 0 is random: refused (exit 1), not compiled."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    def identity(x, attr, mask_dtype: str):
        if attr["tvm_custom"]["num_outputs"] < 2:
            return x
        return relax.Tuple([x, relax.op.ones_like(x, mask_dtype)])

    def v1(cls, bb, inputs, attr, params):
        return identity(inputs[0], attr, str(inputs[0].ty.dtype))

    def v10(cls, bb, inputs, attr, params):
        return identity(inputs[0], attr, "bool")

    def v12(cls, bb, inputs, attr, params):
        values = []
        for k in (1, 2):
            value = onnx_frontend.get_constant(inputs[k], params) if len(inputs) > k and inputs[k] is not None \
                else None
            if value is not None and not isinstance(value, tvm.ir.GenericConst):
                raise NotImplementedError("Dropout needs a constant ratio and training_mode")
            values.append(None if value is None else value.value.numpy())
        ratio, training = values
        if training is not None and bool(np.asarray(training)) and (ratio is None or float(ratio) > 0):
            raise NotImplementedError("Dropout in training mode is random; mlc compiles inference graphs")
        return identity(inputs[0], attr, "bool")

    dropout = onnx_frontend.Dropout
    dropout._impl_v1 = classmethod(v1)
    dropout._impl_v10 = classmethod(v10)
    dropout._impl_v12 = classmethod(v12)


@functools.lru_cache(maxsize=1)
def _batch_norm_training() -> None:
    """BatchNormalization with training_mode=1: normalized by the batch's own mean and (biased) variance, and the
    running statistics as ONNX defines them (input * momentum + batch * (1 - momentum)); TVM mixed them up."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.BatchNormalization._impl_v15.__func__

    def impl(cls, bb, inputs, attr, params):
        if not attr.get("training_mode", 0):
            return original(cls, bb, inputs, attr, params)
        data, scale, bias, mean, var = inputs[:5]
        dtype, stats_dtype = str(data.ty.dtype), str(mean.ty.dtype)
        compute = "float32" if dtype == "float16" else dtype

        def cast(x):
            return x if str(x.ty.dtype) == compute else bb.normalize(relax.op.astype(x, compute))

        x = cast(data)
        rank = len(data.ty.shape)
        axes = [0] + list(range(2, rank))

        def per_channel(v):
            return relax.op.reshape(cast(v), [-1] + [1] * (rank - 2))

        batch_mean = bb.normalize(relax.op.mean(x, axes))
        batch_var = bb.normalize(relax.op.variance(x, axes))
        eps = relax.const(float(attr.get("epsilon", 1e-5)), compute)
        centred = relax.op.subtract(x, relax.op.reshape(batch_mean, [-1] + [1] * (rank - 2)))
        normalized = relax.op.divide(centred, relax.op.sqrt(relax.op.add(
            relax.op.reshape(batch_var, [-1] + [1] * (rank - 2)), eps)))
        y = relax.op.add(relax.op.multiply(normalized, per_channel(scale)), per_channel(bias))
        momentum = float(attr.get("momentum", 0.9))

        def running(old, batch):
            mixed = relax.op.add(relax.op.multiply(cast(old), relax.const(momentum, compute)),
                                 relax.op.multiply(batch, relax.const(1 - momentum, compute)))
            return mixed if compute == stats_dtype else relax.op.astype(mixed, stats_dtype)

        y = y if compute == dtype else relax.op.astype(y, dtype)
        return relax.Tuple([y, running(mean, batch_mean), running(var, batch_var)])

    onnx_frontend.BatchNormalization._impl_v15 = classmethod(impl)


@functools.lru_cache(maxsize=1)
def _conv_transpose_output_shape() -> None:
    """ConvTranspose's output_shape attribute (TVM ignores it): the pads it implies, as onnx's reference derives
    them; a negative pad (a larger output than the full result) becomes zero rows, then the bias."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.ConvTranspose._impl_v1.__func__

    def impl(cls, bb, inputs, attr, params):
        shape = getattr(inputs[0].ty, "shape", None)
        if "output_shape" not in attr or shape is None:
            return original(cls, bb, inputs, attr, params)
        spatial = [int(d) for d in shape.values[2:]]
        n = len(spatial)
        out_shape = list(attr["output_shape"])[-n:]
        strides = list(attr.get("strides", [1] * n))
        dilations = list(attr.get("dilations", [1] * n))
        output_padding = list(attr.get("output_padding", [0] * n))
        kernel = list(attr["kernel_shape"]) if "kernel_shape" in attr else \
            [int(d) for d in inputs[1].ty.shape.values[2:]]
        auto_pad = attr.get("auto_pad", b"NOTSET")
        upper = (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) == "SAME_UPPER"
        begin, end = [], []
        for i in range(n):
            full = strides[i] * (spatial[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1
            total = full - out_shape[i]
            small, large = total // 2, total - total // 2
            begin.append(small if upper else large)
            end.append(large if upper else small)
        kept = {k: v for k, v in attr.items() if k not in ("output_shape", "auto_pad")}
        kept["pads"] = [max(p, 0) for p in begin + end]
        out = bb.normalize(original(cls, bb, [inputs[0], inputs[1], None], kept, params))
        if any(p < 0 for p in begin + end):
            widths = [0, 0, 0, 0] + [w for b, e in zip(begin, end) for w in (max(-b, 0), max(-e, 0))]
            out = bb.normalize(relax.op.nn.pad(out, widths))
        if len(inputs) > 2 and inputs[2] is not None:
            out = relax.op.add(out, relax.op.reshape(inputs[2], [1, -1] + [1] * n))
        return out

    onnx_frontend.ConvTranspose._impl_v1 = classmethod(impl)


@functools.lru_cache(maxsize=1)
def _blocked_quantization() -> None:
    """QuantizeLinear/DequantizeLinear with block_size (opset 21): one scale (and zero point) per block of
    block_size elements along `axis`, repeated to the data's shape, then the elementwise formula (round half to
    even and saturate to the output type when quantizing)."""
    import numpy as np
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    from mlc.compiler.importer import _round_half_even

    def expanded(value, data, axis: int, block: int):
        """`value` per element of `data`: each repeated block_size times along axis, the last block cut."""
        size = int(data.ty.shape.values[axis])
        return relax.op.strided_slice(relax.op.repeat(value, block, axis), [axis], [0], [size])

    def layout(inputs, attr):
        x = inputs[0]
        axis = attr.get("axis", 1)
        axis = axis + x.ty.ndim if axis < 0 else axis
        zp = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        return x, axis, zp

    def quantize(cls, bb, inputs, attr, params):
        x, axis, zp = layout(inputs, attr)
        block = int(attr["block_size"])
        output_dtype = attr.get("output_dtype", 0)
        out = onnx_frontend.get_type(output_dtype) if output_dtype else str(zp.ty.dtype) if zp is not None \
            else "uint8"
        if out not in ("int8", "uint8", "int16", "uint16", "int32", "uint32"):
            raise NotImplementedError(f"blocked QuantizeLinear to {out}")
        scale = expanded(inputs[1], x, axis, block)
        ratio = relax.op.astype(relax.op.divide(x, bb.normalize(scale)), "float64")
        shifted = _round_half_even(bb.normalize(ratio))
        if zp is not None:
            shifted = relax.op.add(shifted, relax.op.astype(expanded(zp, x, axis, block), "float64"))
        info = np.iinfo(out)
        return relax.op.astype(relax.op.clip(shifted, float(info.min), float(info.max)), out)

    def dequantize(cls, bb, inputs, attr, params):
        x, axis, zp = layout(inputs, attr)
        block = int(attr["block_size"])
        scale = bb.normalize(expanded(inputs[1], x, axis, block))
        dtype = str(scale.ty.dtype)
        value = relax.op.astype(x, "int32")
        if zp is not None:
            value = relax.op.subtract(value, relax.op.astype(expanded(zp, x, axis, block), "int32"))
        return relax.op.multiply(relax.op.astype(value, dtype), scale)

    for cls, blocked in ((onnx_frontend.QuantizeLinear, quantize), (onnx_frontend.DequantizeLinear, dequantize)):
        for version in (21, 23):
            original = getattr(cls, f"_impl_v{version}").__func__

            def impl(cls, bb, inputs, attr, params, _original=original, _blocked=blocked):
                if attr.get("block_size", 0):
                    return _blocked(cls, bb, inputs, attr, params)
                return _original(cls, bb, inputs, attr, params)

            setattr(cls, f"_impl_v{version}", classmethod(impl))


def float8_problem(model: onnx.ModelProto) -> Optional[str]:
    """Why mlc cannot compile the model's float8 casts, or None. TVM imports float8 values as float32; mlc
    computes a cast to float8 e4m3fn as the value's bits (uint8, what ONNX Runtime returns), right only for a
    value the graph returns and no node reads."""
    read = {name for node in model.graph.node for name in node.input}
    for node in model.graph.node:
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if to in FLOAT8 and node.output[0] in read:
            return "a float8 value that other nodes read: mlc computes float8 casts of graph outputs only"
    return None


@functools.lru_cache(maxsize=1)
def _cast_to_float8() -> None:
    """Cast to FLOAT8E4M3FN as its bit pattern in uint8 (TVM casts to float32: get_type maps float8 to it):
    rounded to nearest even, saturated to 448 (or NaN with saturate=0), NaN 0x7F, the sign kept (-0 too).
    The other float8 types are refused."""
    from tvm import relax, topi
    from tvm.relax.frontend.onnx import onnx_frontend

    from mlc.compiler.importer import _round_half_even

    original = onnx_frontend.Cast._impl_v13.__func__

    def i32(value: int):
        return relax.const(value, "int32")

    def power_of_two(bb, exponent):
        """2**exponent (int32 tensor, a normal float32 exponent) as float32, exactly."""
        return bb.emit_te(topi.reinterpret, bb.normalize(relax.op.left_shift(
            relax.op.add(exponent, i32(127)), i32(23))), "float32")

    def exponent_of(bb, x):
        bits = bb.emit_te(topi.reinterpret, x, "int32")
        return bits, bb.normalize(relax.op.subtract(relax.op.bitwise_and(relax.op.right_shift(bits, i32(23)),
                                                                         i32(255)), i32(127)))

    def e4m3fn_bits(bb, x, saturate: bool):
        x = x if str(x.ty.dtype) == "float32" else bb.normalize(relax.op.astype(x, "float32"))
        bits, exponent = exponent_of(bb, x)
        magnitude = bb.normalize(relax.op.abs(x))
        quantum = power_of_two(bb, relax.op.subtract(relax.op.maximum(exponent, i32(-6)), i32(3)))
        steps = _round_half_even(bb.normalize(relax.op.astype(relax.op.divide(magnitude, quantum), "float64")))
        rounded = bb.normalize(relax.op.multiply(relax.op.astype(steps, "float32"), quantum))
        _, rounded_exponent = exponent_of(bb, rounded)
        scale = power_of_two(bb, relax.op.subtract(rounded_exponent, i32(3)))
        normal_code = relax.op.add(relax.op.multiply(relax.op.astype(relax.op.add(rounded_exponent, i32(6)),
                                                                     "float32"), relax.const(8.0, "float32")),
                                   relax.op.divide(rounded, scale))
        code = relax.op.where(relax.op.greater_equal(rounded, relax.const(2.0 ** -6, "float32")), normal_code,
                              relax.op.multiply(rounded, relax.const(512.0, "float32")))
        too_large = relax.const(126.0 if saturate else 127.0, "float32")
        code = relax.op.where(relax.op.greater(rounded, relax.const(448.0, "float32")), too_large, code)
        if not saturate:  # as onnx's reference and ONNX Runtime: their truncation keeps [480, 496) at 448
            quirk = relax.op.logical_and(relax.op.greater_equal(magnitude, relax.const(480.0, "float32")),
                                         relax.op.less(magnitude, relax.const(496.0, "float32")))
            code = relax.op.where(quirk, relax.const(126.0, "float32"), code)
        code = relax.op.where(relax.op.isnan(x), relax.const(127.0, "float32"), code)
        sign = relax.op.where(relax.op.less(bits, i32(0)), relax.const(128.0, "float32"),
                              relax.const(0.0, "float32"))
        return relax.op.astype(relax.op.add(code, sign), "uint8")

    def impl(cls, bb, inputs, attr, params):
        to = attr.get("to")
        if to not in FLOAT8:
            return original(cls, bb, inputs, attr, params)
        if to != onnx.TensorProto.FLOAT8E4M3FN:
            raise NotImplementedError(f"Cast to {onnx.TensorProto.DataType.Name(to)}")
        x = inputs[0]
        if not isinstance(x, relax.Expr) or not str(getattr(x.ty, "dtype", "")).startswith("float"):
            raise NotImplementedError("Cast to FLOAT8E4M3FN of a value that is not a float tensor")
        return e4m3fn_bits(bb, x, bool(attr.get("saturate", 1)))

    onnx_frontend.Cast._impl_v13 = classmethod(impl)
