"""The tuning worker: runs MetaSchedule in a child process (`python -m mlc.compiler.metaschedule REQUEST.json`).

Why in-process builds and measurements: MetaSchedule's LocalBuilder starts fresh worker processes
for every batch of candidates, and each imports tvm (~10 s) and `tvm.s_tir.tensor_intrin` (1-3 min
here). This worker builds candidates with `tvm.compile` in its own process and times them with
`time_evaluator` in the same process, so start-up is paid once. A crashing candidate kills only this
child; every measured record is already in the JSON database, so a rerun loses nothing.

Progress goes to an events file as JSON lines (the parent draws the progress bar); TVM's own log
goes to the log file the parent gave as stdout/stderr."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from mlc import child_process
from mlc.compiler.contract import Note, NoteKind, TuneRequest, TuneResult, TuneStop


class Events:
    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)

    def emit(self, kind: str, **data) -> None:
        self.file.write(json.dumps({"event": kind, "t": time.time(), **data}) + "\n")
        self.file.flush()


def make_builder(keep_in_memory: bool):
    """Builds candidates in this process. With `keep_in_memory` the runtime module stays in a dict
    (keyed by a fake artifact path) for the in-process runner; else it is exported as a .tar for
    an RPC runner to upload."""
    import tvm
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from mlc.compiler import tir_pipeline
    from mlc.compiler.log import summarize

    @derived_object
    class InProcessBuilder(ms.builder.PyBuilder):
        def __init__(self):
            super().__init__()
            self.modules = {}
            self.count = 0

        def build(self, build_inputs):
            results = []
            for item in build_inputs:
                try:
                    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(item.mod)
                    # The build's TIR lowering, so candidates are timed as `--db` builds will run them.
                    rt_mod = tvm.driver.build(mod, target=item.target, pipeline=tir_pipeline.register())
                    if keep_in_memory:
                        self.count += 1
                        key = f"mlc-in-memory-{self.count}"
                        self.modules[key] = rt_mod
                    else:
                        key = ms.builder.local_builder.default_export(rt_mod)
                    results.append(ms.builder.BuilderResult(key, None))
                except Exception as e:  # a candidate that does not build is a failed trial, not a crash
                    results.append(ms.builder.BuilderResult(None, f"build failed: {summarize(e)}"))
            return results

    return InProcessBuilder()


# How candidates are timed: each run alone with the weights and output flushed from the caches, as a
# model runs them (the previous kernels evicted them). Timed hot, back to back, schedules that read
# their weights strided "won" by 1-5% over mlc's defaults (which stream repacked weights) and then ran
# up to 70% slower in the model: resnet50 with such records took 1.06-1.17x ORT's time, untuned 1.00x.
COLD_RUNS = 10


def evaluator_config():
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.EvaluatorConfig(number=1, repeat=COLD_RUNS, min_repeat_ms=0, enable_cpu_cache_flush=True)


def make_runner(builder):
    """Times candidates in this process (what LocalRunner does in its worker)."""
    import numpy as np
    import tvm
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    from mlc.compiler.log import summarize

    device = tvm.cpu()
    config = evaluator_config()
    random_fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure", allow_missing=True)

    def alloc(args_info):
        args = []
        for _, dtype, shape in args_info:
            if dtype.startswith(("int", "uint", "bool")) or random_fill is None:
                # Zeros, not random: integer arguments are often indices (take, gather), and TVM's
                # gather reads out of bounds (segfaults) on random ones.
                args.append(tvm.runtime.tensor(np.zeros([int(d) for d in shape], dtype=dtype), device))
            else:
                tensor = tvm.runtime.empty([int(d) for d in shape], dtype=dtype, device=device)
                random_fill(tensor)
                args.append(tensor)
        return [args]

    @derived_object
    class Future(ms.runner.PyRunnerFuture):
        def __init__(self, result):
            super().__init__()
            self.res = result

        def done(self):
            return True

        def result(self):
            return self.res

    @derived_object
    class InProcessRunner(ms.runner.PyRunner):
        def run(self, runner_inputs):
            futures = []
            for item in runner_inputs:
                rt_mod = builder.modules.pop(str(item.artifact_path), None)
                try:
                    args = alloc([a.as_json() for a in item.args_info])
                    costs = run_evaluator_common(rt_mod, device, config, args)
                    result = ms.runner.RunnerResult(costs, None)
                except Exception as e:
                    result = ms.runner.RunnerResult(None, f"run failed: {summarize(e)}")
                futures.append(Future(result))
            return futures

    return InProcessRunner()


def make_rpc_runner(tracker: str, key: str, timeout: int):
    from tvm.s_tir import meta_schedule as ms

    host, port = tracker.rsplit(":", 1)
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=key,
                                 session_timeout_sec=timeout)
    from mlc.compiler import rpc

    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator_config(), max_workers=1,
                               f_alloc_argument=rpc.alloc_argument)


def register_intrinsics(target) -> None:
    """Register the tensor intrinsics of `target`'s architecture only. MetaSchedule imports
    `tvm.s_tir.tensor_intrin`, which parses every architecture's intrinsics (CUDA's above all)
    with the TVMScript parser: 1-4 minutes on these machines, against ~3 s for x86's alone."""
    import importlib
    import types

    import tvm.s_tir

    name = "tvm.s_tir.tensor_intrin"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(Path(tvm.s_tir.__path__[0]) / "tensor_intrin")]
        sys.modules[name] = package
    arch = "arm_cpu" if str(target.attrs.get("mtriple", "")).startswith("aarch64") else "x86"
    importlib.import_module(f"{name}.{arch}")


