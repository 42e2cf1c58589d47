"""--quantize: post-training int8 quantisation of the cleaned ONNX graph's matmuls and convs.

Static (`int8`): weights per output channel, symmetric int8 (scale max|w| / 127); activations per tensor,
asymmetric uint8, their ranges calibrated by running ONNX Runtime on the calibration inputs. Dynamic
(`int8-dynamic`, matmuls only): the activation's range is taken at run time (min/max over the tensor).

Each quantised node becomes plain ONNX that TVM imports as the int8 kernel and elementwise epilogues:

    x_u8 = QuantizeLinear(x, s_x, zp_x)         # clip(round(x / s_x) + zp_x, 0, 255) as uint8
    acc  = MatMulInteger(x_u8, w_s8)            # or ConvInteger; no zero points: u8 x s8 -> i32
    y    = Cast(acc - zp_x * colsum(w_s8), float) * (s_x * s_w[n]) (+ bias)

A conv whose input has a zero point and padding gets an explicit Pad with the zero point (the padded input
then dequantises to 0, as the fp32 conv's zeros), so the correction term is the same at every position.
A conv's input channels are padded to a multiple of 4 (with zero weights), the depth int8 dot products take.

int8 also takes a MatMul of two activations (attention's Q x K^T and P x V; `attention=False` keeps them fp32): the
right operand is int8, symmetric per tensor (vpdpbusd multiplies uint8 by int8), and the zero point's share is
zp_x times its column sums, computed at run time. relax_passes.pad_attention pads the keys of this form too.
A grouped conv is quantised per group (one ConvInteger with `group`) unless it is depthwise or its groups are narrow
(GROUP_MIN_WIDTH). int8-dynamic keeps convs fp32, as it does ops on other types."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mlc.errors import InputError, UnsupportedModelError
from mlc.passes.onnx import constant_values, prune_initializers, readers_of
from mlc.passes.registry import QUANTIZE_MODES

MODES = QUANTIZE_MODES
SEEDED_CALIBRATION = 8  # seeded calibration inputs when the user gives none
MIN_OPSET = 11  # Round, Clip with inputs, Pad with a value input
QUAD = 4  # int8 dot products (VNNI's vpdpbusd, ARM's sdot/udot) reduce 4 values per lane
# A grouped conv of this many output channels a group or fewer stays fp32: its tile is narrower than a vector and
# has no int8 dot product (grouped_conv pads wider groups to whole 16-lane vectors, and their depth to quads)
GROUP_MIN_WIDTH = 8


@dataclass
class Quantization:
    """What --quantize did, for the manifest."""

    mode: str
    calibration: Optional[str]  # "user" (--calibration files), "seeded", None (dynamic: none needed)
    calibration_count: int
    quantized: dict[str, int] = field(default_factory=dict)  # op type -> nodes quantised
    kept_fp32: dict[str, int] = field(default_factory=dict)  # MatMul/Gemm/Conv left fp32, by reason
    converted_from_opset: Optional[int] = None  # the graph's opset, where it was older than MIN_OPSET

    def to_json(self) -> dict:
        record = {"mode": self.mode, "calibration": {"source": self.calibration, "count": self.calibration_count},
                  "quantized": dict(self.quantized), "kept_fp32": dict(self.kept_fp32)}
        if self.converted_from_opset is not None:
            record["opset"] = {"from": self.converted_from_opset, "to": MIN_OPSET}
        return record


@dataclass
class _Candidate:
    node: onnx.NodeProto
    activation: str  # the float input that is quantised
    weight: Optional[np.ndarray]  # MatMul/Gemm: [K, N]; Conv: [O, C, kh, kw]; None: a MatMul of two activations
    bias: Optional[np.ndarray]  # added after the scale (Gemm: beta * C; Conv: [O])
    alpha: float = 1.0

    @property
    def right(self) -> Optional[str]:
        """The second activation of a MatMul of two (attention's K^T or V), quantised as int8."""
        return self.node.input[1] if self.weight is None else None


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def candidates(model: onnx.ModelProto, mode: str, attention: bool = True) -> tuple[list[_Candidate], Counter]:
    """The nodes --quantize rewrites, and the count of MatMul/Gemm/Conv it leaves fp32 by reason. `attention`: int8
    takes MatMuls of two float32 activations too (attention's QK^T and PV)."""
    consts = constant_values(model)
    elem = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.value_info) + list(model.graph.input)
            + list(model.graph.output)}
    elem.update({t.name: t.data_type for t in model.graph.initializer})
    shapes = {v.name: v.type.tensor_type.shape for v in list(model.graph.value_info) + list(model.graph.input)
              if v.type.tensor_type.HasField("shape")}
    found, kept = [], Counter()
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        attrs = _attrs(node)
        x, w = node.input[0], node.input[1] if len(node.input) > 1 else ""
        weight = consts.get(w)
        if weight is None and x not in consts and node.op_type == "MatMul" and mode == "int8" and attention \
                and all(elem.get(v) == TensorProto.FLOAT for v in (x, w)):
            if all(_rank(shapes.get(v)) >= 2 for v in (x, w)):  # the column sums are over axis -2
                found.append(_Candidate(node, x, None, None))  # attention's Q x K^T and P x V
            else:
                kept["MatMul: two activations, not both of known rank >= 2"] += 1
            continue
        if weight is None or x in consts:
            kept[f"{node.op_type}: no constant weight"] += 1
            continue
        if weight.dtype != np.float32 or elem.get(x, TensorProto.FLOAT) != TensorProto.FLOAT:
            kept[f"{node.op_type}: not float32"] += 1
            continue
        bias = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if len(node.input) > 2 and node.input[2] and bias is None:
            kept[f"{node.op_type}: bias not constant"] += 1
            continue
        if node.op_type == "Conv":
            reason = _conv_kept_fp32(mode, weight, attrs)
            if reason:
                kept[reason] += 1
            else:
                found.append(_Candidate(node, x, weight, bias))
            continue
        if weight.ndim != 2:
            kept[f"{node.op_type}: weight not 2-D"] += 1
            continue
        if node.op_type == "Gemm":
            if int(attrs.get("transA", 0)):
                kept["Gemm: transA"] += 1
                continue
            if int(attrs.get("transB", 0)):
                weight = weight.T
            if bias is not None:
                bias = (float(attrs.get("beta", 1.0)) * bias).astype(np.float32)
            found.append(_Candidate(node, x, np.ascontiguousarray(weight), bias, float(attrs.get("alpha", 1.0))))
            continue
        found.append(_Candidate(node, x, weight, None))
    return found, kept


