"""What every framework frontend gives the frontend worker, and the registry of frameworks.

A frontend runs only inside the frontend worker process (`python -m mlc.pipeline.convert_worker`),
one framework per process: tensorflow and paddle segfault when imported together, and a framework
crash must not take mlc down. This module imports no framework."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from mlc.errors import InputError, MissingDependencyError


@dataclass
class InputDecl:
    name: str  # the name the exported ONNX graph input carries
    dtype: str  # numpy dtype name, e.g. "float32", "int64"
    dims: list[int | str]  # ints are fixed; strings are symbolic dims ("batch", "seq", ...)


@dataclass
class FrameworkModel:
    """A model loaded in its own framework, able to export itself to ONNX and to run eagerly."""

    framework: str  # a FRAMEWORKS key
    inputs: list[InputDecl]  # in the exported ONNX graph's input order
    example_sizes: dict[str, int]  # sizes of the symbolic dims used for tracing/export
    # (onnx_path, dynamic dim names) -> writes the ONNX file, the named dims symbolic, the others
    # fixed at example_sizes; returns a description of the exporter that ran.
    export: Callable[[Path, set[str]], str]
    # The original framework, eagerly: inputs in ONNX input order -> flattened outputs in ONNX output order.
    eager: Callable[[list[np.ndarray]], list[np.ndarray]]
    notes: list[str] = field(default_factory=list)
    # The framework's own model object (torch nn.Module, keras Model, paddle Layer), called as
    # native(*inputs) in ONNX input order; benchmarks build their compiled baselines from it
    # (torch.compile, TorchScript, tf.function, paddle.jit.to_static). None when not available.
    native: Any = None
    # The user gave example inputs (a factory, a .pt2): their sizes are the reference and compile shapes.
    user_examples: bool = False
    # Dims the model itself declares dynamic (a .pt2's torch.export Dims), {dim: (min, max) or None}: without
    # --dynamic they stay symbolic, as the program allows.
    declared_dynamic: dict[str, Optional[tuple[int, int]]] = field(default_factory=dict)

    def symbolic_dims(self) -> list[str]:
        return list(dict.fromkeys(d for i in self.inputs for d in i.dims if isinstance(d, str)))


@dataclass(frozen=True)
class Framework:
    name: str
    display: str  # as users write it in prose
    package: str  # the import name whose version is recorded
    extra: str  # pip extra that installs it
    module: str  # the mlc frontend module (detect / open_model)
    aliases: tuple[str, ...] = ()

    def install_hint(self) -> str:
        return f"pip install 'mlc[{self.extra}]'"

    def require(self) -> None:
        """MissingDependencyError (exit 4) when the framework is not installed."""
        if importlib.util.find_spec(self.package) is None:
            raise MissingDependencyError(f"{self.display} is not installed; install it with: {self.install_hint()}")

    def frontend(self):
        return importlib.import_module(self.module)


FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in [
        Framework("torch", "PyTorch", "torch", "torch", "mlc.frontends.torch", ("pytorch", "pt")),
        Framework("tensorflow", "TensorFlow", "tensorflow", "tf", "mlc.frontends.tensorflow", ("tf", "keras")),
        Framework("paddle", "PaddlePaddle", "paddle", "paddle", "mlc.frontends.paddle", ("paddlepaddle",)),
    ]
}
ONNX = "onnx"  # handled in the parent process, no worker


def framework_names() -> list[str]:
    return [ONNX, *FRAMEWORKS]


def resolve_framework(name: str) -> str:
    """A user's --framework value to a FRAMEWORKS key (or "onnx")."""
    key = name.strip().lower()
    if key == ONNX:
        return ONNX
    for framework in FRAMEWORKS.values():
        if key == framework.name or key in framework.aliases:
            return framework.name
    raise InputError(f"unknown framework {name!r}; choose one of: {', '.join(framework_names())}")


def detect(source: str) -> Optional[str]:
    """The framework of a model file or folder, from its name and layout (no framework import)."""
    if Path(source).suffix.lower() == ".onnx":
        return ONNX
    for framework in FRAMEWORKS.values():
        try:
            if framework.frontend().detect(source):
                return framework.name
        except ImportError:  # a frontend module not in this build
            continue
    return None


def dim_axes(decls: list[InputDecl]) -> dict[str, dict[int, str]]:
    """{input name: {axis: symbolic name}} — the shape of torch's `dynamic_axes` and friends."""
    return {d.name: {axis: dim for axis, dim in enumerate(d.dims) if isinstance(dim, str)} for d in decls}