def task_key(task) -> str:
    """A stable id for a task's workload (the database keys records by the same hash)."""
    from tvm_ffi import structural_hash

    return f"{structural_hash(task.dispatched[0]) & 0xFFFFFFFFFFFF:012x}"


def _progress_callback(events: Events, names: list[str], deadline: float | None, best: dict, database):
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class Progress(ms.measure_callback.PyMeasureCallback):
        def __init__(self):
            super().__init__()
            self.trials = 0
            self.errors = 0
            self.last_error = None

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            for b, r in zip(builder_results, runner_results):
                self.trials += 1
                if b.error_msg is not None or r.error_msg is not None:
                    self.errors += 1
                    self.last_error = str(b.error_msg or r.error_msg)[-500:]
                    continue
                latency_us = 1e6 * sum(float(x) for x in r.run_secs) / len(r.run_secs)
                if names[task_id] not in best or latency_us < best[names[task_id]]:
                    best[names[task_id]] = latency_us
            events.emit("measured", task=names[task_id], trials=len(builder_results), best_us=best.get(names[task_id]),
                        errors=self.errors, last_error=self.last_error, dropped=database.dropped,
                        dropped_reason=database.last_reason)
            out_of_time = deadline is not None and time.time() >= deadline
            if out_of_time or child_process.stop_requested():
                # Ends every task after this batch; the database already holds what was measured.
                for i, record in enumerate(task_scheduler.tasks_):
                    if not record.is_terminated:  # TVM aborts on terminating a task twice
                        task_scheduler.terminate_task(i)

    return Progress()


def database_best(database, tasks) -> dict[int, float]:
    """Best measured latency (us) per task index already in the database."""
    best = {}
    for i, task in enumerate(tasks):
        mod = task.dispatched[0]
        if not database.has_workload(mod):
            continue
        workload = database.commit_workload(mod)
        records = database.get_top_k(workload, 1)
        if records and records[0].run_secs:
            secs = [float(x) for x in records[0].run_secs]
            best[i] = 1e6 * sum(secs) / len(secs)
    return best


