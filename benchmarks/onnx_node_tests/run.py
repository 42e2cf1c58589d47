"""ONNX conformance: every backend node test shipped with the installed onnx package, through mlc
(compile for x86 in-process, run the artifact on the shipped inputs, compare with the shipped outputs)
and through ONNX Runtime, in the same run.

    python benchmarks/onnx_node_tests/run.py --every 8            # a sample, to triage
    python benchmarks/onnx_node_tests/run.py --filter 'test_(max|min)_' --jobs 2
    python benchmarks/onnx_node_tests/run.py --every 8 --shipped-inputs   # mlc compile --inputs/--freeze

Cases run in child processes, a batch each, so that a TVM crash or a case past --timeout costs one
case, not the run. Writes results/<name>.json (with the machine) and <name>.md (a table per op).
Out-of-scope cases (training-only ops, map values) are classified with
the reason, not skipped silently; ONNX Runtime still runs on them."""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
RTOL, ATOL = 1e-3, 1e-5
TRAINING_OPS = {"Gradient", "Momentum", "Adagrad", "Adam"}
TRAINING_DOMAIN = "ai.onnx.preview.training"
# Input slots that are an op's parameters (shapes, axes, k, sizes, thresholds), not its data. The node tests
# feed them as graph inputs; deployed models have them as constants, and TVM needs them constant. With
# --freeze-parameters (the default) mlc compiles the model with the shipped values as initializers (what a
# deployed model holds); ONNX Runtime still runs the model as shipped. Each case records what was frozen.
PARAMETER_SLOTS = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Squeeze": {1}, "Unsqueeze": {1},
    "TopK": {1}, "Split": {1}, "Resize": {1, 2, 3}, "Upsample": {1}, "Pad": {1, 2, 3}, "ConstantOfShape": {0},
    "OneHot": {1}, "Range": {0, 1, 2}, "CumSum": {1}, "CenterCropPad": {1, 2}, "AffineGrid": {1}, "Col2Im": {1, 2},
    "NonMaxSuppression": {2, 3, 4}, "Trilu": {1}, "DFT": {1, 2}, "STFT": {1, 2, 3}, "Dropout": {1, 2},
    "BlackmanWindow": {0}, "HannWindow": {0}, "HammingWindow": {0}, "MelWeightMatrix": {0, 1, 2, 3, 4},
    "ReduceL1": {1}, "ReduceL2": {1}, "ReduceLogSum": {1}, "ReduceLogSumExp": {1}, "ReduceMax": {1},
    "ReduceMean": {1}, "ReduceMin": {1}, "ReduceProd": {1}, "ReduceSum": {1}, "ReduceSumSquare": {1},
    "LSTM": {1, 2, 3, 7}, "GRU": {1, 2, 3}, "RNN": {1, 2, 3},  # weights (and peepholes)
    "Loop": {0, 1},  # trip count and initial condition: they decide the scan outputs' shapes
    # a sequence is a tuple of static length in TVM: the positions and split sizes are compile-time values
    "SplitToSequence": {1}, "SequenceInsert": {2}, "SequenceAt": {1}, "SequenceErase": {1},
}


def node_test_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


def list_cases(pattern: Optional[str], every: int, limit: Optional[int]) -> list[str]:
    names = sorted(p.name for p in node_test_dir().iterdir() if (p / "model.onnx").exists())
    if pattern:
        names = [n for n in names if re.search(pattern, n)]
    names = names[::every]
    return names[:limit] if limit else names


# ---------------------------------------------------------------- one case (in the child process)

def _read_value(path: Path, type_proto) -> Any:
    """A test_data_set_*/input_i.pb or output_i.pb as numpy: a tensor, a list (sequence) or None/value (optional)."""
    import onnx
    from onnx import numpy_helper

    kind = type_proto.WhichOneof("value")
    data = path.read_bytes()
    if kind == "sequence_type":
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return numpy_helper.to_list(proto)
    if kind == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return numpy_helper.to_optional(proto)
    if kind == "map_type":
        proto = onnx.MapProto()
        proto.ParseFromString(data)
        return numpy_helper.to_dict(proto)
    proto = onnx.TensorProto()
    proto.ParseFromString(data)
    return numpy_helper.to_array(proto)


