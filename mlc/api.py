"""The Python API: each CLI command is a thin layer over one function here. A facade over mlc.pipeline; options
are keyword-only and become the typed ModelSpec (the model and its inputs) and CompileOptions."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from mlc import passes as graph_passes  # noqa: F401  (api.graph_passes.Options: the pass_options type)
from mlc.pipeline import compile as compiling
from mlc.pipeline import debug as debugging
from mlc.pipeline import export as exporting
from mlc.pipeline import options as declared
from mlc.pipeline import run as running
from mlc.pipeline.compile import CompileResult, precision_supported, prepare_target, quantize_supported
from mlc.pipeline.debug import DebugReport
from mlc.pipeline.export import ExportResult
from mlc.pipeline.options import CompileOptions, ModelSpec, RunOptions, TuneOptions, check_precision
from mlc.pipeline.package import DEFAULT_OUTPUT_ROOT, default_output
from mlc.pipeline.run import Inputs, RunResult, check, open_runner, read_npz, require_pass, save_outputs
from mlc.pipeline.source import model_name, resolve_framework, source_sha256
from mlc.pipeline.steps import StepReporter, quiet_step
from mlc.tuning import TuneResult

__all__ = ["CompileOptions", "CompileResult", "DEFAULT_OUTPUT_ROOT", "DebugReport", "ExportResult", "ModelSpec",
           "RunOptions", "RunResult", "StepReporter", "TuneOptions", "TuneResult", "check", "check_precision",
           "compile", "compile_targets", "debug", "default_output", "export", "model_name", "open_runner",
           "precision_supported", "prepare_target", "quantize_supported", "quiet_step", "read_npz", "require_pass",
           "resolve_framework", "run", "save_outputs", "source_sha256", "tune"]


def _declared(*owners: type, only: Optional[Sequence[str]] = None):
    """Show the options declared in mlc.pipeline.options as the function's keywords (help(), IDEs that read
    __signature__) and in its docstring; the function takes them as **options."""
    def wrap(func):
        signature = inspect.signature(func)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        func.__signature__ = signature.replace(parameters=own + declared.keyword_parameters(owners, only))
        func.__doc__ = (func.__doc__ or "") + "\n\n    Options:\n" + declared.describe(owners, only)
        return func
    return wrap


@_declared(ModelSpec, CompileOptions)
def compile(source: str, *, step: StepReporter = quiet_step, **options: Any) -> CompileResult:  # the verb users know
    """Compile a model (ONNX, PyTorch, TensorFlow, Paddle, or zoo:NAME) for a target into a
    verified artifact directory. Framework models are checked against the framework's eager outputs.

    CPU targets get tuned schedules from the tuning database `db` (see `mlc tune`; records match
    static kernels: with `dynamic`, symbolic kernels keep the default schedules, and a database from
    `mlc tune --dynamic` names their static twins, replayed on them only with MLC_DYNAMIC_RECORDS=replay)
    and mlc's default schedules for the other kernels (`default_schedules=False`: TVM's unscheduled loops,
    for comparison).

    Raises MlcError subclasses for anything the user can fix; AccuracyError (exit 3) is not
    raised here: the artifact is written and `result.check` says whether it matches.
    Each option takes what its CLI flag takes (`input_shapes=["x:1x128"]`, `buckets=["seq=8,16,32"]`) or its value
    type (mlc.pipeline.options.InputShape, ...); `pass_options` is a mlc.passes.Options.
    `precision` bf16/fp16 builds are judged by the accuracy gate (`result.check.gate`), and so are `quantize` ones,
    on several seeded inputs. `inputs` also fix the compile sizes of every symbolic dim but those `dynamic` names
    (a dim that moves with one of those, such as a KV cache's total = past + seq, is found by running the model and
    compiled as that expression)."""
    model, compile_options = declared.split(source, options)
    return compiling.compile(model, compile_options, step)


@_declared(ModelSpec, CompileOptions)
def compile_targets(source: str, target_list: Sequence[str], *, step: StepReporter = quiet_step,
                    on_target: Callable[[str], None] = lambda name: None, **options: Any) -> Iterator[CompileResult]:
    """`compile` for each of several targets (the options as for `compile`, but `target`): every target's options,
    runtime and toolchain are checked before any compiles; with several, `output` is the folder that receives
    MODEL-TARGET for each. `on_target(preset name)` is called before each compile."""
    model, compile_options = declared.split(source, options)
    for plan in compiling.plan_targets(model, compile_options, target_list):
        on_target(plan.preset.name)
        yield compiling.compile(model, plan.options, step)


@_declared(RunOptions)
def run(artifact: str | Path, inputs: Inputs = None, **options: Any) -> RunResult:
    """Run an artifact on inputs (an .npz path, a dict, or None for its reference inputs) and time it."""
    declared.accept(options, declared.names(RunOptions), "run")
    return running.run(artifact, inputs, RunOptions(**options))


@_declared(ModelSpec, TuneOptions, only=(*declared.TUNE_MODEL_OPTIONS, *declared.names(TuneOptions)))
def tune(source: str, *, on_event: Callable[[dict, list], None] = lambda event, tasks: None,
         seed: Optional[int] = None, **options: Any) -> TuneResult:
    """Tune `source`'s kernels with MetaSchedule into a resumable database folder (see mlc.tuning.tune;
    `on_event(event, tasks)` is called as the search goes)."""
    from mlc import tuning

    declared.accept(options, [*declared.TUNE_MODEL_OPTIONS, *declared.names(TuneOptions)], "tune")
    model = {k: v for k, v in options.items() if k in declared.TUNE_MODEL_OPTIONS}
    how = TuneOptions(**{k: v for k, v in options.items() if k not in declared.TUNE_MODEL_OPTIONS})
    return tuning.tune(source, **model, **{f: getattr(how, f) for f in declared.names(TuneOptions)},
                       on_event=on_event, seed=seed)


@_declared(ModelSpec, only=declared.EXPORT_OPTIONS)
def export(source: str, output: str | Path, *, atol: Optional[float] = None, rtol: Optional[float] = None,
           step: StepReporter = quiet_step, **options: Any) -> ExportResult:
    """Convert a framework model (or zoo:NAME) to an ONNX file, and compare ONNX Runtime on it with
    the framework's eager outputs (on `inputs`, the user's .npz of sample inputs, else seeded ones). Stops before
    TVM."""
    declared.accept(options, declared.EXPORT_OPTIONS, "export")
    return exporting.export(ModelSpec(source, **options), output, atol=atol, rtol=rtol, step=step)


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
