"""The compiler's worker contracts, compile's and tune's: the typed request the client sends and the result the
worker returns, as JSON through mlc.child_process. Both sides parse strictly: a field one side does not know (an mlc of
another version) is an error, never dropped. No tvm here: the clients import this module, and so do the other
workers' contracts (mlc.pipeline.convert_contract, mlc.bench.contract) for strict_fields and Note."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from mlc.errors import CompilerError

REPRODUCER_BUDGET_S = 120.0  # seconds the worker may spend searching the smallest failing subgraph


class ContractError(CompilerError):
    """A request or result that does not match this mlc's contract (client and worker of different versions)."""


class NoteKind(str, enum.Enum):
    """What a note says, for code that acts on notes (never their text)."""

    PASS_SKIPPED = "pass_skipped"  # a graph or Relax pass failed on the model and was left out
    FALLBACK = "fallback"  # an optional step TVM failed on was left out ("built without ...")
    UNSCHEDULED = "unscheduled"  # mlc's default schedule failed on kernels: left unscheduled
    RECORDS = "records"  # tuning records skipped, moved, withheld or failed on a kernel
    CALIBRATION = "calibration"  # --quantize int8 calibrated on seeded inputs
    BOUND_DIMS = "bound_dims"  # symbolic dims fixed at the reference sizes
    INPUTS = "inputs"  # the check ran on an input value mlc chose
    FRONTEND = "frontend"  # the framework export's own notes
    AS_TENSORS = "as_tensors"  # sequence or optional inputs and outputs compiled as tensors, and how


class FailureKind(str, enum.Enum):
    """Why a compile worker failed (WorkerResult.kind), besides mlc.child_process's "error" and "exception"."""

    TARGET = "target"  # TVM rejects the target
    UNSUPPORTED = "unsupported"  # op types TVM's importer lacks; CompileFailure.ops
    UNSUPPORTED_OUTPUT = "unsupported_output"  # the model returns something other than tensors
    UNSUPPORTED_NODE = "unsupported_node"  # TVM's converter cannot convert one node
    PASS = "pass"  # a pass the user asked for failed
    COMPILE = "compile"  # a mandatory TVM step failed; CompileFailure may name a reproducer


@dataclass(frozen=True)
class CompileFailure:
    """The payload of a failure of a FailureKind (mlc.child_process's own kinds carry its "error" key instead)."""

    ops: Optional[dict[str, dict]] = None  # UNSUPPORTED: {op type: {"count", "first_nodes"}}
    reproducer: Optional[str] = None  # COMPILE: where the smallest failing subgraph was written
    reproducer_nodes: Optional[int] = None  # its nodes
    model_nodes: Optional[int] = None  # the model's

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Any) -> "CompileFailure":
        return cls(**strict_fields(cls, data, "compile failure"))


def strict_fields(cls, data: Any, what: str, worker: str = "compile worker") -> dict[str, Any]:
    """`data`'s fields for the dataclass `cls`, refusing unknown and missing required ones (ContractError naming
    them; `what` names the value, `worker` the process on the other side)."""
    if not isinstance(data, Mapping):
        raise ContractError(f"{what}: expected a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    missing = sorted(n for n, f in known.items() if n not in data and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    if unknown or missing:
        parts = ([f"unknown field(s) {', '.join(unknown)}"] if unknown else []) + \
                ([f"missing field(s) {', '.join(missing)}"] if missing else [])
        raise ContractError(f"{what}: {'; '.join(parts)} (the mlc client and {worker} differ in version?)")
    return dict(data)


@dataclass(frozen=True)
class Note:
    """A note for the user: `text` is shown as it is; code reads `kind`."""

    kind: NoteKind
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "text": self.text}

    @classmethod
    def from_json(cls, data: Any, worker: str = "compile worker") -> "Note":
        fields = strict_fields(cls, data, "note", worker)
        try:
            kind = NoteKind(fields["kind"])
        except ValueError:
            raise ContractError(f"note: unknown kind {fields['kind']!r}") from None
        return cls(kind, str(fields["text"]))


def texts(notes: list[Note]) -> list[str]:
    return [n.text for n in notes]


@dataclass(frozen=True)
class RunFiles:
    """Run the compiled model on `inputs` (.npz: in_0, ...) and save `outputs` (out_0, ...)."""

    inputs: str
    outputs: str


@dataclass(frozen=True)
class ScheduleRequest:
    """CPU builds: the tuning records (--db, an absolute folder) and whether mlc's default schedules apply."""

    db: Optional[str] = None
    default: bool = True


