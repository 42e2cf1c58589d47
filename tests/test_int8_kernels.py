"""int8 kernels (mlc/compiler/int8_dot.py): u8 x s8 -> int32 dense layers and convs run on AVX512-VNNI's vpdpbusd
where the target has it, on the plain int32 register tile where it does not, and are exact either way (numpy
int64), with the dequantise / requantise epilogue fused in. One Relax module holds every case so each target
builds once (a few seconds)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import ZNVER4, host_runs

RNG = np.random.default_rng(0)
ROWS = 13  # the symbolic row count at run time: no multiple of any row tile


def _epilogue(op, relax, acc, shape, requantise):
    """(acc - zp_x * colsum_w) * scale + bias, then optionally clip(round(y / s) + zp, 0, 255) as uint8."""
    arrays = (RNG.integers(-5000, 5000, shape).astype(np.int32), (RNG.random(shape) * 1e-3).astype(np.float32),
              RNG.standard_normal(shape).astype(np.float32))
    zp_colsum, scale, bias = (relax.const(a) for a in arrays)
    y = op.add(op.multiply(op.astype(op.subtract(acc, zp_colsum), "float32"), scale), bias)
    if requantise:
        y = op.add(op.round(op.divide(y, relax.const(np.float32(0.05)))), relax.const(np.float32(128)))
        y = op.astype(op.clip(y, 0, 255), "uint8")
    return y, arrays


def _numpy_epilogue(acc, arrays, requantise):
    y = (acc - arrays[0]).astype(np.float32) * arrays[1] + arrays[2]
    return np.clip(np.round(y / np.float32(0.05)) + 128, 0, 255).astype(np.uint8) if requantise else y


def _conv_int64(x, w, stride, pad):
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwij,ocij->nohw", windows, w.astype(np.int64))


@pytest.fixture(scope="module")
def case():
    """The module (inputs uint8, weights int8 constants) and numpy's results on random inputs."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    op = relax.op
    m = tvm.tirx.Var("m", "int64")
    shapes = {"dense": (24, 66), "seq": (2, m, 64), "conv3": (1, 16, 11, 11), "conv1": (1, 32, 8, 8), "wide": (8, 768),
              "conv5": (1, 8, 29, 29)}
    params = [relax.Var(name, relax.TensorType(shape, "uint8")) for name, shape in shapes.items()]
    feeds = {name: RNG.integers(0, 256, [ROWS if not isinstance(d, int) else d for d in shape]).astype(np.uint8)
             for name, shape in shapes.items()}
    weights = {"dense": (66, 37), "seq": (64, 96), "conv3": (32, 16, 3, 3), "conv1": (48, 32, 1, 1), "wide": (768, 100),
               "conv5": (32, 8, 5, 5)}
    weights = {name: RNG.integers(-128, 128, shape).astype(np.int8) for name, shape in weights.items()}
    x = dict(zip(shapes, params))
    expected = {}
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            # odd depth (66: padded to quads) and odd width (37), no epilogue
            dense = bb.emit(op.matmul(x["dense"], relax.const(weights["dense"]), out_dtype="int32"))
            expected["dense"] = feeds["dense"].astype(np.int64) @ weights["dense"].astype(np.int64)
            # symbolic rows under a batch axis, dequantised and requantised to uint8 in the same kernel
            seq = bb.emit(op.matmul(x["seq"], relax.const(weights["seq"]), out_dtype="int32"))
            seq, arrays = _epilogue(op, relax, seq, (96,), True)
            seq = bb.emit(seq)
            expected["seq"] = _numpy_epilogue(feeds["seq"].astype(np.int64) @ weights["seq"].astype(np.int64),
                                              arrays, True)
            # 3x3 stride 2, dequantised to float32
            conv3 = bb.emit(op.nn.conv2d(x["conv3"], relax.const(weights["conv3"]), strides=2, padding=1,
                                         out_dtype="int32"))
            conv3, arrays = _epilogue(op, relax, conv3, (1, 32, 1, 1), False)
            conv3 = bb.emit(conv3)
            expected["conv3"] = _numpy_epilogue(_conv_int64(feeds["conv3"], weights["conv3"], 2, 1), arrays, False)
            conv1 = bb.emit(op.nn.conv2d(x["conv1"], relax.const(weights["conv1"]), out_dtype="int32"))
            expected["conv1"] = _conv_int64(feeds["conv1"], weights["conv1"], 1, 0)
            # 7 tiles of 16 columns, 768 deep: visited in blocks of 7 (a partial block of 5 would put a predicate on
            # the tile, which tensorize rejects)
            wide = bb.emit(op.matmul(x["wide"], relax.const(weights["wide"]), out_dtype="int32"))
            expected["wide"] = feeds["wide"].astype(np.int64) @ weights["wide"].astype(np.int64)
            # 25 output rows, which no tile of 2 vectors divides: computed on 27 (relax_passes.int8_conv_rows)
            conv5 = bb.emit(op.nn.conv2d(x["conv5"], relax.const(weights["conv5"]), out_dtype="int32"))
            expected["conv5"] = _conv_int64(feeds["conv5"], weights["conv5"], 1, 0)
            out = bb.emit_output(relax.Tuple([dense, seq, conv3, conv1, wide, conv5]))
        bb.emit_func_output(out)
    return tvm, relax, bb.get(), feeds, expected


