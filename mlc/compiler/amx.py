"""int8 and bf16 dense layers and convs on Intel AMX (Sapphire Rapids and later), on tile registers: u8 x s8 -> int32
where the target has amx-int8, bf16 x bf16 -> float32 where it has amx-bf16 (`Kind`). One tdpbusd multiplies a 16 x 64
uint8 tile of activations by a 16 x 16 x 4 int8 tile of weights (64 quads: the VNNI packing, [N/16, K/4, 16, 4]) into
a 16 x 16 int32 tile; one tdpbf16ps a 16 x 32 bf16 tile by 16 x 16 x 2 bf16 weights ([N/16, K/2, 16, 2], vdpbf16ps's
pairs) into 16 x 16 float32. A tile row is 64 bytes either way.

A kernel's 32 x W output block (W: 32-128 columns) is one intrinsic call over the whole depth: it configures the
tiles (ldtilecfg), then for each 32 x 32 of it holds 4 accumulator tiles (2 row tiles x 2 column tiles) across the
depth, and stores them to the block's accumulator, whose write-back runs the epilogue as on the VNNI path. The
accumulators stay in tiles across the depth (stored and reloaded per 64 of depth, AMX ran no faster than VNNI),
and ldtilecfg (hundreds of cycles) runs once per block. The blocks of a column panel are neighbours in the
parallel loop, so a panel's weights are read from L2 by every row block. benchmarks/int8 has the timings.

Convs come as dense layers over rows of pixels (relax_passes.convs_as_rows): a KxK conv's taps are the same
rows shifted by a fixed offset (in one of the stride's phases of the padded image), so one call runs all taps into
the same accumulators. bf16 rows are padded to whole blocks in the graph, never in the kernel: TVM's bf16
legalisation widens a kernel's own bf16 buffers to float32, which the tiles would read as bf16.

Linux hands out AMX state only to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM); an AMX instruction
before that is SIGILL. mlc.runtime.runner.request_amx asks, when the Runner loads an artifact that requires AMX
and in the compile worker before its check. Imports tvm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Kind:
    """One AMX multiply: its operand and accumulator types, instruction, the depth values a weight lane holds side by
    side (`group`), and the LLVM target feature."""
    activations: str
    weights: str
    accumulator: str
    instruction: str
    group: int
    depth: int  # depth values per tile row (64 bytes)
    feature: str
    # Shallower layers (over all taps) stay on the vector unit: per output, AMX adds tile stores and the
    # write-back's read, which the depth must pay for (int8: a 1x1 conv 56 x 56 x 64 -> 256 took 0.34 ms on AMX, 0.20
    # on VNNI; depth 192: 2x faster). bf16's vector unit is slower (vdpbf16ps no faster than float32 FMAs on Sapphire
    # Rapids): resnet50's depth-64 1x1 convs on AMX made the model 0.77x the time
    min_depth: int


INT8 = Kind("uint8", "int8", "int32", "tdpbusd", 4, 64, "amx-int8", 192)
BF16 = Kind("bfloat16", "bfloat16", "float32", "tdpbf16ps", 2, 32, "amx-bf16", 64)
KINDS = (INT8, BF16)


def kind_of(activations: str, weights: str, accumulator: str) -> Optional[Kind]:
    """The Kind of a multiply of these dtypes, or None."""
    return next((k for k in KINDS if (k.activations, k.weights, k.accumulator) ==
                 (activations, weights, accumulator)), None)


ROWS = 32  # two 16-row tiles of activations
COLS = 32  # two 16-column tiles of weights per step
WIDTHS = (128, 96, 64, 32)  # output columns per block, the widest dividing N: ldtilecfg once per block
# Fewer multiply-adds than this stay on the vector unit: the tile set-up and the row padding cost more than AMX saves (a
# 40 x 64 x 32 layer: 2.2 us on AMX, 1.4 on VNNI)
MIN_MACS = 1 << 20
# A KxK conv runs on rows of its padded image (relax_passes.convs_as_rows), computed on padding columns and
# rows to whole row blocks; where that is more than this many times its output, it stays on VNNI (a 3x3 conv on
# 7 x 7 computes 96 rows for 49 and still runs in half VNNI's time)
MAX_PADDED_ROWS = 2.5
# Convs whose depth is no multiple of a tile row (Kind.depth), or whose output channels are none of COLS, get zero
# channels to one, up to this many times their own (96 -> 128, 1000 -> 1024); more stays on the vector unit
MAX_PADDED_CHANNELS = 1.5
ENABLED = True  # a module flag so a benchmark can build both (the vector unit's tile where off)


def pays(kind: Kind, macs: int, depth: int) -> bool:
    """Whether a layer of `macs` multiply-adds, `depth` deep over all its taps, is big and deep enough to pay for the
    tiles (MIN_MACS, Kind.min_depth)."""
    return macs >= MIN_MACS and depth >= kind.min_depth


def has_amx(target, kind: Optional[Kind] = None) -> bool:
    """Whether the target has AMX for `kind`'s multiply (for either where None)."""
    from tvm.target import codegen

    if not ENABLED:
        return False
    try:
        return any(codegen.target_has_features(k.feature, target) for k in ([kind] if kind else KINDS))
    except Exception:  # not an LLVM x86 target
        return False


