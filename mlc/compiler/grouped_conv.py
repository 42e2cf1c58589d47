"""Grouped convs whose groups are no multiple of the vector width (#39): each group's output channels zero-padded
to a whole number of vectors, then the padding sliced off.

ShuffleNet v1's reduce convs (3 groups of 20 or 40 output channels) ran their per-group register tile
(schedule_rules `_split_groups`) on 4- or 8-lane vectors (`narrow_lanes`: the widest that divides the group),
~60 GFLOP/s and 0.41x ONNX Runtime's kernel speed. Here the weight gets zero output channels appended to every group
(20 -> 32, 40 -> 48; a constant, folded at compile time), so the tile runs on full vectors; one injective op drops
the padding, and FuseOps puts it, with the conv's bias and ReLU, into the kernel that follows (ShuffleNet's channel
shuffle). benchmarks/grouped-conv has the timings (run 2).

uint8 x int8 grouped convs (--quantize int8) get the same output padding, and each group's input channels padded to
a multiple of 4 (zero weights; the activations through one injective copy), so their per-group tile runs on
vpdpbusd: Caffe2 ShuffleNet's 4-group 1x1 convs (34 in and out a group), which --quantize had left fp32."""

from __future__ import annotations

from typing import Optional

from mlc.compiler.mutators import rewrite_functions

# A module flag so a benchmark can build both (benchmarks/grouped-conv).
PAD_GROUPS = True


