"""After conv2d goes to NHWC (mlc.compiler.schedules): TVM 0.27's ConvertLayout has no layout rule for
relax.clip, so it wraps every clip between two NHWC convs in permute_dims to NCHW and back (ReLU6, hard-sigmoid):
each such clip became a transpose-clip-transpose kernel of its own instead of the conv's epilogue
(mobilenetv2: 4 kernels, ~0.7 ms of 13). `cancel_transposes` rewrites permute_dims(op(permute_dims(x, p)), q)
with q after p the identity to op(x), for elementwise ops of one tensor input; `lrn_as_window_sum` rewrites ONNX LRN
(a 3-d pool over channels) on the layout ConvertLayout chose; `pools_before_concat` pools each piece of a
concatenation instead of the concatenated tensor. Before ConvertLayout, `full_rank_constants` rewrites
binary ops with (C, 1, 1) constants, which it would otherwise leave in NCHW between transposes (inception v1 / v2,
#39; benchmarks/inception). Imports tvm."""

from __future__ import annotations

from mlc.compiler.mutators import rewrite_functions

ELEMENTWISE = ("relax.clip", "relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
               "relax.nn.gelu_tanh", "relax.exp", "relax.erf", "relax.negative", "relax.abs", "relax.sqrt")


def _axes(call):
    axes = call.attrs.axes
    return None if axes is None else [int(a) for a in axes]


def _bound(mutator_, expr):
    """What a Relax variable is bound to in the function `mutator_` is rewriting; any other expression as it is."""
    from tvm import relax

    return mutator_.lookup_binding(expr) if isinstance(expr, relax.Var) else expr


def _call_of(mutator_, expr, ops):
    """The call `expr` is (or is bound to), if it calls one of `ops`; else None."""
    import tvm

    expr = _bound(mutator_, expr)
    return expr if isinstance(expr, tvm.ir.Call) and any(expr.op.same_as(op) for op in ops) else None


def cancel_transposes(mod):
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    permute = tvm.ir.Op.get("relax.permute_dims")
    elementwise = {tvm.ir.Op.get(name) for name in ELEMENTWISE}

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(permute):
                return call
            inner = _call_of(self, call.args[0], elementwise)
            if inner is None:
                return call
            source = _call_of(self, inner.args[0], [permute])
            outer_axes, inner_axes = _axes(call), source is not None and _axes(source)
            if not outer_axes or not inner_axes or len(outer_axes) != len(inner_axes):
                return call
            # permute_dims(permute_dims(x, p), q)[i] = x[p[q[i]]]: the identity when p[q[i]] == i
            if any(inner_axes[q] != i for i, q in enumerate(outer_axes)):
                return call
            return relax.Call(inner.op, [source.args[0], *inner.args[1:]], inner.attrs)

    return relax.transform.DeadCodeElimination()(rewrite_functions(Rewrite(mod), mod))


BROADCAST_BINARY = ("relax.add", "relax.multiply", "relax.subtract", "relax.divide", "relax.maximum", "relax.minimum")


def _ndim(expr):
    ndim = getattr(getattr(expr, "ty", None), "ndim", -1)
    return ndim if ndim is not None and ndim >= 0 else None


