"""Tuning records for symbolic kernels (mlc/compiler/dynamic_records.py): a kernel over a symbolic dim takes the
record of its static twin (the same kernel at the tuned length) and stays exact at other lengths. The record is a
MetaSchedule design-space sample committed by hand, so no tuning runs (~20 s here, most of it `import tvm`)."""

from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(0)
TUNED_AT = 32


def _module(relax, rows, weight):
    """x[rows, 64] @ w + 1, relu: one fused kernel with a reduction, the dims symbolic or not."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(weight)))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(np.float32(1)))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _commit_sampled_records(ms, tvm, schedules, static_mod, target, db):
    """One record per task of `static_mod`: a design-space sample with MetaSchedule's post-processing,
    as a search would store it (its time is made up). Returns the names of the tasks given a record."""
    from tvm.s_tir.schedule import Schedule

    from mlc.compiler import metaschedule

    metaschedule.register_intrinsics(target)  # x86's only: all of TVM's take minutes to parse
    tasks, _ = schedules.extract_tasks(static_mod, target)
    database = ms.database.JSONDatabase(work_dir=str(db), module_equality="structural")
    named = []
    for task in tasks:
        mod = task.dispatched[0]
        context = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                                 search_strategy="replay-trace", task_name=task.task_name, num_threads=1, rand_state=1)
        space = context.generate_design_space()[0]
        sch = Schedule(mod, seed=1)
        space.trace.apply_to_schedule(sch, remove_postproc=True)
        if not all(post.apply(sch) for post in context.space_generator.postprocs):
            continue
        if not any(inst.kind.name == "SamplePerfectTile" for inst in sch.trace.insts):
            continue  # nothing tiled: a replay would not exercise the symbolic split
        database.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, database.commit_workload(mod), [0.001], target,
            ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
        named.append(task.task_name)
    return named


def test_symbolic_kernel_takes_its_static_twins_record_and_stays_exact(tmp_path, monkeypatch):
    tvm = pytest.importorskip("tvm")
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from mlc import targets
    from mlc.compiler import dynamic_records, schedules

    target_json = targets.resolve("x86").tvm
    target = tvm.target.Target(target_json)
    weight = (RNG.standard_normal((64, 48)) * 0.1).astype(np.float32)
    db = tmp_path / "db"
    db.mkdir()
    tuned = _commit_sampled_records(ms, tvm, schedules, _module(relax, TUNED_AT, weight), target, db)
    assert tuned, "the matmul kernel should have a tiled design space"
    dynamic_records.add_lengths(db, {"n": TUNED_AT})
    assert dynamic_records.read_lengths(db) == {"n": [TUNED_AT]}

    symbolic = _module(relax, tvm.tirx.Var("n", "int64"), weight)
    notes = []
    # Without the opt-in the twin is found and named, not applied (replays measured slower than the defaults).
    _, report = schedules.build(symbolic, target_json, str(db), True, notes)
    assert not report["tuned"] and not report["tuned_at"] and report["default"], report
    assert len(notes) == 1 and notes[0].kind.value == "records", notes
    assert f"static twins (n={TUNED_AT}), not applied" in notes[0].text, notes
    assert notes[0].text.endswith(", ".join(sorted(tuned))), notes
    notes.clear()
    monkeypatch.setenv(dynamic_records.REPLAY_ENV, "replay")
    executable, report = schedules.build(symbolic, target_json, str(db), True, notes)
    expected = [f"{name}: n={TUNED_AT}" for name in sorted(report["tuned"])]
    assert report.get("tuned_at") and report["tuned_at"] == expected, report
    assert set(report["tuned"]) == set(tuned) and not report["unscheduled"], report
    assert not notes, notes
    # The symbolic rows are left untiled (no predicate); the record's column tiles stay, fused with the rows.
    kernel = next(f for gv, f in schedules.extract_tasks(symbolic, target)[0][0].dispatched[0].functions_items())
    twin = tvm.IRModule({"main": dynamic_records.specialize(kernel, {"n": TUNED_AT})})
    record = ms.database.JSONDatabase(work_dir=str(db), module_equality="structural").query_tuning_record(
        twin, target, "main")
    columns = [list(map(int, d)) for i, d in record.trace.decisions.items() if i.kind.name == "SamplePerfectTile"][1]
    replayed = dynamic_records.replay(kernel, record.trace).script()
    assert f"in T.parallel(n * T.int64({columns[0] * columns[1]}), " in replayed, replayed  # rows x column tiles
    vm = relax.VirtualMachine(executable, tvm.cpu())
    for rows in (1, 7, TUNED_AT, 45):  # below, at and above the tuned length; 45 is not a multiple of any tile
        x = RNG.standard_normal((rows, 64)).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ weight + 1, 0), rtol=1e-5, atol=1e-5)


def test_a_database_without_dynamic_lengths_leaves_symbolic_kernels_to_the_default(tmp_path):
    tvm = pytest.importorskip("tvm")
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from mlc import targets
    from mlc.compiler import schedules

    target_json = targets.resolve("x86").tvm
    weight = (RNG.standard_normal((64, 48)) * 0.1).astype(np.float32)
    db = tmp_path / "db"
    db.mkdir()
    assert _commit_sampled_records(ms, tvm, schedules, _module(relax, TUNED_AT, weight),
                                   tvm.target.Target(target_json), db)
    _, report = schedules.build(_module(relax, tvm.tirx.Var("n", "int64"), weight), target_json, str(db), True, [])
    assert not report["tuned"] and "tuned_at" not in report and report["default"], report


def test_tune_dynamic_checks_the_dim_and_the_length_before_tuning(tmp_path):
    from helpers import assert_clean_error, mlp_onnx, run_mlc

    model = mlp_onnx(tmp_path / "mlp.onnx")  # batch symbolic; the reference input has a small batch
    db = tmp_path / "db"
    assert_clean_error(run_mlc("tune", model, "--db", db, "--dynamic", "seq"), 1,
                       "--dynamic seq: the model has no dim named 'seq'; its symbolic dims: batch")
    assert_clean_error(run_mlc("tune", model, "--db", db, "--dynamic", "batch=100..200"), 1,
                       "--dynamic batch=100..200: tuning would run at batch=", "outside the range; give --input-shape")
    assert not (db / "dynamic_lengths.json").exists()
