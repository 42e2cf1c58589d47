"""The apache-tvm mlc pins and where it is installed, found without importing it (that takes ~6 s): the parent
(client), the importer's op check and the runtime packager all need it, and none may import the others for it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mlc.errors import MissingDependencyError

TVM_PIN = "apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1"


def tvm_package_dir() -> Path:
    """Where the apache-tvm package is installed, found without importing it (that takes ~6 s)."""
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"Apache TVM is not installed; run: pip install {TVM_PIN}")
    return Path(list(spec.submodule_search_locations)[0])
