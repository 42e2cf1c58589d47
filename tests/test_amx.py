"""int8 dense layers on AMX tiles (mlc.compiler.amx) for CPUs that have them (Sapphire Rapids and later): the kernel's
instructions whatever the host, its numbers where the host has AMX, and what the artifact asks of the machine."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ZNVER4, host_runs

from mlc import targets

SAPPHIRE_RAPIDS = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids", "num-cores": 1}


def _dense(rows: int, depth: int, columns: int, target: dict, seed: int = 0):
    """A u8 x s8 -> int32 matmul with a constant weight and an epilogue (less a per-column int32, as float), built
    with mlc's default schedules: (executable, assembly, activations, expected output)."""
    pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import schedules

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (1, rows, depth)).astype(np.uint8)
    weight = rng.integers(-128, 128, (depth, columns)).astype(np.int8)
    shift = rng.integers(-1000, 1000, columns).astype(np.int32)
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x.shape, "uint8"))
    with bb.function("main", [var]):
        with bb.dataflow():
            acc = bb.emit(relax.op.matmul(var, relax.const(weight, "int8"), out_dtype="int32"))
            out = bb.emit_output(bb.emit(relax.op.astype(relax.op.subtract(acc, relax.const(shift)), "float32")))
        bb.emit_func_output(out)
    executable, report = schedules.build(bb.get(), target, None, True, [])
    assert not report["unscheduled"], report
    expected = (x.astype(np.int64) @ weight.astype(np.int64) - shift).astype(np.float32)
    return executable, executable.mod.imports[0].inspect_source("asm"), x, expected


def _amx_host() -> bool:
    from mlc.runtime.runner import host_cpu_flags

    return host_runs(SAPPHIRE_RAPIDS) and {"amx_tile", "amx_int8"} <= host_cpu_flags()


@pytest.mark.parametrize("shape", [(32, 512, 64), (64, 768, 96), (128, 256, 3072), (197, 384, 64), (49, 512, 256)],
                         ids=["one-block", "bert-qkv-like", "wide", "vit-197-rows", "7x7-rows"])
def test_int8_dense_runs_on_amx_tiles(shape):
    """On a target with AMX, a dense layer whose columns and depth the tiles divide runs on tdpbusd, the tiles
    configured once per block (ldtilecfg) and the accumulators stored once (tilestored), its rows zero-padded to
    whole blocks where they are not (197, 49); exact where the host has AMX. (On VNNI alone: 0.6-0.7 TOP/s on one
    Sapphire Rapids core; on AMX 1.0-2.1, benchmarks/int8.)"""
    executable, asm, x, expected = _dense(*shape, SAPPHIRE_RAPIDS)
    assert "tdpbusd" in asm and "ldtilecfg" in asm and "tilestored" in asm
    assert "vpdpbusd" not in asm
    if not _amx_host():
        return
    import tvm
    from tvm import relax

    from mlc.runtime.runner import request_amx

    request_amx()
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape,target", [((40, 64, 32), SAPPHIRE_RAPIDS), ((64, 720, 64), SAPPHIRE_RAPIDS),
                                          ((64, 768, 96), ZNVER4)], ids=["tiny", "depth-720", "no-amx"])
def test_other_dense_layers_stay_on_vnni(shape, target):
    """A layer too small to pay for the tiles, a depth they do not divide, or a target without AMX: the VNNI
    register tile, as before."""
    _, asm, _, _ = _dense(*shape, target)
    assert "vpdpbusd" in asm and "tdpbusd" not in asm.replace("vpdpbusd", "")


def test_int8_artifacts_for_amx_require_it_and_ask_linux_for_it(monkeypatch):
    """An int8 build for a CPU with AMX requires amx_tile and amx_int8 of the machine (a host without them gets a
    clean refusal, not SIGILL); loading it asks Linux for the tile state, whose refusal is a one-line error; a host
    without AMX is not asked."""
    from mlc.pipeline.package import _target_info
    from mlc.runtime import runner

    class Recipe:
        options: dict = {}

    spr = targets.from_json('{"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids"}')
    assert targets.has_amx(spr) and not targets.has_amx(targets.from_json(
        '{"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4"}'))
    assert {"amx_tile", "amx_int8"} <= set(_target_info(spr, Recipe(), "fp32", True)["required_cpu_features"])
    assert "amx_int8" not in _target_info(spr, Recipe(), "fp32", False)["required_cpu_features"]

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


