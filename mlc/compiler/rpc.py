"""TVM RPC for measuring on other devices: `mlc rpc-server` (device side) and what the tuner's
RPCRunner runs in its worker. The server is TVM's own (`tvm.rpc.Server`), so the device needs the
apache-tvm wheel (TVM ships no standalone Python-free RPC server in its wheels)."""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import threading
import time
from typing import Optional

from mlc.errors import InputError


def parse_address(text: str, option: str) -> tuple[str, int]:
    match = re.fullmatch(r"([^:\s]+):(\d{1,5})", text or "")
    if not match or not 0 < int(match.group(2)) < 65536:
        raise InputError(f"{option} {text!r} must be HOST:PORT, e.g. 127.0.0.1:9190")
    return match.group(1), int(match.group(2))


def check_tracker(tracker: str, key: str, timeout_s: float = 5.0) -> None:
    """Fail fast when the tracker is unreachable or has no server under `key`: TVM's client retries a
    refused connection for a minute and the tuner then waits on a request no device will take."""
    import socket

    from tvm.rpc.client import TrackerSession

    host, port = parse_address(tracker, "--rpc-tracker")
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        session = TrackerSession((host, port))
        summary = session.summary()
        session.close()
    except (OSError, RuntimeError) as err:
        raise InputError(f"cannot reach an RPC tracker at {tracker} ({err}); start one with "
                         f"`python -m tvm.exec.rpc_tracker --port {port}`") from None
    # Servers register as "server:KEY"; clients that only asked for a key leave it in queue_info too.
    registered = sorted({info["key"].split(":", 1)[1] for info in summary.get("server_info", [])
                         if info.get("key", "").startswith("server:")})
    if key not in registered:
        raise InputError(f"no device is registered with the tracker at {tracker} under key {key!r} "
                         f"(registered: {', '.join(registered) or 'none'}); start one on the device with "
                         f"`mlc rpc-server --tracker {tracker} --key {key}"
                         f"{'' if is_loopback(host) else ' --host 0.0.0.0'}`")


def alloc_argument(session, device, args_info, alloc_repeat):
    """Random floats, zero integers: integer arguments are often indices, which TVM's gather does
    not bounds-check (random ones crash the device's server). Runs in the RPCRunner's worker."""
    import numpy as np
    import tvm

    random_fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
    repeated = []
    for _ in range(alloc_repeat):
        args = []
        for _, dtype, shape in args_info:
            shape = [int(d) for d in shape]
            if dtype.startswith(("int", "uint", "bool")):
                args.append(tvm.runtime.tensor(np.zeros(shape, dtype=dtype), device=device))
            else:
                tensor = tvm.runtime.empty(shape, dtype=dtype, device=device)
                random_fill(tensor)
                args.append(tensor)
        repeated.append(args)
    return repeated


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (a name other than localhost may resolve to any address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, port: int) -> Optional[str]:
    """The one-line warning for a server that listens beyond loopback, else None."""
    if is_loopback(host):
        return None
    return (f"warning: the RPC server listens on {host}:{port}, beyond loopback: anyone who can reach this port "
            "can run code on this device")


def serve(host: str, port: int, tracker: str | None, key: str, on_ready=lambda server: None) -> None:
    """Run a TVM RPC server until interrupted; registers with `tracker` under `key` when given.

    TVM's server worker leads its own process group (it loads and runs what clients send, in processes it
    forks per session): the terminal's Ctrl-C reaches mlc only, and stopping kills the whole group. mlc's
    SIGINT/SIGTERM handlers (cli.main) stop it; SIGHUP (the terminal closing) is handled like SIGTERM."""
    tracker_addr = parse_address(tracker, "--tracker") if tracker else None
    if tracker_addr and not key:
        raise InputError("--key is required with --tracker: it is the name tuners ask the tracker for")
    if not 0 < port < 65536:
        raise InputError(f"--port {port} must be between 1 and 65535")
    if tracker_addr and is_loopback(host) and not is_loopback(tracker_addr[0]):
        # The tracker hands tuners on other machines this server's address: they could not connect.
        raise InputError(f"--tracker {tracker} is another machine, whose tuners connect to this server; listen "
                         "where they can reach it, e.g. --host 0.0.0.0")
    from tvm import rpc

    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread and callable(signal.getsignal(signal.SIGTERM)):
        signal.signal(signal.SIGHUP, signal.getsignal(signal.SIGTERM))
    server = None
    try:
        server = rpc.Server(host=host, port=port, port_end=port + 100, tracker_addr=tracker_addr, key=key,
                            silent=True, server_init_callback=os.setsid)
        on_ready(server)
        while True:  # the server runs in TVM's worker process until mlc is interrupted
            time.sleep(1)
    finally:
        _stop(server, in_main_thread)


def _stop(server, in_main_thread: bool) -> None:
    """Kill TVM's server worker, its process group and anything else under this process, then reap them.
    A second Ctrl-C meanwhile is ignored: cutting this short would leave them running."""
    import psutil

    ignored = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               } if in_main_thread else {}
    try:
        tree = psutil.Process().children(recursive=True)  # listed first: a killed parent's children leave the tree
        for process in tree:
            try:
                if os.getpgid(process.pid) == process.pid:  # a group leader: the server worker (os.setsid)
                    os.killpg(process.pid, signal.SIGKILL)
                process.kill()
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        if server is not None:
            server.terminate()  # TVM's bookkeeping; reaps its worker
        psutil.wait_procs(tree, timeout=5)
    finally:
        for sig, handler in ignored.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, handler)


def measure_once(tracker: str, key: str, timeout: int = 60) -> float:
    """Build a small kernel here, run it on a device from the tracker; returns its mean seconds.
    (`mlc rpc-server` users check their setup with it; the tests use it on loopback.)"""
    import tempfile
    from pathlib import Path

    import numpy as np
    import tvm
    from tvm import rpc, te

    host, port = parse_address(tracker, "--rpc-tracker")
    n = 256
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    lib = tvm.compile(te.create_prim_func([a, b, c]), target="llvm")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.so"
        lib.export_library(str(path))
        session = rpc.connect_tracker(host, port).request(key, session_timeout=timeout)
        session.upload(str(path))
        remote = session.load_module("kernel.so")
        dev = session.cpu()
        args = [tvm.runtime.tensor(np.ones((n, n), "float32"), dev) for _ in range(3)]
        timer = remote.time_evaluator(remote.entry_name, dev, number=3, repeat=1)
        mean = timer(*args).mean
        if not np.allclose(args[2].numpy(), n):
            raise RuntimeError("the remote kernel computed a wrong result")
        return mean
