"""The frontend worker's contract (mlc.pipeline.convert_worker): the typed request mlc.pipeline.convert sends and
the result the worker returns, as JSON through mlc.child_process, parsed strictly on both sides (mlc.compiler.contract's
rules). No framework and no tvm here: the parent imports this module."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from mlc.compiler.contract import Note, strict_fields

WORKER = "frontend worker"


@dataclass(frozen=True)
class ConvertRequest:
    source: str  # a model file or zoo:NAME
    framework: str  # a registered framework (mlc.frontends.FRAMEWORKS)
    out_dir: str  # the worker writes model.onnx, feeds.npz and eager.npz here
    dynamic: Optional[list[str]] = None  # dims the export keeps symbolic; None: all the model's symbolic dims
    input_shapes: list[str] = field(default_factory=list)  # --input-shape NAME=D1xD2...
    exporter: str = "auto"  # torch: which exporter (mlc.frontends.check_exporter)
    inputs: Optional[str] = None  # the user's .npz of samples the framework runs on, else seeded inputs

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "ConvertRequest":
        return cls(**strict_fields(cls, data, "convert request", WORKER))


@dataclass(frozen=True)
class ConvertResult:
    """A conversion that succeeded; the files are in the request's out_dir."""

    framework: str
    framework_version: str
    exporter: str  # which exporter made the ONNX file
    dynamic: list[str]  # the dims the export kept symbolic
    notes: list[Note] = field(default_factory=list)  # the framework export's own (NoteKind.FRONTEND)
    declared_dynamic: dict[str, Optional[list[int]]] = field(default_factory=dict)  # {dim: [min, max] or None}
    onnx_opset: Optional[int] = None
    onnx_nodes: int = 0
    onnx_ir: int = 0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["notes"] = [n.to_json() for n in self.notes]
        return data

    @classmethod
    def from_json(cls, data: Any) -> "ConvertResult":
        fields = strict_fields(cls, data, "convert result", WORKER)
        fields["notes"] = [Note.from_json(n, WORKER) for n in fields.get("notes", [])]
        return cls(**fields)
