"""The one child-process protocol every mlc worker speaks (compile, tuning, frontend, benchmark).

The parent writes a request as JSON and runs `python -m MODULE REQUEST.json` in its own process group
with its output in a log file (`run`). The child's `main` is `serve(argv, handler)`: it reads the
request, calls the handler, and writes a `WorkerResult` as JSON beside the request, whole or not at
all. A child that dies without one (segfault, abort, OOM kill), runs past its timeout, or makes no
progress for STALL_ENV seconds (default 30 min) is a one-line CompilerError naming the signal or
status, the log's last line and the log file.

No tvm and no framework here: the parent imports this module too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from mlc import errors
from mlc.errors import CompilerError, MlcError

# Kinds of failure that serve() itself reports; workers add their own (the compile worker: "target", ...).
ERROR = "error"  # the handler raised an MlcError: payload["error"] names its class
EXCEPTION = "exception"  # the handler raised anything else (a framework's or TVM's error): its traceback is in the log

POLL_S = 0.3  # how often run() calls `poll` while the child runs
# Seconds a child may go without writing to its log or using CPU before it is killed as stalled; 0: no limit.
# Generous: a deadlocked child uses no CPU at all, and a long TVM build keeps a core busy.
STALL_ENV = "MLC_STALL_TIMEOUT"
DEFAULT_STALL_S = 1800.0
_STALL_CPU_SHARE = 0.05  # CPU time, as a share of the limit, that counts as progress (idle wake-ups stay far below)


@dataclass(frozen=True)
class WorkerResult:
    """What a worker reports. `kind` says which failure (None on success); `stage` the step that failed,
    where the worker knows it; `message` is one line; `payload` holds the rest (the worker's own keys)."""

    ok: bool
    kind: Optional[str] = None
    stage: Optional[str] = None
    message: str = ""
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def success(cls, payload: Optional[Mapping[str, Any]] = None) -> "WorkerResult":
        return cls(True, payload=dict(payload or {}))

    @classmethod
    def failure(cls, kind: str, message: str, stage: Optional[str] = None, **payload) -> "WorkerResult":
        return cls(False, kind, stage, message, payload)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WorkerResult":
        """A handler's flat dict ({"ok": ..., "kind": ..., other keys}) or as_dict()'s output."""
        rest = {k: v for k, v in data.items() if k not in ("ok", "kind", "stage", "message")}
        return cls(bool(data["ok"]), data.get("kind"), data.get("stage"), data.get("message") or "", rest)

    def as_dict(self) -> dict[str, Any]:
        """The flat dict callers read: the payload with "ok" (and on failure "kind", "stage", "message")."""
        if self.ok:
            return {"ok": True, **self.payload}
        return {**self.payload, "ok": False, "kind": self.kind, "stage": self.stage, "message": self.message}

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "kind": self.kind, "stage": self.stage, "message": self.message, "payload": self.payload}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "WorkerResult":
        return cls(bool(data["ok"]), data.get("kind"), data.get("stage"), data.get("message") or "",
                   dict(data.get("payload") or {}))

    def error(self, default: type[MlcError] = errors.InputError) -> MlcError:
        """The MlcError the child raised (kind ERROR), to raise again in the parent."""
        cls = getattr(errors, str(self.payload.get("error")), None)
        if not (isinstance(cls, type) and issubclass(cls, MlcError)):
            cls = default
        if issubclass(cls, CompilerError):
            return cls(self.message, stage=self.stage)
        return cls(self.message)