def load_case(case_dir: Path):
    """The model, and per data set (feeds by input name, expected outputs by output name)."""
    import onnx

    model = onnx.load(str(case_dir / "model.onnx"))
    weights = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in weights]
    sets = []
    for data_dir in sorted(case_dir.glob("test_data_set_*")):
        feeds = {}
        for i, value in enumerate(inputs):
            path = data_dir / f"input_{i}.pb"
            if path.exists():  # an optional input left out
                feeds[value.name] = _read_value(path, value.type)
        expected = {v.name: _read_value(data_dir / f"output_{i}.pb", v.type)
                    for i, v in enumerate(model.graph.output) if (data_dir / f"output_{i}.pb").exists()}
        sets.append((feeds, expected))
    return model, sets


def parameter_inputs(model, name: str = "") -> list[str]:
    """Graph inputs that only feed parameter slots (PARAMETER_SLOTS) of the nodes reading them. An expanded test
    (the op's function body, `test_x_expanded`) freezes the inputs the op's own test (`test_x`) freezes: there the
    shape arithmetic reads them through plain ops (Max, Sub, Split), but they are the same parameters."""
    graph_inputs = {v.name for v in model.graph.input} - {i.name for i in model.graph.initializer}
    op_test = node_test_dir() / re.sub(r"_expanded(_ver\d+)?$", "", name)
    if name and op_test.name != name and (op_test / "model.onnx").exists():
        import onnx

        return [n for n in parameter_inputs(onnx.load(str(op_test / "model.onnx"))) if n in graph_inputs]
    slots: dict[str, bool] = {}
    optional = {v.name for v in [*model.graph.output, *model.graph.value_info]
                if v.type.WhichOneof("value") == "optional_type"}
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            if name in graph_inputs:
                is_parameter = index in PARAMETER_SLOTS.get(node.op_type, ()) and node.domain in ("", "ai.onnx")
                # an If that returns an optional: its condition decides whether the output exists at all, which an
                # artifact's outputs fix at compile time (mlc's own error asks to freeze it)
                is_parameter |= node.op_type == "If" and any(o in optional for o in node.output)
                slots[name] = slots.get(name, True) and is_parameter
    return [name for name, only in slots.items() if only]


def freeze(model, feeds: dict, names: list[str]):
    """A copy of `model` with the inputs `names` made initializers holding `feeds`' values."""
    import onnx
    from onnx import numpy_helper

    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    kept = [v for v in frozen.graph.input if v.name not in names]
    del frozen.graph.input[:]
    frozen.graph.input.extend(kept)
    frozen.graph.initializer.extend(numpy_helper.from_array(np.asarray(feeds[n]), n) for n in names)
    return frozen


def out_of_scope(model) -> Optional[str]:
    """Why mlc does not take this model (by design), or None."""

    for node in model.graph.node:
        if node.domain == TRAINING_DOMAIN or node.op_type in TRAINING_OPS:
            return f"training-only op {node.op_type}"
    for value in list(model.graph.input) + list(model.graph.output):
        kind = value.type.WhichOneof("value")
        if kind == "map_type":
            return f"map value '{value.name}' (mlc compiles tensors, sequences and optionals)"
    return None


def as_tensors(values: dict) -> dict:
    """Sequence and optional values as an artifact takes and gives them (mlc.frontends.onnx_values): a sequence
    `x` as x[0], x[1], ... (an empty one as `x[]`), an optional as its value, an empty optional left out."""
    from mlc.frontends.onnx_values import item_name

    flat = {}
    for name, value in values.items():
        if isinstance(value, list):
            flat.update({item_name(name, i): item for i, item in enumerate(value)} or {f"{name}[]": np.zeros(0)})
        elif value is not None:
            flat[name] = value
    return flat