def padded_group_width(width: int, lanes: int):
    """The output channels a group of `width` is padded to: the next multiple of `lanes` where the group is wider
    than half a vector and no multiple of it (a group of 4 or 8 keeps its narrow tile: padding it to 16 is 2-4x
    the work for 2-4x the lanes); None where it stays as it is."""
    if width % lanes == 0 or width <= lanes // 2:
        return None
    return -(-width // lanes) * lanes


def _split_axis(expr, axis: int, groups: int, width: int):
    """`expr` with its `axis` (groups x width) reshaped to (groups, width)."""
    from tvm import relax

    shape = list(expr.ty.shape)
    return relax.op.reshape(expr, shape[:axis] + [groups, width] + shape[axis + 1:])


def _merge_axis(expr, axis: int):
    """`expr` with its (static) axes `axis` and `axis + 1` merged."""
    from tvm import relax

    shape = list(expr.ty.shape)
    merged = int(shape[axis]) * int(shape[axis + 1])
    return relax.op.reshape(expr, shape[:axis] + [merged] + shape[axis + 2:])


def _static(expr, static_axis: int, dtypes) -> bool:
    """A tensor of one of `dtypes`, of known rank, whose dim `static_axis` is static (a batch may be symbolic)."""
    shape = getattr(expr.ty, "shape", None)
    return getattr(expr.ty, "dtype", None) in dtypes and shape is not None and isinstance(
        getattr(shape[static_axis], "value", None), int)


def _operands(x, weight, call, attrs) -> Optional[str]:
    """"float" (float32 or bf16 operands, float32 out: relax_passes.bf16_matmul's convs), "int8" (uint8 x int8 ->
    int32: --quantize) or None, for a conv whose channels and weight are static."""
    c_axis = str(attrs.data_layout).index("C")
    for kind, (x_types, w_types, out) in {"float": (("float32", "bfloat16"),) * 2 + ("float32",),
                                          "int8": (("uint8",), ("int8",), "int32")}.items():
        if _static(x, c_axis, x_types) and _static(call, str(attrs.out_layout).index("C"), (out,)) \
                and all(_static(weight, axis, w_types) for axis in range(len(str(attrs.kernel_layout)))):
            return kind
    return None


def _padded_depth(bb, x, weight, attrs, groups: int):
    """(x, weight) with each group's input channels zero-padded to a multiple of 4 (int8_dot.QUAD: vpdpbusd takes
    the depth in quads; the grouped tile has no in-kernel depth padding, and ran on int32 multiplies, 3-10x the
    fp32 conv); the pair itself where the depth is a multiple already. Zero weights make the padding add 0."""
    from tvm import relax

    from mlc.compiler.int8_dot import QUAD

    i_axis, c_axis = str(attrs.kernel_layout).index("I"), str(attrs.data_layout).index("C")
    depth = int(weight.ty.shape[i_axis])
    extra = -depth % QUAD
    if not extra:
        return x, weight
    w_pads = [0] * (2 * len(weight.ty.shape))
    w_pads[2 * i_axis + 1] = extra
    x_pads = [0] * (2 * (len(x.ty.shape) + 1))
    x_pads[2 * (c_axis + 1) + 1] = extra
    split = bb.normalize(_split_axis(x, c_axis, groups, depth))
    wide_x = bb.normalize(_merge_axis(bb.normalize(relax.op.nn.pad(split, x_pads)), c_axis))
    return wide_x, bb.normalize(relax.op.nn.pad(weight, w_pads))


def _padded_conv(bb, call, lanes: int):
    """`call` (a grouped relax conv2d) on per-group padded weights (and, int8, per-group padded depth), then
    sliced back; None where it stays."""
    from tvm import relax

    attrs, (x, weight) = call.attrs, call.args
    groups = int(attrs.groups)
    if groups == 1 or not str(attrs.out_layout).endswith("C"):
        return None
    kind = _operands(x, weight, call, attrs)
    if kind is None:
        return None
    o_axis, c_axis = str(attrs.kernel_layout).index("O"), str(attrs.out_layout).index("C")
    channels = int(weight.ty.shape[o_axis])
    width = channels // groups
    if channels % groups:
        return None
    padded = padded_group_width(width, lanes) or width
    if kind == "int8":
        x, weight = _padded_depth(bb, x, weight, attrs, groups)
    if padded == width and x.same_as(call.args[0]):
        return None
    if padded != width:
        pads = [0] * (2 * (len(weight.ty.shape) + 1))
        pads[2 * (o_axis + 1) + 1] = padded - width
        split = bb.normalize(_split_axis(weight, o_axis, groups, width))
        weight = bb.normalize(_merge_axis(bb.normalize(relax.op.nn.pad(split, pads)), o_axis))
    conv = bb.normalize(relax.op.nn.conv2d(x, weight, strides=attrs.strides, padding=attrs.padding,
                                           dilation=attrs.dilation, groups=groups, data_layout=attrs.data_layout,
                                           kernel_layout=attrs.kernel_layout, out_layout=attrs.out_layout,
                                           out_dtype=attrs.out_dtype))
    if padded == width:
        return conv
    return bb.call_te(_drop_padding, conv, c_axis, width, padded, primfunc_name_hint="drop_group_padding")


def _drop_padding(y, axis: int, width: int, padded: int):
    """y[.., c, ..] = padded[.., c // width * padded + c % width, ..]: one injective op (FuseOps puts it into the
    next kernel), where a reshape, strided slice and reshape stayed three kernels over a symbolic batch."""
    from tvm import te

    shape = list(y.shape)
    shape[axis] = shape[axis] // padded * width

    def compute(*index):
        source = list(index)
        source[axis] = index[axis] // width * padded + index[axis] % width
        return y(*source)

    return te.compute(shape, compute, name="drop_group_padding", tag="injective")


def pad_group_channels(mod, target):
    """`mod` with every float32 (or bf16-operand) grouped conv2d (static channels, channels last) whose groups are no
    multiple of the target's vector padded per group (`padded_group_width`), and every uint8 x int8 one padded so
    too and to whole quads of input channels a group (`_padded_depth`); `mod` itself where
    PAD_GROUPS is off or none is. Channels first (where ConvertLayout failed) vectorizes the width: padding would
    only add work."""
    import tvm
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from mlc.compiler.schedule_rules import vector_lanes

    if not PAD_GROUPS or target.kind.name != "llvm":
        return mod
    lanes = vector_lanes(target)
    conv2d = tvm.ir.Op.get("relax.nn.conv2d")

    padded = []

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            if not call.op.same_as(conv2d):
                return call
            replaced = _padded_conv(self.builder_, call, lanes)
            padded.append(replaced is not None)
            return call if replaced is None else replaced

    rewritten = rewrite_functions(Rewrite(mod), mod)
    return rewritten if any(padded) else mod  # no grouped conv to pad: the module exactly as it came