def seed_default_schedules(database, tasks, target, builder, runner, events: Events,
                           constant_inputs: dict[str, list[int]]) -> None:
    """Measure mlc's default schedule of each kernel the database has never seen and store it as
    a record: the search then has to beat it, and compiling with the database never picks a
    tuned schedule slower than the default it replaces. The default repacks constant weights
    (`constant_inputs`, by kernel name) as the build does; the builder drops the repacking block,
    so the record times the kernel alone, as it runs once the build has folded the repacking.

    Returns the names of the kernels left to the default rule: those whose repacked default TVM
    cannot measure (a zero-padded weight: RemoveWeightLayoutRewriteBlock's "Check failed: (load)"), and those
    whose default is no schedule of the kernel itself (a concatenation's copies).
    The search would only have to beat the slower unpacked default, and did: lstm-lm's 10001-wide
    head tuned that way made a --db build 1.5x slower than the untuned one."""
    from mlc.compiler import schedule_rules as rules

    rule = rules.default_rule()
    left_to_default = []
    for task in tasks:
        if child_process.stop_requested():  # Ctrl-C or the budget: the defaults measured so far are kept
            break
        mod = task.dispatched[0]
        # By its records, not its workload: a kernel left to the default has a workload and no record.
        if database.has_workload(mod) and database.get_top_k(database.commit_workload(mod), 1):
            continue
        func = mod["main"]
        if constant_inputs.get(task.task_name):
            func = func.with_attr("layout_free_buffers", constant_inputs[task.task_name])
        try:
            record = _measure_default(rule, func, mod, target, builder, runner, database)
        except Exception:  # the rule or TVM does not handle this kernel this way
            record = None
        if record is not None:
            # A default that rewrites the kernel (a concatenation's copies, mlc.compiler.concat) has a trace that
            # does not apply to the kernel itself: its record would not read back (#41), and a search without it
            # to beat could keep a slower schedule. Such a kernel keeps the default, untuned.
            if database.commit_checked(record) is not None:
                left_to_default.append(task.task_name)
        elif constant_inputs.get(task.task_name):
            left_to_default.append(task.task_name)
    events.emit("seeded")
    return left_to_default


def _measure_default(rule, func, mod, target, builder, runner, database):
    from tvm.s_tir import meta_schedule as ms

    sch = rule.apply(func, target, False)
    if sch is None or sch.trace is None:
        return None
    # The repacked weight's shape: the builder drops the repacking block, the kernel reads it packed.
    args_info = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
    built = builder.build([ms.builder.BuilderInput(sch.mod, target)])[0]
    if built.error_msg is not None:
        return None
    result = runner.run([ms.runner.RunnerInput(built.artifact_path, "cpu", args_info)])[0].result()
    if result.error_msg is not None or not result.run_secs:
        return None
    return ms.database.TuningRecord(sch.trace, database.commit_workload(mod), result.run_secs, target, args_info)


def count_records(database, tasks) -> dict[int, int]:
    counts = {}
    for i, task in enumerate(tasks):
        mod = task.dispatched[0]
        if database.has_workload(mod):
            counts[i] = len(database.get_top_k(database.commit_workload(mod), 1 << 30))
    return counts


def _cost_model(trials_per_task: int, threads: int):
    """XGBoost pays off over many trials; training it (seconds per batch here, even on a few
    samples) costs more than it saves in a short run, where random ranking does as well."""
    from tvm.s_tir import meta_schedule as ms

    if trials_per_task < 32:
        return ms.cost_model.RandomModel()
    return ms.cost_model.XGBModel(num_tuning_cores=threads, early_stopping_rounds=10)


def _tasks_and_database(request: TuneRequest, target):
    """(the model's tuning tasks, their constant inputs, the database, notes on records set aside): the model
    imported and run through the same Relax passes as a build."""
    import onnx

    from mlc.compiler import importer, records
    from mlc.compiler import schedules
    from mlc.compiler import relax_passes

    mod = importer.to_relax(onnx.load(request.onnx))
    mod, _ = relax_passes.run(mod, request.relax_passes, request.target, None, fused_by_build=True)
    tasks, constant_inputs = schedules.extract_tasks(mod, target)
    # Only records that read back are kept (mlc.compiler.records); unreadable ones an older mlc wrote are set aside.
    set_aside: list[str] = []
    database = records.checked(records.open_readable(request.db, set_aside, repair=True),
                               Path(request.events).parent / "read-back")  # the parent's scratch folder
    return tasks, constant_inputs, database, set_aside


def _builder_and_runner(request: TuneRequest):
    """Builds kept in memory and measured in this process, or on the RPC device the request names."""
    builder = make_builder(keep_in_memory=request.rpc is None)
    if request.rpc is not None:
        runner = make_rpc_runner(request.rpc.tracker, request.rpc.key, request.rpc.timeout)
    else:
        runner = make_runner(builder)
    return builder, runner


def _tune_contexts(request: TuneRequest, tasks: list):
    from tvm.s_tir import meta_schedule as ms

    # Smaller than MetaSchedule's defaults (population 512, 4 generations): on 2 cores the
    # defaults spend minutes per batch searching before anything is measured.
    population = request.population
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(50, population // 2),
        genetic_num_iters=request.generations)
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks, work_dir=request.logs, strategy=strategy, num_threads=request.threads, seed=request.seed)
    return contexts