def compare(expected: Any, actual: Any, where: str = "") -> Optional[str]:
    """None when `actual` matches (rtol/atol for floats, exact for integers and booleans), else why not."""
    if isinstance(expected, (list, tuple)) or expected is None or isinstance(expected, dict):
        if type(actual) is not type(expected) and not (isinstance(actual, list) and isinstance(expected, list)):
            return f"{where}: expected {type(expected).__name__}, got {type(actual).__name__}"
        if isinstance(expected, list):
            if len(expected) != len(actual):
                return f"{where}: expected {len(expected)} items, got {len(actual)}"
            return next((r for r in (compare(e, a, f"{where}[{i}]") for i, (e, a) in enumerate(zip(expected, actual)))
                         if r), None)
        return None
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        return f"{where}: shape {list(actual.shape)}, expected {list(expected.shape)}"
    if expected.dtype.kind in "OSU" and actual.dtype.kind in "OSU":  # strings: ORT's object arrays, mlc's unicode
        return None if (expected.astype(str) == actual.astype(str)).all() else f"{where}: strings differ"
    if expected.dtype != actual.dtype:
        return f"{where}: dtype {actual.dtype}, expected {expected.dtype}"
    if expected.dtype.kind in "fc":
        e64, a64 = expected.astype(np.complex128 if expected.dtype.kind == "c" else np.float64), actual.astype(
            np.complex128 if expected.dtype.kind == "c" else np.float64)
        same_nan = np.isnan(e64) & np.isnan(a64)
        close = np.isclose(a64, e64, rtol=RTOL, atol=ATOL, equal_nan=True) | same_nan
        if not close.all():
            err = np.abs(np.where(close, 0, a64 - e64))
            return (f"{where}: {int((~close).sum())}/{close.size} values differ, "
                    f"max abs error {float(np.nanmax(err)):.3g}")
        return None
    if not np.array_equal(expected, actual):
        return f"{where}: {int((expected != actual).sum())}/{expected.size} values differ"
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return f"{type(e).__name__}: {text.splitlines()[0][:240]}"


