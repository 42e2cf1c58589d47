"""TVM's TIR lowering for CPU targets, with these changes: small "local" buffers live on the stack, a
loop over row tiles of a symbolic row count runs whole tiles without a predicate plus one tail kernel per
remainder, and TVM's TIR CSE is left to LLVM (see lowering_passes).

TVM 0.27's LowerTVMBuiltin turns every CPU allocation that is not a "global" buffer under 1 KB into
a TVMBackendAllocWorkspace/FreeWorkspace pair. A register tile's accumulator (up to 12 rows x 32
floats, "local") was therefore allocated, zeroed with memset and freed once per output tile, and
spilled to it at the end: resnet50's 64 -> 256 channel 1x1 conv ran at 59 GFLOP/s instead of 103. With TVM's
own `disable_lower_builtin` annotation, such a buffer becomes an LLVM alloca, which LLVM promotes to
registers.

The default rule tiles a dense layer's rows by up to 12; with a symbolic row count (a sequence length)
every row of the unrolled tile carried a `row < seq` branch inside the reduction loop, and the tile's
accumulators (min(seq, 12) rows) were a heap buffer (the rule now indexes it row % 12): bert-base's dense
layers took 2.7-3.4x the static ones' time (benchmarks/dynamic-kernels). `split_row_tails` turns the loop
the rule marks (schedule_rules.ROW_TAIL) into `for tile in range(seq // 12)` without the branches, then
`if seq % 12 == c` for c = 1..11, each a copy whose branches fold to constants once the tile is unrolled.
A register tile's reduction loop marked schedule_rules.PREFETCH prefetches the next weight panel
(`prefetch_weights`). A loop the rule marks schedule_rules.COL_TAIL (column tiles or vectors over a zero-padded
symbolic J: attention scores, softmax) becomes whole tiles without their `col < seq` branches, then one branched
tail. On targets with AVX512-BF16, a bf16 store rounds with vcvtneps2bf16 (`native_bf16_rounding`).
Imports tvm."""

from __future__ import annotations

import functools

NAME = "mlc_cpu"
STACK_BYTES = 4096  # a tile's accumulators; far below a worker thread's stack


