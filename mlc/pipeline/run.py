"""After the data path: an artifact run on inputs (`mlc run`) and checked against its stored reference
(`mlc check`), through the thin runtime it carries."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

from mlc import artifacts
from mlc.check import CheckResult, compare
from mlc.compiler import runtimes
from mlc.errors import AccuracyError, InputError, IntegrityError, MissingDependencyError
from mlc.pipeline.options import RunOptions, check_tolerances
from mlc.runtime import runner as thin_runtime

Inputs = Optional[str | Path | Mapping[str, np.ndarray]]  # an .npz path, a dict, or None: the reference inputs


@contextlib.contextmanager
def runtime_errors():
    """The thin runtime's exceptions (it cannot import mlc) as MlcErrors with their exit codes."""
    try:
        yield
    except thin_runtime.FeedError as e:
        raise InputError(str(e)) from None
    except (thin_runtime.EmulatorMissing, thin_runtime.DeviceMissing) as e:
        raise MissingDependencyError(str(e)) from None
    except thin_runtime.ArtifactError as e:
        raise IntegrityError(str(e)) from None


def open_runner(artifact: str | Path, threads: Optional[int] = None, device: Optional[str] = None
                ) -> thin_runtime.Runner | thin_runtime.NativeRunner:
    """Validate an artifact (schema + sha256) and load it for running: in this process when it
    was built for this machine, else through its native runner under emulation. `threads`: CPU
    threads (default: TVM_NUM_THREADS, else one per physical core; thin_runtime.set_threads);
    `device`: which GPU ("cuda:1"; default the first)."""
    manifest = artifacts.load(artifact)
    with runtime_errors():
        if manifest.target.runtime_arch == runtimes.HOST_ARCH:
            return thin_runtime.Runner(artifact, verify=False, threads=threads, device=device)  # just verified
        return thin_runtime.NativeRunner(artifact, verify=False, threads=threads)


def read_npz(path: str | Path, names: list[str] | tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    with runtime_errors():
        return thin_runtime.load_npz(path, names)


def save_outputs(path: str | Path, outputs: Mapping[str, np.ndarray], artifact: Optional[str | Path] = None) -> None:
    """Write `outputs` to the .npz `path`; never over a file of `artifact` (the one that made them)."""
    with runtime_errors():
        if artifact is not None:
            thin_runtime.refuse_artifact_file(artifact, thin_runtime.read_manifest(artifact), path)
        thin_runtime.save_npz(path, outputs)


def load_inputs(runner: thin_runtime.Runner, inputs: Inputs) -> dict[str, np.ndarray]:
    if inputs is None:
        return read_npz(runner.root / runner.manifest["reference"]["inputs"])
    if isinstance(inputs, Mapping):
        return dict(inputs)
    return read_npz(inputs, [i["name"] for i in runner.manifest["inputs"]])


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    latency: Optional[dict[str, float]]
    warnings: list[str]
    profile: Optional[list[dict[str, Any]]] = None
    threads: Optional[int] = None  # the CPU threads it ran with (None: TVM's default)


def run(artifact: str | Path, inputs: Inputs = None, options: Optional[RunOptions] = None) -> RunResult:
    """Run an artifact on inputs (an .npz path, a dict, or None for its reference inputs);
    `options.profile` also times each kernel call (Runner.profile)."""
    options = options or RunOptions()
    runner = open_runner(artifact, options.threads, options.device)
    if options.profile and not isinstance(runner, thin_runtime.Runner):
        raise InputError(f"--profile needs an artifact built for this machine; {artifact} runs under emulation here")
    feeds = load_inputs(runner, inputs)
    with runtime_errors():
        outputs, latency, warnings = runner.measure(feeds, options.warmup, options.repeat)
        kernels = runner.profile(feeds) if options.profile else None
    return RunResult(outputs, latency, warnings, kernels, runner.threads)


def check(artifact: str | Path, *, atol: Optional[float] = None, rtol: Optional[float] = None,
          device: Optional[str] = None) -> CheckResult:
    """Run the artifact on its reference inputs and compare with its reference outputs (and, for
    bucketed artifacts, each bucket at its most padded length)."""
    check_tolerances(atol, rtol)
    runner = open_runner(artifact, device=device)
    reference = read_npz(runner.root / runner.manifest["reference"]["outputs"])
    feeds = load_inputs(runner, None)
    try:
        with runtime_errors():
            actual = runner.run(feeds)
    except InputError as e:  # the inputs are the artifact's own: a broken artifact, not a user mistake
        raise IntegrityError(f"the artifact's reference inputs do not fit its model: {e}") from None
    with runtime_errors():
        result = thin_runtime.check_outputs(runner, actual, atol, rtol)
    info = runner.manifest["reference"]
    if info.get("onnxruntime"):
        result.conversion = compare(reference, read_npz(runner.root / info["onnxruntime"]), atol=atol, rtol=rtol)
        result.conversion.reference = info.get("producer", "")
    result.conversion_error = info.get("onnxruntime_error") or ""
    return result


def require_pass(result: CheckResult) -> None:
    """Raise AccuracyError (exit 3) naming the failed outputs, and the export when it lost the accuracy."""
    if not result.passed:
        failed = result.failed()
        where = ""
        if result.gate is not None:
            what = "quantised" if result.gate.precision.startswith("int8") else ""
            raise AccuracyError(f"the {result.gate.precision} {what + ' ' if what else ''}build misses the accuracy "
                                f"gate for output(s): {', '.join(failed)}")
        if result.conversion is not None and not result.conversion.passed:
            where = ("; ONNX Runtime on the exported ONNX differs from the framework's eager outputs too, so the "
                     "error comes before TVM")
            if result.conversion.reference.startswith("torch"):
                where += " (try another --exporter)"
        raise AccuracyError(f"accuracy check failed for output(s): {', '.join(failed)}{where}")
