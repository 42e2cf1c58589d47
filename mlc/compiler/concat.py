"""Concatenation kernels. TVM's concatenate is one loop over the output whose every element picks its input with
an if_then_else; vectorized, the condition is a vector, and TVM's vectorizer then falls back to scalar code:
ghostnet's 30 concatenations (all of its channel-doubling "ghost" modules) took ~4.5 of its 22 ms, at 3 ns an
element. `schedule_concatenation` rewrites such a kernel (nothing else in it) into a copy block per input writing
its slice of the output, each a run of contiguous elements per outer index, vectorized;
`schedule_concatenated_axis` gives an elementwise kernel over a concatenation one loop per input. Imports tvm."""

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


def _segment_start(cond):
    """(variable, k) for a concatenation's condition that holds from v = k on or below it (`k <= v`, `v < k`,
    ...), else None."""
    from tvm import tirx

    if not isinstance(cond, (tirx.LE, tirx.LT, tirx.GE, tirx.GT)):
        return None
    var_left = isinstance(cond.a, tirx.Var) and isinstance(cond.b, tirx.IntImm)
    if not var_left and not (isinstance(cond.b, tirx.Var) and isinstance(cond.a, tirx.IntImm)):
        return None
    var, k = (cond.a, int(cond.b.value)) if var_left else (cond.b, int(cond.a.value))
    # v < k and k <= v change at k; v <= k and k < v at k + 1
    at_k = isinstance(cond, (tirx.LT, tirx.GE)) if var_left else isinstance(cond, (tirx.LE, tirx.GT))
    return var, k if at_k else k + 1


def _bounds(expr, found: list) -> bool:
    """Collect into `found` the (variable, k) where each if_then_else of `expr` changes branch; False if one
    has a condition of another form. TVM 0.27 has no Python visitor for TIR expressions: the walk is by field."""
    import tvm

    children = [getattr(expr, f) for f in ("a", "b", "value", "condition", "true_value", "false_value")
                if isinstance(getattr(expr, f, None), tvm.ir.Expr)]
    if isinstance(expr, tvm.ir.Call):
        children = list(expr.args)
        if expr.op.name.endswith("if_then_else"):
            start = _segment_start(expr.args[0])
            if start is None:
                return False
            found.append(start)
            children = children[1:]
    return all(_bounds(child, found) for child in children)


def schedule_concatenated_axis(sch, block, lanes: int, parallel_min: int) -> bool:
    """Schedule an elementwise kernel over a concatenation (densenet's concat -> batch norm -> ReLU -> cast, one
    block once inlined) as one loop per input along the concatenated axis: the select chain is then decided by
    each loop's bounds, which lowering folds, instead of being a vector select that loads every input for every
    element (densenet121 spent half its bf16 time in such kernels, at 1.4 ns an element). False, unchanged,
    where the block is not one or its loops are not static."""
    from tvm import tirx

    stmt = sch.get(block)
    loops = sch.get_loops(block)
    if not isinstance(stmt.body, tirx.BufferStore) or stmt.init is not None or not loops:
        return False
    extents = [sch.get(loop).extent for loop in loops]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return False
    extents = [int(e.value) for e in extents]
    realize = sch.get(loops[-1]).body
    values = list(getattr(realize, "iter_values", []))
    if len(values) != len(loops) or any(not v.same_as(sch.get(loop).loop_var)
                                        for v, loop in zip(values, loops)):
        return False
    found: list = []
    if not _bounds(stmt.body.value, found) or not found:
        return False
    var = found[0][0]
    axes = [i for i, iv in enumerate(stmt.iter_vars) if iv.var.same_as(var)]
    if not axes or any(not v.same_as(var) for v, _ in found):
        return False
    axis = axes[0]
    cuts = sorted({k for _, k in found if 0 < k < extents[axis]}) + [extents[axis]]
    sizes = [b - a for a, b in zip([0] + cuts, cuts)]
    inner = len(loops) - axis - 1
    # the concatenated axis innermost: vectors of a width that every segment is a multiple of
    width = 1 if inner else _widest(math.gcd(*sizes), lanes)
    target = loops[axis]
    vector = None
    if width > 1:
        target, vector = sch.split(target, factors=[None, width])
    parts = sch.loop_partition(target, [s // width for s in sizes[:-1]] + [None]) if len(sizes) > 1 else [target]
    for part in parts:
        part_block = sch.get_child_blocks(part)[0]
        part_loops = sch.get_loops(part_block)
        if vector is not None:
            sch.vectorize(part_loops[-1])
        elif inner:  # the axes after the concatenated one: fused, in vectors
            rest = part_loops[-inner:]
            fused = sch.fuse(*rest) if len(rest) > 1 else rest[0]
            run_width = _widest(math.prod(extents[axis + 1:]), lanes)
            if run_width > 1:
                sch.vectorize(sch.split(fused, factors=[None, run_width])[1])
    if axis and math.prod(extents) >= parallel_min:
        outer = loops[:axis]
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return True
