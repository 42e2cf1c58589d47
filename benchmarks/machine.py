"""What a benchmark ran on, recorded with every result."""

from __future__ import annotations

import datetime as dt
import os
import platform
from importlib import metadata

from mlc.targets import host_cpu_name, usable_cores


def machine_info() -> dict:
    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": host_cpu_name(),
        "machine": platform.machine(),
        "cores_usable": usable_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {p: version(p) for p in ("mlc", "apache-tvm", "apache-tvm-ffi", "onnx", "onnxruntime", "onnxslim", "numpy")},
    }