def _conv(height: int, width: int, channels: int, out: int, stride: int, target: dict, kernel=1, padding=0):
    """A u8 x s8 -> int32 conv (NHWC; `kernel` and `padding` an int or (rows, columns)) with an epilogue, built as
    schedules.build builds a quantised model's: (executable, assembly, activations, expected output)."""
    pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import schedules

    (kh, kw), (ph, pw) = (v if isinstance(v, tuple) else (v, v) for v in (kernel, padding))
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (1, height, width, channels)).astype(np.uint8)
    weight = rng.integers(-128, 128, (kh, kw, channels, out)).astype(np.int8)
    shift = rng.integers(-1000, 1000, out).astype(np.int32)
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x.shape, "uint8"))
    with bb.function("main", [var]):
        with bb.dataflow():
            acc = bb.emit(relax.op.nn.conv2d(var, relax.const(weight, "int8"), strides=stride,
                                             padding=[ph, pw, ph, pw], data_layout="NHWC", kernel_layout="HWIO",
                                             out_dtype="int32"))
            y = bb.emit_output(bb.emit(relax.op.astype(relax.op.subtract(acc, relax.const(shift)), "float32")))
        bb.emit_func_output(y)
    executable, report = schedules.build(bb.get(), target, None, True, [])
    assert not report["unscheduled"], report
    if kh * kw > 1 and "tdpbusd" in executable.mod.imports[0].inspect_source("asm").replace("vpdpbusd", ""):
        # the crop of a tap conv's padding columns in a kernel of its own: in the conv's, the epilogue could not
        # join the tiles' write-back (relax_passes._crops_apart); a crop of padding channels joins it, predicated
        assert "crop" in report["default"], report
    padded = np.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)]).astype(np.int64)
    rows, cols = (padded.shape[1] - kh) // stride + 1, (padded.shape[2] - kw) // stride + 1
    expected = sum(np.einsum("nhwc,co->nhwo", padded[:, i:i + stride * rows:stride, j:j + stride * cols:stride],
                             weight[i, j].astype(np.int64)) for i in range(kh) for j in range(kw))
    return executable, executable.mod.imports[0].inspect_source("asm"), x, (expected - shift).astype(np.float32)


def _run_exactly(executable, x, expected) -> None:
    """The kernel's output equals `expected`, where the host has AMX."""
    if not _amx_host():
        return
    import tvm
    from tvm import relax

    from mlc.runtime.runner import request_amx

    request_amx()
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape,stride", [((14, 14, 256, 128), 1), ((7, 7, 512, 64), 1), ((28, 28, 192, 96), 1),
                                          ((28, 28, 256, 128), 2), ((15, 15, 512, 64), 2), ((14, 14, 224, 64), 1),
                                          ((13, 13, 512, 1000), 1)],
                         ids=["14x14", "7x7-49-rows", "28x28-depth-192", "stride-2", "stride-2-odd-image",
                              "depth-224-padded", "1000-outputs-padded"])
def test_int8_pointwise_convs_run_on_amx_as_rows_of_pixels(shape, stride):
    """A 1x1 conv reads its NHWC image as rows of pixels (relax_passes.int8_convs_as_rows), its (h, w) merged into
    one row axis that the AMX tiles span across image rows (a strided conv: the pixels it reads, copied); its
    output rows go back through the epilogue. Exact where the host has AMX."""
    executable, asm, x, expected = _conv(*shape, stride, SAPPHIRE_RAPIDS)
    assert "tdpbusd" in asm.replace("vpdpbusd", "")
    _run_exactly(executable, x, expected)


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
    assert "tdpbusd" in asm.replace("vpdpbusd", "") and "vpdpbusd" not in asm
    _run_exactly(executable, x, expected)


@pytest.mark.parametrize("shape,stride,kernel", [((56, 56, 64, 256), 1, 1), ((5, 5, 256, 64), 1, 3),
                                                 ((28, 28, 16, 64), 1, 3)],
                         ids=["1x1-depth-64", "3x3-5x5-image", "depth-16"])
def test_other_convs_stay_on_vnni(shape, stride, kernel):
    """A 1x1 conv of depth 64 (AMX's tile stores cost more than it saves there), a conv whose image is so small
    that whole row blocks are over amx.MAX_PADDED_ROWS times its output, and a depth that whole tile rows would
    multiply (16 channels: 4x) keep the VNNI conv."""
    _, asm, _, _ = _conv(*shape, stride, SAPPHIRE_RAPIDS, kernel, kernel // 2)
    assert "vpdpbusd" in asm and "tdpbusd" not in asm.replace("vpdpbusd", "")