def _check(tvm, relax, executable, feeds, expected):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    outputs = vm["main"](*(tvm.runtime.tensor(feeds[name]) for name in expected))
    for (name, want), got in zip(expected.items(), outputs):
        got = got.numpy()
        assert got.shape == want.shape, name
        if want.dtype == np.float32:  # the float epilogue: same float operations, last-bit differences only
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=name)
        else:
            dtype = np.int32 if want.dtype == np.int64 else want.dtype  # int64: the accumulator, int32 in mlc
            assert got.dtype == dtype and (got == want).all(), (name, int(np.abs(got.astype(np.int64) - want).max()))


def test_int8_kernels_run_on_vpdpbusd_and_are_exact(case):
    """Every int8 kernel tensorized on vpdpbusd (odd depth and width padded, symbolic rows padded to the tile,
    the epilogue on the tile), results equal to numpy's integer arithmetic."""
    tvm, relax, mod, feeds, expected = case
    from mlc.compiler import schedule_rules as rules, schedules

    target_json = ZNVER4
    target = tvm.target.Target(target_json)
    kernels = rules.apply_default_schedules(schedules._legalize_and_fuse(mod, target), target)
    int8 = {gv.name_hint: f.script() for gv, f in kernels.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and ("matmul" in gv.name_hint or "conv2d" in gv.name_hint)}
    assert len(int8) == 6 and all("vpdpbusd" in text for text in int8.values()), list(int8)
    # the padded inputs' copies (conv3's 16 channels, padding 1; conv5's 8, its extra columns) a pixel at a time,
    # its channels one vector: fused whole, the condition's lanes were scalarized, a byte at a time
    padded = [t for t in int8.values() if 'sblock("pad_temp")' in t]
    per_pixel = [t for t in padded if re.search(r'for (ax\d+) in T\.vectorized\(T\.int64\((\d+)\)\):\s+with T\.sblock\('
                                                r'"pad_temp"\):[^@]*?= T\.axis\.spatial\(T\.int64\(\2\), \1\)', t)]
    assert len(padded) == 2 and len(per_pixel) == 2, (len(padded), len(per_pixel))
    executable, report = schedules.build(mod, target_json, None, True)
    assert not report["unscheduled"], report
    assert "vpdpbusd" in executable.mod.imports[0].inspect_source("asm")
    if not host_runs(target_json):
        pytest.skip("the host has no AVX512-VNNI: built, not run")
    _check(tvm, relax, executable, feeds, expected)


