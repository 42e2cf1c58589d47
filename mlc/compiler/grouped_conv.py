"""Grouped convs whose groups are no multiple of the vector width (#39): each group's output channels zero-padded
to a whole number of vectors, then the padding sliced off.

ShuffleNet v1's reduce convs (3 groups of 20 or 40 output channels) ran their per-group register tile
(schedule_rules `_split_groups`) on 4- or 8-lane vectors (`_narrow_lanes`: the widest that divides the group),
~60 GFLOP/s and 0.41x ONNX Runtime's kernel speed. Here the weight gets zero output channels appended to every group
(20 -> 32, 40 -> 48; a constant, folded at compile time), so the tile runs on full vectors; one injective op drops
the padding, and FuseOps puts it, with the conv's bias and ReLU, into the kernel that follows (ShuffleNet's channel
shuffle). benchmarks/grouped-conv has the timings (run 2)."""

from __future__ import annotations

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


def _float(expr, static_axis: int, dtypes=("float32",)) -> bool:
    """A tensor of one of `dtypes`, of known rank, whose dim `static_axis` is static (a batch may be symbolic)."""
    shape = getattr(expr.ty, "shape", None)
    return getattr(expr.ty, "dtype", None) in dtypes and shape is not None and isinstance(
        getattr(shape[static_axis], "value", None), int)


def _padded_conv(bb, call, lanes: int):
    """`call` (a grouped relax conv2d) on per-group padded weights, then sliced back; None where it stays."""
    from tvm import relax

    attrs, (x, weight) = call.attrs, call.args
    groups = int(attrs.groups)
    if groups == 1 or not str(attrs.out_layout).endswith("C"):
        return None
    o_axis, c_axis = str(attrs.kernel_layout).index("O"), str(attrs.out_layout).index("C")
    operands = ("float32", "bfloat16")  # bf16 operands: relax_passes.bf16_matmul's convs (a float32 result)
    if not (_float(x, str(attrs.data_layout).index("C"), operands) and _float(call, c_axis)
            and all(_float(weight, axis, operands) for axis in range(len(str(attrs.kernel_layout))))):
        return None
    channels = int(weight.ty.shape[o_axis])
    padded = padded_group_width(channels // groups, lanes) if channels % groups == 0 else None
    if padded is None:  # depthwise convs too (1 or 2 channels a group)
        return None
    pads = [0] * (2 * (len(weight.ty.shape) + 1))
    width = channels // groups
    pads[2 * (o_axis + 1) + 1] = padded - width
    split = bb.normalize(_split_axis(weight, o_axis, groups, width))
    wide = bb.normalize(_merge_axis(bb.normalize(relax.op.nn.pad(split, pads)), o_axis))
    conv = bb.normalize(relax.op.nn.conv2d(x, wide, strides=attrs.strides, padding=attrs.padding,
                                           dilation=attrs.dilation, groups=groups, data_layout=attrs.data_layout,
                                           kernel_layout=attrs.kernel_layout, out_layout=attrs.out_layout,
                                           out_dtype=attrs.out_dtype))
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
    """`mod` with every float32 (or bf16-operand) grouped conv2d (static channels, channels last, not depthwise)
    whose groups are no multiple of the target's vector padded per group (`padded_group_width`); `mod` itself where
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
