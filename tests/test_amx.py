"""int8 and bf16 dense layers and convs on AMX tiles (mlc.compiler.amx) for CPUs that have them (Sapphire Rapids and
later): the kernel's instructions whatever the host, its numbers where the host has AMX, and what the artifact asks of
the machine."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ZNVER4, host_runs

from mlc import targets

SAPPHIRE_RAPIDS = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids", "num-cores": 1}
# precision -> (the AMX instruction, the vector one the kernels use without it)
INSTRUCTIONS = {"int8": ("tdpbusd", "vpdpbusd"), "bf16": ("tdpbf16ps", "vdpbf16ps")}


def _operands(rng, x_shape, w_shape, precision: str):
    """(activations, weight, the weight as float64, the accumulator's dtype): uint8 x int8 -> int32, or float32
    activations (cast to bf16 in the graph, as bf16_matmul does) x a bf16 weight -> float32."""
    if precision == "int8":
        weight = rng.integers(-128, 128, w_shape).astype(np.int8)
        return rng.integers(0, 256, x_shape).astype(np.uint8), weight, weight.astype(np.float64), "int32"
    import ml_dtypes

    weight = rng.standard_normal(w_shape).astype(ml_dtypes.bfloat16)
    return rng.standard_normal(x_shape).astype(np.float32), weight, weight.astype(np.float64), "float32"


def _build(x, layer, shift, target: dict, precision: str):
    """main(x) = layer(x as its operand dtype) - shift, as float32, built with mlc's default schedules: (executable,
    assembly)."""
    from tvm import relax

    from mlc.compiler import schedules

    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x.shape, str(x.dtype)))
    with bb.function("main", [var]):
        with bb.dataflow():
            acc = bb.emit(layer(relax.op.astype(var, "bfloat16") if precision == "bf16" else var))
            y = bb.emit_output(bb.emit(relax.op.astype(relax.op.subtract(acc, relax.const(shift)), "float32")))
        bb.emit_func_output(y)
    executable, report = schedules.build(bb.get(), target, None, True, [])
    assert not report["unscheduled"], report
    return executable, report


def _operand(x, precision: str):
    """The activations as the kernel multiplies them, as float64."""
    if precision == "int8":
        return x.astype(np.float64)
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def _dense(rows: int, depth: int, columns: int, target: dict, seed: int = 0, precision: str = "int8"):
    """A u8 x s8 -> int32 (or bf16 x bf16 -> float32) matmul with a constant weight and an epilogue (less a
    per-column value, as float): (executable, assembly, activations, expected output)."""
    pytest.importorskip("tvm")
    from tvm import relax

    rng = np.random.default_rng(seed)
    x, weight, weight64, accumulator = _operands(rng, (1, rows, depth), (depth, columns), precision)
    shift = rng.integers(-1000, 1000, columns).astype(accumulator)
    executable, _ = _build(x, lambda v: relax.op.matmul(v, relax.const(weight), out_dtype=accumulator), shift,
                           target, precision)
    expected = (_operand(x, precision) @ weight64 - shift).astype(np.float32)
    return executable, executable.mod.imports[0].inspect_source("asm"), x, expected


def _amx_host() -> bool:
    from mlc.runtime.runner import host_cpu_flags

    return host_runs(SAPPHIRE_RAPIDS) and {"amx_tile", "amx_int8"} <= host_cpu_flags()


def _uses(asm: str, instruction: str) -> bool:
    """Whether the assembly has `instruction` (not as the tail of a longer name: tdpbusd in vpdpbusd)."""
    import re

    return re.search(rf"\b{instruction}\b", asm) is not None


@pytest.mark.parametrize("shape,precision", [
    ((32, 512, 64), "int8"), ((64, 768, 96), "int8"), ((128, 256, 3072), "int8"), ((197, 384, 64), "int8"),
    ((49, 512, 256), "int8"), ((32, 512, 64), "bf16"), ((128, 768, 3072), "bf16"), ((128, 96, 96), "bf16")],
    ids=["one-block", "bert-qkv-like", "wide", "vit-197-rows", "7x7-rows", "bf16-one-block", "bf16-bert-ffn",
         "bf16-depth-96"])
def test_dense_runs_on_amx_tiles(shape, precision):
    """On a target with AMX, a dense layer whose columns and depth the tiles divide runs on tdpbusd (int8) or
    tdpbf16ps (bf16), the tiles configured once per block (ldtilecfg) and the accumulators stored once (tilestored),
    int8 rows zero-padded to whole blocks where they are not (197, 49); exact where the host has AMX (bf16: to
    float32 rounding). (int8 on VNNI alone: 0.6-0.7 TOP/s on one Sapphire Rapids core; on AMX 1.0-2.1,
    benchmarks/int8.)"""
    executable, asm, x, expected = _dense(*shape, SAPPHIRE_RAPIDS, precision=precision)
    amx, vector = INSTRUCTIONS[precision]
    assert _uses(asm, amx) and "ldtilecfg" in asm and "tilestored" in asm
    assert not _uses(asm, vector)
    _run_matches(executable, x, expected)


@pytest.mark.parametrize("shape,target,precision", [
    ((40, 64, 32), SAPPHIRE_RAPIDS, "int8"), ((64, 720, 64), SAPPHIRE_RAPIDS, "int8"), ((64, 768, 96), ZNVER4, "int8"),
    ((197, 384, 64), SAPPHIRE_RAPIDS, "bf16"), ((64, 768, 96), ZNVER4, "bf16")],
    ids=["tiny", "depth-720", "no-amx", "bf16-197-rows", "bf16-no-amx"])
def test_other_dense_layers_stay_on_the_vector_unit(shape, target, precision):
    """A layer too small to pay for the tiles, a depth they do not divide, a target without AMX, or bf16 rows that
    are no whole blocks (a copy padded in the kernel would be float32: TVM's bf16 legalisation widens a kernel's
    own bf16 buffers): the VNNI or AVX512-BF16 register tile, as before."""
    _, asm, _, _ = _dense(*shape, target, precision=precision)
    amx, vector = INSTRUCTIONS[precision]
    assert _uses(asm, vector) and not _uses(asm, amx)


def test_artifacts_for_amx_require_it_and_ask_linux_for_it(monkeypatch):
    """An int8 (bf16) build for a CPU with AMX requires amx_tile and amx_int8 (amx_bf16) of the machine (a host
    without them gets a clean refusal, not SIGILL); loading it asks Linux for the tile state, whose refusal is a
    one-line error; a host without AMX is not asked."""
    from mlc.pipeline.package import _target_info
    from mlc.runtime import runner

    class Recipe:
        options: dict = {}

    spr = targets.from_json('{"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids"}')
    assert targets.has_amx(spr) and not targets.has_amx(targets.from_json(
        '{"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4"}'))
    assert {"amx_tile", "amx_int8"} <= set(_target_info(spr, Recipe(), "fp32", True)["required_cpu_features"])
    assert "amx_int8" not in _target_info(spr, Recipe(), "fp32", False)["required_cpu_features"]
    assert {"amx_tile", "amx_bf16"} <= set(_target_info(spr, Recipe(), "bf16", False)["required_cpu_features"])

    class Refusing:
        def syscall(self, *args):
            return -1

    monkeypatch.setattr(runner, "HOST_ARCH", "x86_64")
    monkeypatch.setattr(runner.platform, "system", lambda: "Linux")
    monkeypatch.setattr(runner.ctypes, "CDLL", lambda *a, **k: Refusing())
    monkeypatch.setattr(runner, "host_cpu_flags", lambda: {"avx512f", "amx_tile", "amx_int8"})
    with pytest.raises(runner.ArtifactError, match="Linux refused this process AMX state"):
        runner.request_amx()
    # a CPU without AMX is never asked (the compile worker calls this before every check; Linux says EINVAL there)
    monkeypatch.setattr(runner, "host_cpu_flags", lambda: {"avx512f", "avx512_vnni"})
    runner.request_amx()


def _conv(height: int, width: int, channels: int, out: int, stride: int, target: dict, kernel=1, padding=0,
          precision: str = "int8"):
    """A u8 x s8 -> int32 (or bf16 x bf16 -> float32) conv (NHWC; `kernel` and `padding` an int or (rows, columns))
    with an epilogue, built as schedules.build builds a quantised (bf16) model's: (executable, assembly, activations,
    expected output)."""
    pytest.importorskip("tvm")
    from tvm import relax

    (kh, kw), (ph, pw) = (v if isinstance(v, tuple) else (v, v) for v in (kernel, padding))
    rng = np.random.default_rng(1)
    x, weight, weight64, accumulator = _operands(rng, (1, height, width, channels), (kh, kw, channels, out), precision)
    shift = rng.integers(-1000, 1000, out).astype(accumulator)
    executable, report = _build(
        x, lambda v: relax.op.nn.conv2d(v, relax.const(weight), strides=stride, padding=[ph, pw, ph, pw],
                                        data_layout="NHWC", kernel_layout="HWIO", out_dtype=accumulator),
        shift, target, precision)
    asm = executable.mod.imports[0].inspect_source("asm")
    if _uses(asm, INSTRUCTIONS[precision][0]) and (kh * kw > 1 or precision == "bf16" and height * width % 32):
        # the crop of a conv's padding columns (a tap conv's, a bf16 1x1 conv's rows padded to whole blocks) in a
        # kernel of its own: in the conv's, the epilogue could not join the tiles' write-back
        # (relax_passes._crops_apart); a crop of padding channels joins it, predicated
        assert "crop" in report["default"], report
    padded = np.pad(_operand(x, precision), [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    rows, cols = (padded.shape[1] - kh) // stride + 1, (padded.shape[2] - kw) // stride + 1
    expected = sum(np.einsum("nhwc,co->nhwo", padded[:, i:i + stride * rows:stride, j:j + stride * cols:stride],
                             weight64[i, j]) for i in range(kh) for j in range(kw))
    return executable, asm, x, (expected - shift).astype(np.float32)


def _run_matches(executable, x, expected) -> None:
    """The kernel's output equals `expected` (int8: exactly; bf16: to float32 accumulation), where the host has
    AMX."""
    if not _amx_host():
        return
    import tvm
    from tvm import relax

    from mlc.runtime.runner import request_amx

    request_amx()
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    if x.dtype == np.uint8:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("shape,stride", [((14, 14, 256, 128), 1), ((7, 7, 512, 64), 1), ((28, 28, 192, 96), 1),
                                          ((28, 28, 256, 128), 2), ((15, 15, 512, 64), 2), ((14, 14, 224, 64), 1),
                                          ((13, 13, 512, 1000), 1)],
                         ids=["14x14", "7x7-49-rows", "28x28-depth-192", "stride-2", "stride-2-odd-image",
                              "depth-224-padded", "1000-outputs-padded"])
def test_int8_pointwise_convs_run_on_amx_as_rows_of_pixels(shape, stride):
    """A 1x1 conv reads its NHWC image as rows of pixels (relax_passes.convs_as_rows), its (h, w) merged into
    one row axis that the AMX tiles span across image rows (a strided conv: the pixels it reads, copied); its
    output rows go back through the epilogue. Exact where the host has AMX."""
    executable, asm, x, expected = _conv(*shape, stride, SAPPHIRE_RAPIDS)
    assert _uses(asm, "tdpbusd")
    _run_matches(executable, x, expected)


@pytest.mark.parametrize("shape,kernel,padding,stride", [
    ((28, 28, 128, 64), 3, 1, 1), ((7, 7, 256, 32), 3, 1, 1), ((13, 13, 64, 96), 3, 1, 1), ((12, 12, 64, 32), 5, 0, 1),
    ((28, 28, 128, 64), 3, 1, 2), ((27, 27, 128, 32), 5, 2, 2), ((30, 30, 64, 64), 3, 0, 3),
    ((14, 14, 96, 64), 3, 1, 1), ((14, 14, 64, 48), 3, 1, 1), ((17, 17, 128, 64), (7, 1), (3, 0), 1),
    ((17, 17, 128, 64), (1, 7), (0, 3), 1)],
    ids=["28x28", "7x7-twice-the-rows", "13x13-depth-64", "5x5-unpadded", "stride-2", "5x5-stride-2-odd-image",
         "stride-3", "depth-96-padded", "48-outputs-padded", "7x1", "1x7"])
def test_int8_kxk_convs_run_on_amx_as_shifted_rows(shape, kernel, padding, stride):
    """A KxK conv reads its zero-padded image as rows (relax_passes._tap_matmul), dealt into one phase per stride:
    each tap is the rows of its phase a fixed offset further on, a tile's rows `stride` pixels apart; all taps
    accumulate in the same tiles, and the columns and rows computed past the output (to whole 32-row blocks) are
    cropped after the fused epilogue. Depths and output channels the tiles do not divide get zero channels;
    Inception's 7x1 and 1x7 convs take the same path (their unit reduction axis dropped). Exact where the host has
    AMX (3x3, one core: 1.2-2.1 TOP/s against VNNI's 0.5-0.6)."""
    executable, asm, x, expected = _conv(*shape, stride, SAPPHIRE_RAPIDS, kernel, padding)
    assert _uses(asm, "tdpbusd") and not _uses(asm, "vpdpbusd")
    _run_matches(executable, x, expected)


@pytest.mark.parametrize("shape,kernel,padding,stride", [
    ((14, 14, 256, 128), 1, 0, 1), ((56, 56, 64, 256), 1, 0, 1), ((28, 28, 256, 128), 1, 0, 2),
    ((28, 28, 128, 64), 3, 1, 1), ((28, 28, 128, 64), 3, 1, 2), ((14, 14, 96, 48), 3, 1, 1),
    ((17, 17, 128, 64), (7, 1), (3, 0), 1)],
    ids=["1x1-14x14-rows-padded", "1x1-depth-64", "1x1-stride-2", "3x3", "3x3-stride-2", "channels-padded", "7x1"])
def test_bf16_convs_run_on_amx(shape, kernel, padding, stride):
    """bf16 convs take the int8 convs' AMX path on tdpbf16ps (depth in pairs, 32 a tile row): 1x1 convs as rows of
    pixels, computed on an image zero-padded to whole row blocks where its pixels are not (14 x 14 -> 16 x 14: a
    kernel's own padded bf16 copy would be float32) and cropped; depths from 64 (vdpbf16ps ran a resnet50 bf16 slower
    than its fp32 build on a Sapphire Rapids core); KxK, strided and channel-padded convs as shifted rows. Correct to
    float32 rounding where the host has AMX."""
    executable, asm, x, expected = _conv(*shape, stride, SAPPHIRE_RAPIDS, kernel, padding, precision="bf16")
    assert _uses(asm, "tdpbf16ps") and not _uses(asm, "vdpbf16ps")
    _run_matches(executable, x, expected)


@pytest.mark.parametrize("shape,stride,kernel,precision", [
    ((56, 56, 64, 256), 1, 1, "int8"), ((5, 5, 256, 64), 1, 3, "int8"), ((28, 28, 16, 64), 1, 3, "int8"),
    ((28, 28, 32, 64), 1, 1, "bf16")], ids=["1x1-depth-64", "3x3-5x5-image", "depth-16", "bf16-1x1-depth-32"])
def test_other_convs_stay_on_the_vector_unit(shape, stride, kernel, precision):
    """An int8 1x1 conv of depth 64 (AMX's tile stores cost more than it saves there; bf16's limit is 64), a conv
    whose image is so small that whole row blocks are over amx.MAX_PADDED_ROWS times its output, and a depth that
    whole tile rows would multiply (16 channels: 4x) keep the VNNI (AVX512-BF16) conv."""
    _, asm, _, _ = _conv(*shape, stride, SAPPHIRE_RAPIDS, kernel, kernel // 2, precision=precision)
    amx, vector = INSTRUCTIONS[precision]
    assert _uses(asm, vector) and not _uses(asm, amx)


def test_bf16_matmul_pads_rows_for_amx():
    """--precision bf16's matmuls whose rows AMX's blocks do not divide (a ViT's 197 tokens) get zero rows in the graph
    (relax_passes.bf16_matmul), so they run on tdpbf16ps rather than vdpbf16ps; the output is cropped back. Correct to
    float32 rounding where the host has AMX."""
    pytest.importorskip("tvm")
    import ml_dtypes
    import tvm
    from tvm import relax

    from mlc.compiler import relax_passes, schedules

    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 197, 384)).astype(np.float32)
    weight = rng.standard_normal((384, 64)).astype(np.float32)
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [var]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.nn.relu(relax.op.matmul(var, relax.const(weight)))))
        bb.emit_func_output(y)
    target = tvm.target.Target(SAPPHIRE_RAPIDS)
    with target:
        mod = relax_passes.bf16_matmul(bb.get(), {}, target)
    executable, report = schedules.build(mod, SAPPHIRE_RAPIDS, None, True, [])
    assert not report["unscheduled"], report
    asm = executable.mod.imports[0].inspect_source("asm")
    assert _uses(asm, "tdpbf16ps") and not _uses(asm, "vdpbf16ps")
    as_bf16 = [a.astype(ml_dtypes.bfloat16).astype(np.float64) for a in (x, weight)]
    _run_matches(executable, x, np.maximum(as_bf16[0] @ as_bf16[1], 0).astype(np.float32))


