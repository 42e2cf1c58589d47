"""`mlc tune`: MetaSchedule over a model's kernels into a resumable JSON database.

The parent (this module, no tvm import) validates options, prepares the model with static shapes,
and runs `mlc.compiler.metaschedule` in a child process in its own session: a TVM crash ends only the
child, and Ctrl-C reaches the child as a stop request that it honours after the batch it is
measuring, so the database stays whole. A --budget stops it the same way, and the parent kills it at
HARD_DEADLINE times the budget whatever TVM is doing. Every measured record is appended to the database as
it is measured (if it reads back: mlc.compiler.records); a rerun skips the trials each kernel already has."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from mlc import child_process
from mlc.compiler import contract
from mlc.compiler.contract import RpcDevice, TuneRequest, TuneStop
from mlc.pipeline.schedules import add_default_kernels, check_db_dir, record_count
from mlc.errors import CompilerError, InputError, TargetError
from mlc.runtime import runner as thin_runtime

DEFAULT_TRIALS_PER_TASK = 64
STOP_GRACE_S = 60  # how long a stopped child may take to finish its batch before it is killed
# At the budget the child is asked to stop after its batch; it is killed at this share of the budget past the
# start, whatever TVM's search is doing (one was seen busy for 12 minutes without measuring anything, #41).
HARD_DEADLINE = 1.1  # leaves the rest of 1.2x to mlc's start-up and the kill
WORKER = "mlc.compiler.metaschedule"  # the child's module
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_budget(text: str) -> float:
    """'20m', '90s', '1h30m', '45' (seconds) -> seconds."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = float(value)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise InputError(f"--budget {text!r} is not a duration; write it like 90s, 20m or 1h30m")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise InputError(f"--budget {text!r} must be longer than zero")
    return seconds


@dataclass
class TaskState:
    name: str
    weight: int
    trials: int = 0
    best_us: Optional[float] = None
    trials_done_before: int = 0


@dataclass
class TuneResult:
    db: Path
    tasks: list[TaskState]
    trials: int  # measured in this run
    records: int  # in the database now
    seconds: float
    reason: str  # "trials", "budget", "interrupted", "already tuned"
    errors: int = 0
    notes: list[str] = field(default_factory=list)
    left_to_default: list[str] = field(default_factory=list)  # kernels not tuned: builds use mlc's default
    threads: Optional[int] = None  # kernels were measured with this many threads (None: on an RPC device)


