"""The artifact manifest schema (versioned). The thin runtime reads the same JSON with plain dicts."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from mlc.runtime.runner import SCHEMA_VERSION

Dim = Union[int, str]  # a fixed size or a symbolic name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorSpec(_Strict):
    name: str
    dtype: str
    shape: list[Dim]
    # Inputs that index a table (e.g. token ids into an embedding) must stay within it; TVM's
    # gather reads out of bounds otherwise.
    value_range: Optional[tuple[int, int]] = None
    # Inputs: the shape the model declares, recorded where it leaves dims open (symbolic) that `shape` fixes at the
    # reference size (mlc's seeded one or --input-shape's). The other fixed dims are the model's own.
    model_shape: Optional[list[Dim]] = None


class TargetInfo(_Strict):
    name: str
    tvm: dict[str, Any]
    runtime_arch: str
    runtime_os: str = "linux"
    device: str
    required_cpu_features: list[str] = Field(default_factory=list)


class SourceInfo(_Strict):
    name: str
    path: str
    format: str  # "onnx" or the framework the model came from: "torch", "tensorflow", "paddle"
    sha256: str
    opset: Optional[int] = None  # of the ONNX graph (as exported, for framework models)
    framework_version: Optional[str] = None
    exporter: Optional[str] = None  # which ONNX exporter ran, e.g. torch's dynamo exporter or its fallback
    dynamic: list[str] = Field(default_factory=list)  # dims exported as symbolic


class RuntimeInfo(_Strict):
    library: str  # libtvm_runtime.so for the target architecture
    module: str  # the thin Python runner (runtime/mlc_runtime.py)
    entry: str  # run.py
    requires: list[str]  # Python packages the thin runner needs
    ffi_library: Optional[str] = None  # libtvm_ffi.so for the target architecture
    native_runner: Optional[str] = None  # runtime/mlc_runner: runs the model without Python
    link: Optional[str] = None  # macOS: the script that links the shipped objects into `library` on the Mac
    device_libraries: list[str] = Field(default_factory=list)  # e.g. the CUDA runtime, loaded in order
    host_functions: list[str] = Field(default_factory=list)  # numpy functions of the thin runtime the model calls
    # CUDA: the compiled GPU code in the library (mlc.compiler.cuda_binary.GpuCode): format, cubin and ptx archs,
    # the CUDA release; the runtime checks the GPU and the driver against it before loading
    gpu_code: Optional[dict[str, str]] = None


class ReferenceInfo(_Strict):
    producer: str  # what computed the reference outputs, with its version (the framework, eagerly)
    inputs: str
    outputs: str
    seed: int
    # Framework models: ONNX Runtime's outputs on the exported ONNX, so `mlc check` can report the
    # conversion error apart from the compilation error; or why ONNX Runtime could not run it.
    onnxruntime: Optional[str] = None
    onnxruntime_error: Optional[str] = None
    # --quantize: more seeded inputs and their fp32 outputs ({"inputs": path, "outputs": path}), which the
    # accuracy gate judges together with the reference's
    gate_cases: list[dict[str, str]] = Field(default_factory=list)
    # False where the gate cases are the user's --calibration inputs: the gate judges those alone
    gate_judges_reference: bool = True
    # --inputs: the reference inputs are the user's samples, {"file": absolute path, "sha256": of the file}; None:
    # seeded (`seed`)
    user_inputs: Optional[dict[str, str]] = None


class PassRecord(_Strict):
    """What one graph pass did (mlc/passes): ONNX node or Relax operator-call counts."""

    name: str
    level: str  # onnx or relax
    status: str  # applied, or skipped (it failed on this model: see reason)
    ops_before: int
    ops_after: int
    op_changes: dict[str, int] = Field(default_factory=dict)  # op -> count after minus before
    time_s: float
    reason: Optional[str] = None


class CompileInfo(_Strict):
    options: dict[str, Any]
    kernels: dict[str, list[str]] = Field(default_factory=dict)  # GPU kernels per device kind (sources in kernels/)
    timings_s: dict[str, float]
    recipe: str  # the command that rebuilds this artifact
    onnx_nodes: dict[str, int]  # node count before and after graph cleanup
    # CPU kernels by where their schedule came from: tuned (a --db record), default (mlc's rules),
    # unscheduled (TVM's plain loop nest). CUDA: matmul/conv kernels on tensor_cores or cuda_cores.
    schedules: Optional[dict[str, list[str]]] = None
    passes: list[PassRecord] = Field(default_factory=list)  # in the order they ran


class WeightTensor(_Strict):
    dtype: str
    shape: list[int]
    offset: int  # bytes from the start of the file, a multiple of 64
    nbytes: int


class WeightsInfo(_Strict):
    """The weights a library's `main` takes after the model's inputs, in order, stored raw in `file`."""

    file: str
    tensors: list[WeightTensor]


class BucketCheck(_Strict):
    """Reference inputs/outputs at one length that pads up to a bucket (checked by `mlc check`)."""

    length: int
    bucket: int
    inputs: str
    outputs: str
    producer: str


class BucketInfo(_Strict):
    """`--buckets`: one static library per length of `dim`; the runtime pads inputs (with 0, the
    mask marking the padding) to the smallest bucket that fits and slices the outputs back."""

    dim: str
    sizes: list[int]
    libraries: dict[str, str]  # str(size) -> library file
    mask: str  # the input whose zeros mark the padding
    checks: list[BucketCheck] = Field(default_factory=list)


class HostInfo(_Strict):
    """String ops the runtime runs on the host before and after the compiled part (mlc.runtime.host_ops): TVM
    compiles numbers only. The manifest's inputs and outputs are then the model's, and these the compiled part's."""

    module: str  # the artifact's copy of mlc.runtime.host_ops
    before: list[dict[str, Any]]
    after: list[dict[str, Any]]
    constants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    core_inputs: list[TensorSpec]
    core_outputs: list[TensorSpec]


class Manifest(_Strict):
    schema_version: int = SCHEMA_VERSION
    mlc_version: str
    tvm_version: str
    created: str
    source: SourceInfo
    target: TargetInfo
    library: str
    runtime: RuntimeInfo
    reference: ReferenceInfo
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    compile: CompileInfo
    # --dynamic NAME=MIN..MAX: the sizes a symbolic dim may take (the runtime refuses others)
    dynamic_ranges: dict[str, tuple[int, int]] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)  # path -> sha256, every file but the manifest
    buckets: Optional[BucketInfo] = None  # --buckets: then `library` is the largest bucket's
    weights: dict[str, WeightsInfo] = Field(default_factory=dict)  # library -> its weights (schema 3)
    # --precision: what matmul/conv compute in (fp32, bf16, fp16); a reduced-precision artifact is judged by the
    # accuracy gate against the fp32 reference, and `gate` holds its figures from the compile's check
    precision: str = "fp32"
    gate: Optional[dict[str, Any]] = None
    # --freeze: inputs folded into the graph, {name: {"dtype", "shape", "value" (up to 64 elements) or "sha256"}};
    # they are not among `inputs`, and the runtime refuses a feed of them
    frozen: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # --quantize: mode, calibration (source, count), the ops quantised and those kept fp32 (mlc.passes.quantize)
    quantization: Optional[dict[str, Any]] = None
    host: Optional[HostInfo] = None  # string ops run on the host (schema 5)
