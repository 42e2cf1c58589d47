"""Framework models (PyTorch, TensorFlow, Paddle, or their zoo builds) to ONNX plus the framework's eager outputs,
in a child process per conversion (convert_worker.py): one framework per process, and a framework crash is an error
message, not a dead mlc."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from mlc import child_process
from mlc.compiler.contract import Note
from mlc.errors import InputError
from mlc.frontends import FRAMEWORKS, check_exporter
from mlc.pipeline.convert_contract import ConvertRequest, ConvertResult
from mlc.pipeline.convert_worker import EAGER, FEEDS, MODEL
from mlc.runtime.runner import load_npz


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
    notes: list[Note] = field(default_factory=list)  # the framework export's (NoteKind.FRONTEND)
    declared_dynamic: dict = field(default_factory=dict)  # {dim: [min, max] or None} the model declares (.pt2)


def convert(source: str, framework: str, workdir: Path, dynamic: Optional[Sequence[str]] = None,
            input_shapes: Sequence[str] = (), exporter: str = "auto", inputs: Optional[str] = None) -> Converted:
    """Export a torch/tensorflow/paddle model (file or zoo:NAME) to ONNX in a child process and run
    it eagerly on seeded inputs (`inputs`: on the user's .npz of samples). Raises the MlcError the worker reported,
    or CompilerError if it crashed."""
    check_exporter(framework, exporter)
    FRAMEWORKS[framework].require()
    out = workdir / f"frontend-{framework}"
    out.mkdir(parents=True, exist_ok=True)
    request = ConvertRequest(source=source, framework=framework, out_dir=str(out),
                             dynamic=None if dynamic is None else list(dynamic), input_shapes=list(input_shapes),
                             exporter=exporter, inputs=str(Path(inputs).resolve()) if inputs else None)
    display = FRAMEWORKS[framework].display
    result, log_path = child_process.run("mlc.pipeline.convert_worker", request.to_json(),
                                         workdir / "frontend.request.json", f"the {display} frontend process")
    if not result.ok and result.kind == child_process.EXCEPTION:  # the framework's own error, traceback in its log
        raise InputError(f"{display} failed on {source}: {result.message} (full log: {log_path})")
    log_path.unlink(missing_ok=True)
    if not result.ok:
        raise result.error(default=InputError)
    done = ConvertResult.from_json(result.payload)
    return Converted(out / MODEL, done.framework, done.framework_version, done.exporter,
                     load_npz(out / FEEDS), load_npz(out / EAGER), done.dynamic, done.notes, done.declared_dynamic)