def tune(
    source: str,
    *,
    target: str = "x86",
    db: str | Path = "tuning",
    framework: Optional[str] = None,
    trials: Optional[int] = None,
    budget: Optional[str] = None,
    input_shapes: Sequence[str] = (),
    rpc_tracker: Optional[str] = None,
    rpc_key: Optional[str] = None,
    on_event: Callable[[dict, list[TaskState]], None] = lambda event, tasks: None,
    seed: Optional[int] = None,
    threads: Optional[int] = None,
    dynamic: Sequence[str] = (),
) -> TuneResult:
    """Tune `source`'s kernels for `target` into the database folder `db` (`framework`: as `mlc compile`'s).

    `trials`: trials per kernel the database should hold (a rerun continues up to it);
    `budget`: wall time for this run ('20m'). Either or both; neither means 64 per kernel.
    `threads`: the thread count kernels are measured with; make it the count the model will run with
    (default: the runtime's, `default_threads()`; the result reports it). A schedule searched at one
    count can lose at another.
    `dynamic`: dims a `mlc compile --dynamic` build keeps symbolic ('seq=1..512'): the kernels are tuned at one
    length of each (the reference input's, or --input-shape's), and the database records that length, so the
    symbolic build can find each kernel's static twin (mlc.compiler.dynamic_records). A rerun at another length
    adds it."""
    from mlc import passes as graph_passes
    from mlc.pipeline.options import ModelSpec
    from mlc.pipeline.prepare import prepare
    from mlc.pipeline.steps import Timer, quiet_step

    from mlc.compiler import dynamic_records

    budget_s, threads = _checked_options(trials, budget, rpc_tracker, rpc_key, threads)
    preset = _measurable_target(target, rpc_tracker)
    db = check_db_dir(Path(db), create=True)
    per_task = trials if trials is not None else (10_000 if budget_s is not None else DEFAULT_TRIALS_PER_TASK)
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="mlc-tune-") as scratch:
        work = Path(scratch)
        # The same default pass plan as `mlc compile`: the kernels tuned are the kernels it builds.
        steps = graph_passes.plan(device=preset.device)
        spec = ModelSpec(source, framework=framework, input_shapes=input_shapes)
        prepared = prepare(spec, work, Timer(quiet_step), static=True, steps=steps)
        lengths = _tuned_lengths(dataclasses.replace(spec, dynamic=dynamic), prepared)
        if lengths:
            dynamic_records.add_lengths(db, lengths)
        request = _worker_request(steps, prepared, preset, db, work, per_task=per_task, budget_s=budget_s,
                                  start=start, seed=seed, rpc_tracker=rpc_tracker, rpc_key=rpc_key)
        hard = start + HARD_DEADLINE * budget_s if budget_s else None
        result, log_path, tasks, errors = _run_child(request, work / "request.json", on_event, threads, hard)
    result = _finished_result(result, log_path, db)
    notes = _tuning_notes(prepared, result, db, budget_s, lengths)
    return TuneResult(db, tasks, result.trials, record_count(db), time.time() - start, result.reason.value, errors,
                      notes, result.left_to_default, None if rpc_tracker else result.threads)


def _checked_options(trials, budget, rpc_tracker, rpc_key, threads) -> tuple[Optional[float], Optional[int]]:
    """(the budget in seconds, the thread count to measure with: the runtime's default unless given; None on an
    RPC device), after refusing options that do not go together."""
    from mlc import targets

    if trials is not None and trials < 1:
        raise InputError(f"--trials must be at least 1, got {trials}")
    budget_s = parse_budget(budget) if budget is not None else None
    if (rpc_tracker is None) != (rpc_key is None):
        raise InputError("--rpc-tracker and --rpc-key go together")
    if threads is not None:
        if rpc_tracker is not None:
            raise InputError("--threads sets local measurement; on an RPC device start `mlc rpc-server` with "
                             "TVM_NUM_THREADS=N instead")
        cores = targets.usable_cores()
        if not 1 <= threads <= cores:
            raise InputError(f"--threads must be between 1 and this machine's {cores} usable cores, got {threads}")
    elif rpc_tracker is None:  # the count the artifact's runtime will start with
        threads = thin_runtime.default_threads()
    if rpc_tracker is not None:
        from mlc.compiler.rpc import check_tracker

        check_tracker(rpc_tracker, rpc_key)
    return budget_s, threads


def _measurable_target(target: str, rpc_tracker: Optional[str]):
    """The target's preset, where its kernels can be measured: a CPU, this machine's architecture or over RPC."""
    from mlc import targets
    from mlc.compiler import runtimes

    preset = targets.resolve(target)
    if preset.tvm.get("kind") != "llvm":
        raise TargetError(f"mlc tune measures CPU (llvm) targets; {preset.name} is a {preset.tvm.get('kind')} target, "
                          "whose builds use rule-based GPU schedules")
    if preset.runtime_arch != runtimes.HOST_ARCH and rpc_tracker is None:
        raise TargetError(f"{preset.name} code cannot run on this {runtimes.HOST_ARCH} machine to be measured; "
                          "tune on the device through --rpc-tracker HOST:PORT --rpc-key KEY (see `mlc rpc-server`)")
    return preset


