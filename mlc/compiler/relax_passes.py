"""Relax-level passes, run in the TVM worker between the ONNX import and tvm.compile.

Each pass is `fn(mod, config, target) -> mod`. tvm.compile then runs its own pipeline: on CPU
(TVM's generic "default" pipeline) that is LegalizeOps plus lowering, with no fusion, so fuse_ops
here is the only fusion; on GPU it is the target's pipeline, which legalizes and fuses again
(a no-op on an already fused module) and schedules with dlight."""

from __future__ import annotations

import math
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from mlc.compiler.contract import Note, NoteKind
from mlc.passes.onnx import changes
from mlc.passes.registry import REGISTRY
from mlc.compiler.mutators import rewrite_functions, static_shape


def _lift_matmul_weights(func):
    """Constant matmul weights and add operands (biases) as new parameters, one per distinct constant."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    matmul, add, lifted = tvm.ir.Op.get("relax.matmul"), tvm.ir.Op.get("relax.add"), {}

    def lift(const):
        var = next((v for v, c in lifted.items() if c.same_as(const)), None)
        if var is None:
            var = relax.Var(f"mlc_lifted{len(lifted)}", const.ty)
            lifted[var] = const
        return var

    @mutator
    class Lift(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(matmul) or call.op.same_as(add):
                args = [lift(a) if isinstance(a, tvm.ir.GenericConst) and (k == 1 or call.op.same_as(add)) else a
                        for k, a in enumerate(call.args)]
                return relax.Call(call.op, args, call.attrs)
            return call

    body = Lift().visit_expr(func.body)
    return relax.Function(list(func.params) + list(lifted), body, func.ret_ty, func.is_pure, func.attrs), lifted


def _has_parallel_matmuls(func, least: int) -> bool:
    """Whether `least` matmuls read the same left-hand side (lifting is slow on big graphs: skip it otherwise)."""
    import tvm
    from tvm import relax

    matmul, lhs = tvm.ir.Op.get("relax.matmul"), Counter()

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(matmul) and isinstance(expr.args[1], tvm.ir.GenericConst):
            lhs[expr.args[0]] += 1

    relax.analysis.post_order_visit(func.body, visit)
    return any(n >= least for n in lhs.values())


def _concat_constants(mod):
    """concat of constants (the combined weights and biases) done in numpy: FoldConstant compiled and ran a TVM kernel
    per distinct shape for them (bert-base: 2 of the pass's 2.5 s). The same bytes either way."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    concat = tvm.ir.Op.get("relax.concat")

    @mutator
    class Fold(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            parts = call.args[0].fields if call.op.same_as(concat) and isinstance(call.args[0], relax.Tuple) else []
            if not parts or not all(isinstance(p, tvm.ir.GenericConst) for p in parts) or call.attrs.axis is None:
                return call
            return relax.const(np.concatenate([p.value.numpy() for p in parts], axis=int(call.attrs.axis)))

    return rewrite_functions(Fold(mod), mod)


def combine_parallel_matmul(mod, config: dict, target):
    """TVM's CombineParallelMatmul only matches weights that are function parameters, and the
    importer makes them constants: lift them to parameters, combine, bind them back, fold the
    concatenated weights into one constant."""
    import tvm
    from tvm import relax

    least = int(config.get("min_branches", 2))
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or not _has_parallel_matmuls(func, least):
            continue
        lifted_func, lifted = _lift_matmul_weights(func)
        if not lifted:
            continue
        lifted_mod = tvm.IRModule({gv.name_hint: lifted_func})
        lifted_mod = relax.transform.CombineParallelMatmul(
            lambda _lhs, rhs, _bias, _bindings: len(rhs) >= least)(lifted_mod)
        lifted_mod = _concat_constants(relax.transform.BindParams(gv.name_hint, dict(lifted))(lifted_mod))
        # TVM keeps the @mutator instance, whose closure holds this dict: emptied, the replaced weights can be freed
        # (bert-base's worker held 376 MB of them through the build)
        lifted.clear()
        mod = mod.clone()  # the caller's module stays as it was
        mod[gv] = relax.transform.FoldConstant()(lifted_mod)[gv.name_hint]
    return mod


def mixed_precision(mod, config: dict, target):
    from tvm import relax

    if config.get("dtype") == "bfloat16":
        return gpu_bf16(mod)
    return relax.transform.ToMixedPrecision(out_dtype=config.get("out_dtype", "float32"))(mod)


def gpu_bf16(mod):
    """GPU --precision bf16: what ToMixedPrecision does for fp16 (it knows no other type), with every float16 it
    made as bfloat16: the same ops in reduced precision with float32 accumulation, at fp32's range. Raises where a
    float16 is left (an op this rewrite does not know), so the build falls back to fp32 with a note."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    astype = tvm.ir.Op.get("relax.astype")

    @mutator
    class Retype(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(astype) and str(call.attrs.dtype) == "float16":
                return relax.op.astype(call.args[0], "bfloat16")
            return call

    mod = mixed_precision(mod, {"out_dtype": "float32"}, None)
    mod = rewrite_functions(Retype(mod), mod)
    left = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: left.extend(
                [e] if str(getattr(getattr(e, "ty", None), "dtype", "")) == "float16" else []))
    if left:
        raise ValueError(f"{len(left)} float16 values left after the bf16 rewrite")
    return mod


def bf16_matmul(mod, config: dict, target):
    """matmul (dense, batch matmul) and conv2d (groups 1, or groups the bf16 tile fits: `_bf16_groups`) with a
    constant weight on float32 -> bf16 inputs and weights with a float32 result: the kernels accumulate in float32
    (mlc's CPU schedule runs them on AVX512-BF16's vdpbf16ps), and everything else (normalisations, softmax,
    reductions, elementwise, and matmuls of two activations that the bf16 tile does not fit: `_bf16_activations`)
    stays float32. Constant weights are cast at compile time (FoldConstant). A conv is shaped for the bf16 register
    tile: an even depth (`_shallow_input`), and output channels and a row count the tile fits
    (`_conv_tile_padding`). On a target with AMX-BF16 only the matmuls and convs AMX's tiles take go to bf16
    (`_amx_row_padding`, `_amx_conv_dims`): there vdpbf16ps ran slower than float32 (one Sapphire Rapids core:
    resnet50 82 ms against 63, bert-base s128 244 against 183)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from mlc.compiler import amx

    matmul, conv2d = tvm.ir.Op.get("relax.matmul"), tvm.ir.Op.get("relax.nn.conv2d")
    amx_bf16 = target is not None and target.kind.name == "llvm" and amx.has_amx(target, amx.BF16)

    def f32(expr) -> bool:
        return str(getattr(expr.ty, "dtype", "")) == "float32"

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            is_conv = call.op.same_as(conv2d) and (int(call.attrs.groups) == 1 or _bf16_groups(call))
            if not (call.op.same_as(matmul) or is_conv) or not all(f32(a) for a in call.args[:2]):
                return call
            if not isinstance(call.args[1], tvm.ir.GenericConst) and not _bf16_activations(call):
                return call
            if call.op.same_as(matmul):
                bf16 = _bf16_matmul(call, amx_bf16)
                return call if bf16 is None else bf16
            if amx_bf16 and (int(call.attrs.groups) != 1 or not _amx_conv_dims(call, target, amx.BF16)):
                return call  # not for AMX: float32
            return _bf16_conv(call, amx_bf16)

    mod = relax.transform.FoldConstant()(mod)  # weights as constants (transposes folded)
    mod = relax.transform.FoldConstant()(rewrite_functions(Rewrite(mod), mod))
    return _conv_inputs_in_bf16(mod)


def _bf16_matmul(call, amx_bf16: bool):
    """bf16_matmul's matmul in bf16 (its rows padded for AMX where the target has AMX-BF16), or None where it stays
    float32."""
    from tvm import relax

    x, weight = (relax.op.astype(v, "bfloat16") for v in call.args[:2])
    rows, extra = _amx_row_padding(call) if amx_bf16 else (0, 0)
    if rows is None and not _few_rows(call):  # not for AMX: float32
        return None
    if not extra:
        return relax.op.matmul(x, weight, out_dtype="float32")
    axis = len(static_shape(call)) - 2
    out = relax.op.matmul(relax.op.nn.pad(x, [0] * (2 * axis) + [0, extra, 0, 0]), weight, out_dtype="float32")
    return relax.op.strided_slice(out, axes=[axis], begin=[0], end=[rows])


def _bf16_conv(call, amx_bf16: bool):
    """bf16_matmul's conv in bf16, shaped for the bf16 register tile; for AMX (`amx_bf16`) as it is: the tiles pad
    rows and channels their own way (convs_as_rows, whose crops sink_crops moves below the epilogue; this one's
    crop would be one more between)."""
    from tvm import relax

    at = call.attrs
    (width, extra_rows), (channels, extra_channels) = ((0, 0), (0, 0)) if amx_bf16 else _conv_tile_padding(call)
    if int(at.groups) > 1:  # per group, by grouped_conv.pad_group_channels
        extra_channels = 0
    padding = [int(p) for p in at.padding]
    padding[3] += extra_rows * int(at.strides[1])
    x, weight, padding = _shallow_input(*call.args[:2], at, padding)
    if extra_channels:
        weight = _pad_axis(weight, str(at.kernel_layout).index("O"), extra_channels)
    conv = relax.op.nn.conv2d(relax.op.astype(x, "bfloat16"), relax.op.astype(weight, "bfloat16"),
                              strides=at.strides, padding=padding, dilation=at.dilation, groups=at.groups,
                              data_layout=at.data_layout, kernel_layout=at.kernel_layout,
                              out_layout=at.out_layout, out_dtype="float32")
    sliced = [(str(at.out_layout).index(axis), end) for axis, end, extra in
              (("W", width, extra_rows), ("C", channels, extra_channels)) if extra]
    if sliced:
        axes, ends = zip(*sliced)
        conv = relax.op.strided_slice(conv, axes=list(axes), begin=[0] * len(axes), end=list(ends))
    return conv


def _amx_row_padding(call) -> tuple[Optional[int], int]:
    """(rows, zero rows to add) for a matmul x[.., M, K] x constant W[K, N] that AMX's bf16 tiles take, M padded to
    whole row blocks (a ViT's 197 tokens) in the graph, as mlc.compiler.amx pads bf16 rows; (None, 0) for a matmul
    they do not take."""
    from mlc.compiler import amx

    x, weight = (static_shape(a) for a in call.args[:2])
    if x is None or weight is None or len(weight) != 2 or len(x) < 2:
        return None, 0
    (rows, depth), (_, columns) = x[-2:], weight
    extra = -rows % amx.ROWS
    fits = depth % amx.BF16.depth == 0 and columns % amx.COLS == 0 \
        and amx.pays(amx.BF16, math.prod(x) * columns, depth) and rows + extra <= amx.MAX_PADDED_ROWS * rows
    return (rows, extra) if fits else (None, 0)


def _few_rows(call) -> bool:
    """A matmul of a constant weight and fewer rows than AMX's blocks (a classifier's fully connected layers at batch
    1), whose time is the weight's bytes, which bf16 halves; or rows known only at run time (a symbolic batch)."""
    import tvm

    from mlc.compiler import amx

    x = static_shape(call.args[0])
    return isinstance(call.args[1], tvm.ir.GenericConst) and (x is None or math.prod(x[:-1]) < amx.ROWS)


def _bf16_activations(call) -> bool:
    """A matmul of two activations (attention's Q x K^T and P x V) whose matrices have static shapes (a batch may
    be symbolic), an even depth and whole vectors of columns (`pad_attention` pads a ViT's 197 keys): the bf16
    register tile fits, and the schedule packs the right operand's pairs at run time. Others stay fp32: a bf16
    kernel the tile does not fit computes in fp32 after casts, slower than fp32."""
    matrices = [_static_matrix(a) for a in call.args[:2]]
    return all(matrices) and matrices[1][0] % 2 == 0 and matrices[1][1] % _target_lanes() == 0


def _static_matrix(expr) -> Optional[tuple[int, int]]:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    try:
        rows, columns = (int(d) for d in shape.values[-2:])
    except (AttributeError, TypeError, ValueError):
        return None
    return rows, columns


def _conv_inputs_in_bf16(mod):
    """A float32 activation that a conv reads as bf16 and other ops read too (a resnet's block output: its skip
    add; an inception block's concatenation: its pools) is kept in bf16 only, so the kernel that makes it writes
    half the bytes and the others read it widened. Convs only: a transformer's hidden states feed its layer norms
    and residuals, where bf16 storage would add up (OpenVINO's bf16 does this for CNNs too)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    conv2d, astype = tvm.ir.Op.get("relax.nn.conv2d"), tvm.ir.Op.get("relax.astype")

    def is_call(expr, op) -> bool:
        return isinstance(expr, relax.Call) and expr.op.same_as(op)

    def to_bf16(expr) -> bool:
        return is_call(expr, astype) and str(expr.attrs.dtype) == "bfloat16" \
            and str(getattr(expr.args[0].ty, "dtype", "")) == "float32"

    users: dict = {}  # var -> the values of the bindings that read it
    casts: dict = {}  # x -> the bindings y = astype(x, bf16) that a conv reads
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        bindings = [b for block in getattr(func.body, "blocks", []) for b in block.bindings]
        for b in bindings:
            for var in relax.analysis.free_vars(b.value):
                users.setdefault(var, []).append(b)
        for b in bindings:
            if to_bf16(b.value) and isinstance(b.value.args[0], relax.DataflowVar) \
                    and any(is_call(u.value, conv2d) for u in users.get(b.var, [])):
                casts.setdefault(b.value.args[0], []).append(b.var)
    # Read by more than one op (else the cast fuses into the kernel that makes x), none a function output
    stored = {x: ys for x, ys in casts.items()
              if len(users[x]) > 1 and all(isinstance(u.var, relax.DataflowVar) for u in users[x])}
    if not stored:
        return mod
    dropped = {y: x for x, ys in stored.items() for y in ys}
    narrow: dict = {}  # x -> its one bf16 copy

    @mutator
    class Store(PyExprMutator):
        def visit_var_binding_(self, binding):
            if binding.var in dropped:
                self.set_var_remap(binding.var, narrow[dropped[binding.var]])
                return
            if binding.var not in stored:
                super().visit_var_binding_(binding)
                return
            x = self.builder_.emit(self.visit_expr(binding.value))
            narrow[binding.var] = self.builder_.emit(relax.op.astype(x, "bfloat16"))
            self.set_var_remap(binding.var, self.builder_.emit(relax.op.astype(narrow[binding.var], "float32")))

    return rewrite_functions(Store(mod), mod)


def _target_lanes() -> int:
    """fp32 lanes of the current target's vector (x86's 16 where none is set)."""
    import tvm

    from mlc.compiler.schedule_rules import vector_lanes

    target = tvm.target.Target.current(allow_none=True)
    return vector_lanes(target) if target is not None else 16


def _bf16_groups(call) -> bool:
    """A grouped conv the bf16 register tile runs per group (schedule_rules `_split_groups`): an even depth per
    group (vdpbf16ps's pairs) and a group of whole vectors, or one grouped_conv pads to them, or (x86) of a narrower
    vector vdpbf16ps also has (ymm/xmm: resnext's groups of 8 and 4 channels); not depthwise-like convs (fewer
    channels a group), whose tile has no bf16 instruction."""
    from mlc.compiler.grouped_conv import padded_group_width
    from mlc.compiler.schedule_rules import narrow_lanes

    weight, at = call.args[1], call.attrs
    layout, groups = str(at.kernel_layout), int(at.groups)
    try:
        depth, channels = int(weight.ty.shape[layout.index("I")]), int(weight.ty.shape[layout.index("O")])
    except (TypeError, ValueError, AttributeError):
        return False
    lanes = _target_lanes()
    width = channels // groups
    narrow = lanes == 16 and narrow_lanes(width, lanes) is not None  # vdpbf16ps on 8 or 4 lanes (ARM: 4 only)
    return depth % 2 == 0 and channels % groups == 0 and (width % lanes == 0 or padded_group_width(width, lanes)
                                                          or narrow)


def _conv_tile_padding(call) -> tuple[tuple[int, int], tuple[int, int]]:
    """((output width, extra columns), (output channels, extra channels)) for the bf16 register tile, which
    takes no predicated tail (tensorize), computed on zero padding and sliced off:
    - channels no multiple of the vector (x86: 16 floats) ran as fp32 arithmetic on bf16 values in 8-float vectors
      (squeezenet1_0's 512 -> 1000 classifier at 49 % of the bf16 peak); to two vectors where that adds at most
      1/16 of the work (1000 -> 1024), so the tile is two vectors wide;
    - output rows (the width) that the tile does not divide (71: inception_v3's 80 -> 192 3x3 conv; 17: its 1x7
      convs) ran without vdpbf16ps or on a narrower tile.
    The vector is the current target's (ARM's bfdot: 4 floats, whose tile has 6 rows at most)."""
    from mlc.compiler.schedule_rules import tile_row_padding

    sizes = _out_width_channels(call)
    if sizes is None:
        return (0, 0), (0, 0)
    width, channels = sizes
    lanes = _target_lanes()
    extra_channels = -channels % lanes
    if 16 * (-channels % (2 * lanes)) <= channels:  # two vectors for at most 1/16 more work
        extra_channels = -channels % (2 * lanes)
    return (width, tile_row_padding(channels + extra_channels, width, lanes)), (channels, extra_channels)


def _out_width_channels(call) -> Optional[tuple[int, int]]:
    """A conv's static output width and channels, from its out_layout; None where either is symbolic or absent."""
    shape = getattr(call.ty, "shape", None)
    layout = str(call.attrs.out_layout)  # Relax fills it from data_layout when not given
    if shape is None or "W" not in layout or "C" not in layout:
        return None
    try:
        return int(shape[layout.index("W")]), int(shape[layout.index("C")])
    except (TypeError, ValueError):  # symbolic
        return None


def _pointwise_matmul(x_rows, weight, height: int, width: int, out_dtype: str):
    """out[n, h, w, o] = sum_k x_rows[n, h * width + w, k] * weight[k, o]: a 1x1 conv reading its NHWC input as rows
    (the same memory), so the schedule can merge (h, w) into the one row axis AMX tiles span."""
    from tvm import te

    k = te.reduce_axis((0, x_rows.shape[2]), "k")
    return te.compute((x_rows.shape[0], height, width, weight.shape[1]),
                      lambda n, h, w, o: te.sum(x_rows[n, h * width + w, k].astype(out_dtype)
                                                * weight[k, o].astype(out_dtype), axis=k), name="pointwise_matmul")


def _tap_matmul(phases, weight, height: int, width: int, out_dtype: str):
    """out[n, h, w, o] = sum_{i, j, k} phases[n, i % s, s * (h * width + w) + (i // s) * s * width + j, k]
    * weight[i, j, k, o]: a KxK conv of stride s over its zero-padded NHWC input of s * width columns, its
    rows dealt into s phases (input row s * r + q is row r of phase q) and each phase read as rows of pixels. An
    output pixel's taps are then rows a fixed offset after the pixel at s times its own index, so merged (h, w) is a
    row axis AMX tiles span (at a row stride of s pixels), and each tap a shifted dense layer; the columns past the
    conv's output width are computed and cropped. At stride 1 there is one phase, the image itself."""
    from tvm import te

    stride = int(phases.shape[1])
    i, j, k = (te.reduce_axis((0, weight.shape[a]), n) for a, n in enumerate("ijk"))
    return te.compute((phases.shape[0], height, width, weight.shape[3]),
                      lambda n, h, w, o: te.sum(
                          phases[n, i % stride, stride * (h * width + w) + i // stride * stride * width + j,
                                 k].astype(out_dtype) * weight[i, j, k, o].astype(out_dtype), axis=[i, j, k]),
                      name="tap_matmul")


def _padded_rows(out_height: int, width: int) -> tuple[int, int]:
    """The fewest (rows, width) of a tap conv's computed output, at least (out_height, width), whose pixel count
    AMX's row blocks divide: their extra rows and columns are zero padding, computed and cropped."""
    from mlc.compiler import amx

    return min(((h, w) for h in range(out_height, out_height + amx.ROWS)
                for w in range(width, width + amx.ROWS) if h * w % amx.ROWS == 0), key=lambda hw: (hw[0] * hw[1], hw))


def _tap_output(call) -> tuple[int, int]:
    """A KxK conv's output rows and the least width `_tap_matmul` computes them on: its padded input's columns
    over the stride."""
    at = call.attrs
    (width,), (height,) = _dims(call.args[0], at.data_layout, "W"), _dims(call, at.out_layout, "H")
    return height, -(-(width + int(at.padding[1]) + int(at.padding[3])) // int(at.strides[1]))


def _dims(expr, layout, axes: str) -> list[int]:
    """`expr`'s static extents along `axes` of its `layout` (a conv's "NHWC", "OIHW", ...)."""
    shape, layout = static_shape(expr), str(layout)
    return [shape[layout.index(a)] for a in axes]


def _amx_conv_dims(call, target, kind=None):
    """(kind, (n, h, w, c, kh, kw, o)) of a conv (any plain layout) that `convs_as_rows` puts on the target's AMX
    tiles once in NHWC: a multiply of `kind` (from its dtypes where None: uint8 x int8 -> int32, bf16 x bf16 ->
    float32, amx.Kind); else None."""
    from mlc.compiler import amx

    at = call.attrs
    kind = kind or amx.kind_of(*(str(getattr(e.ty, "dtype", "")) for e in (*call.args[:2], call)))
    if int(at.groups) != 1 or any(int(v) != 1 for v in at.dilation) or len({int(v) for v in at.strides}) != 1 \
            or any(len(str(layout)) != 4 for layout in (at.data_layout, at.kernel_layout, at.out_layout)) \
            or None in (static_shape(e) for e in (*call.args[:2], call)) \
            or kind is None or not amx.has_amx(target, kind):
        return None
    n, h, w, c = _dims(call.args[0], at.data_layout, "NHWC")
    kh, kw, o = _dims(call.args[1], at.kernel_layout, "HWO")
    out_h, out_w = _dims(call, at.out_layout, "HW")
    # zero channels to whole tile rows and columns, in the input's padding and the weight's (a constant once
    # FoldConstant has run, as the transposed weight is)
    depth, columns = c + -c % kind.depth, o + -o % amx.COLS
    fits = depth <= amx.MAX_PADDED_CHANNELS * c and columns <= amx.MAX_PADDED_CHANNELS * o \
        and amx.pays(kind, n * out_h * out_w * kh * kw * c * o, kh * kw * depth)
    if (kh, kw) == (1, 1):
        rows, width = _pointwise_grid(kind, out_h, out_w)
        fits = fits and not any(int(p) for p in at.padding)
    else:
        rows, width = _padded_rows(*_tap_output(call))
    fits = fits and rows * width <= amx.MAX_PADDED_ROWS * out_h * out_w
    return (kind, (n, h, w, c, kh, kw, o)) if fits else None


def _nhwc(conv) -> bool:
    """Whether a conv runs in the layout `convs_as_rows` rewrites (schedules.CONV_LAYOUT's)."""
    at = conv.attrs
    return (str(at.data_layout), str(at.kernel_layout), str(at.out_layout)) == ("NHWC", "HWIO", "NHWC")


def _pointwise_grid(kind, height: int, width: int) -> tuple[int, int]:
    """The (rows, columns) of pixels a 1x1 conv of this output size is computed on: its own, whose rows an int8
    kernel pads to whole row blocks itself (pad_einsum); for bf16 `_padded_rows`, zero-padded in the graph and
    cropped (mlc.compiler.amx: bf16 rows are never padded in the kernel)."""
    from mlc.compiler import amx

    return (height, width) if kind is amx.INT8 or height * width % amx.ROWS == 0 else _padded_rows(height, width)


def _conv_phases(call, n: int, h: int, w: int, c: int, extra: int):
    """A KxK conv's input zero-padded to `_padded_rows` (s times its columns, and rows for the last taps) and by
    `extra` channels, and dealt into its stride's phases, [n, s, rows, c + extra] (`_tap_matmul`)."""
    from tvm import relax

    stride, kernel_h = int(call.attrs.strides[0]), static_shape(call.args[1])[0]
    top, left, _, _ = (int(p) for p in call.attrs.padding)
    height, width = _padded_rows(*_tap_output(call))
    # each phase's rows: the output's, those its taps reach below, and one of zeros (the last pixel's taps read up
    # to kw - 1 past its image row)
    rows = height + (kernel_h - 1) // stride + 1
    padded = relax.op.nn.pad(call.args[0], [0, 0, top, stride * rows - h - top, left, stride * width - w - left,
                                            0, extra])
    dealt = relax.op.permute_dims(relax.op.reshape(padded, [n, rows, stride, stride * width, c + extra]),
                                  [0, 2, 1, 3, 4])
    return relax.op.reshape(dealt, [n, stride, rows * stride * width, c + extra])


def convs_as_rows(mod, target):
    """uint8 x int8 and bf16 convs (groups 1, NHWC, static) whose channels fit AMX's tiles (zero-padded to whole tile
    rows and columns where that adds at most amx.MAX_PADDED_CHANNELS, the extra outputs cropped), as dense layers over
    the image's pixels on targets with AMX (mlc.compiler.amx), which schedule_rules runs on the tiles:
    - a 1x1 conv without padding reads its input as rows (`_pointwise_matmul`), a strided one the pixels it reads
      (a copy of a quarter of the image at stride 2);
    - a KxK conv reads its padded input, dealt into one phase per stride, as rows (`_tap_matmul`), computed on
      `_padded_rows` and cropped, where that padding adds at most amx.MAX_PADDED_ROWS of the output (a 7 x 7 image
      needs twice its pixels).
    `mod` itself elsewhere."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from mlc.compiler import amx

    if target.kind.name != "llvm" or not amx.has_amx(target):
        return mod
    conv2d = tvm.ir.Op.get("relax.nn.conv2d")

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            fits = _amx_conv_dims(call, target) if call.op.same_as(conv2d) and _nhwc(call) else None
            if fits is None:
                return call
            kind, (*_, c, kh, kw, o), (x, weight) = *fits, call.args
            extra, columns = -c % kind.depth, -o % amx.COLS
            if extra or columns:
                weight = self.builder_.normalize(relax.op.nn.pad(weight, [0, 0, 0, 0, 0, extra, 0, columns]))
            out = self.rows(call, x, weight, extra, kind)
            out = relax.op.strided_slice(out, axes=[3], begin=[0], end=[o]) if columns else out
            if (kh, kw) == (1, 1) and static_shape(self.builder_.normalize(out))[1:3] == static_shape(call)[1:3]:
                return out
            # assume_inbound (it is) marks the crop for sink_crops, which leaves it in a kernel of its own
            return relax.op.strided_slice(out, axes=[1, 2], begin=[0, 0], end=static_shape(call)[1:3],
                                          assume_inbound=True)

        def rows(self, call, x, weight, extra: int, kind):
            """The conv as `_pointwise_matmul` (on `_pointwise_grid`) or `_tap_matmul` on `extra` zero channels (in
            `weight` already)."""
            (n, h, w, c), (kh, kw, _, o) = static_shape(x), static_shape(weight)
            if (kh, kw) == (1, 1):
                strides = [int(v) for v in call.attrs.strides]
                if strides != [1, 1]:  # the pixels a strided 1x1 conv reads, as an image of its output's size
                    x = self.builder_.normalize(relax.op.strided_slice(x, [1, 2], [0, 0], [h, w], strides))
                    h, w = static_shape(call)[1:3]
                grid = _pointwise_grid(kind, h, w)
                if extra or grid != (h, w):
                    x = self.builder_.normalize(relax.op.nn.pad(x, [0, 0, 0, grid[0] - h, 0, grid[1] - w, 0, extra]))
                rows = self.builder_.normalize(relax.op.reshape(x, [n, math.prod(grid), c + extra]))
                weight = self.builder_.normalize(relax.op.reshape(weight, [c + extra, o]))
                return self.builder_.call_te(_pointwise_matmul, rows, weight, *grid, kind.accumulator,
                                             primfunc_name_hint="conv2d_rows")
            phases = self.builder_.normalize(_conv_phases(call, n, h, w, c, extra))
            return self.builder_.call_te(_tap_matmul, phases, weight, *_padded_rows(*_tap_output(call)),
                                         kind.accumulator, primfunc_name_hint="conv2d_taps")

    return rewrite_functions(Rewrite(mod), mod)


_ELEMENTWISE = frozenset(f"relax.{op}" for op in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "astype", "round", "floor", "ceil", "clip",
    "nn.relu", "sigmoid", "tanh", "right_shift", "left_shift"))


def _use_counts(mod) -> Counter:
    """How many times each Relax variable of `mod` is used."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprVisitor, visitor

    uses: Counter = Counter()

    @visitor
    class CountUses(PyExprVisitor):
        def visit_var_(self, var):
            uses[var] += 1

        def visit_dataflow_var_(self, var):
            uses[var] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            CountUses().visit_expr(func)
    return uses


def sink_crops(mod):
    """A strided_slice moved below the elementwise ops it feeds, op(slice(x), c) -> slice(op(x, c)), where the other
    operands do not vary along the sliced axes (a conv's bias, scales, quantisation), so that a conv computed on
    padding and cropped (`convs_as_rows`, `int8_conv_rows`) keeps its epilogue fused, and the crop copies its
    narrowest values. Only crops that keep at least half of their input: the ops run on all of it."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    strided_slice = tvm.ir.Op.get("relax.strided_slice")
    uses = _use_counts(mod)

    def uniform_along(expr, axes: list[int], rank: int) -> bool:
        if not isinstance(expr.ty, relax.TensorType):
            return not isinstance(expr.ty, relax.TupleType)  # a PrimValue (clip's bounds)
        shape = static_shape(expr)
        if shape is None:
            return False
        lead = rank - len(shape)
        return all(a < lead or shape[a - lead] == 1 for a in axes)

    def keeps_most(crop) -> bool:
        kept, whole = static_shape(crop), static_shape(crop.args[0])
        return kept is not None and whole is not None and 2 * math.prod(kept) >= math.prod(whole)

    @mutator
    class Sink(PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _ELEMENTWISE:
                return call
            for index, arg in enumerate(call.args):
                crop = self.lookup_binding(arg) if isinstance(arg, relax.Var) and uses[arg] == 1 else None
                if not isinstance(crop, relax.Call) or not crop.op.same_as(strided_slice) or not keeps_most(crop):
                    continue
                axes, rank = [int(a) for a in crop.args[1].fields], len(call.ty.shape)
                if not all(uniform_along(a, axes, rank) for i, a in enumerate(call.args) if i != index):
                    continue
                args = [crop.args[0] if i == index else a for i, a in enumerate(call.args)]
                inner = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
                sunk.append(crop)
                return relax.Call(crop.op, [inner, *crop.args[1:]], crop.attrs, crop.ty_args)
            return call

    sunk: list = []
    mod = rewrite_functions(Sink(mod), mod)
    mod = relax.transform.DeadCodeElimination()(mod) if sunk else mod
    return _crops_apart(mod) if any(gv.name_hint.startswith(("conv2d_taps", "conv2d_rows")) for gv in mod.functions) \
        else mod


def _crops_apart(mod):
    """The crops of convs computed on padding (`convs_as_rows`, marked assume_inbound) as kernels of their own
    (op_pattern opaque, which FuseOps keeps apart): fused into the conv's kernel, the epilogue read the accumulators
    through the crop, which no write-back of a 32-row block can take (its rows are no rectangle of pixels), and it ran
    after the kernel as one scalar loop over 4 bytes per output. Apart, the epilogue is elementwise on the accumulators
    and the crop copies its narrow output."""
    import tvm
    from tvm import topi
    from tvm.relax.expr_functor import PyExprMutator, mutator

    strided_slice = tvm.ir.Op.get("relax.strided_slice")

    @mutator
    class Apart(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(strided_slice) or not call.attrs.assume_inbound:
                return call
            end = static_shape(call)
            return self.builder_.call_te(lambda x: topi.strided_slice(x, [0] * len(end), end),
                                         call.args[0], primfunc_name_hint="crop", primfunc_attrs={"op_pattern": 8})

    return rewrite_functions(Apart(mod), mod)


def int8_conv_rows(mod, target):
    """uint8 x int8 convs (--quantize int8) whose output rows (the width) the register tile does not divide, computed
    on extra columns of zero padding and sliced off: vpdpbusd's tile takes no predicated tail (tensorize), and such
    a conv ran on int32 multiplies instead, no faster than fp32 (zfnet512's 5x5 conv at 25 x 25: 3.4 ms, fp32 3.3).
    The rows are padded as `_conv_tile_padding` pads a bf16 conv's, for the J `_pad_width` pads int8 channels to.
    `mod` itself on targets without AVX512-VNNI (the int32 tile takes a tail)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from mlc.compiler.int8_dot import has_vnni
    from mlc.compiler.schedule_rules import tile_row_padding, vector_lanes

    if target.kind.name != "llvm" or not has_vnni(target):
        return mod
    lanes = vector_lanes(target)
    conv2d = tvm.ir.Op.get("relax.nn.conv2d")

    def dtype(expr) -> str:
        return str(getattr(expr.ty, "dtype", ""))

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            if not call.op.same_as(conv2d) or int(call.attrs.groups) != 1 \
                    or (dtype(call.args[0]), dtype(call.args[1])) != ("uint8", "int8"):
                return call
            sizes = _out_width_channels(call)
            if sizes is None:
                return call
            (width, channels), at = sizes, call.attrs
            extra = tile_row_padding(channels + -channels % lanes, width, lanes)
            if not extra:
                return call
            padding = [int(p) for p in at.padding]
            padding[3] += extra * int(at.strides[1])
            conv = relax.op.nn.conv2d(*call.args[:2], strides=at.strides, padding=padding, dilation=at.dilation,
                                      groups=1, data_layout=at.data_layout, kernel_layout=at.kernel_layout,
                                      out_layout=at.out_layout, out_dtype=at.out_dtype)
            return relax.op.strided_slice(conv, axes=[str(at.out_layout).index("W")], begin=[0], end=[width])

    return rewrite_functions(Rewrite(mod), mod)


def _pad_axis(weight, axis: int, extra: int):
    """The constant `weight` with `extra` zero entries appended along `axis`."""
    import numpy as np
    from tvm import relax

    w = weight.value.numpy()
    pads = [(0, 0)] * w.ndim
    pads[axis] = (0, extra)
    return relax.const(np.pad(w, pads))


def _shallow_input(x, weight, attrs, padding: list[int]):
    """(input, weight, conv padding) for a conv on few input channels (an RGB stem):
    - an odd depth gets one more channel, zero in the input and the weight: vdpbf16ps takes the depth in pairs
      (the stem ran on plain fp32 arithmetic on bf16 values);
    - under 16 channels, the spatial padding moves into that pad too: the conv's own padding loop, over vectors
      straddling pixels, cost a resnet50 stem 0.65 ms of its 2.1."""
    from tvm import relax

    in_axis, layout = str(attrs.kernel_layout).index("I"), str(attrs.data_layout)
    depth = int(weight.ty.shape[in_axis])
    widths = [0] * (2 * len(layout))
    widths[2 * layout.index("C") + 1] = depth % 2
    if depth < 16:
        top, left, bottom, right = padding
        widths[2 * layout.index("H"):2 * layout.index("H") + 2] = top, bottom
        widths[2 * layout.index("W"):2 * layout.index("W") + 2] = left, right
        padding = [0, 0, 0, 0]
    if any(widths):
        x = relax.op.nn.pad(x, widths)
    if depth % 2:
        weight = _pad_axis(weight, in_axis, 1)
    return x, weight, padding


_KERNEL_LAYOUT = {"NHWC": "OHWI", "NCHW": "OIHW"}


def convert_layout(mod, config: dict, target):
    from tvm import relax

    layout = config.get("layout", "NHWC")
    mod = quantize_as_elementwise(mod)
    return relax.transform.ConvertLayout({"relax.nn.conv2d": [layout, _KERNEL_LAYOUT[layout]]})(mod)


def quantize_as_elementwise(mod):
    """Per-tensor R.quantize (--quantize's activations) as elementwise ops, clip(round(x * (1 / scale)) +
    zero_point) cast: ConvertLayout has no layout rule for R.quantize and wrapped each one in transposes back to NCHW
    and forth (an int8 resnet50 spent 30 % of its time in them); elementwise ops follow the convs' layout."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    quantize = tvm.ir.Op.get("relax.quantize")

    def scalar(expr):
        if isinstance(expr, tvm.ir.GenericConst) and expr.value.numpy().size == 1:
            return expr.value.numpy().reshape(())
        return None

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(quantize):
                return call
            scale, zero = scalar(call.args[1]), scalar(call.args[2])
            dtype = str(call.attrs.out_dtype)
            if scale is None or zero is None or "int" not in dtype:
                return call
            x = call.args[0]
            info = tvm.DataType(dtype)
            low, high = (0, 2 ** info.bits - 1) if dtype.startswith("u") else (-(2 ** (info.bits - 1)),
                                                                                2 ** (info.bits - 1) - 1)
            xdt = str(x.ty.dtype)
            # x times 1 / scale (within an ulp of x / scale): the divide was the costliest op of densenet's
            # BN-ReLU-quantise kernels and of every requantising conv epilogue
            inverse = (1 / scale.astype(np.float64)).astype(xdt)
            shifted = relax.op.add(relax.op.round(relax.op.multiply(x, relax.const(inverse, xdt))),
                                   relax.const(zero.astype(xdt), xdt))
            # maximum/minimum, not clip: ConvertLayout has no layout rule for clip either
            clipped = relax.op.minimum(relax.op.maximum(shifted, relax.const(low, xdt)), relax.const(high, xdt))
            return relax.op.astype(clipped, dtype)

    return rewrite_functions(Rewrite(mod), mod)


def _keep_nan(fn):
    """`fn` (an elementwise TE function) with NaN inputs passed through: TVM's polynomials clamp
    their input first, and a clamp is a max/min, which returns the bound for NaN."""
    from tvm import te, tirx

    def wrapped(x, *args):  # isnan, not x != x: TVM's simplifier folds x != x to false
        y = fn(x, *args)
        return te.compute(x.shape, lambda *i: tirx.Select(tirx.isnan(x(*i)), x(*i), y(*i)), name="keep_nan")

    return wrapped


def _fast_sigmoid(x):
    from tvm import topi

    return topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x))))


def _along(x, axis, reduce, name):
    """`reduce` (te.max, te.sum) of `x` along `axis`, and a function giving, for an index of `x`, that index's
    entry of the result."""
    from tvm import te

    axis = axis + len(x.shape) if axis < 0 else axis
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    rest = [d for i, d in enumerate(x.shape) if i != axis]
    result = te.compute(rest, lambda *i: reduce(x[tuple(i[:axis]) + (k,) + tuple(i[axis:])], axis=k), name=name)
    return lambda i: result[tuple(v for j, v in enumerate(i) if j != axis)]


def _softmax_exp(x, axis):
    """exp(x - max(x)) along `axis`, NaN-preserving (a row holding a NaN is NaN, as in ONNX Runtime): softmax's
    first kernel."""
    from tvm import te, topi

    max_elem = _along(x, axis, te.max, "T_softmax_maxelem")
    delta = te.compute(x.shape, lambda *i: x[i] - max_elem(i), name="T_softmax_delta")
    return _keep_nan(topi.fast_exp)(delta)


def _softmax_normalize(e, axis):
    """e / sum(e) along `axis`: softmax's second kernel."""
    from tvm import te

    total = _along(e, axis, te.sum, "T_softmax_expsum")
    return te.compute(e.shape, lambda *i: e[i] / total(i), name="T_softmax_norm")


def _relu(x):
    """max(0, x), constant first: LLVM gets `0 > x ? 0 : x`, which passes NaN (max(x, 0) does not)."""
    from tvm import te, tirx

    zero = tirx.const(0, x.dtype)
    return te.compute(x.shape, lambda *i: te.max(zero, x(*i)), name="compute")


def _clip(x, lo, hi):
    from tvm import te, tirx

    lo, hi = tirx.Cast(x.dtype, lo), tirx.Cast(x.dtype, hi)
    return te.compute(x.shape, lambda *i: te.min(hi, te.max(lo, x(*i))), name="compute")


def _extremum(pick, scalar_pick):
    def fn(a, b):
        from tvm import te, topi

        tensor, scalar = (a, b) if hasattr(a, "shape") else (b, a)
        if not hasattr(scalar, "shape"):
            # a constant (never NaN: _scalar_constant) first: LLVM's `c > x ? c : x` passes a NaN x, and x is read
            # once (the isnan select below read it three times, and inlined into a fused kernel each copy was
            # computed again: an LRN under --quantize's clamp took 13x its time)
            return te.compute(tensor.shape, lambda *i: scalar_pick(scalar, tensor(*i)), name="compute")
        out = pick(a, b)
        for operand in (b, a):  # a NaN in either operand is the result, a's first (ONNX Runtime's Max/Min)
            if hasattr(operand, "shape"):
                out = topi.where(topi.isnan(operand), topi.broadcast_to(operand, out.shape), out)
        return out

    return fn


def _scalar_constant(expr):
    """A 0-d constant that is not NaN as a TIR immediate (as TVM's own legalization of binary ops does), else
    `expr`: read from a 0-d buffer, a max/min is a broadcast kernel, and FuseOps fuses only elementwise kernels
    into a conv's epilogue (--quantize's clamp after every conv was a kernel of its own)."""
    import math

    import tvm

    if not isinstance(expr, tvm.ir.GenericConst) or expr.ty.ndim != 0:
        return expr
    value, dtype = expr.value.numpy()[()].item(), str(expr.ty.dtype)
    if isinstance(value, float) and math.isnan(value):
        return expr
    return tvm.tirx.const(value, dtype)


def _is_float(expr) -> bool:
    return str(getattr(expr.ty, "dtype", "")).startswith(("float", "bfloat"))


def nan_preserving_legalizations() -> dict:
    """LegalizeOps overrides (op name -> legalize function) for relu, clip, maximum and minimum on
    floats that keep NaN where ONNX Runtime and torch keep it. TVM's versions are max/min, which
    LLVM emits as `a > b ? a : b`: max(NaN, 0) is 0, so a NaN disappeared behind a Relu."""
    from tvm import te, topi

    def relu(bb, call):
        if not _is_float(call.args[0]):
            return bb.call_te(topi.nn.relu, call.args[0])
        return bb.call_te(_relu, call.args[0], primfunc_name_hint="relu")

    def clip(bb, call):
        if not _is_float(call.args[0]):
            return bb.call_te(topi.clip, call.args[0], call.args[1], call.args[2], primfunc_name_hint="tir_clip")
        return bb.call_te(_clip, call.args[0], call.args[1], call.args[2], primfunc_name_hint="tir_clip")

    def binary_op(pick, scalar_pick, name):
        def legalize(bb, call):
            a, b = call.args[0], _scalar_constant(call.args[1])
            if b is call.args[1]:
                a = _scalar_constant(a)
            if not _is_float(call):
                return bb.call_te(pick, a, b)
            return bb.call_te(_extremum(pick, scalar_pick), a, b, primfunc_name_hint=name)

        return legalize

    return {"relax.nn.relu": relu, "relax.clip": clip,
            "relax.maximum": binary_op(topi.maximum, te.max, "maximum"),
            "relax.minimum": binary_op(topi.minimum, te.min, "minimum")}


def _power_as_products(call):
    """x ** 2 and x ** 3 (GPT-2's tanh GELU, T5's RMS norm) as products: TVM lowers power to a scalar powf call per
    element, which keeps the loop from vectorizing."""
    import tvm
    from tvm import relax

    x, exponent = call.args
    if not isinstance(exponent, tvm.ir.GenericConst) or exponent.value.numpy().size != 1 \
            or len(exponent.ty.shape) > len(x.ty.shape):
        return call
    value = float(exponent.value.numpy().reshape(()))
    if value == 2:
        return relax.op.multiply(x, x)
    if value == 3:
        return relax.op.multiply(relax.op.multiply(x, x), x)
    return call


# Ops allowed between attention's scores and its softmax (a scale, a mask), with the value that pads their operand
_SCORE_OPS = {"relax.add": 0.0, "relax.subtract": 0.0, "relax.multiply": 0.0, "relax.divide": 1.0}


def _padded_keys(scores, keys: int, padded: int, pad_value: float):
    """`scores` (..., keys) zero-padded to `padded` columns; a scalar or a column-broadcast operand as it is."""
    from tvm import relax

    shape = static_shape(scores)
    if shape is None:
        return None
    if not shape or shape[-1] == 1:
        return scores
    if shape[-1] != keys:
        return None
    return relax.op.nn.pad(scores, [0, 0] * (len(shape) - 1) + [0, padded - keys], pad_value=pad_value)


def _score_chain(bound, scores):
    """(the matmul under softmax's input `scores`, the ops between them, outermost first), or None. `bound(expr,
    names)`: the call bound to `expr` if it is one of `names`. An int8 matmul's (--quantize) chain holds its
    zero-point correction (subtract) and its cast to float32 (astype, kept as its dtype)."""
    chain = (*_SCORE_OPS, "relax.astype", "relax.matmul")
    ops, call = [], bound(scores, chain)
    while call is not None and call.op.name != "relax.matmul":
        if call.op.name == "relax.astype":
            ops.append((call.op.name, str(call.attrs.dtype)))
            call = bound(call.args[0], chain)
            continue
        x, other = call.args
        if call.op.name in ("relax.add", "relax.multiply") and bound(x, chain) is None:
            x, other = other, x  # the operand the chain continues through comes second
        ops.append((call.op.name, other))
        call = bound(x, chain)
    return None if call is None else (call, ops)


def _padded_attention(matmul, ops, values, keys: int, padded: int, quantize=None, out_dtype=None):
    """softmax(matmul [ops]) @ values with the keys zero-padded to `padded` and their scores masked with -inf;
    None where an op's operand cannot be padded. `quantize`: the call that quantises the probabilities (--quantize
    int8: the padded ones quantise to the zero point 0, and their rows of `values` are 0 anyway)."""
    import numpy as np
    from tvm import relax

    scores = relax.op.matmul(matmul.args[0], _padded_keys(matmul.args[1], keys, padded, 0.0),
                             out_dtype=matmul.attrs.out_dtype)
    for name, other in reversed(ops):
        if name == "relax.astype":
            scores = relax.op.astype(scores, other)
            continue
        other = _padded_keys(other, keys, padded, _SCORE_OPS[name])
        if other is None:
            return None
        scores = getattr(relax.op, name.removeprefix("relax."))(scores, other)
    mask = np.zeros(padded, "float32")
    mask[keys:] = -np.inf
    probs = relax.op.nn.softmax(relax.op.add(scores, relax.const(mask)), axis=-1)
    if quantize is not None:
        probs = relax.op.quantize(probs, *quantize.args[1:], axis=int(quantize.attrs.axis),
                                  out_dtype=str(quantize.attrs.out_dtype))
    rank = len(values.ty.shape)
    return relax.op.matmul(probs, relax.op.nn.pad(values, [0, 0] * (rank - 2) + [0, padded - keys, 0, 0]),
                           out_dtype=out_dtype)


def pad_attention(mod, config: dict, target):
    """softmax(A @ B [scale, mask]) @ V over a static key count that is no multiple of the vector width (a ViT's 197
    tokens) -> the keys zero-padded to the next multiple (B's columns, V's rows) and the padded scores masked with
    -inf, so softmax gives them exactly 0 and the result is unchanged. Every kernel of the attention then runs whole
    vectors: with 197 keys the scores' kernel padded B to 224 columns and copied it, P @ V copied P to pad its rows,
    and softmax ran a scalar tail (deit_tiny's attention: 0.73x the time; benchmarks/attention).
    Not applied where the softmax's result is used elsewhere too (it would then be computed twice)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    lanes = _target_lanes()

    @mutator
    class Rewrite(PyExprMutator):
        def bound(self, expr, names):
            value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
            ok = isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in names
            return value if ok else None

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul":
                return call
            probs, values = call.args
            quantize = self.bound(probs, ("relax.quantize",))  # --quantize int8: P x V on uint8 x int8
            softmax = self.bound(probs if quantize is None else quantize.args[0], ("relax.nn.softmax",))
            shape = static_shape(values)
            if softmax is None or shape is None or len(shape) < 2 \
                    or str(values.ty.dtype) != ("float32" if quantize is None else "int8") \
                    or int(softmax.attrs.axis) not in (-1, len(shape) - 1):
                return call
            keys = shape[-2]
            found = _score_chain(self.bound, softmax.args[0])
            if keys % lanes == 0 or keys < 4 * lanes or found is None \
                    or (static_shape(found[0].args[1]) or [None])[-1] != keys:
                return call
            padded = _padded_attention(*found, values, keys, -(-keys // lanes) * lanes, quantize,
                                       call.attrs.out_dtype)
            return call if padded is None else padded

    before = op_counts(mod)
    rewritten = relax.transform.DeadCodeElimination(["main"])(rewrite_functions(Rewrite(mod), mod))
    after = op_counts(rewritten)
    return rewritten if all(after[op] <= before[op] for op in ("nn.softmax", "matmul")) else mod


def pad_depthwise_channels(mod, config: dict, target):
    """A float32 depthwise conv2d over a static channel count no vector fits (NASNet's 11, 22 and 42:
    `schedule_rules.no_vector_fits`) that feeds a conv2d (a separable conv's pointwise half) -> both on channels
    zero-padded to whole vectors: the depthwise conv's input padded with zero channels and its weight with zero
    filters, the next conv's weight with zero input channels, so the result is unchanged and nothing is sliced. A conv
    is no einsum, so the schedule cannot pad it in the kernel: it ran a scalar loop
    (benchmarks/cnn-kernels/odd_channels.py). Slicing the padded channels off instead put a slice in the conv's
    write-back, and TVM 0.27 then drops the write-back's row bound (a row tail wrote past the output). NCHW, constant
    OIHW weights; the batch and spatial dims may be symbolic. Not applied where the depthwise output is used
    elsewhere too (it would be computed twice)."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from mlc.compiler.schedule_rules import no_vector_fits

    lanes = _target_lanes()

    def plain_conv(call) -> bool:
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d":
            return False
        shape, attrs = getattr(call.args[0].ty, "shape", None), call.attrs
        return (isinstance(call.args[1], tvm.ir.GenericConst) and shape is not None and len(shape) == 4
                and isinstance(shape[1], tvm.tirx.IntImm) and str(call.args[0].ty.dtype) == "float32"
                and (attrs.data_layout, attrs.kernel_layout) == ("NCHW", "OIHW") and attrs.out_layout in ("", "NCHW"))

    def widened(weight, axis: int, size: int):
        values = weight.value.numpy()
        wide = np.zeros(values.shape[:axis] + (size,) + values.shape[axis + 1:], values.dtype)
        wide[(slice(None),) * axis + (slice(0, values.shape[axis]),)] = values
        return relax.const(wide)

    def conv_like(call, data, weight, groups: int):
        attrs = call.attrs
        return relax.op.nn.conv2d(data, weight, strides=attrs.strides, padding=attrs.padding, dilation=attrs.dilation,
                                  groups=groups, data_layout="NCHW", kernel_layout="OIHW", out_dtype=attrs.out_dtype)

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not plain_conv(call) or int(call.attrs.groups) != 1 or not isinstance(call.args[0], relax.Var):
                return call
            depthwise = self.lookup_binding(call.args[0])
            if not plain_conv(depthwise):
                return call
            channels = int(depthwise.args[0].ty.shape[1])
            if int(depthwise.attrs.groups) != channels or tuple(depthwise.args[1].value.shape[:2]) != (channels, 1) \
                    or not no_vector_fits(channels, lanes):
                return call
            padded = -(-channels // lanes) * lanes
            data = relax.op.nn.pad(depthwise.args[0], [0, 0, 0, padded - channels, 0, 0, 0, 0])
            wide = conv_like(depthwise, data, widened(depthwise.args[1], 0, padded), padded)
            return conv_like(call, wide, widened(call.args[1], 1, padded), 1)

    before = op_counts(mod)
    rewritten = relax.transform.DeadCodeElimination(["main"])(rewrite_functions(Rewrite(mod), mod))
    return rewritten if op_counts(rewritten)["nn.conv2d"] <= before["nn.conv2d"] else mod


def fast_math(mod, config: dict, target):
    """erf, tanh, sigmoid, exp and softmax on float32 -> TVM's polynomial versions (topi.fast_*).
    TVM's LLVM codegen calls libm's scalar erff/expf for these (tanh and sigmoid through expf),
    which keeps the loop from vectorizing: an LSTM cell's sigmoid*tanh runs 17x faster here, GELU's
    erf 50x. Measured against float64 on [-20, 20]: max abs error 3.9e-7 (libm 9e-8), exp's relative
    error 4e-6 (libm 6e-8). inf gives libm's results; NaN is passed through (the polynomials clamp their
    input, and a clamp turns NaN into the bound), and a softmax row holding a NaN is NaN."""
    import tvm
    from tvm import topi
    from tvm.relax.expr_functor import PyExprMutator, mutator

    unary = {"relax.erf": _keep_nan(topi.fast_erf), "relax.tanh": _keep_nan(topi.fast_tanh),
             "relax.exp": _keep_nan(topi.fast_exp), "relax.sigmoid": _keep_nan(_fast_sigmoid)}

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op) or str(getattr(call.ty, "dtype", "")) != "float32":
                return call
            name = call.op.name
            if name in unary:
                return self.builder_.call_te(unary[name], call.args[0], primfunc_name_hint=f"fast_{name[6:]}")
            if name == "relax.power":
                return _power_as_products(call)
            if name == "relax.nn.softmax":
                # two kernels: in one, the default schedule inlines the exp polynomial into the sum (a scalar
                # reduction) and again into the normalisation; apart, exp is computed once, vectorized
                e = self.builder_.emit(self.builder_.call_te(_softmax_exp, call.args[0], int(call.attrs.axis),
                                                             primfunc_name_hint="fast_softmax_exp"))
                return self.builder_.call_te(_softmax_normalize, e, int(call.attrs.axis),
                                             primfunc_name_hint="fast_softmax_norm")
            return call

    return rewrite_functions(Rewrite(mod), mod)


def fold_constant(mod, config: dict, target):
    from tvm import relax

    return relax.transform.FoldConstant()(mod)


def dead_code_elimination(mod, config: dict, target):
    from tvm import relax

    return relax.transform.DeadCodeElimination(["main"])(mod)


def fuse_ops(mod, config: dict, target):
    import tvm
    from tvm import relax

    from mlc.compiler.unit_reductions import fold_unit_reductions

    t = relax.transform
    # then reductions over unit axes as elementwise blocks: dlight's GPU rules inline epilogues into their init too
    return tvm.transform.Sequential([t.LegalizeOps(nan_preserving_legalizations()), t.AnnotateTIROpPattern(),
                                     t.FoldConstant(), t.FuseOps(int(config.get("fuse_opt_level", -1))),
                                     t.FuseTIR(), fold_unit_reductions()])(mod)


def op_counts(mod) -> Counter:
    """Operator calls in the module's Relax functions ("matmul", "call_tir", ...)."""
    from tvm import ir, relax

    counts: Counter = Counter()

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, ir.Op):
            counts[expr.op.name.removeprefix("relax.")] += 1

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return counts


def run(mod, steps: list[dict[str, Any]], target_json: dict, dump_dir: Optional[str] = None,
        fused_by_build: bool = False):
    """Run the Relax-level steps (Step.to_json() dicts) under the target. Returns the module and a
    report {"records": [...], "notes": [Note, ...], "error": message or None}: a pass the user named
    that fails is an error, any other failing pass is skipped with a note. `fused_by_build`: the
    build that follows (mlc.compiler.schedules' CPU pipeline) runs LegalizeOps..FuseTIR itself, so fuse_ops
    is recorded as left to it instead of fusing twice."""
    import tvm


    report: dict[str, Any] = {"records": [], "notes": [], "error": None}
    target = tvm.target.Target(target_json)
    folder = Path(dump_dir) if dump_dir else None
    if folder:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "relax_00_import.py").write_text(mod.script())
    relax_steps = [s for s in steps if s["level"] == "relax"]
    for index, step in enumerate(relax_steps, 1):
        before = op_counts(mod)
        start = time.perf_counter()
        if fused_by_build and step["name"] == "fuse_ops":
            report["records"].append({"name": "fuse_ops", "level": "relax", "status": "skipped",
                                      "ops_before": sum(before.values()), "ops_after": sum(before.values()),
                                      "op_changes": {}, "time_s": 0.0, "reason": "the schedules build "
                                      "(mlc.compiler.schedules) legalizes and fuses itself"})
            continue
        requested = step.get("requested", "")
        try:
            with target:
                result = REGISTRY[step["name"]].load()(mod, step["config"], target)
            status, reason = "applied", requested or None
        except Exception as e:  # a pass that cannot handle this model must not take the compile down
            traceback.print_exc()  # into the log file
            lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
            reason = (lines[-1] if lines else type(e).__name__)[:300]
            if step["explicit"]:
                report["error"] = f"pass {step['name']} (requested explicitly) failed on this model: {reason}"
                return mod, report
            result, status = mod, "skipped"
            report["notes"].append(
                Note(NoteKind.FALLBACK, f"built without {requested} (the artifact is fp32): TVM failed with it: "
                                        f"{reason}") if requested
                else Note(NoteKind.PASS_SKIPPED, f"pass {step['name']} skipped: {reason}"))
        elapsed = time.perf_counter() - start
        after = op_counts(result)
        report["records"].append({"name": step["name"], "level": "relax", "status": status,
                                  "ops_before": sum(before.values()), "ops_after": sum(after.values()),
                                  "op_changes": changes(before, after), "time_s": round(elapsed, 4), "reason": reason})
        mod = result
        if folder:
            (folder / f"relax_{index:02d}_{step['name']}.py").write_text(mod.script())
    return mod, report