@dataclass(frozen=True)
class CompileRequest:
    onnx: str  # the cleaned model; its weights are read from the files beside it
    target: dict[str, Any]  # TVM target JSON
    unquantized_onnx: Optional[str] = None  # --quantize: the graph before it, built where TVM fails on `onnx`
    library: Optional[str] = None  # export the library here (its weights beside it)
    run: Optional[RunFiles] = None
    cross_compiler: Optional[str] = None
    kernels_dir: Optional[str] = None  # GPU source of the kernels goes here
    object_dir: Optional[str] = None  # object files instead of a library (macOS)
    schedules: Optional[ScheduleRequest] = None  # None: TVM's own pipeline (GPU)
    relax_passes: list[dict] = field(default_factory=list)  # Step.to_json() of the pass plan
    dump_ir: Optional[str] = None
    dim_upper_bounds: dict[str, int] = field(default_factory=dict)
    precision: str = "fp32"
    cuda_graphs: bool = False  # CUDA: replay the static stretches of `main` as CUDA graphs
    reproducer: Optional[str] = None  # where a failing mandatory step writes its smallest failing subgraph
    reproducer_budget_s: float = REPRODUCER_BUDGET_S

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "CompileRequest":
        fields = strict_fields(cls, data, "compile request")
        if fields.get("run") is not None:
            fields["run"] = RunFiles(**strict_fields(RunFiles, fields["run"], "compile request: run"))
        if fields.get("schedules") is not None:
            fields["schedules"] = ScheduleRequest(**strict_fields(ScheduleRequest, fields["schedules"],
                                                            "compile request: schedules"))
        return cls(**fields)


@dataclass(frozen=True)
class CompileResult:
    """A compile that succeeded."""

    tvm_version: str
    outputs: list[dict]  # per output {"dtype", "shape"}
    timings: dict[str, float]
    pass_records: list[dict]  # the Relax passes' (and the precision step's) manifest records
    notes: list[Note] = field(default_factory=list)
    kernels: dict[str, list[str]] = field(default_factory=dict)  # GPU kernel names per device kind
    schedules: Optional[dict[str, list[str]]] = None  # CPU: kernels {tuned, default, unscheduled[, tuned_at]}
    weights: Optional[dict] = None  # {"file", "tensors"} written beside the library
    precision: str = "fp32"  # what was built: fp32 where TVM failed on the asked precision
    left_out: list[str] = field(default_factory=list)  # the optional steps the fallback ladder left out
    gpu_code: Optional[dict] = None  # CUDA: what the GPU code was compiled for

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["notes"] = [n.to_json() for n in self.notes]
        return data

    @classmethod
    def from_json(cls, data: Any) -> "CompileResult":
        fields = strict_fields(cls, data, "compile result")
        fields["notes"] = [Note.from_json(n) for n in fields.get("notes", [])]
        return cls(**fields)


# --- the tuning worker's (mlc.compiler.metaschedule; its client is mlc.tuning.tune) --------------------------------

TUNE_WORKER = "tuning worker"


class TuneStop(str, enum.Enum):
    """Why a tuning run ended (TuneResult.reason)."""

    TRIALS = "trials"  # every kernel has the trials asked for
    BUDGET = "budget"  # --budget ran out
    INTERRUPTED = "interrupted"  # Ctrl-C
    ALREADY_TUNED = "already tuned"  # the database held the trials asked for before this run


@dataclass(frozen=True)
class RpcDevice:
    """Measure on the device a TVM RPC tracker hands out under `key`."""

    tracker: str  # HOST:PORT
    key: str
    timeout: int = 60  # seconds per measurement


@dataclass(frozen=True)
class TuneRequest:
    onnx: str  # the model prepared with static shapes
    target: dict[str, Any]  # TVM target JSON
    db: str  # the tuning database folder (absolute)
    logs: str  # MetaSchedule's work folder
    events: str  # the JSON-lines file the worker reports progress to as it goes
    trials_per_task: int  # the trials each kernel should have in the database
    trials_per_iter: int  # the batch measured at once
    threads: int  # MetaSchedule's search threads
    relax_passes: list[dict] = field(default_factory=list)  # Step.to_json() of the pass plan, as a compile's
    budget_s: Optional[float] = None
    deadline: Optional[float] = None  # time.time() at which to stop after the batch being measured
    seed: Optional[int] = None
    rpc: Optional[RpcDevice] = None  # None: measured in the worker's own process
    population: int = 128  # the evolutionary search's
    generations: int = 2

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "TuneRequest":
        fields = strict_fields(cls, data, "tune request", TUNE_WORKER)
        if fields.get("rpc") is not None:
            fields["rpc"] = RpcDevice(**strict_fields(RpcDevice, fields["rpc"], "tune request: rpc", TUNE_WORKER))
        return cls(**fields)


@dataclass(frozen=True)
class TuneResult:
    """A tuning run that ended (the parent makes one from the events of a worker it had to kill)."""

    tasks: int  # kernels tuned
    trials: int  # measured in this run
    reason: TuneStop = TuneStop.TRIALS
    threads: Optional[int] = None  # the runtime's thread count the kernels were measured with
    left_to_default: list[str] = field(default_factory=list)  # kernels that keep mlc's default schedule
    notes: list[Note] = field(default_factory=list)  # records set aside (NoteKind.RECORDS)
    dropped: int = 0  # measured schedules not recorded: TVM could not read them back
    dropped_reason: Optional[str] = None
    killed: bool = False  # still busy past the hard deadline: this result is the parent's, from the events

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["reason"] = self.reason.value
        data["notes"] = [n.to_json() for n in self.notes]
        return data

    @classmethod
    def from_json(cls, data: Any) -> "TuneResult":
        fields = strict_fields(cls, data, "tune result", TUNE_WORKER)
        try:
            fields["reason"] = TuneStop(fields.get("reason", TuneStop.TRIALS.value))
        except ValueError:
            raise ContractError(f"tune result: unknown reason {fields['reason']!r}") from None
        fields["notes"] = [Note.from_json(n, TUNE_WORKER) for n in fields.get("notes", [])]
        return cls(**fields)
