"""The benchmark worker's contract (mlc.bench.worker): one typed request per job the matrix and --lengths runs send
("prepare", "measure", "sequence", "compile") and the result each returns, as JSON through mlc.child_process, parsed
strictly on both sides (mlc.compiler.contract's rules). No framework and no tvm here: the parent imports this module."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Union

from mlc.compiler.contract import ContractError, Note, strict_fields

WORKER = "benchmark worker"


class BenchJob(str, enum.Enum):
    """Which job a request asks for (its "job" field in the JSON)."""

    PREPARE = "prepare"  # build a model in its framework, export it, write feeds and eager references per shape
    MEASURE = "measure"  # one cell: one backend at one thread count on one shape
    SEQUENCE = "sequence"  # one --lengths strategy over a list of sentence lengths
    COMPILE = "compile"  # one `mlc compile` in a fresh process


def _to_json(value) -> dict[str, Any]:
    data = dataclasses.asdict(value)
    if "notes" in data:  # a list of Note
        data["notes"] = [n.to_json() for n in value.notes]
    return data


def _from_json(cls, data: Any, what: str) -> dict[str, Any]:
    fields = strict_fields(cls, data, what, WORKER)
    if "notes" in fields:
        fields["notes"] = [Note.from_json(n, WORKER) for n in fields["notes"]]
    return fields


class _Message:
    """to_json/from_json of a flat contract dataclass; a request's JSON also names its job."""

    job: ClassVar[Optional[BenchJob]] = None
    what: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        data = _to_json(self)
        return {"job": self.job.value, **data} if self.job else data

    @classmethod
    def from_json(cls, data: Any):
        if cls.job is not None and isinstance(data, dict):
            if data.get("job") != cls.job.value:
                raise ContractError(f"{cls.what}: job {data.get('job')!r}, not {cls.job.value!r}")
            data = {k: v for k, v in data.items() if k != "job"}
        return cls(**_from_json(cls, data, cls.what))


# --- prepare ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PrepareRequest(_Message):
    job: ClassVar[BenchJob] = BenchJob.PREPARE
    what: ClassVar[str] = "bench prepare request"

    source: str  # zoo:NAME or a suite's model
    framework: str  # the framework it is built in; "onnx": a zoo graph, ONNX Runtime is its reference
    out_dir: str
    batch: list[int]
    seq: list[int]  # used where the model has a "seq" dim
    threads: Optional[int] = None


@dataclass(frozen=True)
class PreparedShape:
    """One benchmark shape: its input shapes, or why it could not be prepared."""

    batch: int
    seq: Optional[int]
    key: str  # names its feeds-KEY.npz and reference-KEY.npz
    shapes: Optional[dict[str, list[int]]] = None
    error: Optional[str] = None

    def to_json(self) -> dict[str, Any]:  # as the results files record it: no "shapes" or "error" key when None
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None or k == "seq"}

    @classmethod
    def from_json(cls, data: Any) -> "PreparedShape":
        return cls(**strict_fields(cls, data, "bench prepare result: shape", WORKER))


@dataclass(frozen=True)
class PrepareResult(_Message):
    what: ClassVar[str] = "bench prepare result"

    exporter: str
    reference: str  # what produced the reference outputs ("torch 2.13.0 eager", "onnxruntime")
    params: int
    inputs: list[str]
    outputs: list[str]
    symbolic: list[str]  # the model's symbolic dims
    shapes: list[PreparedShape]
    notes: list[Note] = field(default_factory=list)  # the framework export's (NoteKind.FRONTEND)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "shapes": [s.to_json() for s in self.shapes]}

    @classmethod
    def from_json(cls, data: Any) -> "PrepareResult":
        fields = _from_json(cls, data, cls.what)
        fields["shapes"] = [PreparedShape.from_json(s) for s in fields["shapes"]]
        return cls(**fields)

    def record(self) -> dict[str, Any]:
        """The dict the matrix keeps and the results files hold: the notes as their texts."""
        return {**self.to_json(), "notes": [n.text for n in self.notes]}