def _map_bodies(stmt, visit):
    """`stmt` with `visit` applied to the statements it holds (loops, sequences, attributes, branches); unchanged
    nodes are returned as they are, so callers can tell by identity whether anything changed."""
    from tvm import tirx

    if isinstance(stmt, tirx.SeqStmt):
        seq = [visit(s) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq, stmt.span)
    if isinstance(stmt, tirx.For):
        body = visit(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.For(
            stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations,
            stmt.step, stmt.span)
    if isinstance(stmt, tirx.AttrStmt):
        body = visit(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body, stmt.span)
    if isinstance(stmt, tirx.IfThenElse):
        then_case = visit(stmt.then_case)
        else_case = visit(stmt.else_case) if stmt.else_case is not None else None
        if then_case.same_as(stmt.then_case) and (else_case is None or else_case.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then_case, else_case, stmt.span)
    if isinstance(stmt, tirx.While):
        body = visit(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.While(stmt.condition, body, stmt.span)
    return stmt  # leaves, and nodes without a statement body


def _body_pass(rewrite, name: str):
    """A PrimFunc pass applying the statement rewrite `rewrite` to each function's body."""
    from tvm import tirx

    def transform(func, _mod, _ctx):
        body = rewrite(func.body)
        return func if body.same_as(func.body) else func.with_body(body)

    return tirx.transform.prim_func_pass(transform, opt_level=0, name=name)


def _on_stack(stmt):
    """`stmt` with its small constant-size "local" AllocBuffers annotated."""
    from tvm import tirx

    if isinstance(stmt, tirx.AllocBuffer):
        buffer = stmt.buffer
        shape = [getattr(d, "value", None) for d in buffer.shape]
        annotations = dict(stmt.annotations or {})
        if (buffer.scope() != "local" or None in shape or "disable_lower_builtin" in annotations
                or _bytes(shape, buffer.dtype) > STACK_BYTES):
            return stmt
        return tirx.AllocBuffer(buffer, {**annotations, "disable_lower_builtin": tirx.IntImm("int32", 1)}, stmt.span)
    return _map_bodies(stmt, _on_stack)


def _bytes(shape, dtype) -> int:
    import tvm

    size = 1
    for extent in shape:
        size *= extent
    return size * tvm.DataType(str(dtype)).itemsize


def small_buffers_on_stack():
    """A PrimFunc pass: annotate small "local" buffers so LowerTVMBuiltin leaves them on the stack."""
    return _body_pass(_on_stack, "mlc.SmallBuffersOnStack")


def _conjuncts(cond):
    from tvm import tirx

    return _conjuncts(cond.a) + _conjuncts(cond.b) if isinstance(cond, tirx.And) else [cond]


def _substitute(node, mapping: dict):
    """`node` (an expression or statement) with vars replaced: TVM 0.27 has no Python Substitute, but
    PrimFunc.specialize substitutes its parameters."""
    from tvm import tirx

    stmt = node if isinstance(node, tirx.Stmt) else tirx.Evaluate(node)
    body = tirx.PrimFunc(list(mapping), stmt).specialize(mapping).body
    return body if isinstance(node, tirx.Stmt) else body.value


def _rewrite_conditions(stmt, decide, analyzer):
    """`stmt` with each IfThenElse condition's conjuncts passed through `decide(conjunct) -> expr`;
    branches whose condition folds to a constant are resolved. Loop ranges are bound in `analyzer`."""
    import tvm
    from tvm import tirx

    if isinstance(stmt, tirx.IfThenElse):
        parts = [analyzer.simplify(decide(c)) for c in _conjuncts(stmt.condition)]
        then_case = _rewrite_conditions(stmt.then_case, decide, analyzer)
        else_case = _rewrite_conditions(stmt.else_case, decide, analyzer) if stmt.else_case is not None else None
        if any(isinstance(p, tirx.IntImm) and not p.value for p in parts):
            return else_case if else_case is not None else tirx.Evaluate(0)
        parts = [p for p in parts if not (isinstance(p, tirx.IntImm) and p.value)]
        if not parts:
            return then_case
        condition = parts[0]
        for part in parts[1:]:
            condition = tirx.And(condition, part)
        return tirx.IfThenElse(condition, then_case, else_case, stmt.span)
    if isinstance(stmt, tirx.BufferStore) and _is_select(stmt.value) and getattr(stmt, "predicate", None) is None:
        # a padding copy's value, `if_then_else(col < cols, load, 0)`: the load where the condition folds to true
        parts = [analyzer.simplify(decide(c)) for c in _conjuncts(stmt.value.args[0])]
        if all(isinstance(p, tirx.IntImm) and p.value for p in parts):
            return tirx.BufferStore(stmt.buffer, stmt.value.args[1], stmt.indices, stmt.span)
        return stmt
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_rewrite_conditions(s, decide, analyzer) for s in stmt.seq], stmt.span)
    if isinstance(stmt, tirx.For):
        analyzer.bind(stmt.loop_var, tvm.ir.Range.from_min_extent(stmt.min, stmt.extent))
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind,
                        _rewrite_conditions(stmt.body, decide, analyzer), stmt.thread_binding, stmt.annotations,
                        stmt.step, stmt.span)
    if isinstance(stmt, tirx.AttrStmt):
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, _rewrite_conditions(stmt.body, decide, analyzer),
                             stmt.span)
    if isinstance(stmt, tirx.While):
        return tirx.While(stmt.condition, _rewrite_conditions(stmt.body, decide, analyzer), stmt.span)
    return stmt


def _is_select(expr) -> bool:
    import tvm

    return isinstance(expr, tvm.ir.Call) and getattr(expr.op, "name", "").endswith("if_then_else")


def _renew(stmt):
    """A copy of `stmt` with fresh loop vars and buffers (each tail kernel defines its own)."""
    from tvm import s_tir, tirx

    return s_tir.renew_defs(tirx.PrimFunc([], stmt)).body