def _bf16_pass(layer, x_shape, w_shape):
    """relax_passes.bf16_matmul on main(x) = layer(x, constant W) for a Sapphire Rapids target: whether it went to
    bf16 (an astype in the result)."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes

    weight = np.random.default_rng(3).standard_normal(w_shape).astype(np.float32)
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [var]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(layer(var, relax.const(weight))))
        bb.emit_func_output(y)
    target = tvm.target.Target(SAPPHIRE_RAPIDS)
    with target:
        return relax_passes.op_counts(relax_passes.bf16_matmul(bb.get(), {}, target)).get("astype", 0) > 0


def test_bf16_on_amx_targets_is_for_what_amx_takes_and_weight_bound_matmuls():
    """On a target with AMX-BF16, vdpbf16ps ran slower than float32 (resnet50 and bert-base on one Sapphire Rapids
    core), so --precision bf16 casts only the matmuls and convs AMX's tiles take, and matmuls of a few rows (a
    classifier's fully connected layers: their time is the weight's bytes, which bf16 halves); other convs (16
    channels deep, grouped) stay float32."""
    from tvm import relax

    def conv(groups=1):
        return lambda x, w: relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1], groups=groups)

    assert _bf16_pass(relax.op.matmul, (1, 128, 256), (256, 256))
    assert _bf16_pass(relax.op.matmul, (1, 4096), (4096, 1000))
    assert _bf16_pass(conv(), (1, 64, 28, 28), (64, 64, 3, 3))
    assert not _bf16_pass(relax.op.matmul, (1, 128, 40), (40, 256))
    assert not _bf16_pass(conv(), (1, 16, 28, 28), (64, 16, 3, 3))
    assert not _bf16_pass(conv(groups=4), (1, 64, 28, 28), (64, 16, 3, 3))


def test_bf16_conv_without_an_epilogue_runs_on_amx():
    """A conv whose output leaves the kernel as it is (a densenet conv feeding a concatenation) has its rows written
    to a buffer of the kernel's own and copied out (schedule_rules._merge_pixel_rows): before, the rows stayed 4-D,
    AMX's schedule refused the block, and a generic one ran it at a twentieth of the speed."""
    pytest.importorskip("tvm")
    import ml_dtypes
    from tvm import relax

    from mlc.compiler import schedules

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 14, 14, 128)).astype(np.float32)
    weight = rng.standard_normal((3, 3, 128, 32)).astype(ml_dtypes.bfloat16)
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [var]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.nn.conv2d(
                relax.op.astype(var, "bfloat16"), relax.const(weight), padding=[1, 1, 1, 1], data_layout="NHWC",
                kernel_layout="HWIO", out_dtype="float32")))
        bb.emit_func_output(y)
    executable, report = schedules.build(bb.get(), SAPPHIRE_RAPIDS, None, True, [])
    assert not report["unscheduled"], report
    assert _uses(executable.mod.imports[0].inspect_source("asm"), "tdpbf16ps")
    padded = np.pad(_operand(x, "bf16"), [(0, 0), (1, 1), (1, 1), (0, 0)])
    expected = sum(np.einsum("nhwc,co->nhwo", padded[:, i:i + 14, j:j + 14], weight[i, j].astype(np.float64))
                   for i in range(3) for j in range(3))
    _run_matches(executable, x, expected.astype(np.float32))
