"""After conv2d goes to NHWC (mlc.compiler.schedules): TVM 0.27's ConvertLayout has no layout rule for
relax.clip, so it wraps every clip between two NHWC convs in permute_dims to NCHW and back (ReLU6, hard-sigmoid):
each such clip became a transpose-clip-transpose kernel of its own instead of the conv's epilogue
(mobilenetv2: 4 kernels, ~0.7 ms of 13). `cancel_transposes` rewrites permute_dims(op(permute_dims(x, p)), q)
with q after p the identity to op(x), for elementwise ops of one tensor input. Imports tvm."""

from __future__ import annotations

from mlc.compiler.mutators import rewrite_functions

ELEMENTWISE = ("relax.clip", "relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
               "relax.nn.gelu_tanh", "relax.exp", "relax.erf", "relax.negative", "relax.abs", "relax.sqrt")


def _axes(call):
    axes = call.attrs.axes
    return None if axes is None else [int(a) for a in axes]


def cancel_transposes(mod):
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    permute = tvm.ir.Op.get("relax.permute_dims")
    elementwise = {tvm.ir.Op.get(name) for name in ELEMENTWISE}

    def call_of(mutator_, expr, ops):
        if isinstance(expr, relax.Var):
            expr = mutator_.lookup_binding(expr)
        if isinstance(expr, tvm.ir.Call) and any(expr.op.same_as(op) for op in ops):
            return expr
        return None

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(permute):
                return call
            inner = call_of(self, call.args[0], elementwise)
            if inner is None:
                return call
            source = call_of(self, inner.args[0], [permute])
            outer_axes, inner_axes = _axes(call), source is not None and _axes(source)
            if not outer_axes or not inner_axes or len(outer_axes) != len(inner_axes):
                return call
            # permute_dims(permute_dims(x, p), q)[i] = x[p[q[i]]]: the identity when p[q[i]] == i
            if any(inner_axes[q] != i for i, q in enumerate(outer_axes)):
                return call
            return relax.Call(inner.op, [source.args[0], *inner.args[1:]], inner.attrs)

    return relax.transform.DeadCodeElimination()(rewrite_functions(Rewrite(mod), mod))