def _split_row_tail(loop):
    """The marked loop over ceil(rows / tile) row tiles -> whole tiles, then one tail per remainder."""
    import tvm
    from tvm import tirx

    from mlc.compiler.schedule_rules import ROW_COUNT, ROW_TAIL

    tile, name = int(loop.annotations[ROW_TAIL]), str(loop.annotations[ROW_COUNT])
    rows = next((v for v in _undefined_vars(loop.extent) if v.name == name), None)
    if rows is None:
        return loop
    dtype = str(rows.ty.dtype)
    tile_ = tirx.IntImm(dtype, tile)
    if not tvm.sym.Analyzer().can_prove_equal(loop.extent, tirx.FloorDiv(rows + tirx.IntImm(dtype, tile - 1), tile_)):
        return loop
    whole = tirx.FloorDiv(rows, tile_)
    analyzer, in_whole_tile = _whole_tile_conditions(rows, loop, tile_)
    annotations = {k: v for k, v in loop.annotations.items() if k not in (ROW_TAIL, ROW_COUNT)}
    main = tirx.For(loop.loop_var, tirx.IntImm(dtype, 0), whole, tirx.ForKind.SERIAL,
                    _rewrite_conditions(loop.body, in_whole_tile, analyzer), None, annotations)
    tails = [main]
    last = _substitute(loop.body, {loop.loop_var: whole})
    for remainder in range(1, tile):
        exact = {rows: whole * tile_ + tirx.IntImm(dtype, remainder)}
        tail_analyzer = tvm.sym.Analyzer()
        body = _rewrite_conditions(last, lambda c, exact=exact: _substitute(c, exact) if rows in _undefined_vars(c)
                                   else c, tail_analyzer)
        tails.append(tirx.IfThenElse(tirx.FloorMod(rows, tile_) == remainder, _renew(body), None))
    return tirx.SeqStmt(tails)


def _whole_tile_conditions(count, loop, tile_):
    """An analyzer and a condition rewriter for the body of `loop` over tiles of `tile_` along a symbolic `count`:
    in a whole tile (one that ends at or before `count`) the `< count` branches are proven true."""
    import tvm
    from tvm import tirx

    dtype = str(count.ty.dtype)
    slack = tirx.Var("slack", dtype)
    analyzer = tvm.sym.Analyzer()
    analyzer.bind(slack, tvm.ir.Range.from_min_extent(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, 1 << 40)))
    bound = {count: loop.loop_var * tile_ + tile_ + slack}

    def in_whole_tile(cond):
        if count not in _undefined_vars(cond):
            return cond
        return tirx.IntImm("bool", 1) if analyzer.can_prove(_substitute(cond, bound)) else cond

    return analyzer, in_whole_tile


def _split_col_tail(loop):
    """The marked loop over ceil(cols / tile) column tiles of a zero-padded symbolic J -> whole tiles, whose
    `col < cols` branches are proven true and removed, then one tail tile (`cols % tile != 0`) that keeps them
    (over a longer padded extent: a loop over the remaining tiles). Row-tile loops inside are split in turn."""
    import tvm
    from tvm import tirx

    from mlc.compiler.schedule_rules import COL_TAIL, ROW_COUNT

    tile, name = int(loop.annotations[COL_TAIL]), str(loop.annotations[ROW_COUNT])
    cols = next((v for v in _undefined_vars(loop.extent) if v.name == name), None)
    if cols is None:
        return _map_bodies(loop, _row_tails)
    dtype = str(cols.ty.dtype)
    tile_ = tirx.IntImm(dtype, tile)
    whole = tirx.FloorDiv(cols, tile_)
    one_tail = tvm.sym.Analyzer().can_prove_equal(loop.extent,
                                                  tirx.FloorDiv(cols + tirx.IntImm(dtype, tile - 1), tile_))
    if not one_tail and not tvm.sym.Analyzer().can_prove(whole <= loop.extent):
        return _map_bodies(loop, _row_tails)
    analyzer, in_whole_tile = _whole_tile_conditions(cols, loop, tile_)
    annotations = {k: v for k, v in loop.annotations.items() if k not in (COL_TAIL, ROW_COUNT)}
    main = tirx.For(loop.loop_var, tirx.IntImm(dtype, 0), whole, tirx.ForKind.SERIAL,
                    _row_tails(_rewrite_conditions(loop.body, in_whole_tile, analyzer)), None, annotations)
    if one_tail:
        tail = _row_tails(_renew(_substitute(loop.body, {loop.loop_var: whole})))
        return tirx.SeqStmt([main, tirx.IfThenElse(tirx.FloorMod(cols, tile_) != 0, tail, None)])
    # a loop over a padded extent (a padding copy's columns): the tiles past the whole ones keep their branches
    rest = tirx.Var("rest", dtype)
    tail = tirx.For(rest, tirx.IntImm(dtype, 0), loop.extent - whole, tirx.ForKind.SERIAL,
                    _row_tails(_renew(_substitute(loop.body, {loop.loop_var: whole + rest}))), None, annotations)
    return tirx.SeqStmt([main, tail])


