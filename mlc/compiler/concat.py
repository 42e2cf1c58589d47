"""A concatenation kernel as one copy loop per input. TVM's concatenate is one loop over the output whose
every element picks its input with an if_then_else; vectorized, the condition is a vector, and TVM's vectorizer
then falls back to scalar code: ghostnet's 30 concatenations (all of its channel-doubling "ghost" modules) took
~4.5 of its 22 ms, at 3 ns an element. `schedule_concatenation` rewrites such a kernel (nothing else in it) into
a copy block per input writing its slice of the output, each a run of contiguous elements per outer index,
vectorized. Imports tvm."""

from __future__ import annotations

import math

PARALLEL_MIN = 2048 * 16  # elements; below, a thread pool launch costs more than a copy saves


def _loads(expr, found: list) -> bool:
    """Collect the TensorLoads of a nested if_then_else over plain loads; False for anything else."""
    import tvm

    if isinstance(expr, tvm.ir.Call) and expr.op.name.endswith("if_then_else"):
        return all(_loads(branch, found) for branch in expr.args[1:])
    if isinstance(expr, tvm.ir.expr.TensorLoad):
        found.append(expr)
        return True
    return False


def _plan(func):
    """(output buffer, axis, [(input buffer, offset)] in output order) of a pure concatenation, or None."""
    import tvm
    from tvm import tirx

    realize = func.body
    root = realize.block if hasattr(realize, "block") else None
    if root is None:
        return None
    body = root.body
    while isinstance(body, tirx.For):
        body = body.body
    block = body.block if hasattr(body, "block") else None
    if block is None or not isinstance(block.body, tirx.BufferStore) or block.init is not None:
        return None
    store = block.body
    loads: list = []
    if not _loads(store.value, loads) or len(loads) < 2:
        return None
    out = store.buffer
    indices = list(store.indices)
    iter_vars = [iv.var for iv in block.iter_vars]
    if len(indices) != len(iter_vars) or any(not i.same_as(v) for i, v in zip(indices, iter_vars)):
        return None
    analyzer = tvm.sym.Analyzer()
    axis, pieces = None, []
    for load in loads:
        if len(load.indices) != len(indices) or str(load.source.dtype) != str(out.dtype):
            return None
        offset = 0
        for position, (index, var) in enumerate(zip(load.indices, iter_vars)):
            delta = analyzer.simplify(var - index)
            if not isinstance(delta, tirx.IntImm):
                return None
            if int(delta.value):
                if axis not in (None, position):
                    return None
                axis, offset = position, int(delta.value)
        pieces.append((load.source, offset))
    if axis is None:  # every input at offset 0 along every axis: find the axis from the shapes
        diffs = [p for p, (a, b) in enumerate(zip(pieces[0][0].shape, out.shape)) if int(a) != int(b)]
        if len(diffs) != 1:
            return None
        axis = diffs[0]
    pieces.sort(key=lambda piece: piece[1])
    at = 0
    for buffer, offset in pieces:
        shape = [int(d) for d in buffer.shape]
        if offset != at or any(shape[p] != int(out.shape[p]) for p in range(len(shape)) if p != axis):
            return None
        at += shape[axis]
    if at != int(out.shape[axis]) or len({b.name for b, _ in pieces}) != len(pieces):
        return None
    return out, axis, pieces


def _script(func, out, axis: int, pieces) -> str:
    """TVMScript of the copy-per-input kernel, with `func`'s own signature and attributes."""
    text = func.script()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    attrs = next(i for i, line in enumerate(lines) if "T.func_attr(" in line)
    head = [line for line in lines[start - 1:attrs + 1] if line.strip()]
    indent = " " * (len(lines[attrs]) - len(lines[attrs].lstrip()))
    kind = "int64" if "T.int64(" in lines[start] else "int32"  # Relax's kernels index in int64, TE's in int32
    body = []
    for k, (buffer, offset) in enumerate(pieces):
        shape = [int(d) for d in buffer.shape]
        loops = [f"i{p}" for p in range(len(shape))]
        vs = [f"v{p}" for p in range(len(shape))]
        target = [f"{v} + T.{kind}({offset})" if p == axis and offset else v for p, v in enumerate(vs)]
        body += [f"{indent}for {', '.join(loops)} in T.grid({', '.join(f'T.{kind}({n})' for n in shape)}):",
                 f"{indent}    with T.sblock(\"copy{k}\"):",
                 f"{indent}        {', '.join(vs)} = T.axis.remap(\"{'S' * len(shape)}\", [{', '.join(loops)}])",
                 f"{indent}        {out.name}[{', '.join(target)}] = {buffer.name}[{', '.join(vs)}]"]
    return "\n".join([*head, *body]) + "\n"


def _widest(extent: int, lanes: int) -> int:
    return next((w for w in (lanes, lanes // 2, lanes // 4) if w >= 4 and extent % w == 0), 1)


def schedule_concatenation(func, lanes: int):
    """A Schedule of the copy-per-input kernel equivalent to `func`, or None when `func` is not a pure
    concatenation along one axis (of inputs with the output's dtype)."""
    import tvm
    from tvm import s_tir

    plan = _plan(func)
    if plan is None:
        return None
    out, axis, pieces = plan
    rewritten = tvm.script.from_source(_script(func, out, axis, pieces))
    if isinstance(rewritten, tvm.IRModule):
        rewritten = rewritten["main"]
    sch = s_tir.Schedule(rewritten)
    for k, (buffer, _) in enumerate(pieces):
        block = sch.get_sblock(f"copy{k}")
        loops = sch.get_loops(block)
        shape = [int(d) for d in buffer.shape]
        # from the axis on, a copy's elements are contiguous in its input and in its slice of the output
        inner = sch.fuse(*loops[axis:]) if len(loops) - axis > 1 else loops[axis]
        run = math.prod(shape[axis:])
        width = _widest(run, lanes)
        if width > 1:
            _, vector = sch.split(inner, factors=[None, width])
            sch.vectorize(vector)
        if axis and math.prod(shape) >= PARALLEL_MIN:
            outer = sch.fuse(*loops[:axis]) if axis > 1 else loops[0]
            sch.parallel(outer)
    return sch