def tune_request(request: TuneRequest) -> TuneResult:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    events = Events(request.events)
    start = time.time()
    target = tvm.target.Target(request.target)
    register_intrinsics(target)
    tasks, constant_inputs, database, set_aside = _tasks_and_database(request, target)
    builder, runner = _builder_and_runner(request)
    left_to_default = seed_default_schedules(database, tasks, target, builder, runner, events, constant_inputs)
    tasks = [t for t in tasks if t.task_name not in left_to_default]
    names = [t.task_name for t in tasks]
    done = count_records(database, tasks)
    prior_best = database_best(database, tasks)
    threads = tvm.get_global_func("runtime.NumThreads")()  # what the in-process runner measures with
    # what the parent reports if it has to kill this process at the deadline
    notes = [Note(NoteKind.RECORDS, text) for text in set_aside]
    events.emit("tasks", tasks=[{"name": t.task_name, "weight": int(t.weight), "key": task_key(t),
                                 "trials_done": done.get(i, 0), "best_us": prior_best.get(i)}
                                for i, t in enumerate(tasks)], setup_s=time.time() - start,
                left_to_default=left_to_default, notes=[n.to_json() for n in notes], threads=threads)
    finished = TuneResult(tasks=len(tasks), trials=0, threads=threads, left_to_default=left_to_default, notes=notes)
    if not tasks:
        return finished
    # --trials is the total the database should hold for this model: a rerun continues from there.
    per_task = request.trials_per_task
    remaining = [max(0, per_task - done.get(i, 0)) for i in range(len(tasks))]
    todo = [i for i, r in enumerate(remaining) if r > 0]
    if not todo:
        events.emit("finished", trials=0, reason=TuneStop.ALREADY_TUNED.value)
        return dataclasses.replace(finished, reason=TuneStop.ALREADY_TUNED)
    # The parent's deadline (mlc.tuning.tune), which also kills this process a little after it.
    deadline = request.deadline or (start + request.budget_s if request.budget_s else None)
    if child_process.stop_requested() or (deadline is not None and time.time() >= deadline):
        reason = TuneStop.INTERRUPTED if child_process.stop_requested() else TuneStop.BUDGET
        events.emit("finished", trials=0, reason=reason.value)
        return dataclasses.replace(finished, reason=reason)
    contexts = _tune_contexts(request, [tasks[i] for i in todo])
    best = {names[i]: v for i, v in prior_best.items()}
    progress = _progress_callback(events, [names[i] for i in todo], deadline, best, database)
    batch = max(1, min(request.trials_per_iter, per_task))
    ms.tune_tasks(
        tasks=contexts, task_weights=[float(tasks[i].weight) for i in todo], work_dir=request.logs,
        max_trials_global=sum(remaining), max_trials_per_task=max(remaining), num_trials_per_iter=batch,
        builder=builder, runner=runner, database=database, cost_model=_cost_model(per_task, request.threads),
        measure_callbacks=[ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel(), progress],
        # Round-robin: the gradient scheduler hands out a task that was stopped during its first round
        # (TVM then aborts), which a budget or Ctrl-C early in a run does.
        task_scheduler="round-robin",
    )
    reason = TuneStop.INTERRUPTED if child_process.stop_requested() else (
        TuneStop.BUDGET if deadline is not None and time.time() >= deadline else TuneStop.TRIALS)
    events.emit("finished", trials=progress.trials, errors=progress.errors, reason=reason.value)
    return dataclasses.replace(finished, trials=progress.trials, reason=reason, dropped=database.dropped,
                               dropped_reason=database.last_reason)


def serve_request(data: dict) -> child_process.WorkerResult:
    """The handler mlc.child_process.serve calls: the JSON request parsed strictly, the result as the worker's
    payload."""
    return child_process.WorkerResult.success(tune_request(TuneRequest.from_json(data)).to_json())


def main(argv: list[str]) -> int:
    from mlc.compiler.log import summarize
    from mlc.runtime.runner import import_without_torch

    import_without_torch("tvm_ffi")  # loading it installs TVM's SIGSEGV handler, which serve() then replaces
    # Ctrl-C in mlc arrives as SIGINT: stop after the batch being measured, so the database stays whole.
    return child_process.serve(argv, serve_request, describe=summarize, graceful_stop=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