def _undefined_vars(expr) -> list:
    from tvm.tirx.analysis import undefined_vars

    return list(undefined_vars(expr))


def _row_tails(stmt):
    from tvm import tirx

    from mlc.compiler.schedule_rules import COL_TAIL, ROW_COUNT, ROW_TAIL

    if isinstance(stmt, tirx.For) and stmt.annotations and COL_TAIL in stmt.annotations \
            and ROW_COUNT in stmt.annotations:
        return _split_col_tail(stmt)
    if isinstance(stmt, tirx.For) and stmt.annotations and ROW_TAIL in stmt.annotations \
            and ROW_COUNT in stmt.annotations:
        return _split_row_tail(stmt)
    return _map_bodies(stmt, _row_tails)


def split_row_tails():
    """A PrimFunc pass (on flattened TIR, before vectorizing and unrolling): see the module docstring."""
    return _body_pass(_row_tails, "mlc.SplitRowTails")


def _loads(node, found: list) -> list:
    """The buffer loads in an expression or statement (appended to `found`)."""
    import tvm
    from tvm import tirx

    if isinstance(node, tvm.ir.expr.TensorLoad):
        found.append(node)
    if isinstance(node, tirx.For):
        return _loads(node.body, found)
    if isinstance(node, tirx.SeqStmt):
        for s in node.seq:
            _loads(s, found)
        return found
    for field in ("a", "b", "value", "condition", "true_value", "false_value", "body", "then_case", "else_case"):
        child = getattr(node, field, None)
        if isinstance(child, (tvm.ir.Expr, tirx.Stmt)):
            _loads(child, found)
    for child in list(getattr(node, "args", None) or []) + list(getattr(node, "indices", None) or []):
        if isinstance(child, tvm.ir.Expr):
            _loads(child, found)
    return found


def _loop_vars(stmt) -> list:
    from tvm import tirx

    if isinstance(stmt, tirx.For):
        return [(stmt.loop_var, str(stmt.loop_var.ty.dtype)), *_loop_vars(stmt.body)]
    if isinstance(stmt, tirx.SeqStmt):
        return [v for s in stmt.seq for v in _loop_vars(s)]
    body = getattr(stmt, "body", None)
    return _loop_vars(body) if isinstance(body, tirx.Stmt) else []


def _with_prefetches(loop):
    """The register tile's reduction loop (marked schedule_rules.PREFETCH with the distance in elements from
    one packed weight panel to the next) with prefetches (into L2) of the next panel's lines at the same depth,
    one per cache line the step reads (clamped to the buffer): the next panel streams from memory while this one
    is computed, where the hardware prefetcher fell behind (bert-base's 3072-deep panels at seq 8-12; resnet50's
    bf16 3x3 convs at 7 x 7)."""
    import tvm
    from tvm import tirx

    from mlc.compiler.schedule_rules import PREFETCH, PREFETCH_LIMIT

    ahead, k = int(loop.annotations[PREFETCH]), loop.loop_var
    limit = loop.annotations.get(PREFETCH_LIMIT)
    inner = {v: tirx.IntImm(dtype, 0) for v, dtype in _loop_vars(loop.body)}
    analyzer = tvm.sym.Analyzer()
    prefetches, seen = [], set()
    views = [s for s in _statements(loop.body, []) if isinstance(s, tirx.DeclBuffer)]
    for load in _loads(loop.body, []):
        size = load.source.shape[0] if len(load.source.shape) == 1 else None
        if limit is not None:  # the load is a view (a bf16 tile's): the weight's own size
            size = tirx.IntImm("int64", int(limit))
        if len(load.indices) != 1 or not isinstance(size, tirx.IntImm) or k not in _undefined_vars(load.indices[0]):
            continue
        index = load.indices[0]
        index = index.base if isinstance(index, tirx.Ramp) else index
        step = analyzer.simplify(_substitute(index, {k: k + 1}) - index)
        per_line = 64 // tvm.DataType(str(load.source.dtype)).itemsize
        if not isinstance(step, tirx.IntImm) or step.value % per_line or step.value < per_line:
            continue  # not a packed weight panel (whose K step is whole lines)
        base = analyzer.simplify(_substitute(index, inner) if inner else index)
        key = (str(load.source), str(base))
        if key in seen:
            continue
        seen.add(key)
        # From the data pointer, outside the body: the load's buffer may be a view declared in it (a bf16 tile's
        # B_bits over the packed weight)
        data = next((v.data for v in views if v.buffer.same_as(load.source)), load.source.data)
        for line in range(step.value // per_line):
            at = tirx.Min(base + (ahead + line * per_line), tirx.IntImm(str(index.ty.dtype), size.value - 1))
            address = tirx.handle_add_byte_offset(data, at * tvm.DataType(str(load.source.dtype)).itemsize)
            # TVM 0.27's tirx.prefetch finds no llvm.prefetch declaration (LLVM 22 overloads it by address space)
            prefetches.append(tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0", address, *[
                tirx.IntImm("int32", v) for v in (0, 2, 1)])))  # read, into L2 (locality 2), data
    if not prefetches:
        return loop
    annotations = {key: value for key, value in loop.annotations.items() if key not in (PREFETCH, PREFETCH_LIMIT)}
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.SeqStmt([*prefetches, loop.body]),
                    loop.thread_binding, annotations, loop.step, loop.span)