def large_blocks_mapped(threshold: int = 1 << 20) -> None:
    """Make glibc serve blocks of `threshold` bytes and more by mmap, so freeing one gives it back: with its default
    (a threshold that grows up to 32 MB) a model's tensors filled the heap, which stayed fragmented (bert-base's
    compile kept 0.8 GB it had freed; 0.4 GB with this)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def release_memory() -> None:
    """Give freed memory back to the system after dropping a model's weights: glibc keeps large freed blocks in
    its heap, and a process's RSS stayed at its peak (bert-base: 2.9 GB) for the rest of a compile."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def one_line(e: BaseException) -> str:
    """'Type: first line of the message' of an exception from code we do not control."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if lines and lines[0] in _HEADERS:  # a header over a traceback: the cause is the last line
        cause = lines[-1][:300]
        return cause if cause.split(":")[0].endswith(("Error", "Exception")) else f"{type(e).__name__}: {cause}"
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


# First lines that only say an error follows (a TorchScript module's errors, raised in its interpreter).
_HEADERS = ("The following operation failed in the TorchScript interpreter.",)


def result_path(request_path: Path) -> Path:
    """Where the child writes its result for the request at `request_path`."""
    return Path(request_path).with_suffix(".result.json")


def write_result(request_path: Path, result: WorkerResult) -> None:
    """The child side: the result appears whole or not at all."""
    tmp = Path(request_path).with_suffix(".result.tmp")
    tmp.write_text(json.dumps(result.to_json()))
    tmp.replace(result_path(request_path))


def read_result(request_path: Path) -> Optional[WorkerResult]:
    path = result_path(request_path)
    return WorkerResult.from_json(json.loads(path.read_text())) if path.exists() else None


# --- the child side ---------------------------------------------------------------------------------------

_stop = {"requested": False}


def stop_requested() -> bool:
    """In a child served with graceful_stop: whether the parent asked it to stop (Ctrl-C in mlc)."""
    return _stop["requested"]


def _request_stop(_signum, _frame) -> None:
    # A flag, not an exception: raising inside a callback that C++ called (TVM's tuner) would abort the process.
    _stop["requested"] = True


Handler = Callable[[dict], Union[WorkerResult, Mapping[str, Any]]]


def handle(request: dict, handler: Handler, describe: Callable[[BaseException], str] = one_line) -> WorkerResult:
    """`handler(request)` as a WorkerResult: an MlcError becomes kind ERROR (its class and stage kept) for the
    parent to raise again; anything else kind EXCEPTION, described in one line, its traceback printed (to the log)."""
    try:
        value = handler(request)
    except MlcError as e:
        return WorkerResult.failure(ERROR, str(e), getattr(e, "stage", None), error=type(e).__name__)
    except Exception as e:  # an error we did not foresee: the log has the traceback
        traceback.print_exc()
        return WorkerResult.failure(EXCEPTION, describe(e), error=type(e).__name__)
    return value if isinstance(value, WorkerResult) else WorkerResult.from_dict(value)


def die_on_fatal_signals() -> None:
    """Make a crash end this process at once, Python's stack dump (faulthandler) in the log, then the signal's
    default action. libtvm_ffi.so installs a SIGSEGV handler when it loads that builds a backtrace with malloc
    and a mutex: a segfault inside malloc (a corrupted heap) deadlocked the worker there for ever. So a worker
    that uses TVM loads tvm_ffi before serve() calls this."""
    import faulthandler

    faulthandler.disable()  # it chains to the handlers it replaced: TVM's among them
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    faulthandler.enable()


def serve(argv: list[str], handler: Handler, describe: Callable[[BaseException], str] = one_line,
          graceful_stop: bool = False) -> int:
    """Every worker module's main(): argv is [REQUEST.json]. With `graceful_stop`, SIGINT and SIGTERM only set
    the flag stop_requested() reads, for a handler that finishes its current step and returns."""
    die_on_fatal_signals()
    if graceful_stop:
        signal.signal(signal.SIGINT, _request_stop)
        signal.signal(signal.SIGTERM, _request_stop)
    request_path = Path(argv[0])
    write_result(request_path, handle(json.loads(request_path.read_text()), handler, describe))
    return 0


# --- the parent side --------------------------------------------------------------------------------------

def stall_limit() -> float:
    """Seconds a child may make no progress (STALL_ENV, else DEFAULT_STALL_S); 0: no limit."""
    text = os.environ.get(STALL_ENV, "").strip()
    if not text:
        return DEFAULT_STALL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise errors.InputError(f"{STALL_ENV} must be a number of seconds (0: no limit), not {text!r}")
    return value


def run(module: str, request: Mapping[str, Any], request_path: Path, what: str, *,
        timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
        poll: Optional[Callable[[], None]] = None, stop_grace_s: Optional[float] = None,
        on_stop: Callable[[], None] = lambda: None, log_prefix: str = "mlc-worker-",
        stall_s: Optional[float] = None) -> tuple[WorkerResult, Path]:
    """Write `request` to `request_path`, run `python -m module REQUEST` and return its result and log's path
    (the caller deletes the log when it is not worth keeping). `what` names the child in messages.

    The child runs in its own session and process group: the terminal's Ctrl-C reaches mlc only, and a kill
    also ends the processes it started (compiler pools). `env` is added to this process's environment.
    `poll` is called every POLL_S seconds while the child runs and once after it ends.

    Interrupted (Ctrl-C): without `stop_grace_s` the group is killed at once; with it the child gets SIGINT
    (serve(graceful_stop=True) turns it into stop_requested()), `on_stop()` is called, and the group is killed
    only if it is still running `stop_grace_s` seconds later. Either way the log is deleted and the
    interrupt goes on. A child still running after `timeout` seconds, or one that neither writes to its log
    nor uses CPU (with its own children) for `stall_s` seconds (None: stall_limit(); 0: no limit), is killed
    with its group, and a child that ends without a result is a CompilerError naming the log."""
    stall_s = stall_limit() if stall_s is None else stall_s
    request_path = Path(request_path)
    request_path.write_text(json.dumps(request))
    result_path(request_path).unlink(missing_ok=True)  # a stale result must not pass for this run's
    child_env = {**os.environ, **env} if env else None
    with tempfile.NamedTemporaryFile("w", prefix=log_prefix, suffix=".log", delete=False) as log:
        log_path = Path(log.name)
        proc = subprocess.Popen([sys.executable, "-m", module, str(request_path)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=child_env)
        try:
            _wait(proc, timeout, poll, _StallWatch(proc, log_path, stall_s) if stall_s else None)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise CompilerError(f"{what} ran longer than {timeout:g} s and was stopped (log: {log_path})") from None
        except _Stalled:
            kill_group(proc)
            raise CompilerError(f"{what} made no progress for {stall_s:g} s (wrote nothing to its log, used no CPU) "
                                f"and was stopped; {STALL_ENV}=SECONDS changes this limit, 0 removes it "
                                f"(log: {log_path})") from None
        except BaseException:  # interrupted: nothing to show the user
            try:
                if stop_grace_s is not None:
                    _stop_gracefully(proc, stop_grace_s, on_stop)
            finally:
                kill_group(proc)
                log_path.unlink(missing_ok=True)
            raise
    if poll is not None:
        poll()
    result = read_result(request_path)
    if proc.returncode != 0 or result is None:
        raise CompilerError(f"{crash_text(what, proc.returncode, log_path)} (full log: {log_path})")
    return result, log_path


class _Stalled(Exception):
    """The child made no progress for its stall limit."""


class _StallWatch:
    """Progress of a child: its log grew, or it and its descendants used CPU (_STALL_CPU_SHARE of the limit, at
    most a second)."""

    def __init__(self, proc: subprocess.Popen, log_path: Path, limit_s: float):
        self.proc, self.log_path, self.limit_s = proc, log_path, limit_s
        self.every_s = min(5.0, limit_s / 4)  # reading the process tree costs a scan of /proc
        self.cpu_s = min(1.0, limit_s * _STALL_CPU_SHARE)
        self.size, self.cpu, self.since, self.checked = -1, 0.0, time.monotonic(), 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now - self.checked < self.every_s:
            return
        self.checked = now
        try:
            size = self.log_path.stat().st_size
        except OSError:
            size = self.size
        cpu = _cpu_seconds(self.proc.pid)
        if size != self.size or cpu >= self.cpu + self.cpu_s:
            self.size, self.cpu, self.since = size, cpu, now
        elif cpu < self.cpu:  # a descendant ended and took its CPU time along: measure from here
            self.cpu = cpu
        elif now - self.since >= self.limit_s:
            raise _Stalled


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its live descendants (and the children it reaped)."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
        if process is root:
            total += times.children_user + times.children_system
    return total


def _wait(proc: subprocess.Popen, timeout: Optional[float], poll: Optional[Callable[[], None]],
          watch: Optional[_StallWatch] = None) -> None:
    if poll is None and watch is None:
        proc.wait(timeout=timeout)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    while proc.poll() is None:
        if poll is not None:
            poll()
        if watch is not None:
            watch.check()
        left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            pass


def _stop_gracefully(proc: subprocess.Popen, grace_s: float, on_stop: Callable[[], None]) -> None:
    """SIGINT to the child alone (its pools are its own business), then wait up to `grace_s` seconds."""
    try:
        proc.send_signal(signal.SIGINT)
    except ProcessLookupError:
        return
    on_stop()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (it leads it: start_new_session) and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def crash_text(what: str, returncode: int, log_path: Path) -> str:
    """'WHAT was killed by SIGSEGV: LAST LOG LINE' / 'WHAT exited with status 1: ...' for a child without a result."""
    if returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"was killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    tail = log_tail(log_path)
    return f"{what} {how}{': ' + tail if tail else ''}"


# Lines of a stack dump (Python's, or the one TVM prints on a segfault): the line before them says what happened.
_FRAME_LINES = ("File ", "Traceback", "Stack trace", "at ", "^", "~")
# faulthandler's dump on a fatal signal (die_on_fatal_signals): its header repeats the signal the message names.
_FAULT_DUMP_LINES = ("Fatal Python error: ", "Thread 0x", "Current thread 0x", "<no Python frame>",
                     "Extension modules: ")


def log_tail(log_path: Path) -> str:
    """What the child said last before it died: the log's last line that is not part of a stack dump
    (TVM's "!!!!!!! Segfault encountered !!!!!!!" becomes "Segfault encountered"), cut to 300 characters."""
    try:
        lines = [ln.strip() for ln in Path(log_path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if not ln.startswith(_FAULT_DUMP_LINES)]
    said = [ln for ln in lines if not ln.startswith(_FRAME_LINES)] or lines
    return said[-1].strip("! ")[:300] if said else ""