def _conv_kept_fp32(mode: str, weight: np.ndarray, attrs: dict) -> Optional[str]:
    """Why --quantize leaves a conv with a constant float32 weight fp32, or None where it quantises it."""
    groups = int(attrs.get("group", 1))
    if mode != "int8":
        return "Conv: int8-dynamic quantises matmuls only"
    if weight.ndim != 4:
        return "Conv: not 2-D"
    if groups > 1 and weight.shape[1] == 1:
        return "Conv: depthwise"
    if groups > 1 and weight.shape[0] // groups <= GROUP_MIN_WIDTH:
        return f"Conv: groups of {GROUP_MIN_WIDTH} or fewer output channels"
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID", "NOTSET", "VALID"):
        return "Conv: auto_pad"
    return None


def _rank(shape) -> int:
    return -1 if shape is None else len(shape.dim)


def calibration_ranges(model: onnx.ModelProto, tensors: Sequence[str], feeds: Sequence[dict]) -> dict:
    """{tensor: (min, max)} over the calibration inputs: ONNX Runtime on the model with `tensors` as outputs."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
                              for t in dict.fromkeys(tensors) if t not in outputs)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own untyped exceptions
        raise UnsupportedModelError(f"--quantize calibrates with ONNX Runtime, which cannot load this model: "
                                    f"{str(e).strip().splitlines()[0][:300]}") from None
    names = list(dict.fromkeys(tensors))
    ranges: dict[str, tuple[float, float]] = {}
    for k, feed in enumerate(feeds):
        try:
            values = session.run(names, feed)
        except Exception as e:  # a calibration input of the wrong shape or type
            raise InputError(f"calibration input {k + 1}: ONNX Runtime cannot run the model on it: "
                             f"{str(e).strip().splitlines()[0][:300]}") from None
        for name, value in zip(names, values):
            finite = value[np.isfinite(value)]
            lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
            old = ranges.get(name, (lo, hi))
            ranges[name] = (min(old[0], lo), max(old[1], hi))
    return ranges


def activation_params(lo: float, hi: float) -> tuple[float, int]:
    """uint8 scale and zero point for values in [lo, hi] (widened to hold 0, so 0 is exact)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0
    if not scale > 0:
        return 1.0, 0
    return float(np.float32(scale)), int(np.clip(np.round(-lo / scale), 0, 255))