def _prefetch(stmt):
    from tvm import tirx

    from mlc.compiler.schedule_rules import PREFETCH

    if isinstance(stmt, tirx.For) and stmt.annotations and PREFETCH in stmt.annotations:
        return _with_prefetches(stmt)
    return _map_bodies(stmt, _prefetch)


def _statements(stmt, found: list) -> list:
    """`stmt` and every statement in it (loops, sequences, branches' cases), in order."""
    from tvm import tirx

    found.append(stmt)
    for child in list(getattr(stmt, "seq", None) or []) + [getattr(stmt, f, None) for f in (
            "body", "then_case", "else_case")]:
        if isinstance(child, tirx.Stmt):
            _statements(child, found)
    return found


def _padded_index(loop, name: str, dim: int, stride: int, extent: int, free=None):
    """The index along `dim` at which the kernel-row or -column `loop` reads the padded buffer `name`, if one
    expression whose only var from inside the loop is `free` (none for rows; the tile's row loop for columns): a
    load's index, or a tensor intrinsic's view's offset (bf16: index = offset // stride % extent)."""
    import tvm
    from tvm import tirx

    analyzer = tvm.sym.Analyzer()
    statements = _statements(loop.body, [])
    inner = [s for s in statements if isinstance(s, tirx.For)]
    for inner_loop in inner:
        analyzer.bind(inner_loop.loop_var, tvm.ir.Range.from_min_extent(inner_loop.min, inner_loop.extent))
    at = {str(load.indices[dim]): load.indices[dim] for load in _loads(loop.body, [])
          if load.source.name == name and len(load.indices) > dim}
    for view in (s for s in statements if isinstance(s, tirx.DeclBuffer)):
        data = view.data  # the buffer it views: buffer_data(name)
        if getattr(getattr(data, "op", None), "name", None) == "tirx.buffer_data" and data.args[0].name == name:
            kind = str(view.buffer.elem_offset.ty.dtype)
            index = analyzer.simplify(tirx.FloorMod(tirx.FloorDiv(view.buffer.elem_offset, tirx.IntImm(kind, stride)),
                                                    tirx.IntImm(kind, extent)))
            at[str(index)] = index
    if len(at) != 1:
        return None
    index = next(iter(at.values()))
    used = {v.loop_var for v in inner} & set(_undefined_vars(index))
    return index if used == ({free} if free is not None else set()) else None


