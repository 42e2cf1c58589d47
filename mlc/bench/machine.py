"""What a benchmark ran on, recorded with every result."""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import subprocess
from pathlib import Path
from importlib import metadata

from mlc.errors import TargetError
from mlc.targets import host_cpu_name, resolve, usable_cores

# Settings that change how thread pools behave; recorded when set (children inherit them).
ENVIRONMENT = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_PROC_BIND", "GOMP_SPINCOUNT", "TVM_BIND_THREADS",
               "TVM_EXCLUDE_WORKER0", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
PACKAGES = ("mlc", "apache-tvm", "apache-tvm-ffi", "onnx", "onnxruntime", "onnxslim", "numpy", "torch",
            "tensorflow", "tensorflow-cpu", "paddlepaddle", "transformers", "openvino", "torchvision", "timm")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def load_average() -> list[float] | None:
    """1/5/15-minute load averages: on a shared machine, the context every timing needs."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def source_commit() -> str | None:
    """The mlc checkout's commit (short hash, "-dirty" with uncommitted changes), or None outside a git checkout:
    a table may only put side by side the records of one commit (`mlc report`, benchmarks/suites/merge.py)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():  # an installed copy, not the checkout
        return None
    try:
        proc = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=root,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def _llvm_cpu() -> str | None:
    """The instruction set the host target compiles for (haswell: AVX2, cooperlake: AVX-512 ...):
    VM model names ("Intel(R) Xeon(R) Processor") often hide it."""
    try:
        return resolve("x86").tvm["mcpu"]
    except TargetError:  # not an x86 host
        return None


def machine_info() -> dict:
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": source_commit(),
        "host": socket.gethostname(),
        "cpu": host_cpu_name(),
        "llvm_cpu": _llvm_cpu(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cores_usable": usable_cores(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "load_average": load_average(),
        "versions": {p: v for p in PACKAGES if (v := _version(p))},
        "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ},
    }
