"""The Python API. Each CLI command is a thin layer over one function here."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Optional, Sequence

import numpy as np
import onnx

from mlc import __version__, artifacts, compiler, models, targets
from mlc.artifacts.manifest import (
    CompileInfo,
    Manifest,
    ReferenceInfo,
    RuntimeInfo,
    SourceInfo,
    TargetInfo,
    TensorSpec,
)
from mlc.check import CheckResult, compare
from mlc.compiler.frontends import onnx as onnx_frontend
from mlc.compiler.passes import onnx as onnx_passes
from mlc.errors import AccuracyError, InputError, IntegrityError
from mlc.runtime import runner as thin_runtime

DEFAULT_OUTPUT_ROOT = Path("artifacts")
LIBRARY = "model.so"
RUNTIME_LIBRARY = "runtime/libtvm_runtime.so"
RUNTIME_MODULE = "runtime/mlc_runtime.py"
RUN_ENTRY = "run.py"
REFERENCE_INPUTS = "reference/inputs.npz"
REFERENCE_OUTPUTS = "reference/outputs.npz"

# A step reporter: called with a description, returns a context manager around the step.
StepReporter = Callable[[str], ContextManager[object]]


def _quiet_step(_: str) -> ContextManager[object]:
    return contextlib.nullcontext()


@dataclass
class CompileResult:
    path: Path
    manifest: Manifest
    check: CheckResult
    archive: Optional[Path] = None
    notes: list[str] = field(default_factory=list)


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _resolve_source(source: str, workdir: Path) -> tuple[Path, SourceInfo]:
    """A model spec ('path.onnx' or 'zoo:NAME') to an ONNX file on disk and its description."""
    if models.is_zoo(source):
        zoo_model = models.get(source)
        path = workdir / f"{zoo_model.name}.onnx"
        data = zoo_model.build().SerializeToString()
        path.write_bytes(data)
        return path, SourceInfo(name=zoo_model.name, path=source, format="onnx", sha256=_sha256_bytes(data))
    path = Path(source)
    if path.suffix.lower() not in (".onnx", "") and path.is_file():
        raise InputError(
            f"{path.name}: only ONNX models (.onnx) and zoo:NAME are supported for now; export the model to ONNX first"
        )
    return path, SourceInfo(name=path.stem, path=str(path), format="onnx", sha256="")


def compile(  # noqa: A001 - the verb users know
    source: str,
    target: str = "x86",
    output: Optional[str | Path] = None,
    input_shapes: Sequence[str] = (),
    archive: bool = False,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    step: StepReporter = _quiet_step,
) -> CompileResult:
    """Compile an ONNX model (or zoo:NAME) for a target into a verified artifact directory.

    Raises MlcError subclasses for anything the user can fix; AccuracyError (exit 3) is not
    raised here: the artifact is written and `result.check` says whether it matches."""
    timings: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(key: str, description: str):
        start = time.perf_counter()
        with step(description):
            yield
        timings[key] = round(time.perf_counter() - start, 4)

    preset = targets.resolve(target)
    runtime_lib = compiler.runtime_library()
    with tempfile.TemporaryDirectory(prefix="mlc-compile-") as scratch:
        workdir = Path(scratch)
        with timed("load", "Loading the model"):
            model_path, source_info = _resolve_source(source, workdir)
            model = onnx_frontend.load(model_path)
            if not source_info.sha256:
                source_info.sha256 = thin_runtime.sha256_file(model_path)
            source_info.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
            compiler.check_supported(model)
            specs = onnx_frontend.input_specs(model)
            fixed = onnx_frontend.resolve_input_shapes(specs, list(input_shapes))
        with timed("reference", "Computing reference outputs with ONNX Runtime"):
            feeds = onnx_frontend.make_inputs(specs, onnx_frontend.concrete_shapes(specs, fixed))
            reference = onnx_frontend.onnxruntime_reference(model_path, feeds)
        with timed("onnx_passes", "Folding constants and inferring shapes"):
            nodes_before = len(model.graph.node)
            cleaned, notes = onnx_passes.clean(onnx_frontend.fix_input_shapes(model, fixed))
            cleaned_path = workdir / "cleaned.onnx"
            onnx.save(cleaned, str(cleaned_path))

        name = source_info.name
        final = Path(output) if output else DEFAULT_OUTPUT_ROOT / f"{name}-{preset.name}"
        with artifacts.staging_dir(final) as staged:
            with timed("tvm", f"Compiling with TVM for {preset.name} ({preset.tvm.get('mcpu', preset.tvm['kind'])})"):
                result = compiler.compile_in_worker(cleaned_path, preset.tvm, staged / LIBRARY)
            timings.update({f"tvm_{k}": round(v, 4) for k, v in result["timings"].items()})
            with timed("package", "Packaging the artifact"):
                manifest = _package(staged, runtime_lib, preset, source_info, specs, fixed, reference, result,
                                    timings, nodes_before, len(cleaned.graph.node), list(input_shapes), source, target)
                artifacts.publish(staged, final)
    with timed("check", "Checking the artifact against the reference"):
        check_result = check(final, atol=atol, rtol=rtol)
    archive_path = artifacts.archive(final) if archive else None
    return CompileResult(final, manifest, check_result, archive_path, notes)


def _package(staged: Path, runtime_lib: Path, preset: targets.Target, source_info: SourceInfo,
             specs: list, fixed: dict, reference: onnx_frontend.Reference, result: dict,
             timings: dict, nodes_before: int, nodes_after: int, input_shapes: list[str],
             source: str, target: str) -> Manifest:
    (staged / "runtime").mkdir()
    shutil.copyfile(runtime_lib, staged / RUNTIME_LIBRARY)
    shutil.copyfile(Path(thin_runtime.__file__), staged / RUNTIME_MODULE)
    shutil.copyfile(Path(thin_runtime.__file__).with_name("run_entry.py"), staged / RUN_ENTRY)
    (staged / "reference").mkdir()
    np.savez(staged / REFERENCE_INPUTS, **reference.inputs)
    np.savez(staged / REFERENCE_OUTPUTS, **reference.outputs)

    inputs = [
        TensorSpec(name=s.name, dtype=s.dtype, shape=fixed.get(s.name, s.shape), value_range=s.value_range)
        for s in specs
    ]
    out_names = list(reference.outputs)
    outputs = [
        TensorSpec(name=n, dtype=sig["dtype"], shape=sig["shape"]) for n, sig in zip(out_names, result["outputs"])
    ]
    recipe = " ".join(["mlc compile", source, "--target", target] + [f"--input-shape {s}" for s in input_shapes])
    manifest = Manifest(
        mlc_version=__version__,
        tvm_version=result["tvm_version"],
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        source=source_info,
        target=TargetInfo(**preset.to_json()),
        library=LIBRARY,
        runtime=RuntimeInfo(library=RUNTIME_LIBRARY, module=RUNTIME_MODULE, entry=RUN_ENTRY,
                            requires=["numpy", "apache-tvm-ffi==0.1.14.post1"]),
        reference=ReferenceInfo(producer=reference.producer, inputs=REFERENCE_INPUTS,
                                outputs=REFERENCE_OUTPUTS, seed=reference.seed),
        inputs=inputs,
        outputs=outputs,
        compile=CompileInfo(options={"target": target, "input_shapes": input_shapes}, timings_s=timings,
                            recipe=recipe, onnx_nodes={"before": nodes_before, "after": nodes_after}),
    )
    return artifacts.seal(staged, manifest)


def open_runner(artifact: str | Path) -> thin_runtime.Runner:
    """Validate an artifact (schema + sha256) and load it for running."""
    artifacts.load(artifact)
    try:
        return thin_runtime.Runner(artifact, verify=False)  # just verified
    except thin_runtime.ArtifactError as e:
        raise IntegrityError(str(e)) from None


def load_inputs(runner: thin_runtime.Runner, inputs: Optional[str | Path | Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if inputs is None:
        return thin_runtime.load_npz(runner.root / runner.manifest["reference"]["inputs"])
    if isinstance(inputs, Mapping):
        return dict(inputs)
    try:
        return thin_runtime.load_npz(inputs)
    except thin_runtime.FeedError as e:
        raise InputError(str(e)) from None


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    latency: Optional[dict[str, float]]
    warnings: list[str]


def run(artifact: str | Path, inputs=None, warmup: int = 3, repeat: int = 50) -> RunResult:
    """Run an artifact on inputs (an .npz path, a dict, or None for its reference inputs)."""
    if warmup < 0 or repeat < 0:
        raise InputError("--warmup and --repeat must be >= 0")
    runner = open_runner(artifact)
    feeds = load_inputs(runner, inputs)
    try:
        _, warnings = runner.prepare(feeds)
        outputs = runner.run(feeds)
        latency = runner.benchmark(feeds, warmup, repeat) if repeat > 0 else None
    except thin_runtime.FeedError as e:
        raise InputError(str(e)) from None
    return RunResult(outputs, latency, warnings)


def check(artifact: str | Path, atol: Optional[float] = None, rtol: Optional[float] = None) -> CheckResult:
    """Run the artifact on its reference inputs and compare with its reference outputs."""
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and not (value >= 0 and np.isfinite(value)):
            raise InputError(f"--{name} must be a finite number >= 0, got {value}")
    runner = open_runner(artifact)
    reference = thin_runtime.load_npz(runner.root / runner.manifest["reference"]["outputs"])
    actual = runner.run(load_inputs(runner, None))
    return compare(reference, actual, atol=atol, rtol=rtol)


def require_pass(result: CheckResult) -> None:
    if not result.passed:
        failed = [o.name for o in result.outputs if not o.passed]
        raise AccuracyError(f"accuracy check failed for output(s): {', '.join(failed)}")
