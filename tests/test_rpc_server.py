"""`mlc rpc-server` (mlc/compiler/rpc.py): where it listens, and that stopping it ends every process it started.
The two server tests take ~15 s each here (an `import tvm` in the server and one in a client)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from helpers import assert_clean_error, run_mlc
from mlc.compiler import rpc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exposure_warning_only_beyond_loopback():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert rpc.is_loopback(host) and rpc.exposure_warning(host, 9090) is None
    for host in ("0.0.0.0", "::", "192.168.1.5", "device.local"):
        warning = rpc.exposure_warning(host, 9090)
        assert warning and f"{host}:9090" in warning and "run code on this device" in warning and "\n" not in warning


def test_remote_tracker_with_a_loopback_server_is_refused():
    """Tuners elsewhere get this server's address from the tracker: on 127.0.0.1 they could never connect."""
    assert_clean_error(run_mlc("rpc-server", "--tracker", "192.0.2.1:9190", "--key", "pi"), 1,
                       "--tracker 192.0.2.1:9190 is another machine", "--host 0.0.0.0")
    assert_clean_error(run_mlc("rpc-server", "--port", "70000"), 1, "--port 70000 must be between 1 and 65535")


@pytest.fixture
def server():
    """Start `mlc rpc-server ARGS` (in its own session, as a shell job would be) and wait for its listening line;
    returns (process, port, first stderr line). Whatever a test leaves running is killed afterwards."""
    started = []

    def start(*args: str):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "mlc", "rpc-server", "--port", str(port), *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, "COLUMNS": "200"})
        started.append(proc)
        line = proc.stderr.readline()  # blocks until it listens (or dies)
        return proc, port, line

    yield start
    for proc in started:
        for process in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            process.kill()
        proc.kill()
        proc.wait()


def _connect_client(port: int) -> subprocess.Popen:
    """A TVM RPC client holding a session open: the server forks a process for it."""
    code = (f"import time; from tvm import rpc; s = rpc.connect('127.0.0.1', {port}); print('connected', flush=True); "
            "time.sleep(120)")
    client = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    assert client.stdout.readline().strip() == "connected"
    return client


def _session_tree(pid: int, timeout_s: float = 30) -> list[psutil.Process]:
    """The server's processes once its session process exists: TVM's worker and the process it forked."""
    deadline = time.time() + timeout_s
    while True:
        tree = psutil.Process(pid).children(recursive=True)
        if len(tree) >= 2 or time.time() > deadline:
            return tree
        time.sleep(0.1)


def _left_running(tree: list[psutil.Process]) -> list[psutil.Process]:
    time.sleep(1)
    return [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_listens_on_loopback_by_default_and_sigterm_ends_every_process(server):
    proc, port, line = server()
    assert line.startswith(f"RPC server listening on 127.0.0.1:{port};"), line
    listening = [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"]
    client = _connect_client(port)
    try:
        tree = _session_tree(proc.pid)
        assert len(tree) >= 2, tree
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        client.kill()
        client.wait()
    assert "Traceback" not in proc.stderr.read()
    assert not _left_running(tree), "the server left processes behind"


def test_ctrl_c_ends_every_process_without_a_traceback(server):
    """The terminal sends Ctrl-C's SIGINT to the whole foreground group: TVM's session process printed a
    KeyboardInterrupt traceback before its worker led a group of its own."""
    proc, port, line = server("--host", "127.0.0.1")
    assert "listening" in line, line
    client = _connect_client(port)
    try:
        tree = _session_tree(proc.pid)
        time.sleep(1)  # into TVM's session loop, which a SIGINT there interrupts
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 128 + signal.SIGINT
    finally:
        client.kill()
        client.wait()
    rest = proc.stderr.read()
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    assert not _left_running(tree), "the server left processes behind"
