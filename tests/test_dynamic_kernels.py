"""Kernels over a symbolic sequence length get the default rule's fast paths (issue #23): the attention scores
(seq x seq, both dims symbolic) a register tile over a zero-padded J split into whole column tiles and one tail,
layer norm over symbolic rows vector partial sums, P x V (symbolic depth) a 6-row x 4-vector tile. Structure is
asserted on the scheduled/lowered TIR (not on timing), results against numpy at and between tile multiples."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ZNVER4

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def tvm_tools():
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc import targets
    from mlc.compiler import schedule_rules as rules, schedules, tir_pipeline

    return tvm, relax, rules, schedules, tir_pipeline, targets.resolve("x86").tvm


def _module(relax, inputs, body):
    bb = relax.BlockBuilder()
    with bb.function("main", inputs):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *inputs))
        bb.emit_func_output(out)
    return bb.get()


def _kernel(tvm, rules, schedules, mod, target_json, name):
    """The scheduled kernel `name`. The tests read its shape built for ZNVER4 (AVX-512) whatever the host, and take
    the numbers from a build for the host."""
    target = tvm.target.Target(target_json)
    mod = rules.apply_default_schedules(schedules._legalize_and_fuse(mod, target), target)
    kernels = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    return next((n, f) for n, f in kernels.items() if name in n)


def _run(tvm, relax, executable, *arrays):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def test_attention_scores_over_symbolic_seq_get_a_register_tile_with_column_tails(tvm_tools):
    """Q K^T * scale + mask over seq x seq: without the padded J the rule left a scalar loop (bert-base at seq
    128: 30-60x the static kernel). Whole 32-column tiles carry no `< seq` branch; one column tail keeps them."""
    tvm, relax, rules, schedules, tir_pipeline, target_json = tvm_tools
    seq = tvm.tirx.Var("seq", "int64")
    heads = 2
    q = relax.Var("q", relax.TensorType((1, heads, seq, 64), "float32"))
    kt = relax.Var("kt", relax.TensorType((1, heads, 64, seq), "float32"))
    mask = relax.Var("mask", relax.TensorType((1, 1, 1, seq), "float32"))
    mod = _module(relax, [q, kt, mask], lambda bb, q, kt, m: relax.op.add(
        bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, kt)), relax.const(0.125, "float32"))), m))
    name, kernel = _kernel(tvm, rules, schedules, mod, ZNVER4, "matmul")
    scheduled = kernel.script()
    assert rules.COL_TAIL in scheduled and rules.ROW_TAIL in scheduled and "T.vectorized" in scheduled, scheduled
    passes = tir_pipeline.lowering_passes({})
    split = next(i for i, p in enumerate(passes) if p.info.name == "mlc.SplitRowTails")
    text = tvm.transform.Sequential(passes[:split + 1])(tvm.IRModule({name: kernel}))[name].script()
    assert "range(seq // T.int64(32))" in text and "seq % T.int64(32) != T.int64(0)" in text, text
    whole = text[text.index("range(seq // T.int64(32))"):text.index("seq % T.int64(32) != T.int64(0)")]
    assert "< seq" not in whole.replace("seq % T.int64(12)", ""), whole  # no per-element branch in whole tiles
    executable, report = schedules.build(mod, target_json, None, True)
    assert report["default"] and not report["unscheduled"], report
    for length in (1, 5, 12, 31, 32, 33, 45):
        a = RNG.standard_normal((1, heads, length, 64)).astype(np.float32)
        b = RNG.standard_normal((1, heads, 64, length)).astype(np.float32)
        m = RNG.standard_normal((1, 1, 1, length)).astype(np.float32)
        np.testing.assert_allclose(_run(tvm, relax, executable, a, b, m), (a @ b) * np.float32(0.125) + m,
                                   rtol=1e-5, atol=1e-5)


def test_layer_norm_over_symbolic_rows_keeps_vector_partial_sums(tvm_tools):
    """Layer norm's sums over a constant 64-wide row, rows symbolic: a vector of partial sums (rfactor) as for
    static rows; the rule had kept a scalar chain of dependent adds (3-6x the static kernel's time)."""
    tvm, relax, rules, schedules, _, target_json = tvm_tools
    rows = tvm.tirx.Var("rows", "int64")
    x = relax.Var("x", relax.TensorType((1, rows, 64), "float32"))
    gamma, beta = RNG.standard_normal(64).astype(np.float32), RNG.standard_normal(64).astype(np.float32)
    mod = _module(relax, [x], lambda bb, x: relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1],
                                                                   epsilon=1e-5))
    _, kernel = _kernel(tvm, rules, schedules, mod, ZNVER4, "layer_norm")
    text = kernel.script()
    assert "_rf" in text and text.count("T.vectorized") >= 2, text
    executable, _ = schedules.build(mod, target_json, None, True)
    for length in (1, 3, 17):
        value = RNG.standard_normal((1, length, 64)).astype(np.float32)
        mean = value.mean(-1, keepdims=True)
        expected = (value - mean) / np.sqrt(((value - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        expected = expected * gamma + beta
        np.testing.assert_allclose(_run(tvm, relax, executable, value), expected, rtol=1e-4, atol=1e-4)


def test_attention_times_values_over_a_symbolic_depth_uses_six_rows_of_four_vectors(tvm_tools):
    """P x V, P seq x seq: the rows of P lie a symbolic stride apart, each row of the tile needs an address
    register, and 12 rows spilled them (1.4-1.5x the static kernel's time); 6 rows x 4 vectors fit."""
    tvm, relax, rules, schedules, _, target_json = tvm_tools
    seq = tvm.tirx.Var("seq", "int64")
    p = relax.Var("p", relax.TensorType((1, 2, seq, seq), "float32"))
    v = relax.Var("v", relax.TensorType((1, 2, seq, 64), "float32"))
    mod = _module(relax, [p, v], lambda bb, p, v: relax.op.matmul(p, v))
    _, kernel = _kernel(tvm, rules, schedules, mod, ZNVER4, "matmul")
    text = kernel.script()
    assert "T.unroll(T.int64(6))" in text and "T.unroll(T.int64(4))" in text, text
    executable, _ = schedules.build(mod, target_json, None, True)
    for length in (1, 7, 13):
        a = RNG.standard_normal((1, 2, length, length)).astype(np.float32)
        b = RNG.standard_normal((1, 2, length, 64)).astype(np.float32)
        np.testing.assert_allclose(_run(tvm, relax, executable, a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_softmax_over_a_symbolic_axis_runs_whole_vectors_then_one_tail(tvm_tools):
    """Softmax over seq x seq: its max and sum as vector partial sums and its exp/division vectorized, over whole
    16-wide vectors without the `< seq` branch and one branched tail; TVM left scalar loops (1.5-2.8x the time)."""
    tvm, relax, rules, schedules, tir_pipeline, target_json = tvm_tools
    seq = tvm.tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType((1, 2, seq, seq), "float32"))
    mod = _module(relax, [x], lambda bb, x: relax.op.nn.softmax(x, axis=-1))
    name, kernel = _kernel(tvm, rules, schedules, mod, ZNVER4, "softmax")
    scheduled = kernel.script()
    assert scheduled.count(rules.COL_TAIL) >= 3 and "_rf" in scheduled, scheduled
    passes = tir_pipeline.lowering_passes({})
    split = next(i for i, p in enumerate(passes) if p.info.name == "mlc.SplitRowTails")
    text = tvm.transform.Sequential(passes[:split + 1])(tvm.IRModule({name: kernel}))[name].script()
    assert text.count("range(seq // T.int64(16))") >= 3 and text.count("seq % T.int64(16) != T.int64(0)") >= 3, text
    executable, _ = schedules.build(mod, target_json, None, True)
    for length in (1, 5, 16, 17, 40):
        value = RNG.standard_normal((1, 2, length, length)).astype(np.float32)
        e = np.exp(value - value.max(-1, keepdims=True))
        np.testing.assert_allclose(_run(tvm, relax, executable, value), e / e.sum(-1, keepdims=True), rtol=1e-5,
                                   atol=1e-6)