def intrinsic(depth: int, width: int, taps: tuple = (), kind: Kind = INT8) -> str:
    """Register (once) the tensor intrinsic for a ROWS x `width` accumulator block of [ROWS, depth] activations x the
    packed [width/16, depth/group, 16, group] weights over the whole depth; returns its name. With `taps` (I, J, step,
    stride), a conv's taps read as rows (relax_passes._tap_matmul): tap (i, j) multiplies the rows of phase
    i % stride, i // stride * step + j further on (a tile's rows `stride` apart), by its own weights [width/16, I, J,
    depth/group, 16, group], all into the same accumulators. Its description is the
    reduction's update (+=, what tensorize matches); its implementation starts the tiles from zero, which is the
    same because the block's init is `zero_intrinsic` right before it."""
    from tvm.s_tir import TensorIntrin

    name = f"mlc_amx_{kind.instruction}_{ROWS}x{width}x{depth}" + "".join(f"_{t}" for t in taps)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, _description(depth, width, taps, kind), _implementation(depth, width, taps, kind))
    return name


def zero_intrinsic(width: int, kind: Kind = INT8) -> str:
    """The accumulator's zero fill (the reduction's init) as nothing: `intrinsic`'s implementation starts its tiles
    from zero (tilezero) over the whole depth, so the block's C is never read before it is written. Filling and
    reloading it cost more than AMX saved on shallow layers (depth 64-128)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    name = f"mlc_amx_zero_{ROWS}x{width}_{kind.accumulator}"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (ROWS, width), kind.accumulator, offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:ROWS, 0:width])
            for i, j in T.grid(ROWS, width):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = T.cast(0, kind.accumulator)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (ROWS, width), kind.accumulator, offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:ROWS, 0:width])
            T.evaluate(0)

    TensorIntrin.register(name, desc, impl)
    return name


def _operand_shapes(depth: int, width: int, taps: tuple, group: int) -> tuple[tuple, tuple]:
    """The shapes of a block's activations and packed weights: a dense layer's rows, or a conv's phases (one per
    stride, relax_passes._tap_matmul) over the rows its taps reach."""
    if not taps:
        return (ROWS, depth), (width // 16, depth // group, 16, group)
    tap_rows, tap_cols, step, stride = taps
    return ((stride, stride * (ROWS - 1) + (tap_rows - 1) // stride * step + tap_cols, depth),
            (width // 16, tap_rows, tap_cols, depth // group, 16, group))


def _description(depth: int, width: int, taps: tuple, kind: Kind):
    from tvm.script import tirx as T

    a_shape, b_shape = _operand_shapes(depth, width, taps, kind.group)
    acc, g = kind.accumulator, kind.group
    a_region, b_region = (tuple(slice(0, n) for n in shape) for shape in (a_shape, b_shape))
    tap_rows, tap_cols, step, stride = taps or (1, 1, 0, 1)
    has_taps, one_column, one_row = bool(taps), bool(taps) and tap_cols == 1, bool(taps) and tap_rows == 1

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, a_shape, kind.activations, offset_factor=1)
        B = T.match_buffer(b, b_shape, kind.weights, offset_factor=1)
        C = T.match_buffer(c, (ROWS, width), acc, offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:ROWS, 0:width], A[a_region], B[b_region])
            T.writes(C[0:ROWS, 0:width])
            if one_column:  # a Kx1 conv: TE drops the unit reduction axis, the block has no tj loop to match
                for i, j, ti, k in T.grid(ROWS, width, tap_rows, depth):
                    with T.sblock("update"):
                        vi, vj, vti, vk = T.axis.remap("SSRR", [i, j, ti, k])
                        C[vi, vj] = C[vi, vj] + T.cast(
                            A[vti % stride, vi * stride + vti // stride * step, vk], acc) * T.cast(
                            B[vj // 16, vti, 0, vk // g, vj % 16, vk % g], acc)
            elif one_row:  # a 1xK conv: no ti loop
                for i, j, tj, k in T.grid(ROWS, width, tap_cols, depth):
                    with T.sblock("update"):
                        vi, vj, vtj, vk = T.axis.remap("SSRR", [i, j, tj, k])
                        C[vi, vj] = C[vi, vj] + T.cast(A[0, vi * stride + vtj, vk], acc) * T.cast(
                            B[vj // 16, 0, vtj, vk // g, vj % 16, vk % g], acc)
            elif has_taps:
                for i, j, ti, tj, k in T.grid(ROWS, width, tap_rows, tap_cols, depth):
                    with T.sblock("update"):
                        vi, vj, vti, vtj, vk = T.axis.remap("SSRRR", [i, j, ti, tj, k])
                        C[vi, vj] = C[vi, vj] + T.cast(
                            A[vti % stride, vi * stride + vti // stride * step + vtj, vk], acc) * T.cast(
                            B[vj // 16, vti, vtj, vk // g, vj % 16, vk % g], acc)
            else:
                for i, j, k in T.grid(ROWS, width, depth):
                    with T.sblock("update"):
                        vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                        C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], acc) * T.cast(
                            B[vj // 16, vk // g, vj % 16, vk % g], acc)

    return desc


def _implementation(depth: int, width: int, taps: tuple, kind: Kind):
    from tvm import tirx
    from tvm.script import tirx as T

    a_shape, b_shape = _operand_shapes(depth, width, taps, kind.group)
    step_k, step_b = kind.depth, kind.depth // kind.group  # per tile: the depth; the weights' rows of groups
    a_region, b_region = (tuple(slice(0, n) for n in shape) for shape in (a_shape, b_shape))
    tap_rows, tap_cols, step, stride = taps or (1, 1, 0, 1)
    has_taps = bool(taps)
    a_strides = [tirx.Var(f"a_stride{d}", "int32") for d in range(len(a_shape) - 1)] + [1]
    b_strides = [tirx.Var(f"b_stride{d}", "int32") for d in range(len(b_shape) - 3)] + [16 * kind.group, kind.group, 1]
    c_stride = tirx.Var("c_stride", "int32")
    # a tile's rows: pixels `stride` apart in their phase
    row_bytes = T.int64(a_strides[-2] * stride * (64 // kind.depth))

    call = _x86_call
    configure_tiles = _tile_configuration()

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, a_shape, kind.activations, offset_factor=1, strides=a_strides)
        B = T.match_buffer(b, b_shape, kind.weights, offset_factor=1, strides=b_strides)
        C = T.match_buffer(c, (ROWS, width), kind.accumulator, offset_factor=1, scope="local", strides=[c_stride, 1])
        with T.sblock("root"):
            T.reads(C[0:ROWS, 0:width], A[a_region], B[b_region])
            T.writes(C[0:ROWS, 0:width])
            configure_tiles()
            for p in range(width // COLS):  # tile numbers are immediates: written out
                T.evaluate(call("tilezero", T.int8(0)))  # C = A x B: zero_intrinsic leaves C unfilled
                T.evaluate(call("tilezero", T.int8(1)))
                T.evaluate(call("tilezero", T.int8(2)))
                T.evaluate(call("tilezero", T.int8(3)))
                for ti, tj, kb in T.grid(tap_rows, tap_cols, depth // step_k):
                    if has_taps:
                        row = ti // stride * step + tj
                        T.evaluate(call("tileloadd64", T.int8(4), T.address_of(A[ti % stride, row, kb * step_k]),
                                        row_bytes))
                        T.evaluate(call("tileloadd64", T.int8(5),
                                        T.address_of(A[ti % stride, row + 16 * stride, kb * step_k]), row_bytes))
                        T.evaluate(call("tileloadd64", T.int8(6), T.address_of(B[2 * p, ti, tj, kb * step_b, 0, 0]),
                                        T.int64(64)))
                        T.evaluate(call("tileloadd64", T.int8(7),
                                        T.address_of(B[2 * p + 1, ti, tj, kb * step_b, 0, 0]), T.int64(64)))
                    else:
                        T.evaluate(call("tileloadd64", T.int8(4), T.address_of(A[0, kb * step_k]), row_bytes))
                        T.evaluate(call("tileloadd64", T.int8(5), T.address_of(A[16, kb * step_k]), row_bytes))
                        T.evaluate(call("tileloadd64", T.int8(6), T.address_of(B[2 * p, kb * step_b, 0, 0]),
                                        T.int64(64)))
                        T.evaluate(call("tileloadd64", T.int8(7), T.address_of(B[2 * p + 1, kb * step_b, 0, 0]),
                                        T.int64(64)))
                    T.evaluate(call(kind.instruction, T.int8(0), T.int8(4), T.int8(6)))
                    T.evaluate(call(kind.instruction, T.int8(1), T.int8(4), T.int8(7)))
                    T.evaluate(call(kind.instruction, T.int8(2), T.int8(5), T.int8(6)))
                    T.evaluate(call(kind.instruction, T.int8(3), T.int8(5), T.int8(7)))
                T.evaluate(call("tilestored64", T.int8(0), T.address_of(C[0, p * COLS]), T.int64(c_stride * 4)))
                T.evaluate(call("tilestored64", T.int8(1), T.address_of(C[0, p * COLS + 16]), T.int64(c_stride * 4)))
                T.evaluate(call("tilestored64", T.int8(2), T.address_of(C[16, p * COLS]), T.int64(c_stride * 4)))
                T.evaluate(call("tilestored64", T.int8(3), T.address_of(C[16, p * COLS + 16]), T.int64(c_stride * 4)))

    return impl


def _x86_call(name: str, *args):
    from tvm.script import tirx as T

    return T.call_llvm_intrin("void", T.llvm_lookup_intrinsic_id(f"llvm.x86.{name}"), *args)


def _tile_configuration():
    """A TVMScript macro that configures the 8 tiles (ldtilecfg)."""
    from tvm.script import tirx as T

    call = _x86_call

    @T.macro
    def configure_tiles():
        # the ldtilecfg operand: palette 1; tiles 0-7 of 16 rows x 64 bytes (C: 16 int32 or float32, A: 64 uint8 or
        # 32 bf16, B: 16 quads of int8 or pairs of bf16)
        cfg = T.alloc_buffer((64,), "uint8", scope="local")
        for i in range(64):
            cfg[i] = T.uint8(0)
        cfg[0] = T.uint8(1)
        for t in range(8):
            cfg[16 + 2 * t] = T.uint8(64)
            cfg[48 + t] = T.uint8(16)
        T.evaluate(call("ldtilecfg", T.address_of(cfg[0])))

    return configure_tiles
