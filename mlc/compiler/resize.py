"""ONNX Resize and Upsample as ONNX defines them, for a static input shape and constant scales, sizes and roi.

TVM 0.27's converter resizes the last two axes only, at the ratio of the sizes (ONNX uses the given scale), and
has no `axes`, `keep_aspect_ratio_policy`, `antialias` or half_pixel_symmetric; Resize-10 and Upsample-9 read
their scales from the wrong input. Here each resized axis becomes a gather of its taps times constant weights,
summed; the taps and weights are computed in numpy the way onnx's reference implementation computes them.
TVM's converter is kept for the forms it computes exactly (one relax image.resize op, which layout passes know)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Mode:
    """How one Resize node interpolates (ONNX attribute values)."""

    mode: str = "nearest"  # nearest, linear, cubic
    coordinate: str = "half_pixel"
    nearest: str = "round_prefer_floor"  # or "simple": ORT's Resize-10/Upsample rule (floor up, ceil down)
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    extrapolation: float = 0.0


# ---------------------------------------------------------------- the taps of one axis (numpy only)

def _nearest_coeffs(ratio, mode: str, downsampling: bool) -> list:
    if isinstance(ratio, int) or ratio.is_integer():
        return [0, 1]
    if mode == "simple":
        mode = "ceil" if downsampling else "floor"
    table = {"round_prefer_floor": [ratio <= 0.5, ratio > 0.5], "round_prefer_ceil": [ratio < 0.5, ratio >= 0.5],
             "floor": [1, 0], "ceil": [0, 1]}
    if mode not in table:
        raise ValueError(f"unknown nearest_mode {mode!r}")
    return table[mode]


def _cubic_coeffs(ratio, a: float) -> list:
    return [((a * (ratio + 1) - 5 * a) * (ratio + 1) + 8 * a) * (ratio + 1) - 4 * a,
            ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
            ((a + 2) * (1 - ratio) - (a + 3)) * (1 - ratio) * (1 - ratio) + 1,
            ((a * ((1 - ratio) + 1) - 5 * a) * ((1 - ratio) + 1) + 8 * a) * ((1 - ratio) + 1) - 4 * a]


def _cubic_coeffs_antialias(ratio, scale, a: float) -> np.ndarray:
    scale = min(scale, 1.0)

    def coeff(x):
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x * x + 1
        return a * x ** 3 - 5 * a * x * x + 8 * a * x - 4 * a if x < 2 else 0.0

    start = int(np.floor(-2 / scale) + 1)
    coeffs = [coeff(scale * (i - ratio)) for i in range(start, 2 - start)]
    return np.array(coeffs) / sum(coeffs)


def _linear_coeffs_antialias(ratio, scale) -> np.ndarray:
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    coeffs = np.clip(1 - np.abs((np.arange(start, start + 2 - 2 * start) - ratio) * scale), 0, 1)
    return coeffs / sum(coeffs)


def _coefficients(ratio, scale, mode: Mode) -> np.ndarray:
    if mode.mode == "nearest":
        return np.array(_nearest_coeffs(ratio, mode.nearest, scale < 1), dtype=np.float64)
    if mode.mode == "linear":
        return _linear_coeffs_antialias(ratio, scale) if mode.antialias else np.array([1 - ratio, ratio])
    if mode.mode == "cubic":
        return (_cubic_coeffs_antialias(ratio, scale, mode.cubic_a) if mode.antialias
                else np.array(_cubic_coeffs(ratio, mode.cubic_a), dtype=np.float64))
    raise ValueError(f"unknown Resize mode {mode.mode!r}")


def _source_coordinate(x, in_len: int, out_len: int, scale, mode: Mode, roi):
    """Where output position `x` samples the input (onnx's reference arithmetic, with its numpy scalar types);
    None where tf_crop_and_resize extrapolates."""
    coordinate = mode.coordinate
    out_width = scale * in_len
    if coordinate == "align_corners":
        return 0.0 if out_width == 1 else x * (in_len - 1) / (out_width - 1)
    if coordinate == "asymmetric":
        return x / scale
    if coordinate == "tf_crop_and_resize":
        if out_width == 1:
            x_ori = (roi[1] - roi[0]) * (in_len - 1) / 2
        else:
            x_ori = x * (roi[1] - roi[0]) * (in_len - 1) / (out_width - 1)
        x_ori += roi[0] * (in_len - 1)
        return None if x_ori < 0 or x_ori > in_len - 1 else x_ori
    if coordinate == "pytorch_half_pixel":
        return -0.5 if out_width == 1 else (x + 0.5) / scale - 0.5
    if coordinate == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if coordinate == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_width)
        return offset + (x + 0.5) / scale - 0.5
    if coordinate == "tf_half_pixel_for_nn":  # Resize-11 only
        return (x + 0.5) / scale
    raise ValueError(f"unknown coordinate_transformation_mode {coordinate!r}")


def _neighbours(x, n: int, in_len: int) -> list[int]:
    """The n positions nearest to x (ties to the smaller) in the input edge-padded by ceil(n/2), unpadded."""
    pad = math.ceil(n / 2)
    limit = in_len + 2 * pad
    x = x + pad
    centre = int(np.floor(x))
    window = [i for i in range(centre - n, centre + n + 2) if 0 <= i < limit]
    if len(window) < 2 * n + 2:  # clipped by an edge: search all of it, as the reference does
        window = list(range(limit))
    return [i - pad for i in sorted(sorted(window, key=lambda i: (abs(x - i), i))[:n])]


def axis_taps(in_len: int, out_len: int, scale, mode: Mode, roi=(0.0, 1.0)
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output position j of a resized axis = sum_k weights[j, k] * input[indices[j, k]], or the extrapolation
    value where outside[j]. Weights of 0 are dropped (rows padded with index 0, weight 0)."""
    rows: list[list[tuple[int, float]]] = []
    outside = np.zeros(out_len, dtype=bool)
    for j, x in enumerate(np.arange(out_len, dtype=np.int64)):
        x_ori = _source_coordinate(x, in_len, out_len, scale, mode, roi)
        if x_ori is None:
            outside[j] = True
            rows.append([])
            continue
        ratio = 1 if x_ori.is_integer() else x_ori - np.floor(x_ori)
        coeffs = _coefficients(ratio, scale, mode)
        idxes = _neighbours(x_ori, len(coeffs), in_len)
        if mode.exclude_outside:
            coeffs = np.where([0 <= i < in_len for i in idxes], coeffs, 0.0)
            coeffs = coeffs / coeffs.sum()
        rows.append([(min(max(i, 0), in_len - 1), float(c)) for i, c in zip(idxes, coeffs) if c != 0])
    n = max(1, max(len(r) for r in rows))
    indices = np.zeros((out_len, n), dtype=np.int64)
    weights = np.zeros((out_len, n), dtype=np.float64)
    for j, row in enumerate(rows):
        for k, (i, c) in enumerate(row):
            indices[j, k], weights[j, k] = i, c
    return indices, weights, outside


@dataclass(frozen=True)
class Plan:
    """Per axis: (in_len, out_len, scale as the reference holds it, roi start/end)."""

    axes: list[int]  # in the order onnx's reference recurses over them (the innermost is resized first)
    in_shape: list  # ints; a symbolic dim (a PrimExpr) only on an axis kept as it is
    out_shape: list
    scales: dict
    rois: dict


def plan(in_shape: list, scales: Optional[np.ndarray], sizes: Optional[np.ndarray], axes: Optional[list[int]],
         roi: Optional[np.ndarray], keep_aspect: str = "stretch") -> Optional[Plan]:
    """Output shape and per-axis scales as onnx's reference derives them (scales as float32, sizes in float64);
    None where a symbolic dim would be resized."""
    rank = len(in_shape)
    axes = [a + rank if a < 0 else a for a in axes] if axes is not None else list(range(rank))
    symbolic = {a for a in range(rank) if not isinstance(in_shape[a], int)}
    if symbolic and (sizes is not None and symbolic & set(axes) or sizes is None and any(
            float(scales[i]) != 1.0 for i, a in enumerate(axes) if a in symbolic)):
        return None
    rois = {a: (0.0, 1.0) for a in range(rank)}
    if roi is not None and roi.size == 2 * len(axes):
        rois.update({a: (roi[i], roi[len(axes) + i]) for i, a in enumerate(axes)})
    if sizes is not None:
        out = list(in_shape)
        for i, a in enumerate(axes):
            out[a] = int(sizes[i])
        scale = {a: np.float64(out[a]) / in_shape[a] if a not in symbolic else np.float64(1.0) for a in range(rank)}
        if keep_aspect != "stretch":
            pick = min if keep_aspect == "not_larger" else max
            common = pick(scale[a] for a in axes)
            scale = {a: common if a in axes else np.float64(1.0) for a in range(rank)}
            out = [int(common * in_shape[a] + 0.5) if a in axes else in_shape[a] for a in range(rank)]
    else:
        scale = {a: np.float32(1.0) for a in range(rank)}
        scale.update({a: np.float32(scales[i]) for i, a in enumerate(axes)})
        out = [int(np.float64(scale[a]) * in_shape[a]) if a not in symbolic else in_shape[a] for a in range(rank)]
    return Plan(axes, list(in_shape), out, scale, rois)


# ---------------------------------------------------------------- Relax

def emit(bb, x, resize: Plan, mode: Mode):
    """The resized tensor: one gather-multiply-sum per axis whose size or sampling changes."""
    from tvm import relax

    dtype = str(x.ty.dtype)
    gather_only = mode.mode == "nearest"
    compute = dtype if gather_only or dtype in ("float32", "float64") else \
        "float32" if dtype.startswith(("float", "bfloat")) else "float64"
    y = x if compute == dtype else bb.normalize(relax.op.astype(x, compute))
    shape = list(resize.in_shape)
    rank = len(shape)
    for axis in reversed(resize.axes):
        in_len, out_len = shape[axis], resize.out_shape[axis]
        if not isinstance(in_len, int):
            continue  # a symbolic dim is never resized (plan)
        indices, weights, outside = axis_taps(in_len, out_len, resize.scales[axis], mode, resize.rois[axis])
        single = indices.shape[1] == 1 and bool((weights == 1.0).all())
        if single and not outside.any() and out_len == in_len and (indices[:, 0] == np.arange(in_len)).all():
            continue  # this axis is not resized
        if single:
            y = bb.normalize(relax.op.take(y, relax.const(indices[:, 0]), axis))
        else:
            n = indices.shape[1]
            gathered = relax.op.take(y, relax.const(indices.reshape(-1)), axis)
            split = shape[:axis] + [out_len, n] + shape[axis + 1:]
            gathered = relax.op.reshape(gathered, split)
            w = relax.const(weights.reshape([out_len, n] + [1] * (rank - axis - 1)).astype(compute))
            y = bb.normalize(relax.op.sum(relax.op.multiply(gathered, w), axis=[axis + 1]))
        if outside.any():
            mask = relax.const(outside.reshape([out_len] + [1] * (rank - axis - 1)))
            fill = relax.const(np.array(mode.extrapolation).astype(compute))
            y = bb.normalize(relax.op.where(mask, fill, y))
        shape[axis] = out_len
    if compute == dtype:
        return y
    if dtype.startswith(("int", "uint")):  # saturated, then truncated (onnx's reference and ONNX Runtime)
        info = np.iinfo(dtype)
        y = relax.op.clip(y, float(info.min), float(info.max))
    return relax.op.astype(y, dtype)


# ---------------------------------------------------------------- the converters

def attr_text(attr: dict, name: str, default: str) -> str:
    value = attr.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def static_dims(x) -> Optional[list]:
    """The dims of `x`: ints, or PrimExprs where symbolic; None when its shape is unknown."""
    shape = getattr(getattr(x, "ty", None), "shape", None)
    if shape is None:
        return None
    return [int(d.value) if hasattr(d, "value") and isinstance(d.value, int) else d for d in shape.values]


def constant_input(value, params) -> Optional[np.ndarray]:
    """The numpy value of a constant input; None for an absent or empty one; raises for a computed one."""
    import tvm
    from tvm.relax.frontend.onnx import onnx_frontend

    if value is None:
        return None
    value = onnx_frontend.get_constant(value, params)
    if not isinstance(value, tvm.ir.GenericConst):
        raise NotConstant
    array = value.value.numpy().reshape(-1)
    return array if array.size else None


class NotConstant(Exception):
    pass


def tvm_is_exact(in_shape: list[int], resize: Plan, mode: Mode, attr: dict, scales_given: bool) -> bool:
    """Whether TVM's converter computes this resize exactly: the last two or three axes of a 3- to 5-D tensor,
    ONNX's scale equal to the size ratio, and no attribute it ignores."""
    rank = len(in_shape)
    spatial = range(2, rank)
    if rank not in (3, 4, 5) or mode.antialias or "axes" in attr:
        return False
    if any(resize.out_shape[a] is not in_shape[a] and resize.out_shape[a] != in_shape[a] for a in (0, 1)) or \
            any(not isinstance(in_shape[a], int) for a in spatial):
        return False
    if attr_text(attr, "keep_aspect_ratio_policy", "stretch") != "stretch":
        return False
    if mode.coordinate not in ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                               "tf_crop_and_resize") or mode.nearest == "simple":
        return False
    for a in spatial:
        if resize.out_shape[a] < 2 and mode.coordinate in ("align_corners", "tf_crop_and_resize"):
            return False  # TVM divides by out - 1
        if scales_given and float(resize.scales[a]) != resize.out_shape[a] / in_shape[a]:
            return False
    return True
