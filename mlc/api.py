"""The Python API: each CLI command is a thin layer over one function here. A facade over mlc.pipeline; options
are keyword-only and become the typed ModelSpec (the model and its inputs) and CompileOptions."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from mlc import passes as graph_passes
from mlc.pipeline import compile as compiling
from mlc.pipeline import debug as debugging
from mlc.pipeline import export as exporting
from mlc.pipeline.compile import (CompileResult, check_precision, precision_supported, prepare_target,
                                  quantize_supported)
from mlc.pipeline.debug import DebugReport
from mlc.pipeline.export import ExportResult
from mlc.pipeline.options import CompileOptions, ModelSpec
from mlc.pipeline.package import DEFAULT_OUTPUT_ROOT, default_output
from mlc.pipeline.run import Inputs, RunResult, check, open_runner, read_npz, require_pass, run, save_outputs
from mlc.pipeline.source import model_name, resolve_framework, source_sha256
from mlc.pipeline.steps import StepReporter, quiet_step
from mlc.tuning import TuneResult, tune

__all__ = ["DEFAULT_OUTPUT_ROOT", "CompileOptions", "CompileResult", "DebugReport", "ExportResult", "ModelSpec",
           "RunResult", "StepReporter", "TuneResult", "check", "check_precision", "compile", "debug",
           "default_output", "export", "model_name", "open_runner", "precision_supported", "prepare_target",
           "quantize_supported", "quiet_step", "read_npz", "require_pass", "resolve_framework", "run", "save_outputs",
           "source_sha256", "tune"]

# Options is frozen, so one shared default instance is safe (and what the inline default was).
_DEFAULT_PASS_OPTIONS = graph_passes.Options()


def compile(  # the verb users know
    source: str,
    *,
    target: str = "x86",
    output: Optional[str | Path] = None,
    input_shapes: Sequence[str] = (),
    framework: Optional[str] = None,
    dynamic: Sequence[str] = (),
    exporter: str = "auto",
    buckets: Sequence[str] = (),
    db: Optional[str | Path] = None,
    default_schedules: bool = True,
    pass_options: graph_passes.Options = _DEFAULT_PASS_OPTIONS,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    archive: bool = False,
    isolate: bool = True,
    step: StepReporter = quiet_step,
    precision: str = "fp32",
    emulated: bool = False,
    quantize: Optional[str] = None,
    calibration: Sequence[str | Path] = (),
    inputs: Optional[str | Path] = None,
    freeze: Sequence[str] = (),
) -> CompileResult:
    """Compile a model (ONNX, PyTorch, TensorFlow, Paddle, or zoo:NAME) for a target into a
    verified artifact directory. Framework models are checked against the framework's eager outputs.

    CPU targets get tuned schedules from the tuning database `db` (see `mlc tune`; records match
    static kernels: with `dynamic`, symbolic kernels keep the default schedules, and a database from
    `mlc tune --dynamic` names their static twins, replayed on them only with MLC_DYNAMIC_RECORDS=replay)
    and mlc's default schedules for the other kernels (`default_schedules=False`: TVM's unscheduled loops,
    for comparison).

    Raises MlcError subclasses for anything the user can fix; AccuracyError (exit 3) is not
    raised here: the artifact is written and `result.check` says whether it matches.
    `isolate=False` runs TVM in this process (faster for many small models; a TVM crash then
    takes the process down). `pass_options`: -O level and pass choices (see `mlc passes`).
    `buckets` (["8,16,32"] or ["seq=8,16,32"]): one static build per length of that dim in one
    artifact; the runtime pads inputs to the next bucket and slices the outputs back.
    `precision` "bf16" (CPUs with AVX512-BF16) or "fp16" (CUDA): matmul/conv in that type with fp32 accumulation,
    judged by the accuracy gate (`result.check.gate`); `emulated` builds it on a target without the instructions.
    `quantize` "int8" (calibrated on the `calibration` .npz files, else seeded inputs) or "int8-dynamic": matmul/conv
    on int8 (CPUs with VNNI/dotprod), judged by the int8 gate on several seeded inputs.
    `inputs`: the user's sample inputs (.npz keyed by input name): the reference inputs the check runs on, and the
    compile sizes of every symbolic dim but those `dynamic` names (a dim that moves with one of those, such as a KV
    cache's total = past + seq, is found by running the model and compiled as that expression). `freeze`: inputs
    whose value (from `inputs`) is folded into the graph as a constant; the artifact no longer takes them."""
    model = ModelSpec(source, framework, input_shapes, dynamic, exporter, buckets, inputs, freeze)
    options = CompileOptions(target, Path(output) if output else None, db, default_schedules, pass_options, atol,
                             rtol, archive, isolate, precision, emulated, quantize, tuple(map(str, calibration)))
    return compiling.compile(model, options, step)


def export(source: str, output: str | Path, *, framework: Optional[str] = None, dynamic: Sequence[str] = (),
           input_shapes: Sequence[str] = (), exporter: str = "auto", atol: Optional[float] = None,
           rtol: Optional[float] = None, step: StepReporter = quiet_step,
           inputs: Optional[str | Path] = None) -> ExportResult:
    """Convert a framework model (or zoo:NAME) to an ONNX file, and compare ONNX Runtime on it with
    the framework's eager outputs (on `inputs`, the user's .npz of sample inputs, else seeded ones). Stops before
    TVM."""
    model = ModelSpec(source, framework, input_shapes, dynamic, exporter, (), inputs)
    return exporting.export(model, output, atol=atol, rtol=rtol, step=step)


def debug(
    source: str,
    *,
    target: Optional[str] = None,
    input_shapes: Sequence[str] = (),
    inputs: Inputs = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    extract: Optional[str | Path] = None,
    method: str = "auto",
    isolate: bool = True,
    step: StepReporter = quiet_step,
    framework: Optional[str] = None,
) -> DebugReport:
    """Find the first node whose compiled output differs from ONNX Runtime.

    `source` is a model (path or zoo:NAME) or an artifact directory (its source model, target,
    shapes and reference inputs are reused). `method`: "auto" (one normal build; if its outputs
    are wrong, one build exposing every value; if that hides the fault, bisection), "exposed" or
    "bisect"."""
    model = ModelSpec(source, framework, input_shapes)
    return debugging.debug(model, target=target, inputs=inputs, atol=atol, rtol=rtol, extract=extract,
                           method=method, isolate=isolate, step=step)
