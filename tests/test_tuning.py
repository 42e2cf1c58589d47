"""mlc tune / compile --db / default CPU schedules / RPC. The unmarked tests run in CI (~2.5 min here):
a tiny MLP tuned with a few trials per kernel, and a fire module's database of measured defaults (#41).
`-m tune` adds interruption, loopback RPC and a short real budget."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import assert_clean_error, mlp_onnx, run_mlc
from mlc import tuning
from mlc.errors import InputError


def _records(db: Path) -> list[dict]:
    return [json.loads(ln) for ln in (db / tuning.DB_FILES[1]).read_text().splitlines() if ln.strip()]


def test_budget_parsing():
    assert tuning.parse_budget("20m") == 1200
    assert tuning.parse_budget("1h30m") == 5400
    assert tuning.parse_budget("45") == 45
    assert tuning.parse_budget("90s") == 90
    for bad in ("", "soon", "10x", "0m", "-5", "m20"):
        with pytest.raises(InputError):
            tuning.parse_budget(bad)


def test_repair_drops_a_cut_last_line_and_refuses_corruption(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    records = db / tuning.DB_FILES[1]
    records.write_text('[0, {"a": 1}]\n[1, {"b"')  # a writer killed mid-line
    tuning.check_db_dir(db, create=True)
    assert records.read_text() == '[0, {"a": 1}]\n'
    records.write_text('[0, {"a": 1}]\nnot json\n[1, 2]\n')
    with pytest.raises(InputError, match="corrupt"):
        tuning.check_db_dir(db, create=True)


def test_bad_options_give_clean_errors(tmp_path):
    model = mlp_onnx(tmp_path / "mlp.onnx")
    assert_clean_error(run_mlc("tune", model, "--db", tmp_path / "db", "--budget", "soon"), 1, "--budget 'soon'")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_clean_error(run_mlc("tune", model, "--db", a_file, "--trials", "2"), 1, "is a file")
    assert_clean_error(run_mlc("tune", model, "--db", tmp_path / "db", "--trials", "0"), 1,
                       "--trials must be at least 1")
    assert_clean_error(run_mlc("tune", model, "--db", tmp_path / "db", "--threads", "0"), 1,
                       "--threads must be between 1")
    assert_clean_error(run_mlc("tune", model, "--db", tmp_path / "db", "--rpc-tracker", "localhost:9190"), 1,
                       "--rpc-tracker and --rpc-key go together")
    nobody = f"127.0.0.1:{_free_port()}"
    assert_clean_error(run_mlc("tune", model, "--db", tmp_path / "db", "--rpc-tracker", nobody, "--rpc-key", "pi"), 1,
                       f"cannot reach an RPC tracker at {nobody}")
    assert_clean_error(run_mlc("compile", model, "--db", tmp_path / "missing", "-o", tmp_path / "out"), 1,
                       "does not exist")
    assert not (tmp_path / "out").exists()
    # --framework picks the model's framework as compile's does (the kernels tuned are the ones that build)
    assert_clean_error(run_mlc("tune", "zoo:mlp", "-f", "tensorflow", "--db", tmp_path / "db", "--trials", "1"), 1,
                       "zoo:mlp is not built for tensorflow")


def test_tune_resume_and_compile_with_db(tmp_path):
    model = mlp_onnx(tmp_path / "mlp.onnx")
    db = tmp_path / "db"
    first = run_mlc("tune", model, "--db", db, "--trials", "2", "--threads", "1", "--json", check=True)
    summary = json.loads(first.stdout)
    assert summary["threads"] == 1, summary  # read back from the measuring process's thread pool
    # Each kernel's first record is mlc's default schedule, measured; the search adds the rest.
    assert summary["tasks"] >= 2 and summary["trials"] == summary["tasks"], summary
    assert all(k["best_us"] and k["best_us"] > 0 and k["trials"] == 2 for k in summary["kernels"]), summary
    assert len(_records(db)) == summary["records"] == 2 * summary["tasks"]
    # A dense layer's default is measured as the build runs it: reading its constant weight
    # repacked per register tile ([K, N] -> [N/16, K, 16]), the repacking folded away.
    seeds = {}
    for workload, record in _records(db):
        seeds.setdefault(workload, record)
    assert any(len(shape) == 3 for record in seeds.values() for _, _, shape in record[3]), seeds

    # Same target count: nothing to do. A higher one: continues from the records already there.
    again = json.loads(run_mlc("tune", model, "--db", db, "--trials", "2", "--json", check=True).stdout)
    assert again["trials"] == 0 and again["stopped_by"] == "already tuned"
    more = json.loads(run_mlc("tune", model, "--db", db, "--trials", "3", "--json", check=True).stdout)
    assert more["trials"] == summary["tasks"]  # one more per kernel
    assert len(_records(db)) == summary["records"] + more["trials"]

    out = tmp_path / "tuned"
    compiled = run_mlc("compile", model, "--db", db, "-o", out)
    assert compiled.returncode == 0, compiled.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    schedules = manifest["compile"]["schedules"]
    assert len(schedules["tuned"]) == summary["tasks"] and not schedules["unscheduled"], schedules
    assert manifest["compile"]["options"]["db"] == str(db.resolve())
    assert "--db" in manifest["compile"]["recipe"]
    assert run_mlc("check", out).returncode == 0


def test_untuned_cpu_build_uses_default_schedules_and_says_so(tmp_path):
    out = tmp_path / "a"
    proc = run_mlc("compile", "zoo:transformer", "-o", out)
    assert proc.returncode == 0, proc.stderr
    schedules = json.loads((out / "manifest.json").read_text())["compile"]["schedules"]
    assert schedules["default"] and not schedules["tuned"] and not schedules["unscheduled"], schedules
    assert "untuned build" in proc.stderr and "mlc tune" in proc.stderr


@pytest.mark.tune
def test_interrupt_keeps_the_database_and_a_rerun_continues(tmp_path):
    model = mlp_onnx(tmp_path / "mlp.onnx")
    db = tmp_path / "db"
    proc = subprocess.Popen([sys.executable, "-m", "mlc", "tune", model, "--db", db, "--trials", "200", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and (not (db / tuning.DB_FILES[1]).exists() or len(_records(db)) < 4):
        time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    kept = len(_records(db))  # every line parses: the database is consistent
    assert kept >= 4
    rerun = json.loads(run_mlc("tune", model, "--db", db, "--trials", "200", "--budget", "20s", "--json",
                               check=True).stdout)
    assert rerun["records"] == kept + rerun["trials"] and rerun["trials"] > 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_registered(tracker: str, key: str, timeout_s: float = 60) -> None:
    """The server registers with the tracker after it starts listening, in its own time (seconds
    on a loaded machine): a tune started before that finds no device under the key."""
    from mlc.errors import InputError
    from mlc.compiler.rpc import check_tracker

    deadline = time.time() + timeout_s
    while True:
        try:
            return check_tracker(tracker, key)
        except InputError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture
def loopback_rpc():
    """A TVM RPC tracker and an `mlc rpc-server` registered with it as 'loop', on 127.0.0.1."""
    import psutil

    port = _free_port()
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                "--port", str(port), "--port-end", str(port + 1), "--silent"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = subprocess.Popen([sys.executable, "-m", "mlc", "rpc-server", "--tracker", f"127.0.0.1:{port}",
                               "--key", "loop", "--host", "127.0.0.1", "--port", str(_free_port())],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()  # blocks until the server listens (or dies)
        assert "RPC server listening" in line, line
        _wait_until_registered(f"127.0.0.1:{port}", "loop")
        children = psutil.Process(server.pid).children(recursive=True)
        yield f"127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        for process in psutil.Process(tracker.pid).children(recursive=True):  # TVM's tracker runs in a worker
            process.kill()
        tracker.kill()
        tracker.wait()
    assert server.returncode == 128 + signal.SIGTERM
    time.sleep(1)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE], "server left processes"


@pytest.mark.tune  # ~60 s, most of it two `import tvm`s: kept out of CI's time
def test_loopback_rpc_measures_a_kernel(loopback_rpc):
    code = f"from mlc.compiler import rpc; print(rpc.measure_once({loopback_rpc!r}, 'loop'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 0 < float(proc.stdout.strip().splitlines()[-1]) < 10


@pytest.mark.tune
def test_tune_through_loopback_rpc(loopback_rpc, tmp_path):
    model = mlp_onnx(tmp_path / "mlp.onnx")
    assert_clean_error(run_mlc("tune", model, "--db", tmp_path / "db", "--rpc-tracker", loopback_rpc,
                               "--rpc-key", "pi"),
                       1, "under key 'pi' (registered: loop)")
    proc = run_mlc("tune", model, "--db", tmp_path / "db", "--trials", "1", "--rpc-tracker", loopback_rpc,
                   "--rpc-key", "loop", "--json", check=True)
    summary = json.loads(proc.stdout)
    assert summary["records"] == summary["tasks"] and summary["failed_trials"] == 0, summary  # the measured defaults
    assert all(k["best_us"] > 0 for k in summary["kernels"])


def test_kernel_with_zero_padded_weight_keeps_the_default(tmp_path):
    """A dense layer 100 wide pads its weight to the vector tile; TVM cannot measure that repacked
    default, and a search measured against the unpacked one made lstm-lm's --db build slower than
    the untuned build. Such kernels are not tuned: --db builds use mlc's default for them."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 100])],
        [numpy_helper.from_array(rng.standard_normal((64, 100)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(100).astype(np.float32), "b")])
    model = tmp_path / "wide.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    db = tmp_path / "db"
    summary = json.loads(run_mlc("tune", model, "--db", db, "--trials", "1", "--json", check=True).stdout)
    assert len(summary["left_to_default"]) == 1 and "matmul" in summary["left_to_default"][0], summary
    assert summary["left_to_default"][0] not in {k["name"] for k in summary["kernels"]}
    out = tmp_path / "tuned"
    assert run_mlc("compile", model, "--db", db, "-o", out).returncode == 0
    schedules = json.loads((out / "manifest.json").read_text())["compile"]["schedules"]
    assert summary["left_to_default"][0] in schedules["default"], schedules
    assert run_mlc("check", out).returncode == 0


