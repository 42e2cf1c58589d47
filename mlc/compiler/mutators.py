"""The loop every Relax rewrite in mlc ends with, and what rewrites read off an expression."""

from __future__ import annotations

from typing import Optional


def static_shape(expr) -> Optional[list[int]]:
    """The shape of a Relax expression as ints; None where a dim is symbolic or the shape unknown."""
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    try:
        return [int(v) for v in shape.values]
    except (TypeError, ValueError):
        return None


def rewrite_functions(rewrite, mod):
    """`mod` with `rewrite` (a PyExprMutator made for `mod`) applied to each of its Relax functions."""
    from tvm import relax

    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewrite.builder_.update_func(gv, rewrite.visit_expr(func))
    return rewrite.builder_.get()