def full_rank_constants(mod):
    """A constant of rank 2 or 3 that a binary op broadcasts against a 4-d tensor (Caffe2's inception v2: a batch norm's
    scale and shift as Mul / Add by Unsqueeze(c, [1, 2]), shape (C, 1, 1), after each conv) reshaped to the tensor's
    rank, (1, C, 1, 1): TVM 0.27's ConvertLayout gives a binary op of two ranks no layout, so it moved each such
    Mul / Add (and the pools and concatenations after them) back to NCHW between two transposes, where a full-rank
    constant follows the conv to NHWC and becomes its epilogue. Same values, same broadcast."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    ops = {tvm.ir.Op.get(name) for name in BROADCAST_BINARY}

    def widened(const, rank: int):
        value = const.value.numpy()
        return relax.const(value.reshape((1,) * (rank - value.ndim) + value.shape), str(value.dtype))

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not any(call.op.same_as(op) for op in ops) or len(call.args) != 2:
                return call
            ranks = [_ndim(a) for a in call.args]
            if None in ranks or ranks[0] == ranks[1]:
                return call
            low = 0 if ranks[0] < ranks[1] else 1
            # (C, 1, 1) or (1, 1) against an image; a vector broadcasts along the last axis, which layouts keep
            if not isinstance(call.args[low], tvm.ir.GenericConst) or ranks[low] < 2 or ranks[1 - low] != 4:
                return call
            args = list(call.args)
            args[low] = widened(args[low], ranks[1 - low])
            return relax.Call(call.op, args, call.attrs)

    return rewrite_functions(Rewrite(mod), mod)


def _lrn_parts(lookup, call):
    """(data, channel axis, size, front padding, alpha, bias, beta) where `call` is TVM's ONNX LRN over 4-d data:
    divide(x, power(add(multiply(squeeze(avg_pool3d(expand_dims(multiply(x, x), 1), (size, 1, 1))), alpha), bias),
    beta)); else None. The pool's D axis is the channel axis: NCDHW as imported, NCHWD after ConvertLayout moved the
    conv before it to NHWC."""
    import tvm
    from tvm import relax

    def op(expr, name, arity=None):
        expr = lookup(expr) if isinstance(expr, relax.Var) else expr
        ok = isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == f"relax.{name}"
        return expr if ok and (arity is None or len(expr.args) == arity) else None

    def scalar(expr):
        value = expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None
        return float(value) if value is not None and value.size == 1 else None

    found, expr = [], call
    for name, arity, arg in (("divide", 2, 1), ("power", 2, 0), ("add", 2, 0), ("multiply", 2, 0), ("squeeze", None, 0),
                             ("nn.avg_pool3d", None, 0), ("expand_dims", None, 0), ("multiply", 2, 0)):
        expr = op(expr, name, arity)
        if expr is None:
            return None
        found.append(expr)
        expr = expr.args[arg]
    _, power, add, scale, squeeze, pool, expand, square = found
    layout = str(pool.attrs.layout)
    if not square.args[0].same_as(square.args[1]) or not square.args[0].same_as(call.args[0]) \
            or _ndim(call.args[0]) != 4 or [int(a) for a in expand.attrs.axis] != [1] \
            or [int(a) for a in squeeze.attrs.axis] != [1] or sorted(layout) != sorted("NCDHW") or layout[1] != "C" \
            or [int(p) for p in pool.attrs.pool_size][1:] != [1, 1] or not pool.attrs.count_include_pad:
        return None
    numbers = [scalar(scale.args[1]), scalar(add.args[1]), scalar(power.args[1])]
    if None in numbers:
        return None
    size = int(pool.attrs.pool_size[0])  # ONNX's window: (size - 1) // 2 channels before, the rest after (TVM's pool
    axis = layout.index("D") - 1  # of the 4-d data: the 5-d pool's unit axis 1 squeezed away
    return (call.args[0], axis, size, (size - 1) // 2, *numbers)  # pads size // 2 before: one off for even sizes


def _denominator(t, beta: float):
    """t ** beta, by square roots (vector instructions) for the exponents LRNs use; power (a scalar powf call per
    element) otherwise."""
    from tvm import relax

    if beta == 1.0:
        return t
    if beta not in (0.25, 0.5, 0.75):
        return relax.op.power(t, relax.const(beta, "float32"))
    root = relax.op.sqrt(t)
    fourth = relax.op.sqrt(root)
    return {0.25: fourth, 0.5: root, 0.75: relax.op.multiply(root, fourth)}[beta]


def _channel_window_sum(squares, axis: int, channels: int, size: int, pad: int):
    """The sum over each channel's window (`pad` channels before it, size - 1 - pad after, zeros outside) as `size`
    shifted slices of the channel-padded squares: injective ops, which FuseOps puts into one kernel with the
    epilogue."""
    from tvm import relax

    widths = [0] * 8
    widths[2 * axis:2 * axis + 2] = [pad, size - 1 - pad]
    padded = relax.op.nn.pad(squares, widths)
    total = None
    for k in range(size):
        window = relax.op.strided_slice(padded, axes=[axis], begin=[k], end=[k + channels])
        total = window if total is None else relax.op.add(total, window)
    return total


def lrn_as_window_sum(mod):
    """ONNX LRN (TVM imports it as a pool over channels: avg_pool3d on an expand_dims, then power) as the sum of
    `size` shifted channel slices of the squares and its epilogue, t ** 0.75 as sqrt(t) * sqrt(sqrt(t)): one
    injective kernel. Inception v1's two LRNs took 16.6 ms of 69 (OpenVINO: 0.64) as a scalar 3-d pool and a powf
    per element. Runs after ConvertLayout, on the channel axis the conv before it left (NHWC: axis 3): TVM 0.27's
    ConvertLayout has no rule for nn.pad, and the rewrite before it kept the padded squares NCHW between
    transposes, a buffer written and read across the channel stride (zfnet512's first LRN 1.2 ms; 0.3 ms in NHWC).
    (A 1x1 conv with a band of alpha / size does C / size times the adds: v1 3 % slower, benchmarks/inception.)"""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            parts = _lrn_parts(self.lookup_binding, call) if getattr(call.op, "name", "") == "relax.divide" else None
            channels = parts and call.args[0].ty.shape[parts[1]]
            if not parts or not isinstance(channels, tvm.tirx.IntImm) or str(call.ty.dtype) != "float32":
                return call
            data, axis, size, pad, alpha, bias, beta = parts
            sums = _channel_window_sum(relax.op.multiply(data, data), axis, int(channels), size, pad)
            scaled = relax.op.multiply(sums, relax.const(alpha / size, "float32"))
            t = relax.op.add(scaled, relax.const(bias, "float32"))
            return relax.op.divide(data, _denominator(t, beta))

    return relax.transform.DeadCodeElimination()(rewrite_functions(Rewrite(mod), mod))


POOLS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d")


def pools_before_concat(mod):
    """pool(concat(pieces)) -> concat(pool(piece), ...) where the concatenation's axis is not one the pool slides
    over (channels): a concatenation before a pool (SqueezeNet's fire modules before each downsampling, Inception's
    blocks before their pool branch) is a copy kernel of its own; pooled first, it copies the pooled pieces (a
    quarter of the bytes after a stride-2 pool), and the pools read what the one pool read."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    concat = tvm.ir.Op.get("relax.concat")
    pools = [tvm.ir.Op.get(name) for name in POOLS]

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not any(call.op.same_as(op) for op in pools):
                return call
            source = _call_of(self, call.args[0], [concat])
            if source is None:
                return call
            pieces = _bound(self, source.args[0])
            layout = str(call.attrs.layout)
            axis = int(source.attrs.axis) % len(layout) if source.attrs.axis is not None else None
            if not isinstance(pieces, relax.Tuple) or axis is None or not layout.isupper() or layout[axis] in "DHW":
                return call
            pooled = [relax.Call(call.op, [piece], call.attrs) for piece in pieces.fields]
            return relax.op.concat(relax.Tuple(pooled), axis)

    return relax.transform.DeadCodeElimination()(rewrite_functions(Rewrite(mod), mod))


def _each_optional(mod, rewrites):
    """Each rewrite in turn, an optimisation: skipped (the module as it was) where it fails."""
    for rewrite in rewrites:
        try:
            mod = rewrite(mod)
        except Exception:  # an optimisation: the module as it was
            continue
    return mod


def before_convert_layout(mod):
    return _each_optional(mod, (full_rank_constants,))


def after_convert_layout(mod):
    """Also where ConvertLayout failed: the LRN rewrite pays in NCHW too."""
    return _each_optional(mod, (cancel_transposes, lrn_as_window_sum, pools_before_concat))