# --- #41: records that read back, a compile that survives those that do not, a budget that holds --------------

def _fire_onnx(path: Path) -> Path:
    """A SqueezeNet fire module (squeeze conv, two expand convs concatenated) and a conv after it: the
    concatenation is a kernel of its own, which mlc's default schedules as one copy per input (mlc.compiler.concat)."""
    rng = np.random.default_rng(0)
    weights = {"ws": (4, 8, 1, 1), "wa": (16, 4, 1, 1), "wb": (16, 4, 3, 3), "wc": (8, 32, 1, 1)}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "ws"], ["s"], kernel_shape=[1, 1]), helper.make_node("Relu", ["s"], ["r"]),
         helper.make_node("Conv", ["r", "wa"], ["a"], kernel_shape=[1, 1]),
         helper.make_node("Conv", ["r", "wb"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
         helper.make_node("Conv", ["c", "wc"], ["y"], kernel_shape=[1, 1])], "fire",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array((0.3 * rng.standard_normal(s)).astype(np.float32), k) for k, s in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def fire_db(tmp_path_factory):
    """The fire module and a database of its kernels' measured defaults (--trials 1: no search, ~7 s)."""
    folder = tmp_path_factory.mktemp("fire")
    model = _fire_onnx(folder / "fire.onnx")
    proc = run_mlc("tune", model, "--db", folder / "db", "--trials", "1", "--json", check=True)
    return model, folder / "db", json.loads(proc.stdout)


def test_a_concatenation_keeps_its_default_and_every_record_reads_back(fire_db):
    """mlc's default for a concatenation rewrites the kernel into copies: its trace does not apply to the kernel,
    and TVM's JSONDatabase failed to open a database holding its record ("parallel_for_dynamic error")."""
    from tvm.s_tir import meta_schedule as ms

    _, db, summary = fire_db
    assert [k for k in summary["left_to_default"] if "concatenate" in k], summary
    assert len(ms.database.JSONDatabase(work_dir=str(db), allow_missing=False)) == summary["records"] > 0


def test_tune_keeps_only_records_that_read_back(fire_db, tmp_path):
    """What TVM's search commits goes through records.checked: a record whose trace does not apply to its kernel
    (one kernel's schedule on another's) is dropped, counted and explained; a good one is kept."""
    from tvm.s_tir import meta_schedule as ms

    from mlc.compiler import records

    good = ms.database.JSONDatabase(work_dir=str(fire_db[1]), allow_missing=False).get_all_tuning_records()
    donor = next(r for r in good if "conv2d" in r.workload.mod.script())
    kernel = next(r for r in good if "conv2d" not in r.workload.mod.script())
    bad = ms.database.TuningRecord(donor.trace, kernel.workload, donor.run_secs, donor.target, donor.args_info)
    (tmp_path / "db").mkdir()
    database = records.checked(ms.database.JSONDatabase(work_dir=str(tmp_path / "db")), tmp_path / "scratch")
    database.commit_workload(kernel.workload.mod)  # as TVM's AddToDatabase does, then the records
    database.commit_tuning_record(bad)  # through TVM's Database interface, as its AddToDatabase calls it
    database.commit_tuning_record(kernel)
    assert database.dropped == 1 and "does not apply to its kernel" in database.last_reason, database.last_reason
    assert len(database) == 1 and len(ms.database.JSONDatabase(work_dir=str(tmp_path / "db"))) == 1


def _plant_unreadable_record(db: Path) -> tuple[int, str]:
    """Append a copy of a record whose trace names a block its kernel lacks (as the copies' records did); returns
    the record count and the planted line."""
    lines = [ln for ln in (db / tuning.DB_FILES[1]).read_text().splitlines() if ln.strip()]
    planted = re.sub(r'("GetSBlock",\[\],\[")[^"]+', r"\1no_such_block", next(ln for ln in lines if "GetSBlock" in ln),
                     count=1)
    (db / tuning.DB_FILES[1]).write_text("".join(ln + "\n" for ln in lines + [planted]))
    return len(lines) + 1, planted


def test_compile_skips_an_unreadable_record_and_tune_sets_it_aside(fire_db, tmp_path):
    model, source_db, summary = fire_db
    db = tmp_path / "db"
    shutil.copytree(source_db, db)
    count, planted = _plant_unreadable_record(db)
    before = (db / tuning.DB_FILES[1]).read_text()
    proc = run_mlc("compile", model, "--db", db, "-o", tmp_path / "art")
    assert proc.returncode == 0, proc.stderr
    assert f"skipped 1 of the {count} tuning records" in proc.stderr and "no_such_block" in proc.stderr, proc.stderr
    schedules = json.loads((tmp_path / "art" / "manifest.json").read_text())["compile"]["schedules"]
    assert len(schedules["tuned"]) == summary["tasks"], schedules  # the readable records all applied
    assert "tune this model" not in proc.stderr  # the concatenation is left to its default on purpose
    assert (db / tuning.DB_FILES[1]).read_text() == before  # compile never edits the database
    # `mlc tune`, which appends to the database, opens it so: the record moves out of TVM's way, kept
    from mlc.compiler import records

    notes: list[str] = []
    assert len(records.open_readable(db, notes, repair=True)) == count - 1
    assert [n for n in notes if "moved 1 tuning records that TVM cannot read" in n], notes
    assert (db / records.SET_ASIDE).read_text() == planted + "\n"
    assert planted not in (db / tuning.DB_FILES[1]).read_text()


def test_a_build_that_fails_with_the_records_is_built_without_them(fire_db, tmp_path, monkeypatch):
    """Whatever breaks a build with the records (#41: "parallel_for_dynamic error", exit 70), a valid model is built
    without them, and a note names the step. In-process (isolate=False), the failure injected."""
    from mlc import api
    from mlc.compiler import schedules

    build = schedules.build

    def broken(mod, target, db_dir, *args):
        if db_dir:
            raise RuntimeError("parallel_for_dynamic error (injected)")
        return build(mod, target, db_dir, *args)

    monkeypatch.setattr(schedules, "build", broken)
    model, db, _ = fire_db
    result = api.compile(str(model), output=tmp_path / "art", db=db, isolate=False)
    assert result.check.passed
    assert [n for n in result.notes if "built without the tuning records" in n and "injected" in n], result.notes


_STUCK_TUNER = '''
import json, signal, sys, time
from pathlib import Path

signal.signal(signal.SIGINT, signal.SIG_IGN)  # a search busy in TVM's C++ never looks at the stop flag
request = json.loads(Path(sys.argv[1]).read_text())
task = {"name": "conv2d", "weight": 1, "key": "0", "trials_done": 0, "best_us": None}
with open(request["events"], "a") as f:
    f.write(json.dumps({"event": "tasks", "t": time.time(), "tasks": [task], "threads": 1}) + "\\n")
    f.write(json.dumps({"event": "measured", "t": time.time(), "task": "conv2d", "trials": 16, "best_us": 5.0,
                        "errors": 0, "last_error": None}) + "\\n")
with open(Path(request["db"]) / "database_tuning_record.json", "a") as f:
    f.write('[0, [[["GetSBlock"')  # killed while writing a record
for _ in range(600):
    time.sleep(0.1)
'''


def test_tune_stops_at_its_budget_whatever_the_search_does(tmp_path, monkeypatch):
    """#41: a search measured every kernel once, then nothing for 12 minutes of a 4-minute budget. The parent stops
    the child at the budget and kills it soon after; what the events said is the result, and a record line cut by
    the kill is dropped."""
    tune_module = importlib.import_module("mlc.tuning.tune")  # the package's `tune` is the function
    (tmp_path / "stuck_tuner.py").write_text(_STUCK_TUNER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(tune_module, "WORKER", "stuck_tuner")
    db = tmp_path / "db"
    start = time.time()
    result = tuning.tune(str(mlp_onnx(tmp_path / "mlp.onnx")), db=db, budget="15s", threads=1)
    # The stuck child would run 60 s: well under that is the budget honoured (not 1.2x of it: a loaded CI machine
    # took 12 s to start and stop the child for an 8 s budget, and at load 6 an 8 s budget ended before the child
    # had written its events)
    assert time.time() - start < 15 + 25
    assert result.reason == "budget" and result.trials == 16 and result.tasks[0].best_us == 5.0, result
    assert [n for n in result.notes if "was stopped" in n], result.notes
    assert not (db / tuning.DB_FILES[1]).read_text().strip()


@pytest.mark.tune  # ~40 s of real search
def test_a_short_budget_holds_and_its_records_build(tmp_path):
    """#41 end to end: `mlc tune --budget` on a model with a concatenation ends within 1.2x its budget, and
    `mlc compile --db` builds with every record it wrote."""
    model = _fire_onnx(tmp_path / "fire.onnx")
    db = tmp_path / "db"
    start = time.time()
    summary = json.loads(run_mlc("tune", model, "--db", db, "--budget", "30s", "--json", check=True).stdout)
    assert time.time() - start < 1.2 * 30 and summary["records"] > 0, summary  # on a busy machine maybe no search
    proc = run_mlc("compile", model, "--db", db, "-o", tmp_path / "art")
    assert proc.returncode == 0 and "cannot read" not in proc.stderr, proc.stderr
    schedules = json.loads((tmp_path / "art" / "manifest.json").read_text())["compile"]["schedules"]
    assert len(schedules["tuned"]) == summary["tasks"], schedules