def _columns_versions(loop, spec):
    """The kernel-column `loop`'s body, versioned by which of the tile's pixels (its unrolled row loop, [0, R))
    read padding at this kernel column: where none do, the body; else the body over the pixels [lo, hi) that
    read the image (at a 3x3 conv's left or right edge, R - 1 of them), for each (lo, hi) the padding allows; else
    (not reached) the body. None where the tile's pixel loop is not found."""
    import tvm
    from tvm import tirx

    name, dim, first, end, stride, extent = (spec[0], *map(int, spec[1:]))
    rows = next((r for r in _statements(loop.body, []) if isinstance(r, tirx.For) and r.kind == tirx.ForKind.UNROLLED
                 and isinstance(r.extent, tirx.IntImm) and isinstance(r.min, tirx.IntImm) and int(r.min) == 0), None)
    column = _padded_index(loop, str(name), dim, stride, extent, rows.loop_var) if rows is not None else None
    if column is None:
        return None
    analyzer, pixels, kind = tvm.sym.Analyzer(), int(rows.extent), str(column.ty.dtype)
    analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))  # (bf16: drops `% columns`)

    def const(v: int):
        return tirx.IntImm(kind, v)

    def at(pixel: int):
        return analyzer.simplify(_substitute(column, {rows.loop_var: tirx.IntImm(str(rows.loop_var.ty.dtype),
                                                                                   pixel)}))

    step = analyzer.simplify(at(1) - at(0)) if pixels > 1 else None
    if not isinstance(step, tirx.IntImm) or step.value < 1:
        return None

    def over(lo: int, hi: int):  # the body on the tile's pixels [lo, hi) only
        def visit(stmt):
            if isinstance(stmt, tirx.For) and stmt.loop_var.same_as(rows.loop_var):
                # a var of its own: TVM's passes reject one var bound to two ranges
                pixel = tirx.Var(f"{stmt.loop_var.name}_{lo}_{hi}", stmt.loop_var.ty)
                return tirx.For(pixel, tirx.IntImm(str(stmt.min.ty.dtype), lo),
                                tirx.IntImm(str(stmt.extent.ty.dtype), hi - lo), stmt.kind,
                                _substitute(stmt.body, {stmt.loop_var: pixel}), stmt.thread_binding,
                                stmt.annotations, stmt.step, stmt.span)
            return _map_bodies(stmt, visit)
        return visit(loop.body) if lo < hi else tirx.Evaluate(const(0))

    left, right = -(-first // step.value), -(-(extent - end) // step.value)  # pixels a tile can have on padding
    versions = loop.body
    for lo in reversed(range(0, min(left, pixels) + 1)):
        for hi in reversed(range(max(pixels - right, 0), pixels + 1)):
            if (lo, hi) == (0, pixels):
                continue
            bounds = [const(first) <= at(lo) if lo < pixels else None, at(lo - 1) < const(first) if lo else None,
                      at(hi - 1) < const(end) if hi else None, const(end) <= at(hi) if hi < pixels else None]
            versions = tirx.IfThenElse(functools.reduce(tirx.And, [c for c in bounds if c is not None]),
                                       over(lo, hi), versions)
    return tirx.IfThenElse(tirx.And(const(first) <= at(0), at(pixels - 1) < const(end)), loop.body, versions)


def _skip_padding(stmt):
    """A conv tile's kernel-row loop marked schedule_rules.VALID_ROWS runs over the kernel rows whose padded input
    row (which no loop inside the tile changes) is in [first, end) only (`_valid_range`; where that row is not the
    loop var plus a constant, its body goes under `if first <= row < end`); its kernel-column loop marked VALID_COLS
    gets `_columns_versions`: kernel rows and columns over zero padding only are skipped."""
    from tvm import tirx

    from mlc.compiler.schedule_rules import VALID_COLS, VALID_ROWS

    marks = stmt.annotations if isinstance(stmt, tirx.For) and stmt.annotations else {}
    if VALID_ROWS not in marks and VALID_COLS not in marks:
        return _map_bodies(stmt, _skip_padding)
    annotations = {k: v for k, v in marks.items() if k not in (VALID_ROWS, VALID_COLS)}
    start, count = stmt.min, stmt.extent
    if VALID_ROWS in marks:
        name, dim, first, end, stride, extent = (marks[VALID_ROWS][0], *map(int, marks[VALID_ROWS][1:]))
        row = _padded_index(stmt, str(name), dim, stride, extent)  # (before the columns' versions repeat loops)
        body = _skip_padding(stmt.body)
        bounds = _valid_range(stmt, row, first, end) if row is not None else None
        if bounds is not None:
            start, count = bounds
        elif row is not None:
            kind = str(row.ty.dtype)
            body = tirx.IfThenElse(tirx.And(tirx.IntImm(kind, first) <= row, row < tirx.IntImm(kind, end)), body, None)
    else:
        body = _columns_versions(stmt, list(marks[VALID_COLS])) or stmt.body
    return tirx.For(stmt.loop_var, start, count, stmt.kind, body, stmt.thread_binding, annotations,
                    stmt.step, stmt.span)


def _valid_range(loop, row, first: int, end: int):
    """(min, extent) of the kernel rows of `loop` whose input `row` (the loop var's coefficient 1) lies in [first,
    end): the loop's bounds rather than a branch in its body, which made LLVM spill a 12-row tile's accumulators
    (a 7x1 conv at 17 x 24: 156 spills and reloads against 24, 1.13x the time). None for another coefficient."""
    import tvm
    from tvm import tirx

    analyzer, var = tvm.sym.Analyzer(), loop.loop_var
    # A bf16 view's row is (offset // stride) % extent: the padded row, batch rows apart; within one image the
    # kernel rows read it without wrapping, so the bounds come from the row at kernel row 0
    wrap = row.b if isinstance(row, tirx.FloorMod) and isinstance(row.b, tirx.IntImm) else None
    linear = row.a if wrap is not None else row
    at = [analyzer.simplify(_substitute(linear, {var: tirx.IntImm(str(var.ty.dtype), k)})) for k in (0, 1)]
    step = analyzer.simplify(at[1] - at[0])
    if not isinstance(step, tirx.IntImm) or step.value != 1:
        return None
    kind = str(var.ty.dtype)
    base = analyzer.simplify(tirx.FloorMod(at[0], wrap)) if wrap is not None else at[0]
    base = tirx.Cast(kind, base) if str(base.ty.dtype) != kind else base
    lo = analyzer.simplify(tirx.Max(loop.min, tirx.IntImm(kind, first) - base))
    hi = analyzer.simplify(tirx.Min(loop.min + loop.extent, tirx.IntImm(kind, end) - base))
    return lo, analyzer.simplify(tirx.Max(hi - lo, tirx.IntImm(kind, 0)))


def skip_padding():
    """A PrimFunc pass (before FlattenBuffer: it reads N-d indices): see `_skip_padding`."""
    return _body_pass(_skip_padding, "mlc.SkipPadding")


def prefetch_weights():
    """A PrimFunc pass (on flattened TIR): see `_with_prefetches`."""
    return _body_pass(_prefetch, "mlc.PrefetchWeights")


# fp32 -> bf16 in one instruction (AVX512-BF16's vcvtneps2bf16, round to nearest even), for `native_bf16_rounding`
BF16_ROUND_LLVM = """
define linkonce_odr <16 x i16> @mlc_cvtneps2bf16(<16 x float> %x) alwaysinline {
  %r = call <16 x bfloat> @llvm.x86.avx512bf16.cvtneps2bf16.512(<16 x float> %x)
  %b = bitcast <16 x bfloat> %r to <16 x i16>
  ret <16 x i16> %b
}
declare <16 x bfloat> @llvm.x86.avx512bf16.cvtneps2bf16.512(<16 x float>)
"""


def _bf16_rounding(x, lanes: int):
    """TVM's fp32 -> bf16 conversion of `x` as BF16ComputeLegalize writes it before a bf16 store
    (DTypeConversion: round half to even on the bits), vectorized to `lanes`."""
    from tvm import tirx

    def const(value):
        return tirx.Broadcast(tirx.const(value, "uint32"), lanes)

    bits = tirx.reinterpret(f"uint32x{lanes}", x)
    rounded = (bits + (((bits >> const(16)) & const(1)) + const(0x7FFF))) >> const(16)
    return tirx.reinterpret(f"bfloat16x{lanes}", tirx.Cast(f"uint16x{lanes}", rounded))


def _native_rounding(stmt):
    """`stmt` with each 16-lane bf16 store's rounding done by vcvtneps2bf16 (`mlc_cvtneps2bf16`): TVM's takes six
    integer instructions per vector (shift, and, add, add, shift, narrow), in every bf16 kernel's write-back."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    if not isinstance(stmt, tirx.BufferStore):
        return _map_bodies(stmt, _native_rounding)
    value = stmt.value
    if str(value.ty.dtype) != "bfloat16x16" or not isinstance(value, tvm.ir.Call):
        return stmt
    try:  # reinterpret(cast(uint16, (reinterpret(uint32, x) + ...) >> 16)): x
        x = value.args[0].value.a.a.args[0]
    except (AttributeError, IndexError, TypeError):
        return stmt
    if str(x.ty.dtype) != "float32x16" or not tvm_ffi.structural_equal(value, _bf16_rounding(x, 16)):
        return stmt
    native = tirx.call_pure_extern("uint16x16", "mlc_cvtneps2bf16", x)
    return tirx.BufferStore(stmt.buffer, tirx.reinterpret("bfloat16x16", native), stmt.indices, stmt.span)


def native_bf16_rounding():
    """A PrimFunc pass (after VectorizeLoop) for targets with AVX512-BF16: see `_native_rounding`. A function it
    changes imports BF16_ROUND_LLVM."""
    import tvm
    from tvm import tirx
    from tvm.target import Target, codegen

    def transform(func, _mod, _ctx):
        target = (func.attrs.get("target") if func.attrs else None) or Target.current(allow_none=True)
        try:
            if target is None or not codegen.target_has_features("avx512bf16", target):
                return func
        except Exception:  # not an LLVM x86 target
            return func
        body = _native_rounding(func.body)
        if body.same_as(func.body):
            return func
        return func.with_body(tirx.AttrStmt(tvm.ir.StringImm("mlc"), "pragma_import_llvm",
                                            tvm.ir.StringImm(BF16_ROUND_LLVM), body))

    return tirx.transform.prim_func_pass(transform, opt_level=0, name="mlc.NativeBF16Rounding")


def lowering_passes(config) -> list:
    """TVM 0.27's s_tir lowering (tvm/s_tir/pipeline.py) with split_row_tails and prefetch_weights after
    FlattenBuffer, native_bf16_rounding after VectorizeLoop, without CSE."""
    from tvm import s_tir, tirx

    passes = [
        s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(), s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerAutoCopy(), s_tir.transform.UnifyThreadBinding(), s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(), s_tir.transform.InjectPermutedLayout(),
        s_tir.transform.AnnotateIrregularLoop(), s_tir.transform.InjectSoftwarePipeline(),
        s_tir.transform.TransformMmaBufferLayout(), s_tir.transform.LowerOpaqueBlock(), skip_padding(),
        tirx.transform.FlattenBuffer(), split_row_tails(), prefetch_weights(), tirx.transform.BF16ComputeLegalize(),
        tirx.transform.NarrowDataType(32), s_tir.transform.LoopPartition(),
        tirx.transform.VectorizeLoop(not bool(config.get("tirx.disable_vectorize", False))), native_bf16_rounding(),
        s_tir.transform.InjectVirtualThread(), s_tir.transform.InjectDoubleBuffer(),
    ]
    if not bool(config.get("tirx.disable_storage_rewrite", False)):
        passes.append(tirx.transform.StorageRewrite())
    passes += [s_tir.transform.HoistIfThenElse(), tirx.transform.UnrollLoop(),
               s_tir.transform.RenormalizeSplitPattern(), tirx.transform.StmtSimplify(),
               tirx.transform.RemoveNoOp(), s_tir.transform.RewriteUnsafeSelect()]
    # No CommonSubexprElim (TVM's runs here): its lets of loop-invariant addresses sit at the top of the
    # kernel, live across every tail kernel, and LLVM spilled the reduction loop's own induction variable
    # (combined Q/K/V matmul, 5 to 27 rows: 1.16-1.22x the time without it; resnet50 unchanged, 1.004x).
    # LLVM's own GVN and LICM find the same subexpressions, inside each loop nest.
    return passes + [
        tirx.transform.FP8ComputeLegalize(), s_tir.transform.VerifyVTCMLimit(), s_tir.transform.LowerVtcmAlloc(),
        tirx.transform.VerifyMemory(), tirx.transform.AnnotateEntryFunc(), s_tir.transform.ThreadSync("shared"),
        s_tir.transform.ThreadSync("shared.dyn"), s_tir.transform.ThreadSync("warp"), s_tir.transform.InferFragment(),
        s_tir.transform.LowerThreadAllreduce(), s_tir.transform.MergeSharedMemoryAllocations(),
        tirx.transform.SplitHostDevice(), tirx.transform.MakePackedAPI(), tirx.transform.FP8StorageLegalize(),
        tirx.transform.BF16StorageLegalize()]


def _lower():
    import tvm

    @tvm.transform.module_pass(opt_level=0)
    def pipeline(mod, _ctx):
        return tvm.transform.Sequential(lowering_passes(tvm.transform.PassContext.current().config))(mod)

    return pipeline


def register() -> str:
    """Register the pipeline with TVM (idempotent); returns its name for tvm.compile(tir_pipeline=)."""
    import tvm
    from tvm.tirx import compilation_pipeline

    if NAME not in compilation_pipeline.PIPELINE_MAP:
        def factory():
            _, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir")
            return (_lower(), lambda: tvm.transform.Sequential([small_buffers_on_stack(), finalize_host()]),
                    finalize_device)

        compilation_pipeline.register_tir_pipeline(NAME, factory)
    return NAME
