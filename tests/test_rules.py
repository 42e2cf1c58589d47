"""Default CPU schedules (mlc/compiler/schedule_rules.py): the conv/matmul register-tile rule applies where it
should, falls back where it cannot, and never changes results. Builds tiny Relax modules in
process (~40 s here, most of it `import tvm` and LLVM)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import ZNVER4

from helpers import run_mlc

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def tvm_tools():
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc import targets
    from mlc.compiler import schedule_rules as rules, schedules

    return tvm, relax, rules, schedules, targets.resolve("x86").tvm


def _const(relax, *shape):
    return relax.const((RNG.standard_normal(shape) * 0.1).astype(np.float32))


def _conv_module(relax, x_shape, out_channels, kernel, groups=1, strides=1, padding=1, dilation=1, residual=False):
    """conv2d (NCHW, constant OIHW weight) + bias + [residual] + relu, as the ONNX importer makes it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    weight = _const(relax, out_channels, x_shape[1] // groups, kernel, kernel)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, weight, strides=strides, padding=padding, dilation=dilation,
                                           groups=groups))
            y = bb.emit(relax.op.add(y, _const(relax, 1, out_channels, 1, 1)))
            if residual:
                y = bb.emit(relax.op.add(y, y))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def _matmul_module(tvm, relax, m, k, n, transposed=False):
    bb = relax.BlockBuilder()
    rows = m if isinstance(m, int) else tvm.tirx.Var(m, "int64")
    x = relax.Var("x", relax.TensorType((rows, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.op.permute_dims(_const(relax, n, k)) if transposed else _const(relax, k, n)
            y = bb.emit(relax.op.add(relax.op.matmul(x, w), _const(relax, n)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _run(tvm, relax, executable, x):
    return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _scheduled_kernels(tvm, rules, schedules, mod, target_json):
    target = tvm.target.Target(target_json)
    mod = rules.apply_default_schedules(schedules._legalize_and_fuse(mod, target), target)
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


CASES = {
    "3x3": dict(x_shape=(1, 16, 14, 14), out_channels=32, kernel=3),
    "3x3 residual": dict(x_shape=(2, 32, 7, 7), out_channels=32, kernel=3, residual=True),
    "strided": dict(x_shape=(1, 8, 15, 15), out_channels=16, kernel=3, strides=2),
    "1x1, 10 channels": dict(x_shape=(1, 16, 9, 9), out_channels=10, kernel=1, padding=0),
    "grouped": dict(x_shape=(1, 32, 8, 8), out_channels=32, kernel=3, groups=2),
    "depthwise": dict(x_shape=(1, 32, 8, 8), out_channels=32, kernel=3, groups=32),
    "dilated": dict(x_shape=(1, 16, 12, 12), out_channels=16, kernel=3, dilation=2, padding=2),
    "7x7 stem": dict(x_shape=(1, 3, 32, 32), out_channels=16, kernel=7, strides=2, padding=3),
}


@pytest.mark.parametrize("case", CASES)
def test_default_schedules_keep_conv_results(tvm_tools, case):
    """Every conv shape builds with every kernel scheduled and matches TVM's unscheduled build."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    mod = _conv_module(relax, **CASES[case])
    x = RNG.standard_normal(CASES[case]["x_shape"]).astype(np.float32)
    expected = _run(tvm, relax, tvm.compile(mod, target="llvm"), x)
    executable, report = schedules.build(mod, target_json, None, True)
    assert report["default"] and not report["unscheduled"] and not report["tuned"], report
    np.testing.assert_allclose(_run(tvm, relax, executable, x), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,k,n,transposed", [(32, 64, 128, False), (5, 32, 1000, False), (16, 32, 48, True),
                                              ("rows", 32, 64, False), (20, 512, 224, False)])
def test_default_schedules_keep_matmul_results(tvm_tools, m, k, n, transposed):
    """Dense layers: register tile, odd widths (tail), B transposed (fallback), symbolic rows,
    J tiles visited in blocks with a partial last block (7 tiles of 512-deep weights: blocks of 4)."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    mod = _matmul_module(tvm, relax, m, k, n, transposed)
    x = RNG.standard_normal((m if isinstance(m, int) else 13, k)).astype(np.float32)
    expected = _run(tvm, relax, tvm.compile(mod, target="llvm"), x)
    executable, report = schedules.build(mod, target_json, None, True)
    assert not report["unscheduled"], report
    np.testing.assert_allclose(_run(tvm, relax, executable, x), expected, rtol=1e-4, atol=1e-4)


def test_conv_rule_tiles_registers_and_packs_weights(tvm_tools):
    """A 3x3 conv becomes NHWC, its accumulators a register tile ("local"), its constant weight a
    packing block that the build folds away; the bias and relu run on the tile (no second loop)."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    kernels = _scheduled_kernels(tvm, rules, schedules, _conv_module(relax, **CASES["3x3"]), target_json)
    conv = next(f for name, f in kernels.items() if "conv2d" in name)
    text = conv.script()
    assert 'T.sblock("conv2d_nhwc' in text and 'scope="local"' in text and "T.vectorized" in text, text
    assert "meta_schedule.layout_rewrite_preproc" in text, text
    assert 'T.sblock("compute"' not in text and "T.max(" in text, text  # relu inlined into the write-back
    depthwise = _scheduled_kernels(tvm, rules, schedules, _conv_module(relax, **CASES["depthwise"]), target_json)
    assert all(f.attrs and f.attrs.get(rules.SCHEDULED, False) for f in depthwise.values())


def test_zoo_cnn_convs_get_the_default_conv_schedule_and_pass_the_check(tmp_path):
    out = tmp_path / "cnn"
    proc = run_mlc("compile", "zoo:cnn", "-o", out)
    assert proc.returncode == 0, proc.stderr  # exit 3 if the artifact disagreed with the reference
    schedules = json.loads((out / "manifest.json").read_text())["compile"]["schedules"]
    assert [k for k in schedules["default"] if "conv2d" in k] and not schedules["unscheduled"], schedules
    assert run_mlc("check", out).returncode == 0


def test_odd_width_matmul_is_padded_to_the_register_tile(tvm_tools):
    """A 1001-wide dense layer (a vocabulary head) computes on a zero-padded width with the
    register tile and a folded weight, not a predicated scalar tail; the write-back drops the
    padding and applies the bias."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    kernels = _scheduled_kernels(tvm, rules, schedules, _matmul_module(tvm, relax, 24, 32, 1001), target_json)
    text = next(f for name, f in kernels.items() if "matmul" in name).script()
    assert "_pad" in text and "meta_schedule.layout_rewrite_preproc" in text and 'scope="local"' in text, text
    assert 'T.sblock("T_add"' not in text, text  # the bias runs in the write-back
    mod = _matmul_module(tvm, relax, 24, 32, 1001)
    x = RNG.standard_normal((24, 32)).astype(np.float32)
    executable, report = schedules.build(mod, target_json, None, True)
    assert report["default"] and not report["unscheduled"], report
    np.testing.assert_allclose(_run(tvm, relax, executable, x), _run(tvm, relax, tvm.compile(mod, target="llvm"), x),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", ["m", 13])
def test_padded_matmul_writes_only_its_output(tvm_tools, rows):
    """13 rows are no multiple of the 12-row register tile: the last tile must not write past
    the output (TVM 0.27 drops the write-back's row bound when the unpadding block is inlined;
    the overrun corrupted the heap and crashed later tests). The kernel writes into the first
    13 rows of a 26-row tensor whose other rows must keep their sentinel."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    kernels = _scheduled_kernels(tvm, rules, schedules, _matmul_module(tvm, relax, rows, 12, 50), target_json)
    kernel = next(f for name, f in kernels.items() if "matmul" in name)
    assert "_pad" in kernel.script()
    library = tvm.compile(kernel.with_attr("global_symbol", "main"), target=tvm.target.Target(target_json))
    x, w, b = (RNG.standard_normal(shape).astype(np.float32) for shape in [(13, 12), (12, 50), (50,)])
    whole = tvm.runtime.tensor(np.full((26, 50), 7.0, np.float32))
    library["main"](*(tvm.runtime.tensor(a) for a in (x, w, b)), whole._create_view((13, 50)))
    written = whole.numpy()
    np.testing.assert_allclose(written[:13], x @ w + b, rtol=1e-5, atol=1e-5)
    assert (written[13:] == 7.0).all(), "the kernel wrote past its output"


def test_computed_input_of_a_concatenation_is_not_recomputed_per_element(tvm_tools):
    """An LSTM's last step (sigmoid * tanh of its gates) fused with the concatenation of all its
    steps: inlined into the concatenation it would be evaluated for every output element. It stays
    a block of its own; the copies (expand_dims) are inlined."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    steps, batch, hidden = 6, 8, 32
    bb = relax.BlockBuilder()
    states = [relax.Var(f"h{i}", relax.TensorType((batch, hidden), "float32")) for i in range(steps - 1)]
    gates = relax.Var("gates", relax.TensorType((batch, 2 * hidden), "float32"))
    op = relax.op
    with bb.function("main", states + [gates]):
        with bb.dataflow():
            i_gate = op.sigmoid(op.strided_slice(gates, [1], [0], [hidden]))
            last = bb.emit(op.multiply(i_gate, op.tanh(op.strided_slice(gates, [1], [hidden], [2 * hidden]))))
            stacked = bb.emit(op.concat([op.expand_dims(h, [0]) for h in states + [last]], axis=0))
            out = bb.emit_output(op.reshape(op.permute_dims(stacked, [1, 0, 2]), (batch * steps, hidden)))
        bb.emit_func_output(out)
    mod = bb.get()
    kernel = next(f for f in _scheduled_kernels(tvm, rules, schedules, mod, target_json).values()
                  if f.attrs and f.attrs.get(rules.SCHEDULED, False))
    blocks = [line for line in kernel.script().splitlines() if "with T.sblock(" in line and "root" not in line]
    assert len(blocks) == 2, kernel.script()  # the last step's cell, then the concatenation (copies inlined)
    arrays = [RNG.standard_normal((batch, hidden)).astype(np.float32) for _ in states]
    gate_values = RNG.standard_normal((batch, 2 * hidden)).astype(np.float32)
    executable, report = schedules.build(mod, target_json, None, True)
    assert not report["unscheduled"], report
    result = relax.VirtualMachine(executable, tvm.cpu())["main"](
        *(tvm.runtime.tensor(a) for a in arrays + [gate_values])).numpy()
    cell = 1 / (1 + np.exp(-gate_values[:, :hidden])) * np.tanh(gate_values[:, hidden:])
    np.testing.assert_allclose(result, np.stack(arrays + [cell], 1).reshape(batch * steps, hidden), rtol=1e-5,
                               atol=1e-6)


def _library_asm(module) -> str:
    """Assembly of every LLVM module under `module` (an executable's library and its imports)."""
    pending, text = [module], []
    while pending:
        current = pending.pop()
        pending += list(current.imports)
        try:
            text.append(current.inspect_source("asm"))
        except Exception:  # a module with no LLVM source (the VM's own)
            continue
    return "\n".join(text)


def test_register_tile_accumulators_live_on_the_stack(tvm_tools, monkeypatch):
    """A conv's accumulator tile (8 rows x 32 floats: 1 KB, "local") is a stack buffer that LLVM
    keeps in registers; TVM's own lowering allocates it from the workspace pool, zeroes it and frees
    it once per output tile (resnet50's 64 -> 256 channel 1x1 conv: 59 GFLOP/s instead of 103)."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    from mlc.compiler import tir_pipeline

    mod = _conv_module(relax, x_shape=(1, 16, 16, 16), out_channels=32, kernel=1, padding=0)
    x = RNG.standard_normal((1, 16, 16, 16)).astype(np.float32)
    expected = _run(tvm, relax, tvm.compile(mod, target="llvm"), x)
    ours, _ = schedules.build(mod, target_json, None, True)
    monkeypatch.setattr(tir_pipeline, "register", lambda: "default")
    tvms, _ = schedules.build(mod, target_json, None, True)
    assert "TVMBackendAllocWorkspace" in _library_asm(tvms.mod)  # the control: TVM's lowering
    assert "TVMBackendAllocWorkspace" not in _library_asm(ours.mod)
    np.testing.assert_allclose(_run(tvm, relax, ours, x), expected, rtol=1e-4, atol=1e-4)


def test_symbolic_rows_run_whole_tiles_then_one_tail_per_remainder(tvm_tools):
    """A dense layer over a symbolic row count: whole 12-row tiles with no per-row `< rows` branch, then one
    tail kernel per remainder (tir_pipeline.split_row_tails), the accumulator a stack tile (it was a heap
    buffer of min(rows, 12) rows); results match TVM's unscheduled build below, at and between tile multiples."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    from mlc.compiler import tir_pipeline

    mod = _matmul_module(tvm, relax, "rows", 64, 64)
    # the tiles as on AVX-512 whatever the host (12 rows of 2 vectors); the numbers from a build for the host
    name, kernel = next((n, f) for n, f in _scheduled_kernels(tvm, rules, schedules, mod, ZNVER4).items()
                        if "matmul" in n)
    passes = tir_pipeline.lowering_passes({})
    split = next(i for i, p in enumerate(passes) if p.info.name == "mlc.SplitRowTails")
    text = tvm.transform.Sequential(passes[:split + 1])(tvm.IRModule({name: kernel}))[name].script()
    assert "< rows" not in text
    assert text.count("rows % T.int64(12) == T.int64(") == 11, text
    for target in (ZNVER4, target_json):
        executable, report = schedules.build(mod, target, None, True)
        assert report["default"] and not report["unscheduled"], report
        assert "TVMBackendAllocWorkspace" not in _library_asm(executable.mod)
    reference = tvm.compile(mod, target="llvm")
    for rows in (1, 5, 11, 12, 13, 24, 31):
        x = RNG.standard_normal((rows, 64)).astype(np.float32)
        np.testing.assert_allclose(_run(tvm, relax, executable, x), _run(tvm, relax, reference, x), rtol=1e-4,
                                   atol=1e-4)


def test_symbolic_transpose_is_vectorized_without_a_division_per_element(tvm_tools):
    """A transpose over a symbolic length (attention heads, as BERT's): the symbolic loop stays nested and
    the constant trailing loop is vectorized; fused into one loop it needed a run-time division per element
    and ran scalar (bert-base: 5-25x the static transposes' time)."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    rows = tvm.tirx.Var("rows", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, rows, 4, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.permute_dims(relax.op.add(x, x), [0, 2, 1, 3]))
        bb.emit_func_output(out)
    mod = bb.get()
    kernels = _scheduled_kernels(tvm, rules, schedules, mod, target_json)
    text = "\n".join(f.script() for f in kernels.values())
    assert "T.vectorized" in text and "// rows" not in text and "% rows" not in text, text
    executable, _ = schedules.build(mod, target_json, None, True)
    for length in (1, 7, 16):
        value = RNG.standard_normal((1, length, 4, 64)).astype(np.float32)
        np.testing.assert_allclose(_run(tvm, relax, executable, value), (value + value).transpose(0, 2, 1, 3))


def test_deep_weight_panels_are_prefetched_a_panel_ahead(tvm_tools):
    """A dense layer whose weight panel (2304 deep x 32 floats: 288 KB) exceeds its L2 share prefetches the next
    panel while it computes this one (tir_pipeline.prefetch_weights; the last panel's prefetch is clamped to the
    weight buffer), and still computes x @ w + b; 64 columns = two panels, so the second is a prefetched one."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 2304), "float32"))
    w, b = (RNG.standard_normal(shape).astype(np.float32) * 0.05 for shape in [(2304, 64), (64,)])
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(b)))
        bb.emit_func_output(out)
    executable, report = schedules.build(bb.get(), ZNVER4, None, True)  # 32-float panels: AVX-512's
    assert report["default"] and not report["unscheduled"], report
    assert "prefetcht1" in _library_asm(executable.mod)
    executable, _ = schedules.build(bb.get(), target_json, None, True)  # the numbers from a build for the host
    value = RNG.standard_normal((8, 2304)).astype(np.float32)
    np.testing.assert_allclose(_run(tvm, relax, executable, value), value.astype(np.float64) @ w + b,
                               rtol=1e-4, atol=1e-4)