# --- measure ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MeasureRequest(_Message):
    job: ClassVar[BenchJob] = BenchJob.MEASURE
    what: ClassVar[str] = "bench measure request"

    backend: str  # "mlc" or a registered baseline
    source: str
    framework: str
    threads: int
    warmup: int
    repeat: int
    feeds: str  # .npz
    reference: str  # .npz of the eager outputs
    onnx: str  # the exported model
    inputs: list[str]  # the model's input names, in order
    scratch: str  # a folder the backend may write to
    artifact: Optional[str] = None  # backend "mlc": the artifact to run


@dataclass(frozen=True)
class MeasureResult(_Message):
    """One cell measured, or `skipped` with the reason the backend cannot run here (then nothing else is set)."""

    what: ClassVar[str] = "bench measure result"

    skipped: Optional[str] = None
    setup_s: Optional[float] = None
    compile_s: Optional[float] = None  # a backend that compiles: its setup
    precision: Optional[str] = None  # what it ran at
    latency_ms: Optional[dict[str, float]] = None  # none for a throughput baseline
    throughput: Optional[dict[str, Any]] = None
    runtime_precisions: Optional[dict[str, Any]] = None  # OpenVINO: the precisions its layers ran at
    accuracy: Optional[dict[str, Any]] = None
    peak_rss_mb: Optional[float] = None
    load_average: Optional[float] = None
    emulated: Optional[bool] = None  # backend "mlc": ran under an emulator


# --- sequence -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SequenceRequest(_Message):
    job: ClassVar[BenchJob] = BenchJob.SEQUENCE
    what: ClassVar[str] = "bench sequence request"

    backend: str  # "mlc" (the artifacts), "ort", "openvino" or "torch"
    dir: str  # the prepare job's out_dir
    lengths: list[int]
    inputs: list[str]
    outputs: list[str]
    source: str
    threads: int
    artifacts: dict[str, str] = field(default_factory=dict)  # backend "mlc": {seq or "*": artifact}


@dataclass(frozen=True)
class SequenceResult(_Message):
    what: ClassVar[str] = "bench sequence result"

    setup_s: float
    run_total_s: float
    run_ms: list[float]
    run_cpu_total_s: float
    run_cpu_ms: list[float]
    accuracy: dict[str, Any]
    peak_rss_mb: float
    load_average: Optional[float] = None


# --- compile ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompileJobRequest(_Message):
    job: ClassVar[BenchJob] = BenchJob.COMPILE
    what: ClassVar[str] = "bench compile request"

    source: str
    target: str
    output: str
    options: dict[str, Any] = field(default_factory=dict)  # keyword arguments of mlc.api.compile
    threads: Optional[int] = None


@dataclass(frozen=True)
class CompileJobResult(_Message):
    what: ClassVar[str] = "bench compile result"

    path: str  # the artifact


BenchRequest = Union[PrepareRequest, MeasureRequest, SequenceRequest, CompileJobRequest]
REQUESTS: dict[BenchJob, type] = {BenchJob.PREPARE: PrepareRequest, BenchJob.MEASURE: MeasureRequest,
                                  BenchJob.SEQUENCE: SequenceRequest, BenchJob.COMPILE: CompileJobRequest}
RESULTS: dict[type, type] = {PrepareRequest: PrepareResult, MeasureRequest: MeasureResult,
                             SequenceRequest: SequenceResult, CompileJobRequest: CompileJobResult}


def request_from_json(data: Any) -> BenchRequest:
    """The request of whichever job `data` names; ContractError for an unknown job or field."""
    try:
        job = BenchJob(data.get("job") if isinstance(data, dict) else None)
    except ValueError:
        raise ContractError(f"bench request: unknown job {data.get('job')!r} (the mlc client and {WORKER} "
                            "differ in version?)") from None
    return REQUESTS[job].from_json(data)
