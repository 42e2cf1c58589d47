"""mlc.child_process, the child-process protocol every worker speaks, with a tiny worker module (no TVM, no
framework)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mlc import child_process
from mlc.errors import CompilerError, InputError, UnsupportedModelError

REPO = Path(__file__).resolve().parent.parent

CHILD = '''
import os, signal, sys, time

from mlc import child_process
from mlc.errors import CompilerError


def handler(request):
    mode = request["mode"]
    if mode == "ok":
        return {"ok": True, "echo": request["value"], "env": os.environ.get("MLC_PROC_TEST")}
    if mode == "typed":
        return child_process.WorkerResult.failure("pass", "the pass cannot", stage="passes", op="Erf")
    if mode == "mlc":
        raise CompilerError("bad model\\nsecond line", stage="build")
    if mode == "raise":
        print("some framework chatter", flush=True)
        raise ValueError("first line\\nsecond line\\n")
    if mode == "segv":
        print("last words before the crash", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "exit":  # without a result
        os._exit(request["status"])
    open(request["ready"], "w").write(str(os.getpid()))
    if mode == "sleep":
        time.sleep(120)
    if mode == "stop":  # a worker that honours the stop request
        while not child_process.stop_requested():
            time.sleep(0.05)
        return {"ok": True, "stopped": True}
    if mode == "stubborn":  # ignores it: killed after the grace period
        time.sleep(120)
    if mode == "chatty":  # silent on CPU, but writing to its log
        for _ in range(15):
            print("still going", flush=True)
            time.sleep(0.2)
        return {"ok": True}
    if mode == "busy":  # silent, but computing
        end = time.monotonic() + 3
        while time.monotonic() < end:
            pass
        return {"ok": True}


if __name__ == "__main__":
    sys.exit(child_process.serve(sys.argv[1:], handler, graceful_stop=True))
'''


@pytest.fixture
def child(tmp_path):
    (tmp_path / "proc_child.py").write_text(CHILD)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "MLC_PROC_TEST": "passed through"}

    def run(request: dict, **options):
        options.setdefault("env", env)
        return child_process.run("proc_child", request, tmp_path / "job.request.json", "the test child", **options)

    return run


def _gone(pid: int) -> bool:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_result_comes_back_typed_with_the_environment(child, tmp_path):
    polls = []
    result, log = child({"mode": "ok", "value": [1, 2]}, poll=lambda: polls.append(1))
    assert result == child_process.WorkerResult(True, payload={"echo": [1, 2], "env": "passed through"})
    assert result.as_dict() == {"ok": True, "echo": [1, 2], "env": "passed through"}
    assert polls and log.exists()  # the caller decides whether the log is worth keeping
    log.unlink()
    assert (tmp_path / "job.request.result.json").exists()


def test_worker_kinds_and_stage_pass_through(child):
    result, log = child({"mode": "typed"})
    log.unlink()
    assert (result.ok, result.kind, result.stage, result.message) == (False, "pass", "passes", "the pass cannot")
    assert result.as_dict() == {"ok": False, "kind": "pass", "stage": "passes", "message": "the pass cannot",
                                "op": "Erf"}


def test_mlc_error_is_raised_again_with_class_and_stage(child):
    result, log = child({"mode": "mlc"})
    log.unlink()
    assert result.kind == child_process.ERROR
    error = result.error()
    assert type(error) is CompilerError and error.stage == "build" and str(error) == "bad model\\nsecond line"


def test_unforeseen_exception_is_one_line_and_the_traceback_is_logged(child):
    result, log = child({"mode": "raise"})
    assert result.kind == child_process.EXCEPTION and result.message == "ValueError: first line"
    text = log.read_text()
    log.unlink()
    assert "Traceback" in text and "second line" in text


def test_segfault_names_the_signal_the_last_log_line_and_the_log(child):
    with pytest.raises(CompilerError) as caught:
        child({"mode": "segv"})
    message = str(caught.value)
    assert message.startswith("the test child was killed by SIGSEGV: last words before the crash (full log: ")
    log = Path(message.rsplit("(full log: ", 1)[1].rstrip(")"))
    text = log.read_text()
    assert "last words before the crash" in text and "\n" not in message
    assert "Fatal Python error: Segmentation fault" in text  # faulthandler's dump, after the last words
    log.unlink()


@pytest.mark.parametrize("status", [3, 0])
def test_exit_without_result_is_an_error_whatever_was_left_before(child, tmp_path, status):
    (tmp_path / "job.request.result.json").write_text('{"ok": true, "payload": {}}')  # from an earlier run
    with pytest.raises(CompilerError, match=rf"^the test child exited with status {status} \(full log: ") as caught:
        child({"mode": "exit", "status": status})
    Path(str(caught.value).rsplit("(full log: ", 1)[1].rstrip(")")).unlink()


def test_timeout_kills_the_child(child, tmp_path):
    ready = tmp_path / "ready"
    start = time.monotonic()
    with pytest.raises(CompilerError, match=r"^the test child ran longer than 2 s and was stopped \(log: ") as caught:
        child({"mode": "sleep", "ready": str(ready)}, timeout=2, poll=lambda: None)
    assert time.monotonic() - start < 20
    assert _gone(int(ready.read_text()))
    Path(str(caught.value).rsplit("(log: ", 1)[1].rstrip(")")).unlink()


def test_a_child_without_progress_is_killed_as_stalled(child, tmp_path):
    ready = tmp_path / "ready"
    start = time.monotonic()
    with pytest.raises(CompilerError, match=r"^the test child made no progress for 1 s \(wrote nothing to its log, "
                                            r"used no CPU\) and was stopped; MLC_STALL_TIMEOUT=SECONDS changes "
                                            r"this limit, 0 removes it \(log: ") as caught:
        child({"mode": "sleep", "ready": str(ready)}, stall_s=1)
    assert time.monotonic() - start < 30
    assert _gone(int(ready.read_text()))
    Path(str(caught.value).rsplit("(log: ", 1)[1].rstrip(")")).unlink()


@pytest.mark.parametrize("mode", ["chatty", "busy"])
def test_a_child_that_writes_or_computes_is_not_stalled(child, tmp_path, mode):
    result, log = child({"mode": mode, "ready": str(tmp_path / "ready")}, stall_s=1)  # 3 s of work
    log.unlink()
    assert result.ok


def test_stall_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(child_process.STALL_ENV, raising=False)
    assert child_process.stall_limit() == child_process.DEFAULT_STALL_S == 1800
    monkeypatch.setenv(child_process.STALL_ENV, "0")
    assert child_process.stall_limit() == 0
    monkeypatch.setenv(child_process.STALL_ENV, "90")
    assert child_process.stall_limit() == 90
    monkeypatch.setenv(child_process.STALL_ENV, "nan")
    with pytest.raises(InputError, match="^MLC_STALL_TIMEOUT must be a number of seconds"):
        child_process.stall_limit()


def _interrupt_when(ready: Path):
    def poll():
        if ready.exists() and ready.read_text():
            raise KeyboardInterrupt
    return poll


def test_interrupt_asks_the_child_to_stop_and_lets_it_finish(child, tmp_path):
    ready, stops = tmp_path / "ready", []
    with pytest.raises(KeyboardInterrupt):
        child({"mode": "stop", "ready": str(ready)}, poll=_interrupt_when(ready), stop_grace_s=30,
              on_stop=lambda: stops.append(1), log_prefix="mlc-proc-test-")
    assert stops == [1]
    result = child_process.read_result(tmp_path / "job.request.json")
    assert result is not None and result.ok and result.payload == {"stopped": True}  # it got to write its result


def test_interrupt_kills_a_child_that_does_not_stop_in_time(child, tmp_path):
    ready = tmp_path / "ready"
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        child({"mode": "stubborn", "ready": str(ready)}, poll=_interrupt_when(ready), stop_grace_s=1)
    assert 1 <= time.monotonic() - start < 30
    assert _gone(int(ready.read_text()))
    assert child_process.read_result(tmp_path / "job.request.json") is None


def test_interrupt_without_grace_kills_at_once(child, tmp_path):
    ready = tmp_path / "ready"
    with pytest.raises(KeyboardInterrupt):
        child({"mode": "stop", "ready": str(ready)}, poll=_interrupt_when(ready))
    assert _gone(int(ready.read_text())) and child_process.read_result(tmp_path / "job.request.json") is None


def test_one_line():
    assert child_process.one_line(RuntimeError("\n  \nfirst\nsecond")) == "RuntimeError: first"
    assert child_process.one_line(KeyError()) == "KeyError: "


def test_compile_worker_results_map_to_errors():
    """compile_in_worker's reading of the compile worker's kinds (here without running TVM)."""
    from mlc.compiler.client import _check_result

    payload = {"tvm_version": "0.27", "outputs": [], "timings": {}, "pass_records": []}
    ok = child_process.WorkerResult.success(payload)
    assert _check_result(ok, None).to_json() == {**payload, "notes": [], "kernels": {}, "schedules": None,
                                                  "weights": None, "precision": "fp32", "left_out": [],
                                                  "gpu_code": None}
    with pytest.raises(CompilerError, match="^TVM failed during build: boom$") as caught:
        _check_result(child_process.WorkerResult.from_dict({"ok": False, "kind": "compile", "stage": "build",
                                                    "message": "boom"}), None)
    assert caught.value.stage == "build"
    with pytest.raises(UnsupportedModelError, match="Erf x1"):
        _check_result(child_process.WorkerResult.failure("unsupported", "",
                                                          ops={"Erf": {"count": 1, "first_nodes": ["e"]}}), None)


def test_log_tail_skips_stack_dumps(tmp_path):
    log = tmp_path / "w.log"
    log.write_text("compiling\n!!!!!!! Segfault encountered !!!!!!!\n  File \"<unknown>\", line 0, in _start\n"
                   "  File \"<unknown>\", line 0, in 0xffffffffffffffff\n\n")
    assert child_process.log_tail(log) == "Segfault encountered"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    boom()\n"
                   "ValueError: boom\n")
    assert child_process.log_tail(log) == "ValueError: boom"
    log.write_text("  File \"a\", line 1\n")  # nothing but frames: the last line still says something
    assert child_process.log_tail(log) == 'File "a", line 1'
    assert child_process.log_tail(tmp_path / "missing.log") == ""
