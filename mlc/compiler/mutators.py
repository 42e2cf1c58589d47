"""The loop every Relax rewrite in mlc ends with."""

from __future__ import annotations


def rewrite_functions(rewrite, mod):
    """`mod` with `rewrite` (a PyExprMutator made for `mod`) applied to each of its Relax functions."""
    from tvm import relax

    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewrite.builder_.update_func(gv, rewrite.visit_expr(func))
    return rewrite.builder_.get()