def _worker_request(steps, prepared, preset, db: Path, work: Path, *, per_task: int, budget_s, start: float,
                    seed, rpc_tracker, rpc_key) -> TuneRequest:
    return TuneRequest(
        relax_passes=[s.to_json() for s in steps], onnx=str(prepared.cleaned_path), target=preset.tvm,
        db=str(db.resolve()), logs=str(work / "logs"), events=str(work / "events.jsonl"),
        trials_per_task=per_task, trials_per_iter=16 if per_task >= 16 else per_task,
        budget_s=budget_s, deadline=start + budget_s if budget_s else None,
        threads=preset.tvm.get("num-cores", 1), seed=seed,
        rpc=RpcDevice(rpc_tracker, rpc_key) if rpc_tracker else None)


def _finished_result(result: child_process.WorkerResult, log_path: Optional[Path], db: Path) -> contract.TuneResult:
    """The worker's result; a failed run is a CompilerError that names its log, a finished run's log is deleted."""
    if not result.ok:
        where = f" (full log: {log_path})" if log_path else ""
        raise CompilerError(f"tuning failed: {result.message or 'the tuning process died'}{where}")
    if log_path is not None:
        log_path.unlink(missing_ok=True)
    check_db_dir(db, create=True)  # a killed child may have left a record line cut short
    return contract.TuneResult.from_json(result.payload)


def _tuning_notes(prepared, result: contract.TuneResult, db: Path, budget_s: Optional[float],
                  lengths: dict) -> list[str]:
    """The run's notes for the user; records the kernels left to mlc's default schedules in the database."""
    from mlc.compiler import dynamic_records

    notes = [n.text for n in prepared.notes] + [n.text for n in result.notes]
    if result.killed:
        notes.append(f"the tuning process was still busy {HARD_DEADLINE * budget_s - budget_s:.0f} s after the "
                     "budget and was stopped; every record measured before is kept")
    if result.dropped:
        notes.append(f"{result.dropped} measured schedule(s) were not recorded: TVM could not read them back "
                     f"({result.dropped_reason})")
    if result.left_to_default:
        add_default_kernels(db, result.left_to_default)
        notes.append(f"{len(result.left_to_default)} kernel(s) keep mlc's default schedule, which MetaSchedule "
                     "cannot measure or record (a repacked weight it cannot drop, or a concatenation's copies): "
                     f"{', '.join(result.left_to_default)}")
    if lengths:
        at = ", ".join(f"{k}={v}" for k, v in lengths.items())
        notes.append(f"tuned at {at} for builds with --dynamic {','.join(lengths)}: `mlc compile --dynamic ... "
                     f"--db {db}` finds the static twin of each symbolic kernel and names it; "
                     f"{dynamic_records.REPLAY_ENV}=replay replays the twins' records on the symbolic kernels (on "
                     "bert-tiny slower than mlc's default schedules: benchmarks/dynamic-tuning)")
    elif any(isinstance(d, str) for spec in prepared.specs for d in spec.shape):
        shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in prepared.fixed.items())
        notes.append(f"tuned for static input shapes {shapes}; compile with the same shapes to use the records")
    return notes


def _tuned_lengths(model, prepared) -> dict[str, int]:
    """{dim: the length tuned at} for the dims --dynamic names; the length must lie in the dim's range."""
    dims = model.dynamic_dims()
    if not dims:
        return {}
    sizes = {d: size for spec in prepared.specs if spec.name in prepared.fixed
             for d, size in zip(spec.shape, prepared.fixed[spec.name]) if isinstance(d, str)}
    lengths = {}
    for name, bounds in dims.items():
        if name not in sizes:
            known = ", ".join(sorted(sizes)) or "none"
            raise InputError(f"--dynamic {name}: the model has no dim named {name!r}; its symbolic dims: {known}")
        if bounds and not bounds[0] <= sizes[name] <= bounds[1]:
            raise InputError(f"--dynamic {name}={bounds[0]}..{bounds[1]}: tuning would run at {name}={sizes[name]}, "
                             "outside the range; give --input-shape with a length inside it")
        lengths[name] = int(sizes[name])
    return lengths


class _Deadline(Exception):
    """Raised from the poll at the budget: mlc.child_process.run then stops the child as on Ctrl-C."""


