"""Frontends turn a user's model into ONNX plus the source framework's eager outputs.

ONNX files are read in this process (frontends/onnx.py). PyTorch, TensorFlow and Paddle models are
converted in a child process (frontends/worker.py), one framework per process."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from mlc.frontends.base import FRAMEWORKS, ONNX, detect, framework_names, resolve_framework
from mlc.errors import InputError

__all__ = ["Converted", "convert", "parse_dynamic", "detect", "framework_names", "resolve_framework", "ONNX"]


@dataclass
class Converted:
    """A framework model exported to ONNX, with its eager outputs on the feeds mlc chose."""

    onnx_path: Path
    framework: str
    framework_version: str
    exporter: str
    feeds: dict[str, np.ndarray]
    eager: dict[str, np.ndarray]  # by ONNX output name
    dynamic: list[str]
    notes: list[str] = field(default_factory=list)


_DYNAMIC = re.compile(r"^([A-Za-z_][\w.]*)(?:=(\d+)\.\.(\d+))?$")


def parse_dynamic(values: Sequence[str]) -> Optional[dict[str, Optional[tuple[int, int]]]]:
    """`--dynamic batch,seq` / `--dynamic seq=1..512` (repeatable) -> {dim: range or None};
    None when not given (the model's own symbolic dims all stay dynamic)."""
    if not values:
        return None
    dims: dict[str, Optional[tuple[int, int]]] = {}
    for value in values:
        for item in filter(None, (part.strip() for part in value.split(","))):
            match = _DYNAMIC.match(item)
            if not match:
                raise InputError(f"--dynamic {item!r} is malformed; write a dim name (batch), or NAME=MIN..MAX (seq=1..512)")
            name, lo, hi = match.group(1), match.group(2), match.group(3)
            if lo is not None and not (1 <= int(lo) <= int(hi)):
                raise InputError(f"--dynamic {item!r}: the range must satisfy 1 <= MIN <= MAX")
            dims[name] = (int(lo), int(hi)) if lo is not None else None
    return dims


def check_exporter(framework: str, exporter: str) -> None:
    from mlc.frontends.torch import EXPORTERS

    if exporter not in EXPORTERS:
        raise InputError(f"unknown exporter {exporter!r}; choose one of: {', '.join(EXPORTERS)}")
    if exporter != "auto" and framework != "torch":
        raise InputError(f"--exporter chooses between PyTorch's ONNX exporters; {framework} models have one")


def convert(source: str, framework: str, workdir: Path, dynamic: Optional[Sequence[str]] = None,
            input_shapes: Sequence[str] = (), exporter: str = "auto") -> Converted:
    """Export a torch/tensorflow/paddle model (file or zoo:NAME) to ONNX in a child process and run
    it eagerly on seeded inputs. Raises the MlcError the worker reported, or CompilerError if it crashed."""
    from mlc import _proc
    from mlc.runtime.runner import load_npz

    check_exporter(framework, exporter)
    FRAMEWORKS[framework].require()
    out = workdir / f"frontend-{framework}"
    out.mkdir(parents=True, exist_ok=True)
    request = {"source": source, "framework": framework, "out_dir": str(out),
               "dynamic": None if dynamic is None else list(dynamic), "input_shapes": list(input_shapes),
               "options": {"input_shapes": list(input_shapes), "exporter": exporter}}
    display = FRAMEWORKS[framework].display
    result, log_path = _proc.run("mlc.frontends.worker", request, workdir / "frontend.request.json",
                                 f"the {display} frontend process")
    if not result.ok and result.kind == _proc.EXCEPTION:  # the framework's own error: its traceback is in the log
        raise InputError(f"{display} failed on {source}: {result.message} (full log: {log_path})")
    log_path.unlink(missing_ok=True)
    if not result.ok:
        raise result.error(default=InputError)
    done = result.payload
    from mlc.frontends.worker import EAGER, FEEDS, MODEL

    return Converted(out / MODEL, done["framework"], done["framework_version"], done["exporter"],
                     load_npz(out / FEEDS), load_npz(out / EAGER), done["dynamic"], done["notes"])