def weight_params(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (along `axis`) symmetric int8 weights and their float32 scales."""
    reduce = tuple(a for a in range(weight.ndim) if a != axis)
    peak = np.abs(weight).max(axis=reduce)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    shape = [1] * weight.ndim
    shape[axis] = -1
    q = np.clip(np.round(weight / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


class _Emitter:
    def __init__(self, model: onnx.ModelProto):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        taken = {t for n in model.graph.node for t in list(n.input) + list(n.output)}
        self.taken = taken | {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}

    def name(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], base: str, out: Optional[str] = None, **attrs) -> str:
        out = out or self.name(base)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(f"{base}/{op_type}"), **attrs))
        return out


def _quantize_static(e: _Emitter, x: str, scale: float, zero: int, dtype=np.uint8) -> str:
    """x_u8 = clip(round(x / s) + zp, 0, 255) as uint8, or as int8 with `dtype` (QuantizeLinear: one elementwise op
    in Relax)."""
    base = f"{x}_q8" if dtype is np.uint8 else f"{x}_s8"
    return e.op("QuantizeLinear", [x, e.const(f"{base}/scale", np.float32(scale)),
                                   e.const(f"{base}/zero", dtype(zero))], base)


def _quantize_dynamic(e: _Emitter, x: str) -> tuple[str, str, str]:
    """x_u8, its scale (float scalar) and zero point (int32 scalar), from the tensor's range at run time (what
    DynamicQuantizeLinear computes, with a floor on the scale: an all-zero tensor does not divide by 0)."""
    base = f"{x}_dq8"
    zero_f = e.const(f"{base}/0", np.float32(0))
    hi = e.op("Max", [e.op("ReduceMax", [x], base, keepdims=0), zero_f], base)
    lo = e.op("Min", [e.op("ReduceMin", [x], base, keepdims=0), zero_f], base)
    scale = e.op("Div", [e.op("Sub", [hi, lo], base), e.const(f"{base}/255", np.float32(255))], base)
    scale = e.op("Max", [scale, e.const(f"{base}/tiny", np.float32(np.finfo(np.float32).tiny))], base)
    zero = e.op("Clip", [e.op("Round", [e.op("Div", [e.op("Neg", [lo], base), scale], base)], base), zero_f,
                         e.const(f"{base}/255f", np.float32(255))], base)
    y = e.op("QuantizeLinear", [x, scale, e.op("Cast", [zero], base, to=TensorProto.UINT8)], base)
    return y, scale, e.op("Cast", [zero], base, to=TensorProto.INT32)


def _epilogue(e: _Emitter, acc: str, correction: Optional[str], scale: str, bias: Optional[str], out: str,
              base: str) -> None:
    """(acc - correction) as float * scale (+ bias), written to `out`."""
    if correction is not None:
        acc = e.op("Sub", [acc, correction], base)
    y = e.op("Cast", [acc], base, to=TensorProto.FLOAT)
    if bias is None:
        e.op("Mul", [y, scale], base, out=out)
    else:
        e.op("Add", [e.op("Mul", [y, scale], base), bias], base, out=out)


def _integer_conv(e: _Emitter, node: onnx.NodeProto, c, x_u8: str, zp, base: str):
    """A ConvInteger on the quantised input: (its int32 output, the weights' per-channel sums, their scales, the
    shape that broadcasts per-channel values over it)."""
    w_q, s_w = weight_params(c.weight, 0)
    bshape = [1, -1, 1, 1]
    attrs = _attrs(node)
    pads = [int(p) for p in attrs.get("pads", [0] * 4)]
    conv = {k: attrs[k] for k in ("strides", "dilations", "kernel_shape") if k in attrs}
    # input channels padded to a multiple of 4 (zero weights): the int8 dot-product instructions take the
    # depth in quads, and a 3-channel stem conv otherwise runs on plain int32 multiplies (3x its time)
    groups = int(attrs.get("group", 1))
    extra = -w_q.shape[1] % QUAD if groups == 1 else 0
    w_q = np.pad(w_q, ((0, 0), (0, extra), (0, 0), (0, 0)))
    if zp and any(pads) or extra:  # padding must be the zero point, which dequantises to 0
        spatial = pads if zp else [0] * 4
        x_in = e.op("Pad", [x_u8, e.const(f"{base}/pads", np.array(
            [0, 0, spatial[0], spatial[1], 0, extra, spatial[2], spatial[3]], np.int64)),
                            e.const(f"{base}/pad_value", np.uint8(zp))], base, mode="constant")
        pads = [p - q for p, q in zip(pads, spatial)]
    else:
        x_in = x_u8
    acc = e.op("ConvInteger", [x_in, e.const(f"{base}/weight", w_q)], base, pads=pads, group=groups, **conv)
    return acc, w_q.astype(np.int32).sum(axis=(1, 2, 3)), s_w, bshape


def _correction_and_scale(e: _Emitter, mode: str, zp, colsum, s_x, s_w, bshape: list, base: str):
    """(the zero point's share of the int32 sums, to subtract, or None; the float scale): constants for static
    int8, computed at run time for dynamic."""
    if mode == "int8":
        correction = e.const(f"{base}/zp_colsum", (zp * colsum).astype(np.int32).reshape(bshape)) if zp else None
        scale = e.const(f"{base}/scale", (np.float32(s_x) * s_w).astype(np.float32).reshape(bshape))
    else:
        correction = e.op("Mul", [zp, e.const(f"{base}/colsum", colsum.astype(np.int32))], base)
        scale = e.op("Mul", [s_x, e.const(f"{base}/w_scale", s_w)], base)
    return correction, scale


def _quantize_symmetric(e: _Emitter, x: str, lo: float, hi: float) -> tuple[str, float]:
    """x_s8 = clip(round(x / s), -128, 127) with s = max|x| / 127 over the calibration (the right operand of a matmul
    of two activations: vpdpbusd multiplies uint8 by int8), and s."""
    peak = max(abs(lo), abs(hi))
    scale = float(np.float32(peak / 127.0)) if peak > 0 else 1.0
    return _quantize_static(e, x, scale, 0, np.int8), scale


def _activations_matmul(e: _Emitter, x_u8: str, s_x: float, zp: int, y_s8: str, s_y: float, out: str, base: str,
                        version: int) -> None:
    """MatMul(x, y) of two activations as MatMulInteger(x_u8, y_s8), less the zero point's share (zp times the
    column sums of y_s8, computed at run time), scaled by s_x * s_y."""
    acc = e.op("MatMulInteger", [x_u8, y_s8], base)
    correction = None
    if zp:
        wide = e.op("Cast", [y_s8], base, to=TensorProto.INT32)
        if version >= 13:
            sums = e.op("ReduceSum", [wide, e.const(f"{base}/axes", np.array([-2], np.int64))], base, keepdims=1)
        else:
            sums = e.op("ReduceSum", [wide], base, axes=[-2], keepdims=1)
        correction = e.op("Mul", [sums, e.const(f"{base}/zero", np.int32(zp))], base)
    _epilogue(e, acc, correction, e.const(f"{base}/scale", np.float32(s_x * s_y)), None, out, base)


def _pools_to_quantize_first(model: onnx.ModelProto, chosen: dict) -> dict[str, onnx.NodeProto]:
    """{activation: the MaxPool that makes it} where only quantised nodes read the pool's output: its input is
    quantised instead and the pool runs on uint8. Exact (quantising is monotonic: the max of the quantised values
    is the quantised max), and the conv before the pool then writes uint8, not float32, with its requantise as
    its epilogue (squeezenet's stem: 111 x 111 x 64 values)."""
    readers = readers_of(model)
    outputs = {o.name for o in model.graph.output}
    return {node.output[0]: node for node in model.graph.node
            if node.op_type == "MaxPool" and len([o for o in node.output if o]) == 1
            and node.output[0] not in outputs
            and all(id(r) in chosen and chosen[id(r)].activation == node.output[0] for r in readers[node.output[0]])}


def _quantized_activation(e: _Emitter, x: str, mode: str, ranges: Optional[dict], pools: dict, cache: dict):
    """(x_u8, its scale, its zero point), quantised once per activation (Q, K and V projections share it); an x
    made by a MaxPool in `pools` is quantised before the pool, which then runs on uint8."""
    if x not in cache:
        if mode != "int8":
            cache[x] = _quantize_dynamic(e, x)
            return cache[x]
        s_x, zp = activation_params(*ranges[x])
        pool = pools.get(x)
        if pool is None:
            x_u8 = _quantize_static(e, x, s_x, zp)
        else:
            x_u8 = e.op("MaxPool", [_quantize_static(e, pool.input[0], s_x, zp)], f"{x}_q8", **_attrs(pool))
        cache[x] = (x_u8, s_x, zp)
    return cache[x]


def _weighted(e: _Emitter, c: _Candidate, mode: str, x_u8: str, s_x, zp, out: str, base: str) -> None:
    """A MatMul/Gemm/Conv with a constant weight on the quantised input: the int8 kernel and its epilogue."""
    node = c.node
    if node.op_type == "Conv":
        acc, colsum, s_w, bshape = _integer_conv(e, node, c, x_u8, zp, base)
    else:
        w_q, s_w = weight_params(c.weight, 1)
        bshape = [-1]
        acc = e.op("MatMulInteger", [x_u8, e.const(f"{base}/weight", w_q)], base)
        colsum = w_q.astype(np.int32).sum(axis=0)
    s_w = (s_w * np.float32(c.alpha)).astype(np.float32)
    bias = None if c.bias is None else e.const(f"{base}/bias", np.asarray(
        c.bias.reshape(bshape) if node.op_type == "Conv" else c.bias, np.float32))
    correction, scale = _correction_and_scale(e, mode, zp, colsum, s_x, s_w, bshape, base)
    _epilogue(e, acc, correction, scale, bias, out, base)


def rewrite(model: onnx.ModelProto, mode: str, ranges: Optional[dict] = None, attention: bool = True
            ) -> tuple[onnx.ModelProto, Counter, Counter]:
    """The model with its candidates quantised (`ranges`: calibration, for int8); returns it, the op types
    quantised and the ones kept fp32 by reason."""
    found, kept = candidates(model, mode, attention)
    chosen = {id(c.node): c for c in found}
    pools = _pools_to_quantize_first(model, chosen) if mode == "int8" else {}
    moved = {id(pool) for pool in pools.values()}
    e = _Emitter(model)
    quantized_inputs: dict = {}  # _quantized_activation's cache, and the right operands' int8 forms
    done = Counter()
    new_nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        c = chosen.get(id(node))
        if c is None:
            if id(node) not in moved:
                new_nodes.append(node)
            continue
        e.nodes = []
        base, out = f"{node.output[0]}_int8", node.output[0]
        x_u8, s_x, zp = _quantized_activation(e, c.activation, mode, ranges, pools, quantized_inputs)
        if c.right:
            right = (c.right, "int8")  # its own key: a tensor may be the left operand (uint8) of another matmul
            if right not in quantized_inputs:
                quantized_inputs[right] = _quantize_symmetric(e, c.right, *ranges[c.right])
            _activations_matmul(e, x_u8, s_x, zp, *quantized_inputs[right], out, base, opset(model))
            done["MatMul of two activations"] += 1
        else:
            _weighted(e, c, mode, x_u8, s_x, zp, out, base)
            done[node.op_type] += 1
        new_nodes.extend(e.nodes)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(new_nodes)
    result.graph.initializer.extend(e.inits)
    return prune_initializers(result), done, kept


def opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def quantize(model: onnx.ModelProto, mode: str, calibration: Sequence[dict], source: Optional[str],
             attention: bool = True) -> tuple[onnx.ModelProto, Quantization]:
    """The cleaned model quantised (`calibration`: input feeds for int8, `source` "user" or "seeded"; `attention`:
    candidates())."""
    if mode not in MODES:
        raise InputError(f"--quantize {mode}: choose one of {', '.join(MODES)}")
    original = opset(model)
    if original < MIN_OPSET:
        model = _converted(model, original)
    ranges = None
    if mode == "int8":
        found, _ = candidates(model, mode, attention)
        tensors = [c.activation for c in found] + [c.right for c in found if c.right]
        ranges = calibration_ranges(model, tensors, calibration) if found else {}
    quantized, done, kept = rewrite(model, mode, ranges, attention)
    info = Quantization(mode, source if mode == "int8" else None, len(calibration) if mode == "int8" else 0,
                        dict(done), dict(kept), original if original < MIN_OPSET else None)
    return quantized, info


def _converted(model: onnx.ModelProto, original: int) -> onnx.ModelProto:
    """The graph at MIN_OPSET (the rewrite emits Round, Clip with inputs and Pad with a value input), by onnx's
    version converter; a one-line error where it fails."""
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # the converter raises RuntimeError or its C++ errors
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UnsupportedModelError(f"--quantize needs ONNX opset {MIN_OPSET} or newer; this model is opset "
                                    f"{original}, and onnx's version converter fails on it ({reason}); convert it "
                                    f"to opset {MIN_OPSET} or newer yourself") from None
