"""Default CPU schedules for kernels no tuning record covers. Without a schedule TVM's CPU
code is a serial scalar loop nest (170x slower than ONNX Runtime on a small BERT); these rules
give every kernel threads and SIMD:

- spatial (elementwise, transpose, pad): fuse all loops, split by the vector width, parallel outer
  loop, vectorize the inner one;
- matmul/conv-like reductions out[.., M, J] whose J is contiguous in every input that reads it
  (CPU builds run conv2d in NHWC/HWIO for this, mlc.compiler.schedules): blocks of J tiles outermost, then a
  rows x 2 vectors accumulator tile in registers inside the reduction loops, the bias/residual/
  activation applied on the tile, constant weights repacked so each J tile is contiguous (folded at
  compile time); a J that is no multiple of the vector width is zero-padded to one (dense layers)
  or gets a 4 x vector-width tile with a tail (convs); each row tile visits a block of J tiles
  whose weights fit in L2, so big outputs are written in long runs;
- int8 (uint8 x int8 -> int32) and bf16 tiles run on AVX512-VNNI's vpdpbusd (mlc.compiler.int8_dot) and
  AVX512-BF16's vdpbf16ps where the target has them, with rows padded to the tile (tensorize takes no predicate);
- other reductions (softmax, layer norm, A x B^T): parallel over the spatial loops;
- a concatenation's computed inputs stay blocks of their own (inlined, they would run once per
  output element).

Rules only restructure loops and buffers with TVM's schedule primitives, which keep semantics; a
kernel a rule cannot handle is left unscheduled. Imports tvm."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from mlc.compiler import int8_dot, shared_tables
from mlc.compiler.contract import Note, NoteKind
from mlc.compiler.concat import schedule_concatenated_axis, schedule_concatenation
from mlc.targets import cpu_features

SCHEDULED = "tirx.is_scheduled"
PARALLEL_MIN = 2048  # below this many output elements a thread pool launch costs more than it saves
ROW_TILE = 4
# A loop over the row tiles of a symbolic row count: rows per tile, and the row count (a Var's name)
ROW_TAIL, ROW_COUNT = "mlc.row_tail", "mlc.row_count"
# A loop over the column tiles of a symbolic J (zero-padded to the tile): columns per tile; ROW_COUNT names J's Var
COL_TAIL = "mlc.col_tail"
L1_WAYS = 8  # set associativity of the L1 data cache (x86 and Neoverse cores: 8 or more)
PANEL_BLOCK_BYTES = 256 * 1024  # L2 is 512 KB to 2 MB on the x86 and ARM cores we target
# On a register tile's reduction loop: elements from one packed weight panel to the next, which tir_pipeline
# prefetches (`_schedule_register_tile` says where)
PREFETCH = "mlc.prefetch_ahead"
PREFETCH_LIMIT = "mlc.prefetch_limit"  # elements from the weight's data pointer to its end (its load may be a view)
PREFETCH_WEIGHTS = True
PREFETCH_MIN_ROWS = 8
PREFETCH_MAX_PASSES = 8  # a bf16 conv's row tiles per weight panel, at most, for prefetching the next
# On a conv tile's kernel-row (-column) loop: [padded input buffer's name, its row (column) dim, first and end
# index that are not padding, elements per index, indices], so tir_pipeline skips the kernel rows (and each
# pixel's kernel columns) that read zero padding only (`_padding_extents`)
VALID_ROWS, VALID_COLS = "mlc.valid_rows", "mlc.valid_cols"


def vector_lanes(target) -> int:
    """fp32 lanes of the target's vector, from the same LLVM cpu table as the presets' int8 and bf16 checks."""
    if target.kind.name != "llvm":
        return 4
    attrs = target.attrs or {}
    return cpu_features.vector_lanes(str(attrs.get("mcpu", "")), [str(a) for a in attrs.get("mattr", [])],
                                     "aarch64" in str(attrs.get("mtriple", "")))


def _extent(sch, loop):
    value = sch.get(loop).extent
    return int(value.value) if hasattr(value, "value") else None


def _vars_in(expr) -> set:
    from tvm.tirx.analysis import undefined_vars

    return set(undefined_vars(expr))


def _schedule_symbolic_spatial(sch, loops, lanes: int) -> None:
    """Loops of which some have a symbolic extent: fused, they cost a division by a run-time value per
    element and cannot be vectorized (bert-base's transposes and layer norm over a symbolic sequence ran
    5-25x slower than static ones). The constant leading loops are fused and run in parallel, the symbolic
    ones stay nested, and the constant trailing loops are fused and vectorized (per row where the innermost is no
    multiple of the vector: `_vector_rows`)."""
    extents = [_extent(sch, loop) for loop in loops]
    first = extents.index(None)
    last = len(extents) - 1 - extents[::-1].index(None)
    lead, middle, tail = loops[:first], loops[first:last + 1], loops[last + 1:]
    outer = None
    rows = _vector_rows(sch, tail, lanes) if tail else None
    if rows is not None:  # fused, resnet50's stem input (padded, cast, transposed) took 11x the static kernel's time
        outer = rows if math.prod(extents[last + 1:]) >= PARALLEL_MIN else None
    elif tail:
        width = math.prod(extents[last + 1:])
        fused = sch.fuse(*tail) if len(tail) > 1 else tail[0]
        if width >= lanes and width % lanes == 0:
            outer, inner = sch.split(fused, factors=[None, lanes])
            sch.vectorize(inner)
            outer = outer if width >= PARALLEL_MIN else None
    elif _vector_columns(sch, middle[-1], lanes) and len(middle) == 1:
        middle = []  # its tiles are split in tir_pipeline: not a parallel loop
    if lead and math.prod(extents[:first]) > 1:
        sch.parallel(sch.fuse(*lead) if len(lead) > 1 else lead[0])
    elif outer is not None:
        sch.parallel(outer)
    elif middle:
        sch.parallel(middle[0])


def _vector_columns(sch, loop, lanes: int):
    """A loop over a symbolic innermost axis (softmax's exp and division over seq x seq): vectors of `lanes`,
    whole ones without the per-element `col < cols` branch (tir_pipeline splits the loop marked COL_TAIL), the
    tail branched; TVM left it a scalar loop (1.5-2.8x the static kernels' time). Returns the loop over vectors,
    or None where the extent is not a plain Var."""
    from tvm import tirx

    columns = sch.get(loop).extent
    if not isinstance(columns, tirx.Var):
        return None
    outer, inner = sch.split(loop, factors=[None, lanes])
    sch.vectorize(inner)
    sch.annotate(outer, COL_TAIL, lanes)
    sch.annotate(outer, ROW_COUNT, columns.name)
    return outer


def _vector_rows(sch, loops, lanes: int):
    """Static loops whose innermost extent is no multiple of `lanes`: fused, a vector would straddle two rows of it
    (a ViT's 197 tokens): div/mod gathers and a predicated tail, which TVM's vectorizer scalarizes (softmax's exp:
    7 ns an element). The rows are fused instead, each row's loop vectorized by a width that divides it or left to
    LLVM's loop vectorizer (it adds the scalar tail itself). Returns the rows' loop, None where this does not
    apply."""
    last = _extent(sch, loops[-1])
    if len(loops) < 2 or last < lanes or last % lanes == 0:
        return None
    rows = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    width = narrow_lanes(last, lanes)
    if width is not None:
        _, inner = sch.split(loops[-1], factors=[None, width])
        sch.vectorize(inner)
    return rows


def _short_rows(sch, block, loops, lanes: int):
    """Static loops whose innermost extent is under a vector (an image's 3 channels, channels last) in a block that
    is not elementwise (a pad, a transpose): fused whole, a vector's lanes straddled pixels whose source addresses
    only div/mod could give, and LLVM gathered them element by element (a 224x224 image's NCHW -> NHWC transpose
    and its first conv's padding: 0.4 ms each, 5-7x what follows). The last two loops become each row's loop
    instead, left to LLVM's loop vectorizer: its addresses are affine in it (contiguous runs, or the interleaved
    groups of a transpose, which it shuffles). Returns the rows' loop, None where this does not apply."""
    if len(loops) < 3 or _elementwise(sch.get(block)):
        return None
    last, second = _extent(sch, loops[-1]), _extent(sch, loops[-2])
    if last >= lanes or last * second < 2 * lanes:
        return None
    sch.fuse(loops[-2], loops[-1])
    return sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]


def _elementwise(stmt) -> bool:
    """Every read indexes its buffer as the block writes its output, or broadcasts (constant indices in place of
    some): fused whole, its loops address every buffer linearly."""
    from tvm import tirx

    written = [r.min for r in stmt.writes[0].region] if len(stmt.writes) == 1 else None
    if written is None:
        return False
    for region in stmt.reads:
        read = [r.min for r in region.region]
        if len(read) > len(written):
            return False
        for index, write in zip(read, written[len(written) - len(read):]):
            if not (index.same_as(write) or isinstance(index, tirx.IntImm)):
                return False
    return True


def _operands(expr):
    """`expr` and, depth first, the operands of its binary operations (an index's `a // b`, `a % b`, `a + b`)."""
    yield expr
    for part in ("a", "b"):
        if hasattr(expr, part):
            yield from _operands(getattr(expr, part))


def _split_at_index_period(sch, block, loops):
    """`block`'s loops with the innermost split at a period `w` its reads index it by (`v // w * p + v % w`: a grouped
    conv's output with each group's padding dropped, grouped_conv), so each vector lies in one period and reads
    contiguous addresses; fused or split by the vector alone, its lanes' addresses took a div/mod each and LLVM
    gathered them (regnety_016's 24-of-32 groups: 0.18 ms a call at 28 x 28 x 120). `loops` where no read does."""
    from tvm import tirx

    stmt = sch.get(block)
    extent = _extent(sch, loops[-1])
    if extent is None or not stmt.iter_vars:
        return loops
    last = stmt.iter_vars[-1].var
    periods = {int(e.b.value) for region in stmt.reads for r in region.region for e in _operands(r.min)
               if isinstance(e, tirx.FloorMod) and e.a.same_as(last) and isinstance(e.b, tirx.IntImm)}
    period = max((w for w in periods if w % 4 == 0 and w < extent and extent % w == 0), default=None)
    if period is None:
        return loops
    sch.split(loops[-1], factors=[None, period])
    return sch.get_loops(block)


def _padding_copy(sch, block, loops):
    """A padding copy whose condition leaves out the innermost axis (an int8 conv's input padded with the zero
    point, channels last): each pixel's channels as one vector, the condition tested once a pixel. Fused whole and
    cut into vectors, a vector straddled pixels, and TVM's vectorizer scalarized the condition's lanes: a byte at a
    time with a div/mod each (squeezenet's 224 x 226 x 4 stem input: 0.2 ms, half its conv's time). Returns the
    pixels' loop, None where this does not apply."""
    import tvm

    stmt = sch.get(block)
    store = stmt.body
    value = getattr(store, "value", None)
    name = str(getattr(getattr(value, "op", None), "name", ""))  # "prim.if_then_else" in TVM 0.27
    if len(loops) < 2 or not name.endswith("if_then_else") or stmt.iter_vars[-1].var in _vars_in(value.args[0]):
        return None
    bits, extent = tvm.DataType(str(store.buffer.dtype)).bits, _extent(sch, loops[-1])
    width = max(d for d in range(1, extent + 1) if extent % d == 0 and d * bits <= 512)
    if width * bits < 32 or width & (width - 1):  # (an image's 3 channels: `_short_rows`)
        return None
    if width < extent:
        sch.vectorize(sch.split(loops[-1], factors=[None, width])[1])
    else:
        sch.vectorize(loops[-1])
    return sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]


def _schedule_spatial(sch, block, lanes: int) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    loops = _split_at_index_period(sch, block, loops)
    if any(_extent(sch, loop) is None for loop in loops):
        _schedule_symbolic_spatial(sch, loops, lanes)
        return
    total = math.prod(_extent(sch, loop) for loop in loops)
    rows = _padding_copy(sch, block, loops)
    if rows is None:
        rows = _vector_rows(sch, loops, lanes)
    if rows is None:
        rows = _short_rows(sch, block, loops, lanes)
    if rows is not None:
        if total >= PARALLEL_MIN:
            sch.parallel(rows)
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = _extent(sch, fused)
    if extent is not None and extent >= lanes * 2:
        outer, inner = sch.split(fused, factors=[None, lanes])
        if extent >= PARALLEL_MIN:
            sch.parallel(outer)
        sch.vectorize(inner)
    elif extent is None or extent >= PARALLEL_MIN:
        sch.parallel(fused)


def _contiguous_last_axis(stmt, last_spatial) -> bool:
    """Every read that depends on the last spatial iterator does so only in its last index."""
    for region in stmt.reads:
        indices = [r.min for r in region.region]
        for position, index in enumerate(indices):
            if last_spatial in _vars_in(index) and position != len(indices) - 1:
                return False
    return True


def _registers(lanes: int) -> int:
    """Vector registers to spend on accumulators: AVX-512 has 32, AVX2/NEON 16; the rest hold the
    broadcast input and the weight vectors."""
    return 24 if lanes >= 16 else 12


def _divisor_at_most(extent, cap: int) -> int:
    """A row tile for a loop of `extent`: the largest divisor not above `cap` (no tail), or `cap`
    (a predicated tail) when the divisors are all small or the extent is unknown."""
    if extent is None:
        return cap
    if extent <= cap:
        return extent
    best = max(d for d in range(1, cap + 1) if extent % d == 0)
    return best if best * 2 > cap else cap


def _inline_epilogue(sch, block) -> None:
    """Fold the elementwise consumers (bias, residual add, activation) into `block`, the
    accumulator's write-back, so they run on the tile while it is in registers."""
    while True:
        for consumer in sch.get_consumers(block):
            try:
                sch.reverse_compute_inline(consumer)
                break
            except Exception:  # not elementwise over the same indices: leave it its own loop
                continue
        else:
            return


def _padding_extents(sch, block, n_spatial: int) -> dict:
    """{reduction loop: (VALID_ROWS or VALID_COLS, extents)} where `block`, a conv, reads an input that a block of
    its kernel zero-pads: along a dim indexed by a reduction var (a kernel row) and spatial vars outside the
    register tile (the output row), a whole tile reads only padding at some kernel rows (at a 3x3 conv's top and
    bottom output rows, 1 of 3); along one indexed by a reduction var (a kernel column) and the tile's rows (output
    pixels), some pixels do at some kernel columns. Those add nothing and can be skipped: 4/21 of a 7x7 output's
    work (OpenVINO skips them too). A 1x7 conv has no kernel-row var (its extent is 1): its kernel columns are
    the first reduction var."""
    import tvm
    from tvm import tirx

    stmt = sch.get(block)
    iters = list(stmt.iter_vars)
    reduction = [iv.var for iv in iters[n_spatial:]]
    if not reduction or n_spatial < 2:
        return {}
    outside_tile, tile_rows = {iv.var for iv in iters[:n_spatial - 2]}, iters[n_spatial - 2].var
    analyzer, found = tvm.sym.Analyzer(), {}
    for producer in sch.get_producers(block):
        pad = sch.get(producer)
        store, padded = pad.body, pad.writes[0].source
        value = getattr(store, "value", None)
        if not isinstance(value, tvm.ir.Call) or value.op.name != "prim.if_then_else" \
                or getattr(value.args[2], "value", None) != 0 or not hasattr(value.args[1], "indices"):
            continue
        source = value.args[1]  # the unpadded input, read at (padded index - padding before)
        for read in (r for r in stmt.reads if r.source.same_as(padded)):
            for dim, (at, stored) in enumerate(zip(read.region, store.indices)):
                used = set(_vars_in(at.min))
                kernel = [k for k, r in enumerate(reduction) if r in used]
                if len(kernel) != 1 or kernel[0] in found:
                    continue
                others = used - {reduction[kernel[0]]}
                mark = VALID_ROWS if others <= outside_tile else VALID_COLS if tile_rows in others and \
                    others <= outside_tile | {tile_rows} else None
                if mark is None or any(m == mark for m, _ in found.values()):
                    continue
                before = analyzer.simplify(stored - source.indices[dim])
                extent = source.source.shape[dim]
                shape = [int(n) if isinstance(n, tirx.IntImm) else None for n in padded.shape[dim:]]
                if isinstance(before, tirx.IntImm) and isinstance(extent, tirx.IntImm) and before.value > 0 \
                        and None not in shape:  # (the batch before it may be symbolic)
                    found[kernel[0]] = (mark, [padded.name, dim, before.value, before.value + extent.value,
                                               math.prod(shape[1:]), shape[0]])
    return found


def _pack_weights(sch, block, last, width: int, pairs: int = 0) -> None:
    """Constant inputs indexed by J last (a conv's HWIO or a dense layer's weight) are repacked
    so each tile's J slice is contiguous: [.., J] -> [J/width, .., width]. Rows of a power-of-two
    stride otherwise land in a few cache sets and a 512-channel conv's slice misses L2 (3x
    slower). The repacking block is marked like MetaSchedule's layout rewrite, so the build
    splits it out and folds it into the constant at compile time. A weight that `_pad_width`
    zero-padded is read through its padding block, which becomes the repacking block. A dot-product
    tile (`pairs`) needs its pairs side by side whatever the input: an activation (attention's K^T or V in
    bf16) is packed so at run time, in the kernel (`_pack_at_run_time`)."""
    constant = int8_dot.constant_params(sch)
    if not constant and not pairs:
        return

    def is_constant(region) -> bool:
        return any(region.source.same_as(c) for c in constant)

    for index, region in enumerate(sch.get(block).reads):
        indices = [r.min for r in region.region]
        if len(indices) < 2 or last not in _vars_in(indices[-1]):
            continue
        at_run_time = False
        if is_constant(region):
            packer = sch.cache_read(block, index, "global")
        else:
            packer = next((p for p in sch.get_producers(block) if sch.get(p).writes[0].source.same_as(region.source)
                           and all(is_constant(r) for r in sch.get(p).reads)), None)
            if packer is None:
                if not pairs or not _right_operand(sch.get(block), indices, last):
                    continue
                packer, at_run_time = sch.cache_read(block, index, "global"), True
        if not at_run_time:
            sch.annotate(packer, "meta_schedule.layout_rewrite_preproc", True)
        if pairs:  # [.., K, J] -> [J/width, .., K/p, width, p]: a lane's p K values side by side (vdpbf16ps: 2,
            # vpdpbusd: 4)
            sch.transform_layout(block, ("read", index),
                                 lambda *idx: [idx[-1] // width, *idx[:-2], idx[-2] // pairs, idx[-1] % width,
                                               idx[-2] % pairs])
        else:
            sch.transform_layout(block, ("read", index),
                                 lambda *idx: [idx[-1] // width, *idx[:-1], idx[-1] % width])
        if at_run_time:
            _pack_at_run_time(sch, packer)


def _right_operand(stmt, indices, last) -> bool:
    """Whether a read is a matmul's [.., K, J] operand: J (`last`) alone in its last index, only reduction variables
    in the one before (a grouped conv's input, whose channel also depends on the group, is not)."""
    reduction = {iv.var for iv in stmt.iter_vars if int(iv.iter_type) == 2}  # IterVar.CommReduce
    depth = _vars_in(indices[-2])
    return _vars_in(indices[-1]) == {last} and bool(depth) and depth <= reduction


def _pack_at_run_time(sch, packer) -> None:
    """The run-time copy, in the packed order (its writes contiguous), its pairs unrolled: LLVM interleaves the pair's
    rows into whole-vector stores (vpermt2w), where TVM's vectorizer made a scalar insert per value."""
    *batch, k, j = sch.get_loops(packer)
    width, pairs = (int(e) for e in sch.get(packer).writes[0].source.shape[-2:])
    jo, ji = sch.split(j, factors=[None, width])
    ko, ki = sch.split(k, factors=[None, pairs])
    sch.reorder(jo, *batch, ko, ji, ki)
    sch.parallel(sch.fuse(jo, *batch))
    sch.unroll(ki)


def _tile_shape(j_extent: int, row_extent, lanes: int, registers=None, depths=()) -> tuple[int, int]:
    """(vectors, rows) of the register tile for a J that is a multiple of `lanes`. A symbolic depth is (in
    attention's P x V) a symbolic row stride: each row of the tile then needs an address register of its own,
    and 12 rows spilled them (1.4-1.5x the static kernel's time); 4 vectors x 6 rows need half as many. A J of 3
    vectors (inception_v3's 48-channel 1x1 convs) gets all 3: one vector by 24 rows loaded an input element per
    multiply-add (0.37 -> 0.30 ms in the model, OpenVINO 0.31)."""
    wide = None in depths and j_extent % (4 * lanes) == 0
    vectors = 4 if wide else 2 if j_extent % (2 * lanes) == 0 else 3 if j_extent % (3 * lanes) == 0 else 1
    return vectors, _divisor_at_most(row_extent, (registers or _registers(lanes)) // vectors)


def tile_row_padding(j_extent: int, rows: int, lanes: int) -> int:
    """The fewest rows to add to a static row count so that a register tile divides it. A dot-product tile
    (vdpbf16ps, vpdpbusd) takes no predicated tail (tensorize) and a conv's rows cannot be padded in the kernel (not
    an einsum): also where `_schedule_register_tile` could cover the rows with a one-vector tile: inception_v3's 17
    rows ran at 60-68 % of the bf16 peak so, and at 85-93 % as 18 in a 9 x 2-vector tile. Einsum blocks pad
    this way too (`_padding_row_tile`). 0 where none are needed."""
    extra = 0
    while (rows + extra) % _tile_shape(j_extent, rows + extra, lanes)[1]:
        extra += 1
    return extra


def _padding_row_tile(j_extent: int, rows: int, lanes: int) -> int:
    """The row tile to pad a static row count to, of the fewest padded rows (`tile_row_padding`), not the widest
    tile: a 12-row tile padded inception_v3's 17 x 17 1x1 convs to 24 rows (0.71x the work useful, 58 % of the fp32
    peak), a 9-row one pads them to 18. 0 where the tile divides the rows."""
    extra = tile_row_padding(j_extent, rows, lanes)
    return _tile_shape(j_extent, rows + extra, lanes)[1] if extra else 0


def _row_tile(j_extent: int, row_extent, lanes: int, depths, registers=None) -> int:
    """The register tile's rows (`_tile_shape`), fewer where symbolic rows would alias in L1 (below)."""
    _, row_tile = _tile_shape(j_extent, row_extent, lanes, registers, depths)
    if row_extent is None and None not in depths and math.prod(depths) * 4 % 4096 == 0:
        # Symbolic rows read `depth` floats apart: at a multiple of 4 KB every row of the tile maps to one
        # L1 set, and more rows than the L1's ways (8) evict each other (bert-base's 3072 -> 768 layer:
        # 12 rows 1.14-1.2x the time of 8).
        row_tile = min(row_tile, L1_WAYS)
    return row_tile


def _pad_width(sch, block, spatial, n_reduction: int, lanes: int, depth: int = 0) -> bool:
    """Zero-pad J (and the weight) to a multiple of the vector tile, so a 10001-wide vocabulary
    head runs the register tile with no tail (a predicated tail makes LLVM emit scalar code:
    80x slower). The padded columns are computed and dropped in the write-back. Rows are padded
    to the row tile too where it would leave a tail: TVM 0.27's reverse_compute_inline replaces
    the write-back's row bound with the unpadding block's column bound, so the last row tile
    would write past the output (heap corruption, seen as crashes far from here). Needs an
    einsum (plain-index) block: a conv, whose input index is h*stride+r, keeps the tail rule. `depth` (vpdpbusd
    tiles, which must have no tail): the innermost reduction's multiple; J is then padded only if it needs it."""
    j_extent = _extent(sch, spatial[-1])
    multiple = 2 * lanes if j_extent >= 8 * lanes else lanes
    if depth and j_extent % lanes == 0:
        multiple = 1
    factors = [1] * (len(spatial) - 1) + [multiple] + [1] * (n_reduction - 1) + [max(depth, 1)]
    if len(spatial) > 1:
        row_extent = _extent(sch, spatial[-2])
        depths = [_extent(sch, r) for r in sch.get_loops(block)[len(spatial):]]
        depths[-1] = depths[-1] and -(-depths[-1] // factors[-1]) * factors[-1]
        padded_j = -(-j_extent // multiple) * multiple
        if row_extent is None:
            factors[len(spatial) - 2] = _row_tile(padded_j, row_extent, lanes, depths)
        elif row_tile := _padding_row_tile(padded_j, row_extent, lanes):  # squeezenet1_0's 1000-channel
            # classifier at 13 x 13 had 24 rows in 12-row tiles (51 % of the fp32 peak), now 14 in 7-row ones
            factors[len(spatial) - 2] = row_tile
    if all(f == 1 for f in factors):
        return False  # nothing to pad
    try:
        sch.pad_einsum(block, factors)
        return True
    except Exception:  # not an einsum
        return False


def _pad_symbolic_width(sch, block, spatial, reduction, lanes: int) -> bool:
    """Zero-pad a symbolic J (attention scores over seq x seq) to a multiple of 2 vectors, so the register tile
    runs on it: without, the kernel was a scalar loop reading K^T a row apart per step (bert-base at seq 128:
    30-60x the static kernel's time). J and rows are padded (copies of K^T and Q, 64 x seq floats each); the
    row and column tiles are split into whole tiles and tails in tir_pipeline. Floats only."""
    stmt = sch.get(block)
    if len(spatial) < 2 or None in [_extent(sch, r) for r in reduction]:
        return False
    if any(str(r.source.dtype) != "float32" for r in [*stmt.reads, *stmt.writes]):
        return False
    columns = sch.get(spatial[-1]).extent
    factors = [1] * (len(spatial) + len(reduction))
    factors[len(spatial) - 1] = 2 * lanes
    row_tile = _row_tile(2 * lanes, _extent(sch, spatial[-2]), lanes, [_extent(sch, r) for r in reduction])
    row_extent = _extent(sch, spatial[-2])
    if row_extent is None or row_extent % row_tile:
        # TVM 0.27's reverse_compute_inline of the unpadding block drops the write-back's row bound (`_pad_width`)
        factors[len(spatial) - 2] = row_tile
    before = [sch.get(p) for p in sch.get_producers(block)]
    try:
        sch.pad_einsum(block, factors)
    except Exception:  # not an einsum
        return False
    for pad in sch.get_producers(block):
        if not any(sch.get(pad).same_as(b) for b in before):
            _schedule_padding(sch, pad, lanes, columns)
    return True


def _schedule_padding(sch, pad, lanes: int, columns) -> None:
    """A zero-padding copy whose last loop is the padded symbolic J (K^T's): vectors of `lanes` columns, whole
    tiles without the `col < cols` branch (tir_pipeline splits the loop marked COL_TAIL), the tail branched."""
    from tvm import tirx

    loops = sch.get_loops(pad)
    if not isinstance(columns, tirx.Var) or _extent(sch, loops[-1]) is not None or None in [
            _extent(sch, loop) for loop in loops[:-1]]:
        _schedule_spatial(sch, pad, lanes)
        return
    outer, _, inner = sch.split(loops[-1], factors=[None, 2, lanes])  # J was padded to 2 vectors
    sch.vectorize(inner)
    sch.annotate(outer, COL_TAIL, 2 * lanes)
    sch.annotate(outer, ROW_COUNT, columns.name)
    if len(loops) > 1:
        sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])


def narrow_lanes(j_extent, lanes: int):
    """A narrower vector (8 or 4 floats) that divides a J no multiple of `lanes`, e.g. ghostnet's 12-, 36- and
    72-channel convs (J is padded only in einsum blocks; a conv's predicated J tail made LLVM emit scalar code,
    and a J below `lanes` was not vectorized at all); None when none divides it."""
    if j_extent is None:
        return None
    return next((width for width in (lanes // 2, lanes // 4) if width >= 4 and j_extent % width == 0), None)


# PAD_NARROW_WIDTHS is a module flag so a benchmark can build without it (benchmarks/cnn-kernels/odd_channels.py).
PAD_NARROW_WIDTHS = True


def no_vector_fits(j_extent: int, lanes: int) -> bool:
    """A static J of more than half a vector that neither `lanes` nor a narrower vector (`narrow_lanes`) divides:
    its kernels run a predicated tail, which LLVM emits as scalar code, unless J is padded to whole vectors."""
    return bool(j_extent % lanes) and j_extent > lanes // 2 and narrow_lanes(j_extent, lanes) is None


def _pads_width(j_extent: int, lanes: int) -> bool:
    """Whether a static J that is no multiple of the vector width is zero-padded to one: a wide J, or one no vector
    fits (NASNet's 1x1 convs to 11 and 22 channels ran a scalar loop and a predicated tail;
    benchmarks/cnn-kernels/odd_channels.py). Below half a vector (a GEMV's J of 1 or 2) partial sums over the
    depth stay cheaper than a mostly padded tile."""
    return j_extent >= 2 * lanes or (PAD_NARROW_WIDTHS and no_vector_fits(j_extent, lanes))


def _pad_rows(sch, block, spatial, n_reduction: int, j_extent: int, lanes: int) -> bool:
    """Zero-pad a static row count that the row tile does not divide (a ViT's 197 tokens) to a multiple of it, so
    every tile runs without the per-row predicate that kept the tile out of registers. Einsum blocks only."""
    if len(spatial) < 2:
        return False
    row_extent = _extent(sch, spatial[-2])
    if row_extent is None:
        return False
    row_tile = _padding_row_tile(j_extent, row_extent, lanes)
    if not row_tile:
        return False
    factors = [1] * (len(spatial) + n_reduction)
    factors[len(spatial) - 2] = row_tile
    try:
        sch.pad_einsum(block, factors)
        return True
    except Exception:  # not an einsum (a conv): the predicated tail
        return False


def _panels_per_block(n_panels, depth, width: int) -> int:
    """How many J tiles (panels) one row tile visits before the next row tile: as many as keep
    their weight slices (`depth` x `width` floats each) within PANEL_BLOCK_BYTES of L2, so the
    output is written in runs of a kilobyte or more. One panel per visit wrote a 10001-wide
    vocabulary head's 256 MB output in 128-byte pieces 40 KB apart, each cache line fetched twice
    or more: 290 ms where the blocked loop takes 240 (ONNX Runtime: 280)."""
    if not n_panels or not depth:
        return 1
    fit = min(PANEL_BLOCK_BYTES // (depth * width * 4), n_panels)
    return _divisor_at_most(n_panels, fit) if fit > 1 else 1


# C[lanes] (fp32) += A[2] (bf16) . B[lanes, 2] (bf16), one instruction: (lanes, aarch64) -> (intrinsic, LLVM
# function, the instruction's LLVM intrinsic, the target feature). AVX512-BF16's vdpbf16ps (16 lanes; 8 and 4 on
# ymm/xmm, for the narrow tiles of groups of 8 or 4 channels: resnext's), ARM BF16's bfdot (4 lanes, Neoverse
# V1/V2: Graviton 3/4): each adds to every fp32 lane the products of a pair of bf16 values broadcast from A with
# that lane's pair of B.
BF16_DOTS = {(16, False): ("mlc_bf16_dot_16x2", "mlc_dpbf16ps", "llvm.x86.avx512bf16.dpbf16ps.512", "avx512bf16"),
             (8, False): ("mlc_bf16_dot_8x2", "mlc_dpbf16ps_8", "llvm.x86.avx512bf16.dpbf16ps.256", "avx512bf16"),
             (4, False): ("mlc_bf16_dot_4x2_x86", "mlc_dpbf16ps_4", "llvm.x86.avx512bf16.dpbf16ps.128",
                          "avx512bf16"),
             (4, True): ("mlc_bf16_dot_4x2", "mlc_bfdot", "llvm.aarch64.neon.bfdot.v4f32.v8bf16", "bf16")}


def bf16_dot_llvm(dot: tuple) -> str:
    """The instruction of BF16_DOTS key `dot` with bfloat operands, in LLVM IR: a kernel using the intrinsic imports
    it (pragma_import_llvm). TVM's LLVM codegen has no bfloat type, so the kernel passes bf16 bits as integers."""
    lanes = dot[0]
    _, function, instruction, _ = BF16_DOTS[dot]
    return f"""
define linkonce_odr <{lanes} x float> @{function}(<{lanes} x float> %c, i32 %a, <{2 * lanes} x i16> %b) alwaysinline {{
  %one = insertelement <{lanes} x i32> poison, i32 %a, i64 0
  %all = shufflevector <{lanes} x i32> %one, <{lanes} x i32> poison, <{lanes} x i32> zeroinitializer
  %abf = bitcast <{lanes} x i32> %all to <{2 * lanes} x bfloat>
  %bbf = bitcast <{2 * lanes} x i16> %b to <{2 * lanes} x bfloat>
  %r = call <{lanes} x float> @{instruction}(<{lanes} x float> %c, <{2 * lanes} x bfloat> %abf,
                                            <{2 * lanes} x bfloat> %bbf)
  ret <{lanes} x float> %r
}}
declare <{lanes} x float> @{instruction}(<{lanes} x float>, <{2 * lanes} x bfloat>, <{2 * lanes} x bfloat>)
"""


def _bf16_intrinsic(dot: tuple) -> str:
    """Register the bf16 dot-product tensor intrinsic of BF16_DOTS key `dot` (TVM 0.27 ships none); weights packed
    [.., K/2, lanes, 2]."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    lanes = dot[0]
    name, function, _, _ = BF16_DOTS[dot]
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    vector = f"float32x{lanes}"
    bits = f"uint16x{2 * lanes}"

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (2,), "bfloat16", offset_factor=1)
        B = T.match_buffer(b, (lanes, 2), "bfloat16", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "float32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2], B[0:lanes, 0:2])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "float32") * T.cast(B[vi, vk], "float32")

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (2,), "bfloat16", offset_factor=1)
        B = T.match_buffer(b, (lanes, 2), "bfloat16", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "float32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2], B[0:lanes, 0:2])
            T.writes(C[0:lanes])
            # bf16 bits as integers: TVM's BF16ComputeLegalize widens bf16 values to fp32, and its LLVM codegen has
            # no bfloat type, so the call goes to bf16_dot_llvm's function (linked in, inlined), which passes them
            # on as bfloat
            A_bits = T.decl_buffer((2,), "uint16", data=A.data, elem_offset=A.elem_offset)
            B_bits = T.decl_buffer((2 * lanes,), "uint16", data=B.data, elem_offset=B.elem_offset)
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_pure_extern(
                vector, function, C.vload([0], dtype=vector),
                T.reinterpret(A_bits.vload([0], "uint16x2"), dtype="int32"), B_bits.vload([0], dtype=bits))

    TensorIntrin.register(name, desc, impl)
    return name


def _bf16_dot_block(sch, block, reduction, lanes: int, target) -> Optional[tuple]:
    """The BF16_DOTS key of the instruction a register-tile block of `lanes` can run on: fp32 output from two bf16
    operands, an even innermost reduction, and a target with vdpbf16ps (16, 8 or 4 lanes) or bfdot (4); None where
    it cannot (no target, or an --emulated build, which has neither: plain casts there)."""
    from tvm.target import codegen

    if target is None:
        return None
    stmt = sch.get(block)
    dot = (lanes, "aarch64" in str(target.attrs.get("mtriple", "")))  # bfdot is ARM's, vdpbf16ps x86's
    if dot not in BF16_DOTS or str(stmt.writes[0].source.dtype) != "float32" or len(stmt.reads) < 2:
        return None
    if sum(str(r.source.dtype) == "bfloat16" for r in stmt.reads) < 2:
        return None
    depth = _extent(sch, reduction[-1])
    if depth is None or depth % 2:
        return None
    try:
        return dot if codegen.target_has_features(BF16_DOTS[dot][3], target) else None
    except Exception:  # not an LLVM target of that architecture
        return None


@dataclass
class _TilePlan:
    """A register tile: `row_tile` rows x `vectors` vectors of `lanes`, over a J of `j_extent` and rows of
    `row_extent` (None: symbolic), the innermost reduction in groups of `group` (a dot product's pairs or quads;
    0: none)."""
    lanes: int
    vectors: int
    row_tile: int
    group: int
    row_extent: object
    j_extent: int
    depths: list

    @property
    def width(self) -> int:
        return self.vectors * self.lanes


@dataclass
class _TileLoops:
    """The loops around a tile: `head` run in parallel, `serial` inside them (symbolic row and column tiles, a
    block's panels), `rows` the tile's rows (None: one row)."""
    head: list
    serial: list
    rows: object
    row_loop: object  # the serial loop over symbolic rows' tiles
    col_loop: object  # the serial loop over a symbolic J's tiles


def _plan_tile(sch, spatial, reduction, lanes: int, bf16: bool, int8: bool, registers, columns) -> _TilePlan:
    row_extent = _extent(sch, spatial[-2]) if len(spatial) > 1 else 1
    # A symbolic J (attention scores, seq x seq) comes zero-padded to 2 vectors (`_pad_symbolic_width`)
    j_extent = _extent(sch, spatial[-1]) if columns is None else 2 * lanes
    depths = [_extent(sch, r) for r in reduction]
    vectors, _ = _tile_shape(j_extent, row_extent, lanes, registers, depths)
    row_tile = _row_tile(j_extent, row_extent, lanes, depths, registers)
    group = 2 if bf16 else int8_dot.QUAD if int8 else 0
    if group and row_extent is not None and row_extent % row_tile and row_extent <= (registers or _registers(lanes)):
        # A dot-product tile takes no row predicate (tensorize), and a conv's rows cannot be padded (not an
        # einsum): one vector wide, every row of the tile, where no Relax pass padded the rows (relax_passes pads
        # bf16 convs' in bf16_matmul, int8 convs' in int8_conv_rows)
        vectors, row_tile = 1, row_extent
    return _TilePlan(lanes, vectors, row_tile, group, row_extent, j_extent, depths)


def _split_column_panels(sch, j_loop, plan: _TilePlan, padded_rows: bool, grouped: bool):
    """J into tiles of `plan.width` and blocks of tiles whose weight panels fit in L2: (blocks, vectors, lanes,
    panels per block, [the loop over a block's panels] or [])."""
    jo, jv, ji = sch.split(j_loop, factors=[None, plan.vectors, plan.lanes])
    panels = _panels_per_block(_extent(sch, jo), None if None in plan.depths else math.prod(plan.depths), plan.width)
    # A partial last block puts a predicate on the tile: no tensorize. TVM 0.27 wrote wrong values with padded
    # rows (inception_v3's 1x1 conv 768 -> 160 channels at 17 x 17 rows: 5 panels in blocks of 2), and where J is
    # one group's channels (`_split_groups`): the write-back's predicate bounds g x J, so a group's partial block
    # overwrote the next group's first panel with an unwritten accumulator (regnet_x_32gf: groups of 7 or 11
    # vectors in blocks of 4)
    if (plan.group or padded_rows or grouped) and _extent(sch, jo) % panels:
        panels = max(d for d in range(1, panels + 1) if _extent(sch, jo) % d == 0)
    inner_panels = []
    if panels > 1:
        jo, inner = sch.split(jo, factors=[None, panels])
        inner_panels = [inner]
    return jo, jv, ji, panels, inner_panels


def _row_tile_passes(sch, spatial, plan: _TilePlan):
    """The row tiles of one image (of the static dims after the last symbolic one) per weight panel; None where
    the rows are symbolic."""
    if len(spatial) < 2 or plan.row_extent is None:
        return None
    outer = [_extent(sch, loop) for loop in spatial[:-2]]
    static = outer[len(outer) - outer[::-1].index(None):] if None in outer else outer
    return math.prod(static) * -(-plan.row_extent // plan.row_tile)


def _tile_loop_nest(sch, spatial, plan: _TilePlan, jo, inner_panels, columns) -> _TileLoops:
    # A symbolic J's tiles get a serial loop (the other spatial loops run in parallel), which tir_pipeline splits
    # into whole tiles, whose write-back needs no predicate, and one tail tile.
    col_loop = jo if columns is not None and len(spatial) > 2 else None
    head = [jo] if col_loop is None else []
    rows = None
    # Rows come from the innermost other spatial loop only (a conv's output width): a tile that
    # crossed into the next output row would make the accumulator a non-rectangular region,
    # which LLVM can no longer keep in registers.
    if len(spatial) > 1:
        head += spatial[:-2]
        if plan.row_tile > 1:
            mo, rows = sch.split(spatial[-2], factors=[None, plan.row_tile])
            head.append(mo)
        else:
            head.append(spatial[-2])
    row_loop = None
    if rows is not None and plan.row_extent is None:
        # Symbolic rows: the row tiles get a serial loop of their own between the parallel blocks of J tiles
        # and the block's tiles, which tir_pipeline splits into whole tiles without a predicate and one tail
        # kernel per remainder.
        row_loop = head.pop(head.index(mo))
        serial = [row_loop] + inner_panels
    else:
        head += inner_panels
        serial = []
    if col_loop is not None:
        serial = [col_loop] + serial
    return _TileLoops(head, serial, rows, row_loop, col_loop)


def _mark_padding_taps(sch, block, spatial, reduction, plan: _TilePlan, int8: bool) -> None:
    for k, (mark, extents) in ({} if int8 else _padding_extents(sch, block, len(spatial))).items():  # (int8 pads
        # with the zero point.) The columns' versions of a tile with a predicated row tail each kept the predicate,
        # and LLVM spilled the accumulators (a 3x3 conv at 17 x 17, 12-row tiles: 1.4x the time without versions)
        if mark == VALID_ROWS or (plan.row_extent is not None and plan.row_extent % plan.row_tile == 0):
            sch.annotate(reduction[k], mark, extents)


def _parallel_tiles_with_write_back(sch, block, loops: _TileLoops, lanes: int):
    """Fuse and parallelize the head; the accumulator written back (with the epilogue, vectorized) per tile.
    Returns the fused loop."""
    tile = sch.fuse(*loops.head) if len(loops.head) > 1 else loops.head[0]
    # Annotate before decompose_reduction: the primitives need the block to still be a reduction.
    sch.parallel(tile)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, loops.serial[-1] if loops.serial else tile, preserve_unit_loops=True)
    _inline_epilogue(sch, write_back)
    inner = sch.get_loops(write_back)[1 + len(loops.serial):]
    if inner:
        _, vec = sch.split(sch.fuse(*inner) if len(inner) > 1 else inner[0], factors=[None, lanes])
        sch.vectorize(vec)
    return tile


def _prefetch_weight_panels(sch, reduction, plan: _TilePlan, panels: int, loops: _TileLoops, passes,
                            columns) -> None:
    depths, width, row_extent = plan.depths, plan.width, plan.row_extent
    if PREFETCH_WEIGHTS and panels == 1 and loops.row_loop is None and row_extent is not None \
            and PREFETCH_MIN_ROWS <= row_extent <= plan.row_tile and not plan.group and columns is None \
            and len(reduction) == 1 and None not in depths and depths[0] * width * 4 > PANEL_BLOCK_BYTES:
        # One row tile of 8-12 rows reads each weight panel once, straight from memory: where a panel is over
        # L2's share (bert-base's 3072 -> 768: 384 KB) the hardware prefetcher fell behind (seq 8: 0.54-0.58 ms
        # cold, 0.39-0.45 with these; seq 12: 0.9-1.2 -> 0.6-0.8). Not on fewer rows (1-4: no gain measured, one
        # run read them up to 1.7x slower), nor where more row tiles reread the panel (seq 32: 0.95-1.21x the
        # time, swin's 49 rows: 1.08x), on shallower panels (two to a block) or symbolic-row tiles (--dynamic
        # seq: 1.07x at seq 8). benchmarks/dense-kblock
        sch.annotate(reduction[0], PREFETCH, depths[0] * width)
    elif PREFETCH_WEIGHTS and plan.group == 2 and len(reduction) > 1 and passes is not None \
            and passes <= PREFETCH_MAX_PASSES and columns is None and None not in depths \
            and math.prod(depths) * width * 2 > PANEL_BLOCK_BYTES:
        # A bf16 conv whose weight panels only a few row tiles read waits on memory in the first of them (resnet50's
        # 3x3 convs at 7 x 7: 0.53 ms in the model, 0.38 with the weights in cache): each pass prefetches the next
        # block's panel (0.45-0.48 ms). With more passes the redundant prefetches cost more than they hide, in the
        # first pass only they hid little, and at fp32 they did not pay (benchmarks/precision, run 11). A symbolic
        # batch counts one image's passes.
        sch.annotate(reduction[-1], PREFETCH, panels * math.prod(depths) * width)
        sch.annotate(reduction[-1], PREFETCH_LIMIT, plan.j_extent * math.prod(depths))


def _annotate_symbolic_tails(sch, block, loops: _TileLoops, plan: _TilePlan, row_count, columns) -> None:
    """Mark the serial loops over symbolic rows' (a symbolic J's) tiles for tir_pipeline's whole-tile split."""
    from tvm import tirx

    if loops.row_loop is not None:
        # The accumulator indexed by row % row_tile (injective within the tile, the only rows it holds at a
        # time): its compacted size is then row_tile rows, not min(rows, row_tile), a size known only at run
        # time that TVM allocates on the heap and LLVM cannot keep in registers.
        row_tile = plan.row_tile
        sch.transform_layout(block, ("write", 0), lambda *idx: [*idx[:-2], idx[-2] % row_tile, idx[-1]],
                             assume_injective_transform=True)
    if loops.row_loop is not None and isinstance(row_count, tirx.Var):
        sch.annotate(loops.row_loop, ROW_TAIL, plan.row_tile)
        sch.annotate(loops.row_loop, ROW_COUNT, row_count.name)  # a Var would be read as a schedule variable
    if loops.col_loop is not None and isinstance(columns, tirx.Var):
        sch.annotate(loops.col_loop, COL_TAIL, plan.width)
        sch.annotate(loops.col_loop, ROW_COUNT, columns.name)


def _schedule_register_tile(sch, block, spatial, reduction, last, lanes: int, bf16: Optional[tuple] = None,
                            int8: bool = False, registers=None, columns=None, row_count=None,
                            padded_rows: bool = False) -> None:
    """out[M, J] += ... with J contiguous: a (rows x vectors) accumulator tile in registers,
    the reduction loops around it, blocks of J tiles outermost so their weight slices stay in
    cache while the rows stream past (each row tile visits the block's tiles in turn), epilogue
    applied on the tile. `bf16`: the BF16_DOTS key of the tile's instruction."""
    plan = _plan_tile(sch, spatial, reduction, lanes, bf16, int8, registers, columns)
    if row_count is None:  # (else the row count before `_pad_symbolic_width` padded it)
        row_count = sch.get(spatial[-2]).extent if len(spatial) > 1 else None
    grouped = len(_vars_in(sch.get(block).writes[0].region[-1].min)) > 1  # out[.., g x width + j]
    jo, jv, ji, panels, inner_panels = _split_column_panels(sch, spatial[-1], plan, padded_rows, grouped)
    passes = _row_tile_passes(sch, spatial, plan)
    loops = _tile_loop_nest(sch, spatial, plan, jo, inner_panels, columns)
    pair = []
    if plan.group:  # the innermost reduction in pairs (quads), innermost: vdpbf16ps's (vpdpbusd's) operand layout
        ko, ki = sch.split(reduction[-1], factors=[None, plan.group])
        reduction, pair = [*reduction[:-1], ko], [ki]
    sch.reorder(*loops.head, *loops.serial, *reduction, *([loops.rows] if loops.rows is not None else []), jv, ji,
                *pair)
    _mark_padding_taps(sch, block, spatial, reduction, plan, int8)
    _pack_weights(sch, block, last, plan.width, pairs=plan.group)
    tile = _parallel_tiles_with_write_back(sch, block, loops, lanes)
    if loops.rows is not None:
        sch.unroll(loops.rows)
    sch.unroll(jv)
    if not plan.group:
        sch.vectorize(ji)
    init = sch.decompose_reduction(block, reduction[0])
    if plan.group:
        sch.vectorize(sch.get_loops(init)[-1])
    _prefetch_weight_panels(sch, reduction, plan, panels, loops, passes, columns)
    _annotate_symbolic_tails(sch, block, loops, plan, row_count, columns)
    # The dot-product tiles must have no predicate (TVM 0.27's tensorize rejects one): rows padded by `_pad_width`
    if bf16:
        sch.tensorize(ji, _bf16_intrinsic(bf16))
        sch.annotate(tile, "pragma_import_llvm", bf16_dot_llvm(bf16))
    if int8:
        sch.tensorize(ji, int8_dot.vnni_intrinsic())


def _loops_of(sch, block, n_spatial: int):
    """(spatial loops, reduction loops) of `block`, read again after a padding rewrote it."""
    loops = sch.get_loops(block)
    return loops[:n_spatial], loops[n_spatial:]


def _dot_product_depth(sch, block, reduction, lanes: int, target, contiguous: bool) -> tuple[bool, int]:
    """(whether the block runs on vpdpbusd, the reduction depth padding `_pad_width` must apply: 1 for a bf16
    dot-product block, whose rows it pads)."""
    int8 = target is not None and contiguous and int8_dot.vnni_dot_block(sch, block, target, lanes)
    depth = int8_dot.depth_padding(sch, reduction) if int8 else 0
    int8 = int8 and depth > 0
    if contiguous and not int8 and _bf16_dot_block(sch, block, reduction, lanes, target):
        depth = 1  # vdpbf16ps: rows padded (an odd depth has no bf16 tile)
    return int8, depth


def _schedule_static_width_tile(sch, block, n_spatial: int, spatial, reduction, last, lanes: int, target, int8,
                                rows_before) -> None:
    """A register tile on a J that is a multiple of the vector width, on the dot-product instructions where the
    block and target have them."""
    j_extent = _extent(sch, spatial[-1])
    if _pad_rows(sch, block, spatial, len(reduction), j_extent, lanes):
        spatial, reduction = _loops_of(sch, block, n_spatial)
        last = sch.get(block).iter_vars[n_spatial - 1].var
    bf16 = _bf16_dot_block(sch, block, reduction, lanes, target)
    int8 = int8 and int8_dot.depth_padding(sch, reduction) == 1
    padded = len(spatial) > 1 and _extent(sch, spatial[-2]) != rows_before
    _schedule_register_tile(sch, block, spatial, reduction, last, lanes, bf16, int8, padded_rows=padded)


def _schedule_vector_rows(sch, block, spatial, reduction, lanes: int) -> None:
    """A J that is no multiple of the vector width (and not narrow): vectors of J by ROW_TILE rows, the tail
    predicated."""
    jo, ji = sch.split(spatial[-1], factors=[None, lanes])
    outer = list(spatial[:-1])
    rows = None
    if outer and (_extent(sch, outer[-1]) or 0) >= ROW_TILE:
        io, rows = sch.split(outer[-1], factors=[None, ROW_TILE])
        outer = outer[:-1] + [io]
    order = outer + [jo] + list(reduction) + ([rows] if rows is not None else []) + [ji]
    sch.reorder(*order)
    head = outer + [jo]
    fused = sch.fuse(*head) if len(head) > 1 else head[0]
    sch.parallel(fused)
    if rows is not None:
        sch.unroll(rows)
    sch.vectorize(ji)
    sch.decompose_reduction(block, reduction[0])


def _parallelize_spatial(sch, spatial) -> None:
    extents = [_extent(sch, loop) for loop in spatial]
    if None in extents:  # fused, symbolic loops cost a division by a run-time value per output element
        first = extents.index(None)
        lead = spatial[:first]
        if lead and math.prod(extents[:first]) > 1:
            sch.parallel(sch.fuse(*lead) if len(lead) > 1 else lead[0])
        else:
            sch.parallel(spatial[first])
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    extent = _extent(sch, fused)
    if extent is None or extent > 1:
        sch.parallel(fused)


def _amx_operands(sch, stmt):
    """(kind, activations, weights) of a block out = A x W whose operand and output dtypes one AMX multiply takes
    (amx.kind_of: u8 x s8 -> int32, bf16 x bf16 -> float32), W constant; else None."""
    from mlc.compiler import amx

    output = str(stmt.writes[0].source.dtype)
    operands = [r for r in stmt.reads if str(r.source.dtype) != output]
    constant = int8_dot.constant_params(sch)
    weights = [r for r in operands if any(r.source.same_as(c) for c in constant)]
    if len(operands) != 2 or len(weights) != 1:
        return None
    activations = next(r for r in operands if r is not weights[0])
    kind = amx.kind_of(str(activations.source.dtype), str(weights[0].source.dtype), output)
    return None if kind is None else (kind, activations, weights[0])


def _amx_dense_shape(sch, block, n_spatial: int, target, row_width=None):
    """(kind, rows, columns, depth, taps) of a dense layer out[.., M, N] = A[.., M, K] x W[K, N] (taps ()) of a
    multiply the target's AMX takes (`_amx_operands`), or of relax_passes._tap_matmul's conv once
    `_merge_pixel_rows` made its pixels rows of `row_width` (`_tap_rows`: taps (I, J, step, stride)), W constant, of
    static shape whose columns and depth fit AMX's tiles (amx.COLS, Kind.depth), big and deep enough to pay for them
    (amx.pays); else None."""
    from tvm import tirx

    from mlc.compiler import amx

    stmt = sch.get(block)
    loops = sch.get_loops(block)
    tap_count = len(loops) - n_spatial - 1
    operands = _amx_operands(sch, stmt) if n_spatial >= 2 and tap_count in (0, 1, 2) else None
    if operands is None or not amx.has_amx(target, operands[0]):
        return None
    kind, activations, weights = operands
    rows, columns, *taps, depth = (_extent(sch, loop) for loop in loops[n_spatial - 2:])
    if None in (rows, columns, depth, *taps) or columns % amx.COLS or depth % kind.depth \
            or not amx.pays(kind, rows * columns * depth * math.prod(taps), depth * math.prod(taps)):
        return None
    i, j, *tap_vars, k = (iv.var for iv in stmt.iter_vars[n_spatial - 2:])
    a, w = ([x.min for x in r.region] for r in (activations, weights))
    if tap_count == 1:  # a Kx1 or 1xK conv: TE drops the unit reduction axis, its index is 0
        unit = next((d for d in (1, 0) if len(w) == 4 and isinstance(w[d], tirx.IntImm) and w[d].value == 0), None)
        if unit is None:
            return None
        tap_vars.insert(unit, w[unit])
        taps.insert(unit, 1)
    if tap_vars:
        tap_rows = _tap_rows(activations, i, tap_vars, taps, row_width)
        if tap_rows is None:
            return None
        taps.extend(tap_rows)
    elif not a[-2].same_as(i):
        return None

    def same(x, v) -> bool:  # a tap var, or the 0 of a dropped unit tap axis
        return x.same_as(v) or isinstance(x, tirx.IntImm) and isinstance(v, tirx.IntImm) and x.value == v.value

    if len(w) != 2 + len(tap_vars) or not all(same(x, v) for x, v in zip(w, [*tap_vars, k, j])) \
            or not a[-1].same_as(k):
        return None
    return kind, rows, columns, depth, tuple(taps)


def _tap_rows(activations, i, tap_vars, taps, row_width):
    """(step, stride) where `activations` (a BufferRegion) is relax_passes._tap_matmul's input read at merged pixel
    row i and taps (ti, tj) of extents `taps`: [.., ti % stride, stride * i + ti // stride * step + tj, k] with
    step = stride * row_width; else None."""
    import tvm
    from tvm import tirx

    if row_width is None or len(activations.region) < 3:
        return None
    stride = activations.source.shape[-3]
    (ti, tj), analyzer = tap_vars, tvm.sym.Analyzer()
    for var, extent in zip(tap_vars, taps):  # TE folds ti // stride to 0 where the kernel is no taller than it
        if isinstance(var, tirx.Var):
            analyzer.bind(var, tvm.ir.Range(0, extent))
    phase, row = (x.min for x in activations.region[-3:-1])
    step = stride * row_width
    if not isinstance(stride, tirx.IntImm) \
            or not analyzer.can_prove_equal(row, stride * i + tirx.floordiv(ti, stride) * step + tj) \
            or not analyzer.can_prove_equal(phase, tirx.floormod(ti, stride)):
        return None
    return int(step), int(stride)


def _merge_pixel_rows(sch, block, n_spatial: int) -> tuple[int, Optional[int]]:
    """relax_passes.convs_as_rows's convs out[.., h, w, o] reading A[.., h * W + w, k] (a 1x1 conv) or
    A[.., phase, s * (h * W + w) + a tap's offset, k]: the output (an intermediate the epilogue reads, or a copy of
    the kernel's output) laid out as rows too and (h, w) merged into one row iterator, so the block is a dense layer
    out[.., h * W + w, o]. Returns its spatial loop count and W (unchanged and None where this does not apply)."""
    from tvm import tirx

    stmt = sch.get(block)
    if n_spatial < 3 or not stmt.name_hint.startswith(("pointwise_matmul", "tap_matmul")):
        return n_spatial, None
    output = stmt.writes[0].source
    if any(output.same_as(b) for b in sch.mod["main"].params):  # no epilogue (a densenet conv feeding a concat): the
        sch.cache_write(block, 0, "global")  # rows written to a buffer of its own, copied out as an epilogue would be
        output = sch.get(block).writes[0].source
    width = int(output.shape[-2])
    sch.transform_layout(block, ("write", 0), lambda *i: [*i[:-3], i[-3] * width + i[-2], i[-1]])

    def merged(*v):
        return (*v[:n_spatial - 3], v[n_spatial - 3] * width + v[n_spatial - 2], *v[n_spatial - 1:])

    sch.transform_block_layout(block, tirx.IndexMap.from_func(merged, ndim=len(sch.get_loops(block))))
    return n_spatial - 1, width


def _schedule_amx_dense(sch, block, n_spatial: int, target) -> bool:
    """A dense layer on AMX tiles (mlc.compiler.amx): blocks of amx.ROWS rows x W columns in parallel, each one
    intrinsic call over the whole depth (and the taps of a conv read as rows) into a local accumulator, the epilogue
    on it. Rows the blocks do not divide (a ViT's 197 tokens) are zero-padded in the kernel (`pad_einsum`: a copy
    of the activations; a conv's rows come padded). False where it does not apply (no AMX, columns or depth the
    tiles do not divide)."""
    from mlc.compiler import amx

    if not amx.has_amx(target):
        return False
    n_spatial, row_width = _merge_pixel_rows(sch, block, n_spatial)
    shape = _amx_dense_shape(sch, block, n_spatial, target, row_width)
    if shape is None:
        return False
    kind, rows, columns, depth, taps = shape
    if rows % amx.ROWS:
        # convs_as_rows pads a conv's rows, and bf16 rows are padded in the graph (mlc.compiler.amx)
        if taps or kind is amx.BF16:
            return False
        factors = [1] * (n_spatial + 1)
        factors[n_spatial - 2] = amx.ROWS
        try:
            sch.pad_einsum(block, factors)
        except Exception:  # not an einsum TVM can pad: the VNNI tile
            return False
        for pad in int8_dot.input_pads(sch, block):
            _schedule_spatial(sch, pad, vector_lanes(target))
    width = next(w for w in amx.WIDTHS if columns % w == 0)
    *outer, i, j = sch.get_loops(block)[:n_spatial]
    reduction = sch.get_loops(block)[n_spatial:]
    _pack_weights(sch, block, sch.get(block).iter_vars[n_spatial - 1].var, 16, pairs=kind.group)
    io, ii = sch.split(i, factors=[None, amx.ROWS])
    jo, ji = sch.split(j, factors=[None, width])
    sch.reorder(*outer, jo, io, ii, ji, *reduction)
    loops = _TileLoops(head=[*outer, jo, io], serial=[], rows=None, row_loop=None, col_loop=None)
    _parallel_tiles_with_write_back(sch, block, loops, 16)
    init = sch.decompose_reduction(block, ii)
    sch.tensorize(sch.get_loops(init)[-2], amx.zero_intrinsic(width, kind))
    sch.tensorize(ii, amx.intrinsic(depth, width, taps, kind))
    return True


def _schedule_reduction(sch, block, n_spatial: int, lanes: int, target=None, deferred=None) -> None:
    if target is not None and _schedule_amx_dense(sch, block, n_spatial, target):
        return
    stmt = sch.get(block)
    spatial, reduction = _loops_of(sch, block, n_spatial)
    last = stmt.iter_vars[n_spatial - 1].var
    j_extent = _extent(sch, spatial[-1])
    contiguous = _contiguous_last_axis(stmt, last)
    int8, depth = _dot_product_depth(sch, block, reduction, lanes, target, contiguous)
    rows_before = _extent(sch, spatial[-2]) if len(spatial) > 1 else None
    if (contiguous and j_extent is not None and (j_extent % lanes and _pads_width(j_extent, lanes) or depth)
            and _pad_width(sch, block, spatial, len(reduction), lanes, depth)):
        spatial, reduction = _loops_of(sch, block, n_spatial)
        last = sch.get(block).iter_vars[n_spatial - 1].var
        j_extent = _extent(sch, spatial[-1])
        for pad in int8_dot.input_pads(sch, block) if depth else []:  # a copy of the activations: vectorized
            _schedule_spatial(sch, pad, lanes)
    if j_extent is not None and j_extent % lanes == 0 and contiguous:
        _schedule_static_width_tile(sch, block, n_spatial, spatial, reduction, last, lanes, target, int8,
                                    rows_before)
        return
    if j_extent is None and contiguous and n_spatial > 1:
        columns, row_count = sch.get(spatial[-1]).extent, sch.get(spatial[-2]).extent
        if _pad_symbolic_width(sch, block, spatial, reduction, lanes):
            spatial, reduction = _loops_of(sch, block, n_spatial)
            _schedule_register_tile(sch, block, spatial, reduction, sch.get(block).iter_vars[n_spatial - 1].var,
                                    lanes, columns=columns, row_count=row_count)
            return
    narrow = narrow_lanes(j_extent, lanes) if contiguous else None
    if narrow is not None:
        bf16 = _bf16_dot_block(sch, block, reduction, narrow, target)
        _schedule_register_tile(sch, block, spatial, reduction, last, narrow, bf16, registers=_registers(lanes))
        return
    if j_extent is not None and j_extent >= lanes and contiguous:
        _schedule_vector_rows(sch, block, spatial, reduction, lanes)
        return
    if _vector_partial_sums(sch, block, spatial, reduction, lanes, deferred):
        return
    _parallelize_spatial(sch, spatial)


# A grouped conv's register tile runs per group (`_split_groups`) where a group has at least 4 output channels (a
# 4-lane vector); SPLIT_GROUPS is a module flag so a benchmark can build both (benchmarks/grouped-conv).
GROUP_MIN_CHANNELS = 4
SPLIT_GROUPS = True


def _group_width(stmt, n_spatial: int):
    """Output channels per group where `stmt` is a grouped conv (its input's last index holds J // width, TVM's
    group_conv2d_nhwc: `ff // (out per group) * (in per group) + rc`), else None."""
    from tvm import tirx

    last = stmt.iter_vars[n_spatial - 1].var
    found = [int(e.b.value) for region in stmt.reads if region.region for e in _operands(region.region[-1].min)
             if isinstance(e, tirx.FloorDiv) and e.a.same_as(last) and isinstance(e.b, tirx.IntImm)]
    return found[0] if len(set(found)) == 1 else None


def _split_groups(sch, block, n_spatial: int) -> int:
    """A grouped conv out[.., J] (J = groups x width) as out[g, .., j], g outermost, so each register tile covers
    one group's channels and broadcasts one input element per row: with J whole, a vector of 16 channels spanned
    groups of 4 or 8, read the input at J // width * depth + k, a different element per lane, and LLVM built each
    input vector element by element (resnext-style 3x3 convs, 32 groups: 6.4-13.6x the time, 4.8-6.4x ONNX
    Runtime's; benchmarks/grouped-conv).
    `block`'s loops are normalized (no unit loops). Returns its spatial loop count (unchanged where this does not
    apply)."""
    from tvm import tirx

    stmt = sch.get(block)
    j_extent = _extent(sch, sch.get_loops(block)[n_spatial - 1])
    width = _group_width(stmt, n_spatial) if SPLIT_GROUPS else None
    if width is None or j_extent is None or width >= j_extent or j_extent % width or width < GROUP_MIN_CHANNELS:
        return n_spatial

    def index_map(*v):
        return (v[n_spatial - 1] // width, *v[:n_spatial - 1], v[n_spatial - 1] % width, *v[n_spatial:])

    try:
        sch.transform_block_layout(block, tirx.IndexMap.from_func(index_map, ndim=len(sch.get_loops(block))))
    except Exception:  # not a block TVM can remap (not a plain loop nest): the whole-J tile
        return n_spatial
    return n_spatial + 1


def _unit_stride_last(stmt, var) -> bool:
    """Every read depends on `var` only in its last index, as var + (something without var)."""
    import tvm

    analyzer = tvm.sym.Analyzer()
    for region in stmt.reads:
        indices = [r.min for r in region.region]
        if any(var in _vars_in(index) for index in indices[:-1]):
            return False
        if indices and var in _vars_in(indices[-1]) and var in _vars_in(analyzer.simplify(indices[-1] - var)):
            return False
    return True


# A Swin window's rows of 49 ran 1.15x slower as partial sums; rows of 197 gained 1.3x on a kernel that is ~1 % of
# deit/beit, while the changed summation order moved visformer_small's logits (~300, chaotic with random
# weights) past the suite's fp64 rule (RMSE 8.7e-4 vs 6.5e-4): only long rows (dinov2's 1370: 2.5x) take it.
TAIL_MIN_VECTORS = 32


def _vector_partial_sums(sch, block, spatial, reduction, lanes: int, deferred=None) -> bool:
    """A row reduction over a contiguous axis (layer norm's sums, softmax's max and sum over 768 or 128) as
    `lanes` partial results in a vector, combined at the end of the row (rfactor), instead of a scalar chain of
    dependent adds (one per 4 cycles); rows in parallel. Layer norm + softmax over 197 x 192: 0.66x the time,
    128 x 768: 0.74x; over symbolic rows (a sequence), bert-base's layer norm had kept the scalar chain: 3x the
    static kernel's time. A long row no multiple of `lanes` (dinov2's 1370 tokens) gets a predicated last vector,
    which LoopPartition splits off (softmax over 12 x 1370 x 1370: 0.4x the time). With `deferred` (a list), a
    reduction over static rows waits there for `_finish_partial_sums`. False (nothing changed) where it does not
    fit."""
    from tvm import tirx

    depth = _extent(sch, reduction[-1]) if len(reduction) == 1 else None
    columns = sch.get(reduction[0]).extent if len(reduction) == 1 else None
    symbolic = depth is None and isinstance(columns, tirx.Var)  # softmax's max and sum over seq x seq
    stmt = sch.get(block)
    if ((not symbolic and (depth is None or depth < 2 * lanes or depth % lanes and depth < TAIL_MIN_VECTORS * lanes))
            or not _unit_stride_last(stmt, stmt.iter_vars[len(spatial)].var)):
        return False
    extents = [_extent(sch, s) for s in spatial]
    if deferred is not None and not symbolic and None not in extents:
        deferred.append((block, math.prod(extents), lanes))
        return True
    return _partial_sums(sch, block, lanes, columns) is not None


def _row_consumer(sch, block, rows: int):
    """The one consumer of `block` (a row reduction over `rows` rows) where it is elementwise with one loop per
    row outermost (the elementwise schedule of rows no multiple of the vector width), else None."""
    consumers = sch.get_consumers(block)
    if len(consumers) != 1:
        return None
    loops = sch.get_loops(consumers[0])
    return consumers[0] if len(loops) == 2 and _extent(sch, loops[0]) == rows else None


def _partial_sums(sch, block, lanes: int, columns=None):
    """`_vector_partial_sums`'s rfactor, rows in parallel; the partial block, or None where rfactor fails.
    `columns`: the reduction's extent, split into whole vectors and a tail (tir_pipeline) when it is a Var."""
    from tvm import tirx

    loops = sch.get_loops(block)
    _, inner = sch.split(loops[-1], factors=[None, lanes])
    try:  # partial[.., lane] (lanes last: one vector per row)
        partial = sch.rfactor(inner, factor_axis=len(sch.get(block).writes[0].region))
    except Exception:  # not a reduction rfactor knows: the split alone changes nothing
        return None
    for target, reduction_loops in ((partial, 2), (block, 1)):  # each: rows (parallel), then its reduction
        loops = sch.get_loops(target)
        head = loops[:len(loops) - reduction_loops]
        row = sch.fuse(*head) if len(head) > 1 else head[0]  # symbolic rows: a division per row, not per element
        if (_extent(sch, row) or 2) > 1:
            sch.parallel(row)
    loops = sch.get_loops(partial)  # row, outer (reduction), lane
    sch.vectorize(loops[-1])
    init = sch.decompose_reduction(partial, loops[-2])
    sch.vectorize(sch.get_loops(init)[-1])
    if isinstance(columns, tirx.Var):  # whole vectors without the `k < depth` branch, then one branched tail
        sch.annotate(loops[-2], COL_TAIL, lanes)
        sch.annotate(loops[-2], ROW_COUNT, columns.name)
    return partial


def _finish_partial_sums(sch, block, rows: int, lanes: int) -> None:
    """A deferred `_vector_partial_sums` reduction; where its consumer is elementwise row by row, the consumer
    runs inside the reduction's row loop (softmax's max then exp, sum then divide: the row is still in L1 when
    it is read again; over 12 x 1370 x 1370 scores that saves two passes through memory)."""
    consumer = _row_consumer(sch, block, rows)
    partial = _partial_sums(sch, block, lanes)
    if partial is None:
        loops = sch.get_loops(block)
        row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        if _extent(sch, row) > 1:
            sch.parallel(row)
        return
    if consumer is None:
        return
    row = sch.get_loops(partial)[0]
    try:
        sch.reverse_compute_at(block, row)
        sch.reverse_compute_at(consumer, row)
    except Exception:  # not movable: the consumer keeps its own loops (a pass of its own)
        return
    inner = sch.get_loops(consumer)[-1]
    width = narrow_lanes(_extent(sch, inner), lanes)
    if width is not None:
        _, vec = sch.split(inner, factors=[None, width])
        sch.vectorize(vec)


# A depthwise conv reads its padding inline (a select on h/w, uniform across the channel vector) instead of from a
# padded copy: mobilenetv2's and ghostnet's depthwise convs (with the layout transposes around them) 0.85-0.91x the
# time. So does a grouped conv of narrow groups (resnext's 4 or 8 channels a group: 0.94-0.95x). A module flag so a
# benchmark can build both.
INLINE_DEPTHWISE_PAD = True


def _feeds_depthwise(sch, pad, lanes: int) -> bool:
    """Whether padding `pad` feeds only a conv that reads it with its output channel in the last index: a depthwise
    conv (no reduction var there: 9 multiply-adds per element, so a padded copy of its input cost as much as the
    conv), or a grouped one whose groups are half a vector or narrower (`ff // width * depth + rc`). Wider groups
    read the copy: their register tile runs on vdpbf16ps only over plain loads (tensorize), and the copy is read
    once per group's every output channel."""
    consumers = sch.get_consumers(pad)
    if len(consumers) != 1:
        return False
    stmt = sch.get(consumers[0])
    written = sch.get(pad).writes[0].source
    if not stmt.iter_vars or not any(str(v.iter_type) in ("2", "CommReduce") for v in stmt.iter_vars):
        return False
    spatial = [v.var for v in stmt.iter_vars if str(v.iter_type) in ("0", "DataPar")]
    reduction = [v.var for v in stmt.iter_vars if str(v.iter_type) in ("2", "CommReduce")]
    if not spatial:
        return False
    for region in stmt.reads:
        if region.source.same_as(written):
            used = _vars_in(region.region[-1].min)
            if spatial[-1] not in used:
                return False
            width = _group_width(stmt, len(spatial))
            return not any(r in used for r in reduction) or (width is not None and width <= lanes // 2)
    return False


def _is_copy(block) -> bool:
    import tvm
    from tvm import tirx

    return isinstance(block.body, tirx.BufferStore) and isinstance(block.body.value, tvm.ir.expr.TensorLoad)


def _is_concatenation(expr, top: bool = True) -> bool:
    """Whether an expression is a concatenation's: nested if_then_else over plain loads."""
    import tvm

    if isinstance(expr, tvm.ir.Call) and expr.op.name.endswith("if_then_else"):
        return all(_is_concatenation(branch, False) for branch in expr.args[1:])
    return not top and isinstance(expr, tvm.ir.expr.TensorLoad)


def _concatenation_inputs(sch, infos):
    """The blocks among `infos` that feed a concatenation. A computed input inlined into one is
    evaluated for every output element (the select's branches are vectorized), so an LSTM's
    last-step cell (sigmoid, tanh) fused into the concat of its 50 steps ran 50 times over: 15 ms
    instead of 1.5. The caller keeps them out of the inlining, then inlines the plain copies."""
    from tvm import tirx

    concats = [i for i in infos if i.is_injective() and isinstance(sch.get(i.block_rv).body, tirx.BufferStore)
               and _is_concatenation(sch.get(i.block_rv).body.value)]
    producers = [sch.get(p) for c in concats for p in sch.get_producers(c.block_rv)]
    return [i for i in infos if i not in concats and any(sch.get(i.block_rv).same_as(p) for p in producers)]


def _feeds_elementwise(sch, pad, infos) -> bool:
    """Whether a padding block's consumers are all elementwise: a 1x1 pool with a stride (made elementwise by
    `unit_reductions`) that reads a corner of its ceil-mode padding. Left as a producer, TVM 0.27 reverse-inlines
    such a consumer into the padding loop and writes its one output at every padded position (the last one: the
    padding's -inf)."""
    consumers = [sch.get(c) for c in sch.get_consumers(pad)]
    injective = [sch.get(i.block_rv) for i in infos if i.is_injective()]
    return bool(consumers) and all(any(c.same_as(b) for b in injective) for c in consumers)


def _rule():
    from tvm import s_tir, tirx
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

    class CPUDefault(dl.ScheduleRule):
        def apply(self, func, target, _tunable):
            if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
                return None
            try:
                return self.schedule(func, target, bf16_dot=True)
            except Exception:  # a bf16 kernel vdpbf16ps does not fit: the plain register tile
                return self.schedule(func, target, bf16_dot=False)

        def schedule(self, func, target, bf16_dot: bool):
            copies = schedule_concatenation(func, vector_lanes(target))
            if copies is not None:
                return copies
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if not infos:
                return None
            # Padding stays its own loop: inlined into a convolution it puts a branch in the
            # vectorized inner loop.
            pads = [i for i in infos if i.is_injective() and i.is_data_pad(sch)]
            inlined = [i for i in pads if _feeds_elementwise(sch, i.block_rv, infos)
                       or (INLINE_DEPTHWISE_PAD and _feeds_depthwise(sch, i.block_rv, vector_lanes(target)))]
            for info in inlined:
                sch.compute_inline(info.block_rv)
            pads = [i for i in pads if i not in inlined]
            infos = [i for i in infos if i not in inlined]
            concat_inputs = _concatenation_inputs(sch, [i for i in infos if i not in pads])
            infos = try_inline_contiguous_spatial(sch, [i for i in infos if i not in pads + concat_inputs])
            for info in concat_inputs:  # copies (expand_dims) go into the concatenation; computed inputs stay out
                if _is_copy(sch.get(info.block_rv)):
                    sch.compute_inline(info.block_rv)
            infos = pads + concat_inputs + (infos or [])
            lanes = vector_lanes(target)
            deferred = []  # row reductions whose rows wait for their consumer's schedule
            for info in infos:
                try:
                    sch.get(info.block_rv)
                except Exception:  # inlined into a reduction's write-back already
                    continue
                kinds = info.dom_kind()
                n_spatial = len(kinds) - len(kinds.lstrip("S"))
                if info.is_injective():
                    if not schedule_concatenated_axis(sch, info.block_rv, lanes, PARALLEL_MIN):
                        _schedule_spatial(sch, info.block_rv, lanes)
                elif n_spatial and set(kinds[n_spatial:]) == {"R"}:
                    n_spatial = _split_groups(sch, info.block_rv, n_spatial)
                    _schedule_reduction(sch, info.block_rv, n_spatial, lanes, target if bf16_dot else None,
                                        deferred)
            for block, rows, row_lanes in deferred:
                _finish_partial_sums(sch, block, rows, row_lanes)
            return sch

    return CPUDefault()


def vectorizable_intrinsics() -> None:
    """Mark TIR's nearbyint (round half to even: --quantize's rounding) and isnan (the NaN-preserving max/min)
    vectorizable, as TVM marks round, floor and exp: without it TVM's vectorizer scalarizes every loop holding
    one, and LLVM re-vectorizes the fused index arithmetic as gathers and scatters (an int8 resnet50's quantise
    of a 56x56x256 tensor took 3.7 ms, 0.3 ms vectorized). LLVM lowers both for vectors (llvm.nearbyint, fcmp
    uno). Process-wide; idempotent."""
    import tvm

    for name in ("tirx.nearbyint", "tirx.isnan"):
        if tvm.ir.Op.get(name).get_attr("TVectorizable") is None:
            tvm.ir.register_op_attr(name, "TVectorizable", True)


def default_rule():
    """The rule as a dlight ScheduleRule: `.apply(func, target, False)` -> Schedule or None."""
    vectorizable_intrinsics()
    return _SafeRule(_rule())


def mark_constant_inputs(mod):
    """Set "layout_free_buffers" (the PrimFunc parameters that every call passes a constant) on
    kernels not yet scheduled, so the rule may repack those. TVM's AttachAttrLayoutFreeBuffers
    does the same but renames the kernels, and the build reports kernels by name. Build only:
    tuning tasks stay unmarked (with the attribute, TVM 0.27's ArgInfo.from_prim_func fails); the
    default schedule `mlc tune` seeds its database with is made from a marked copy."""
    import tvm
    from tvm import relax

    constant: dict = {}
    for function in mod.functions.values():
        if not isinstance(function, relax.Function):
            continue

        def visit(expr):
            if isinstance(expr, tvm.ir.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
                gv, args = expr.args[0], list(expr.args[1].fields)
                flags = [isinstance(a, tvm.ir.expr.Constant) for a in args]
                previous = constant.get(gv)
                constant[gv] = flags if previous is None else [a and b for a, b in zip(previous, flags)]

        relax.analysis.post_order_visit(function.body, visit)
    for gv, flags in constant.items():
        function = mod[gv]
        if isinstance(function, tvm.tirx.PrimFunc) and not (function.attrs and function.attrs.get(SCHEDULED, False)):
            indices = [i for i, flag in enumerate(flags) if flag]
            if indices:
                mod[gv] = function.with_attr("layout_free_buffers", indices)
    return mod


def well_formed(func):
    """`func` if TVM's well-formedness check passes, else a well-formed copy; raises with TVM's reason if none.

    TVM 0.27's loop_partition (`schedule_concatenated_axis`) gives every part a copy of the block that defines the
    same iter and loop Vars. Lowering copes, but each later `s_tir.Schedule` of the kernel runs the check and raises
    ("multiple definitions of variable v0"): mlc.compiler.inplace did, and ghostnet's build lost all its schedules.
    Printed and parsed again, each copy defines Vars of its own (the check runs in C++: ~0.2 ms a kernel)."""
    from tvm import s_tir

    if s_tir.analysis.verify_well_formed(func, False):
        return func
    parsed = _reparsed(func)
    s_tir.analysis.verify_well_formed(parsed)  # raises TVM's reason
    return parsed


def _reparsed(func):
    import tvm

    parsed = tvm.script.from_source(func.script())
    return parsed["main"] if isinstance(parsed, tvm.IRModule) else parsed


def _reason(error: BaseException) -> str:
    """TVM's message, its first sentence (the rest of a well-formedness error is the IR path)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1].split(". ", 1)[0][:200] if lines else type(error).__name__


def apply_default_schedules(mod, target, notes: list[str] | None = None):
    """Schedule every PrimFunc of `mod` not yet scheduled (e.g. by a tuning database), one kernel at a time: a kernel
    the rule fails on, or whose schedule TVM finds ill-formed, keeps its unscheduled loop nest alone, and `notes`
    gets a line naming it and TVM's reason. Scheduled kernels that are ill-formed are mended (`well_formed`).
    Weights the rules repack stay in-kernel blocks until `fold_weight_packing`."""
    import tvm

    rule = _rule()
    vectorizable_intrinsics()
    failed: dict[str, str] = {}
    mod = mark_constant_inputs(mod)
    with target:
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            scheduled = bool(func.attrs and func.attrs.get(SCHEDULED, False))  # by a tuning record
            try:
                if scheduled:
                    mod[gv] = well_formed(func)
                    continue
                sch = rule.apply(func, func.attrs.get("target", target) if func.attrs else target, False)
                if sch is not None:
                    mod[gv] = well_formed(sch.mod["main"]).with_attr(SCHEDULED, True)
            except Exception as e:  # TVM raises many kinds: this kernel keeps what it had
                if not scheduled:
                    failed[gv.name_hint] = _reason(e)
    if failed and notes is not None:
        listed = "; ".join(f"{name} ({why})" for name, why in sorted(failed.items())[:3])
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        notes.append(f"mlc's default CPU schedule failed on {len(failed)} kernel(s), left unscheduled: {listed}{more}")
    return mod


PREPROC = "meta_schedule.layout_rewrite_preproc"


def _has_layout_rewrite(func) -> bool:
    """Whether a PrimFunc holds a weight-repacking block (ours or a tuning record's)."""
    from tvm import s_tir

    try:
        sch = s_tir.Schedule(func)
        pending = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # no "root" block (e.g. a hand-written opaque kernel): nothing to split
        return False
    while pending:
        block = pending.pop()
        annotations = sch.get(block).annotations
        if PREPROC in annotations and bool(annotations[PREPROC]):
            return True
        pending.extend(sch.get_child_blocks(block))
    return False


def fold_weight_packing(mod, target, notes: list):
    """Move the repacking blocks out of the kernels and evaluate them on the constant weights now
    (MetaSchedule's layout-rewrite path), so no repacking runs at inference.

    TVM's SplitLayoutRewritePreproc visits every PrimFunc and asserts that its root block holds
    compute blocks; TVM's generic cumsum, topk and sort kernels are one opaque block of loops
    (IR-builder code), so it failed on them ("There should be a compute block ..."). Only the
    kernels with a repacking block go through it; the others are put back unchanged. A token lookup whose table
    is a prepacked weight reads it there (shared_tables); where that fails, a note in `notes` says so."""
    import tvm
    from tvm import relax

    kernels = {gv: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    if not any(_has_layout_rewrite(f) for f in kernels.values()):
        return mod
    aside = {gv: f for gv, f in kernels.items() if not _has_layout_rewrite(f)}
    split = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv not in aside}, attrs=mod.attrs)
    with target:
        split = relax.transform.SplitLayoutRewritePreproc()(split)
    for gv, f in aside.items():
        split[gv] = f
    try:
        split = shared_tables.read_lookups_from_packed(split)
    except Exception as e:  # an optional saving: the artifact then stores the table and its packed copy
        notes.append(Note(NoteKind.FALLBACK, f"built without reading token lookups from the prepacked LM head "
                                             f"(the table is stored twice): {type(e).__name__}: {e}"))
    # DeadCodeElimination: the pass's own skipped the split kernels while calls lacked callees. EliminateCommonSubexpr:
    # a weight that several layers share (ALBERT's 12) is repacked once, not once per layer (12 copies: a 0.8 GB
    # model's compile passed 9 GB).
    with target:
        return tvm.transform.Sequential([relax.transform.DeadCodeElimination(),
                                         relax.transform.EliminateCommonSubexpr(),
                                         relax.transform.FoldConstant()])(split)


class _SafeRule:
    """Wraps a rule so that a kernel it fails on stays unscheduled instead of failing the build."""

    def __new__(cls, rule):
        from tvm.s_tir import dlight as dl

        class Safe(dl.ScheduleRule):
            def apply(self, func, target, tunable):
                try:
                    return rule.apply(func, target, tunable)
                except Exception:  # a pattern the rule does not know: leave the kernel as it is
                    return None

        return Safe()
