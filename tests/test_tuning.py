"""mlc tune / compile --db / default CPU schedules / RPC. The unmarked tests run in CI (~2 min here):
a tiny MLP tuned with a few trials per kernel. `-m tune` adds interruption and loopback RPC."""

from __future__ import annotations

import json
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