def run_ort(case_dir: Path, sets) -> dict:
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4
        session = ort.InferenceSession(str(case_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        for feeds, expected in sets:
            got = dict(zip(names, session.run(names, feeds)))
            for name, value in expected.items():
                problem = compare(value, got.get(name), name)
                if problem:
                    return {"pass": False, "stage": "compare", "reason": problem}
    except Exception as e:  # onnxruntime raises its own exception types
        return {"pass": False, "stage": "run", "reason": _first_line(e)}
    return {"pass": True}


def _stage_of(error: BaseException) -> str:
    from mlc.errors import CompilerError, InputError, MlcError, UnsupportedModelError

    if isinstance(error, UnsupportedModelError):
        return "unsupported"
    if isinstance(error, CompilerError):
        return error.stage or "compile"
    if isinstance(error, InputError):
        return "reference" if "cannot run" in str(error) else "load"
    return "mlc" if isinstance(error, MlcError) else "internal"


def run_mlc(model_path: Path, sets, scratch: Path, inputs: Optional[Path] = None, freeze: tuple = ()) -> dict:
    import mlc.api as api
    from mlc.errors import ExitCode, MlcError

    art = scratch / "artifact"
    try:
        api.compile(str(model_path), target="x86", output=art, isolate=False, inputs=inputs, freeze=freeze)
    except MlcError as e:
        return {"pass": False, "stage": _stage_of(e), "exit_code": int(e.exit_code), "reason": str(e)[:300]}
    except Exception as e:  # an mlc bug: the CLI would exit 70
        return {"pass": False, "stage": "internal", "exit_code": int(ExitCode.INTERNAL), "reason": _first_line(e)}
    try:
        runner = api.open_runner(art)
        runner_inputs = {spec["name"] for spec in runner.manifest["inputs"]}
        for feeds, expected in sets:
            got = runner.run({k: v for k, v in as_tensors(feeds).items() if k in runner_inputs})
            for name, value in as_tensors(expected).items():
                problem = compare(value, got.get(name), name)
                if problem:
                    return {"pass": False, "stage": "compare", "reason": problem}
    except Exception as e:  # the runtime's errors, typed or not
        return {"pass": False, "stage": "run", "reason": _first_line(e)}
    return {"pass": True}


def run_case(name: str, freeze_parameters: bool = True, shipped_inputs: bool = False) -> dict:
    case_dir = node_test_dir() / name
    start = time.perf_counter()
    record: dict[str, Any] = {"name": name}
    try:
        model, sets = load_case(case_dir)
    except Exception as e:  # a test we cannot read
        record.update(ort={"pass": False, "stage": "load", "reason": _first_line(e)},
                      mlc={"pass": False, "stage": "load", "reason": _first_line(e)})
        return record
    record["ops"] = sorted({n.op_type for n in model.graph.node})
    record["ort"] = run_ort(case_dir, sets)
    scope = out_of_scope(model)
    if scope:
        record["mlc"] = {"pass": False, "stage": "out_of_scope", "reason": scope}
    else:
        import onnx

        with tempfile.TemporaryDirectory(prefix="mlc-node-") as scratch:
            model_path = case_dir / "model.onnx"
            frozen = parameter_inputs(model, name) if freeze_parameters else []
            samples = None
            if shipped_inputs:  # mlc compile --inputs (the shipped set 0) --freeze (its parameter inputs)
                samples = Path(scratch) / "inputs.npz"
                np.savez(samples, **{k: v.astype(str) if v.dtype == object else v  # strings: unpickled
                                     for k, v in as_tensors(sets[0][0]).items()})
                record["inputs"] = "shipped"
            if frozen and all(all(n in feeds for n in frozen) for feeds, _ in sets):
                if any(any(not np.array_equal(feeds[n], sets[0][0][n]) for n in frozen) for feeds, _ in sets[1:]):
                    frozen = []  # data sets disagree on the parameters: one frozen model cannot serve them all
                else:
                    record["frozen_inputs"] = frozen
                    if not shipped_inputs:
                        model_path = Path(scratch) / "model.onnx"
                        onnx.save(freeze(model, sets[0][0], frozen), str(model_path))
            else:
                frozen = []
            record["mlc"] = run_mlc(model_path, sets, Path(scratch), samples, tuple(frozen) if samples else ())
    record["time_s"] = round(time.perf_counter() - start, 2)
    return record


def worker(fd: int, freeze_parameters: bool, shipped_inputs: bool = False) -> None:
    """Child: read case names from stdin, one per line; report {"start"}, {"result"} events on `fd`."""
    out = os.fdopen(fd, "w", buffering=1)
    import mlc.api  # noqa: F401 - import (and TVM's, on the first compile) before the first case's clock starts
    import tvm  # noqa: F401

    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        out.write(json.dumps({"start": name}) + "\n")
        out.write(json.dumps({"result": run_case(name, freeze_parameters, shipped_inputs)}) + "\n")


# ---------------------------------------------------------------- the parent: batches, timeouts, crashes

class Pool:
    def __init__(self, names: list[str], jobs: int, batch: int, timeout: float, log_dir: Path, progress: bool,
                 freeze_parameters: bool = True, shipped_inputs: bool = False, on_result=None):
        self.freeze_parameters, self.shipped_inputs, self.on_result = freeze_parameters, shipped_inputs, on_result
        self.pending = collections.deque(names)
        self.total = len(names)
        self.results: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.jobs, self.batch, self.timeout, self.log_dir, self.progress = jobs, batch, timeout, log_dir, progress

    def _take(self) -> list[str]:
        with self.lock:
            return [self.pending.popleft() for _ in range(min(self.batch, len(self.pending)))]

    def _record(self, result: dict) -> None:
        with self.lock:
            self.results[result["name"]] = result
            if self.progress:
                mlc, ort = result.get("mlc", {}), result.get("ort", {})
                flag = "pass" if mlc.get("pass") else mlc.get("stage", "?")
                print(f"[{len(self.results)}/{self.total}] {result['name']}: "
                      f"ort {'pass' if ort.get('pass') else 'FAIL'}"
                      f", mlc {flag} ({result.get('time_s', '-')} s)", flush=True)
            if self.on_result:
                self.on_result(dict(self.results))

    def _lost(self, name: str, stage: str, reason: str, started: float) -> None:
        self._record({"name": name, "ort": {"pass": None, "stage": stage, "reason": "not known: the child died"},
                      "mlc": {"pass": False, "stage": stage, "exit_code": 70, "reason": reason},
                      "time_s": round(time.monotonic() - started, 2)})

    def _run_batch(self, names: list[str], slot: int) -> None:
        todo = collections.deque(names)
        while todo:
            read_fd, write_fd = os.pipe()
            log = open(self.log_dir / f"worker-{slot}.log", "a")
            env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "TVM_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker-fd", str(write_fd)]
                                    + ([] if self.freeze_parameters else ["--no-freeze-parameters"])
                                    + (["--shipped-inputs"] if self.shipped_inputs else []),
                                    stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,), text=True,
                                    env=env)
            os.close(write_fd)
            proc.stdin.write("".join(n + "\n" for n in todo))
            proc.stdin.close()
            reader = os.fdopen(read_fd)
            current, started, buffer = None, time.monotonic(), ""
            ready = False
            while True:
                limit = self.timeout if ready else self.timeout + 120  # the first event waits for `import tvm`
                left = limit - (time.monotonic() - started)
                readable, _, _ = select.select([reader], [], [], max(left, 0))
                if not readable:
                    proc.kill()
                    proc.wait()
                    if current:
                        todo.popleft()
                        self._lost(current, "timeout", f"over {self.timeout:.0f} s", started)
                    break
                chunk = os.read(reader.fileno(), 65536).decode()
                if not chunk:  # the child exited
                    code = proc.wait()
                    if current:
                        todo.popleft()
                        self._lost(current, "crash", f"the process died (exit {code}) in TVM or the runtime", started)
                    elif todo and not ready:
                        for name in list(todo):
                            self._lost(name, "crash", f"the worker did not start (exit {code})", started)
                        todo.clear()
                    break
                buffer += chunk
                while "\n" in buffer:
                    line, buffer = buffer.split("\n", 1)
                    event = json.loads(line)
                    if "ready" in event:
                        ready, started = True, time.monotonic()
                    elif "start" in event:
                        current, started = event["start"], time.monotonic()
                    elif "result" in event:
                        self._record(event["result"])
                        if todo and todo[0] == event["result"]["name"]:
                            todo.popleft()
                        current, started = None, time.monotonic()
            reader.close()
            log.close()

    def _slot(self, slot: int) -> None:
        while True:
            names = self._take()
            if not names:
                return
            self._run_batch(names, slot)

    def run(self) -> dict[str, dict]:
        threads = [threading.Thread(target=self._slot, args=(i,)) for i in range(self.jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.results


# ---------------------------------------------------------------- report

def op_of(name: str, ops: list[str]) -> str:
    """The op a test is about: the longest ONNX op name its test name starts with (test_reduce_sum_x -> ReduceSum)."""
    import onnx

    key = name[len("test_"):].replace("_", "").lower()
    known = sorted({s.name for s in onnx.defs.get_all_schemas_with_history()}, key=len, reverse=True)
    op = next((s for s in known if key.startswith(s.lower())), None) or (ops[0] if ops else "?")
    return op + (" (expanded)" if "_expanded" in name else "")


def failure_class(mlc: dict) -> str:
    reason = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", mlc.get("reason", ""))
    reason = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", reason)
    reason = re.sub(r"\(first: [^)]*\)", "", reason)
    return f"{mlc.get('stage')}: {reason[:110]}"


def summarise(cases: list[dict]) -> dict:
    ort_pass = [c for c in cases if c["ort"].get("pass")]
    scoped = [c for c in cases if c["mlc"].get("stage") != "out_of_scope"]
    mlc_on_ort = [c for c in ort_pass if c["mlc"].get("pass")]
    failures = collections.Counter(failure_class(c["mlc"]) for c in ort_pass
                                   if not c["mlc"].get("pass") and c["mlc"].get("stage") != "out_of_scope")
    stages = collections.Counter(c["mlc"].get("stage") for c in ort_pass if not c["mlc"].get("pass"))
    exit70 = [c["name"] for c in cases if c["mlc"].get("exit_code") == 70]
    ort_in_scope = [c for c in ort_pass if c["mlc"].get("stage") != "out_of_scope"]
    frozen = [c for c in ort_in_scope if c.get("frozen_inputs")]
    training = [c for c in cases if c["mlc"].get("reason", "").startswith("training-only op")]
    ort_not_training = [c for c in ort_pass if c not in training]
    return {"cases": len(cases), "ort_pass": len(ort_pass), "in_scope": len(scoped),
            "out_of_scope": len(cases) - len(scoped), "mlc_pass": sum(1 for c in cases if c["mlc"].get("pass")),
            "mlc_pass_where_ort_passes": len(mlc_on_ort),
            "ort_pass_in_scope": sum(1 for c in ort_pass if c["mlc"].get("stage") != "out_of_scope"),
            "mlc_failure_stages_where_ort_passes": dict(stages.most_common()),
            "mlc_failure_classes_where_ort_passes": dict(failures.most_common(25)),
            "mlc_exit_70": exit70, "frozen": sum(1 for c in cases if c.get("frozen_inputs")),
            # the frozen cases counted apart: in-scope cases ORT passes, with and without parameter inputs frozen
            "frozen_where_ort_passes": len(frozen),
            "mlc_pass_frozen_where_ort_passes": sum(1 for c in frozen if c["mlc"].get("pass")),
            "not_frozen_where_ort_passes": len(ort_in_scope) - len(frozen),
            "mlc_pass_not_frozen_where_ort_passes": sum(1 for c in ort_in_scope
                                                         if c["mlc"].get("pass") and not c.get("frozen_inputs")),
            # only the training-only ops left out (strings count as mlc failures)
            "training_only": len(training), "ort_pass_not_training": len(ort_not_training),
            "mlc_pass_where_ort_passes_not_training": sum(1 for c in ort_not_training if c["mlc"].get("pass"))}


def markdown(doc: dict) -> str:
    s, m = doc["summary"], doc["machine"]
    lines = [f"# ONNX backend node tests through mlc and ONNX Runtime ({doc['selection']})", "",
             f"onnx {doc['versions']['onnx']}, onnxruntime {doc['versions']['onnxruntime']}, "
             f"apache-tvm {doc['versions']['apache-tvm']}; {m.get('cpu')}, {m.get('cores_usable')} cores, "
             f"{m.get('date')}, commit {doc.get('commit', '?')}. "
             f"Tolerance rtol {RTOL}, atol {ATOL} (exact for integers and booleans).", "",
             ("Parameter inputs (axes, shapes, k, sizes: see PARAMETER_SLOTS in run.py) are compiled as constants "
              f"holding the shipped values, as deployed models hold them ({s['frozen']} cases)."
              if doc["args"]["freeze_parameters"] else "Parameter inputs are compiled as runtime inputs, as shipped.")
             + (" The shipped inputs (test_data_set_0) are the reference inputs (`mlc compile --inputs`), and the "
                "parameter inputs are frozen with `--freeze`." if doc["args"].get("shipped_inputs") else ""),
             "",
             f"- cases: {s['cases']} ({s['out_of_scope']} out of scope: training-only ops, strings)",
             f"- ONNX Runtime passes: {s['ort_pass']}",
             f"- mlc passes: {s['mlc_pass']}; on the {s['ort_pass_in_scope']} in-scope cases ONNX Runtime passes: "
             f"{s['mlc_pass_where_ort_passes']}",
             f"- frozen cases counted apart, of those {s['ort_pass_in_scope']}: {s['frozen_where_ort_passes']} "
             f"with parameter inputs frozen, mlc passes {s['mlc_pass_frozen_where_ort_passes']}; "
             f"{s['not_frozen_where_ort_passes']} with nothing frozen, mlc passes "
             f"{s['mlc_pass_not_frozen_where_ort_passes']}",
             f"- only the {s['training_only']} training-only cases left out (strings counted as failures): "
             f"mlc passes {s['mlc_pass_where_ort_passes_not_training']} of the "
             f"{s['ort_pass_not_training']} cases ONNX Runtime passes",
             f"- mlc exits 70 (internal) on {len(s['mlc_exit_70'])} case(s)", "",
             "## mlc failure classes where ONNX Runtime passes", "", "| cases | stage: reason |", "|---:|---|"]
    lines += [f"| {n} | {k.replace('|', '/')} |" for k, n in s["mlc_failure_classes_where_ort_passes"].items()]
    lines += ["", "## Per op", "",
              "| op | cases | ORT pass | mlc pass | mlc pass where ORT passes | mlc failures (stage) |",
              "|---|---:|---:|---:|---:|---|"]
    by_op: dict[str, list[dict]] = collections.defaultdict(list)
    for c in doc["cases"]:
        by_op[c["op"]].append(c)
    for op in sorted(by_op):
        group = by_op[op]
        ort = [c for c in group if c["ort"].get("pass")]
        stages = collections.Counter(c["mlc"].get("stage") for c in group if not c["mlc"].get("pass"))
        lines.append(f"| {op} | {len(group)} | {len(ort)} | {sum(1 for c in group if c['mlc'].get('pass'))} | "
                     f"{sum(1 for c in ort if c['mlc'].get('pass'))}/{len(ort)} | "
                     f"{', '.join(f'{k} {n}' for k, n in stages.most_common())} |")
    return "\n".join(lines) + "\n"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip() or "?"
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", help="only the test names this regular expression finds")
    parser.add_argument("--every", type=int, default=1, help="every Nth case (a sample), after --filter")
    parser.add_argument("--limit", type=int, help="at most this many cases")
    parser.add_argument("--jobs", type=int, default=1, help="child processes at once")
    parser.add_argument("--batch", type=int, default=40, help="cases per child process")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per case")
    parser.add_argument("--name", help="results name (default: node-tests-full / -every-N / -filtered)")
    parser.add_argument("--rerun-failed", metavar="RESULTS_JSON",
                        help="run again only the cases mlc failed in RESULTS_JSON (all of them, or those --filter "
                             "finds) and write the merged results; the JSON records both runs' selections")
    parser.add_argument("--no-freeze-parameters", dest="freeze_parameters", action="store_false",
                        help="compile parameter inputs (axes, shapes, k) as runtime inputs, as the tests ship them")
    parser.add_argument("--shipped-inputs", action="store_true",
                        help="compile with the shipped inputs (test_data_set_0) through `mlc compile --inputs`, and "
                             "the parameter inputs through --freeze (not by rewriting the model)")
    parser.add_argument("--report", metavar="RESULTS_JSON",
                        help="run nothing: recompute the summary of RESULTS_JSON (a finished or partial record) and "
                             "write it and its .md again")
    parser.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_fd is not None:
        worker(args.worker_fd, args.freeze_parameters, args.shipped_inputs)
        return 0
    sys.path.insert(0, str(HERE.parents[1]))
    from importlib import metadata

    from mlc.bench.machine import machine_info

    if args.report:
        path = Path(args.report)
        doc = json.loads(path.read_text())
        for c in doc["cases"]:
            c.setdefault("op", op_of(c["name"], c.get("ops", [])))
        doc["summary"] = summarise(doc["cases"])
        doc["summary_by"] = _commit()  # the run.py that computed this summary (the cases keep their commit)
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        (HERE / f"{path.stem}.md").write_text(markdown(doc))
        print(f"{doc['summary']['cases']} cases summarised again; written {path} and {HERE / (path.stem + '.md')}")
        return 0

    base = json.loads(Path(args.rerun_failed).read_text()) if args.rerun_failed else None
    if base:
        names = [c["name"] for c in base["cases"] if not c["mlc"].get("pass")
                 and c["mlc"].get("stage") != "out_of_scope" and (not args.filter or re.search(args.filter, c["name"]))]
    else:
        names = list_cases(args.filter, args.every, args.limit)
    selection = "all cases" if not args.filter and args.every == 1 and not args.limit else \
        f"{len(names)} cases: " + ", ".join(x for x in (f"filter {args.filter!r}" if args.filter else "",
                                                        f"every {args.every}th" if args.every > 1 else "",
                                                        f"limit {args.limit}" if args.limit else "") if x)
    name = args.name or ("node-tests-full" if selection == "all cases" else
                         f"node-tests-every-{args.every}" if args.every > 1 and not args.filter
                         else "node-tests-filtered")
    if not args.freeze_parameters and not args.name:
        name += "-raw"
    if args.shipped_inputs and not args.name:
        name += "-shipped"
    results_dir = HERE / "results"
    results_dir.mkdir(exist_ok=True)
    start = time.monotonic()
    machine, versions = machine_info(), {p: metadata.version(p) for p in ("onnx", "onnxruntime", "apache-tvm")}

    def partial(results: dict) -> None:  # every 25 cases: a run stopped part way keeps a record of what ran
        if len(results) % 25 == 0 and len(results) < len(names):
            cases = [results[n] for n in names if n in results]  # `op` comes with the final record (or --report)
            doc = {"selection": f"{selection} (partial: {len(cases)} of {len(names)} ran)", "partial": True,
                   "args": vars(args), "machine": machine, "versions": versions, "commit": _commit(),
                   "wall_s": round(time.monotonic() - start, 1), "tolerance": {"rtol": RTOL, "atol": ATOL},
                   "summary": summarise(cases), "cases": cases}
            (results_dir / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="mlc-node-logs-") as logs:
        results = Pool(names, args.jobs, args.batch, args.timeout, Path(logs), progress=True,
                       freeze_parameters=args.freeze_parameters, shipped_inputs=args.shipped_inputs,
                       on_result=None if base else partial).run()
    cases = [results[n] for n in names if n in results]
    if base:  # the earlier run's cases, with the ones run again replaced
        cases = [results.get(c["name"], c) for c in base["cases"]]
        selection = f"{base['selection']}; its {len(names)} mlc failures run again at {_commit()}"
        name = args.name or Path(args.rerun_failed).stem + "-rerun"
    for c in cases:
        c["op"] = op_of(c["name"], c.get("ops", []))
    doc = {"selection": selection, "args": vars(args), "machine": machine, "versions": versions,
           "commit": _commit(), "wall_s": round(time.monotonic() - start, 1), "tolerance": {"rtol": RTOL, "atol": ATOL},
           "summary": summarise(cases), "cases": cases}
    (results_dir / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (HERE / f"{name}.md").write_text(markdown(doc))
    s = doc["summary"]
    print(f"{s['cases']} cases: ONNX Runtime passes {s['ort_pass']}; "
          f"mlc passes {s['mlc_pass_where_ort_passes']} of the "
          f"{s['ort_pass_in_scope']} in-scope cases ONNX Runtime passes; written {results_dir / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