class _Events:
    """The tuning child's events file, read as it grows: the task table, the error count, and what the child
    said about the run (for a result without its own); each event goes on to `on_event`."""

    def __init__(self, path: Path, on_event) -> None:
        self.path = path
        self.on_event = on_event
        self.tasks: list[TaskState] = []
        self.errors = 0
        self.offset = 0
        self.seen: dict = {}

    def drain(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break
                self.offset = f.tell()
                event = json.loads(line)
                if event["event"] == "tasks":
                    self.tasks[:] = [TaskState(t["name"], t["weight"], t["trials_done"], t["best_us"],
                                               t["trials_done"]) for t in event["tasks"]]
                    self.seen.update({k: event[k] for k in ("left_to_default", "notes", "threads") if k in event})
                elif event["event"] == "measured":
                    for task in self.tasks:
                        if task.name == event["task"]:
                            task.trials += event["trials"]
                            if event["best_us"] is not None:
                                task.best_us = event["best_us"]
                    self.errors = event["errors"]
                    self.seen.update(dropped=event.get("dropped", 0), dropped_reason=event.get("dropped_reason"))
                self.on_event(event, self.tasks)


def _result_at_deadline(request_path: Path, events: _Events) -> child_process.WorkerResult:
    """The child's own result if it finished its batch in time, else one made from the events."""
    result = child_process.read_result(request_path)
    if result is None:
        trials = sum(t.trials - t.trials_done_before for t in events.tasks)
        said = {k: v for k, v in events.seen.items() if k != "deadline"}  # TuneResult's fields, as JSON
        made = contract.TuneResult.from_json({**said, "tasks": len(events.tasks), "trials": trials,
                                              "reason": TuneStop.BUDGET.value, "killed": True})
        result = child_process.WorkerResult.success(made.to_json())
    elif result.ok:
        finished = contract.TuneResult.from_json(result.payload)
        if finished.reason is TuneStop.INTERRUPTED:  # by the deadline, not by the user
            result = child_process.WorkerResult.success(dataclasses.replace(finished, reason=TuneStop.BUDGET).to_json())
    return result


def _run_child(request: TuneRequest, request_path: Path, on_event, threads: Optional[int],
               hard_deadline: Optional[float] = None
               ) -> tuple[child_process.WorkerResult, Optional[Path], list[TaskState], int]:
    """Run the tuning worker, feeding `on_event` from its events file; Ctrl-C asks it to stop after the batch
    it is measuring (STOP_GRACE_S), so the database stays whole. With a budget (request.deadline) the same
    stop comes at the deadline, and the child is killed at `hard_deadline`: a search that measures nothing
    cannot hold the run past it. Then the result comes from the events (the records are in the database
    already) and the log path is None. A crash is "tuning failed: ..." (CompilerError)."""
    events = _Events(Path(request.events), on_event)
    deadline = request.deadline

    def poll() -> None:
        events.drain()
        if deadline is not None and time.time() >= deadline and not events.seen.get("deadline"):
            events.seen["deadline"] = True
            raise _Deadline

    # TVM's thread pool reads these when it starts: the measurements use `threads`.
    env = {"TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)} if threads else None
    grace = STOP_GRACE_S if hard_deadline is None else max(0.0, hard_deadline - max(time.time(), deadline or 0))
    try:
        result, log_path = child_process.run(WORKER, request.to_json(), request_path, "the tuning process",
                                     env=env, poll=poll, stop_grace_s=grace, log_prefix="mlc-tune-",
                                     on_stop=lambda: on_event({"event": "stopping"}, events.tasks))
    except _Deadline:  # stopped at the budget: its own result if it finished its batch in time, else the events'
        events.drain()
        return _result_at_deadline(request_path, events), None, events.tasks, events.errors
    except CompilerError as e:  # the worker died without a result
        raise CompilerError(f"tuning failed: {e}") from None
    return result, log_path, events.tasks, events.errors