def test_int8_kernels_without_vnni_use_the_int32_tile(case):
    """AVX-512 without VNNI: the same module builds on the plain int32 register tile, exact; an aarch64 preset
    builds too (not run)."""
    tvm, relax, mod, feeds, expected = case
    from mlc import targets
    from mlc.compiler import schedules

    skylake = {**ZNVER4, "mcpu": "skylake-avx512"}
    executable, report = schedules.build(mod, skylake, None, True)
    assert not report["unscheduled"], report
    assert "vpdpbusd" not in executable.mod.imports[0].inspect_source("asm")
    if host_runs(skylake):
        _check(tvm, relax, executable, feeds, expected)
    _, report = schedules.build(mod, targets.resolve("graviton2").tvm, None, True)
    assert not report["unscheduled"], report


def test_bf16_dense_with_symbolic_rows_runs_on_vdpbf16ps():
    """The bf16 tile gets the same row padding (it had none: symbolic rows fell back to the fp32 tile), and a width
    of 7 tiles visited whole; results within bf16 products' fp32 accumulation of float64."""
    tvm = pytest.importorskip("tvm")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from tvm import relax

    from mlc.compiler import schedules

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, tvm.tirx.Var("m", "int64"), 768), "bfloat16"))
    w = RNG.standard_normal((768, 100)).astype(ml_dtypes.bfloat16)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.matmul(x, relax.const(w, "bfloat16"), out_dtype="float32")
            out = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(out)
    executable, report = schedules.build(bb.get(), {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4",
                                                    "num-cores": 1}, None, True)
    assert not report["unscheduled"], report
    assert "vdpbf16ps" in executable.mod.imports[0].inspect_source("asm")
    from mlc import targets

    if not targets.has_bf16_dot(targets.resolve("x86")):
        pytest.skip("the host has no AVX512-BF16: built, not run")
    feed = RNG.standard_normal((1, ROWS, 768)).astype(ml_dtypes.bfloat16)
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(feed)).numpy()
    np.testing.assert_allclose(got, np.maximum(feed.astype(np.float64) @ w.astype(np.float64), 0), atol=2e-4)


def test_crops_sink_below_their_epilogue_but_not_past_a_full_operand():
    """relax_passes.sink_crops moves a crop of padded output (a conv computed on extra columns) below the
    elementwise ops after it whose other operands are per channel, so the conv keeps its epilogue fused; it stops
    at an operand that varies along the cropped axis (a residual), and leaves crops that drop over half alone."""
    pytest.importorskip("tvm")
    import tvm
    from tvm import relax

    from mlc.compiler.relax_passes import sink_crops

    def ops_after(crop_end: int, residual: bool) -> list[str]:
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((1, 4, 8, 16), "int32"))
        r = relax.Var("r", relax.TensorType((1, 4, crop_end, 16), "float32"))
        with bb.function("main", [x, r]):
            with bb.dataflow():
                y = bb.emit(relax.op.strided_slice(x, axes=[2], begin=[0], end=[crop_end]))
                y = bb.emit(relax.op.astype(y, "float32"))
                y = bb.emit(relax.op.multiply(y, relax.const(np.ones(16, np.float32))))
                y = bb.emit(relax.op.add(y, r) if residual else relax.op.nn.relu(y))
                out = bb.emit_output(relax.op.astype(y, "uint8"))
            bb.emit_func_output(out)
        mod = sink_crops(bb.get())
        tvm.ir.assert_structural_equal(relax.transform.Normalize()(mod), mod)
        return [b.value.op.name for b in mod["main"].body.blocks[0].bindings]

    assert ops_after(6, residual=False) == ["relax.astype", "relax.multiply", "relax.nn.relu", "relax.astype",
                                            "relax.strided_slice"]
    assert ops_after(6, residual=True) == ["relax.astype", "relax.multiply", "relax.strided_slice", "relax.add",
                                           "relax.astype"]
    assert ops_after(3, residual=False)[0] == "relax.strided_slice"
