"""`mlc export`: the first step of the data path alone. A framework model to an ONNX file, with ONNX Runtime on the
export compared to the framework's eager outputs; stops before TVM."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mlc.artifacts.manifest import SourceInfo
from mlc.check import CheckResult, compare
from mlc.errors import InputError
from mlc.frontends import onnx as onnx_frontend
from mlc.frontends import onnx_weights
from mlc.pipeline import source as sources
from mlc.pipeline.options import ModelSpec, check_tolerances
from mlc.pipeline.steps import StepReporter, Timer, quiet_step
from mlc.runtime import runner as thin_runtime


@dataclass
class ExportResult:
    path: Path
    source: SourceInfo
    conversion: Optional[CheckResult]  # ONNX Runtime on the export vs the framework's eager outputs
    conversion_error: str = ""


def export(model: ModelSpec, output: str | Path, *, atol: Optional[float] = None, rtol: Optional[float] = None,
           step: StepReporter = quiet_step) -> ExportResult:
    """Write `model` as the ONNX file `output` (see mlc.api.export)."""
    check_tolerances(atol, rtol)
    output = Path(output)
    if output.suffix.lower() != ".onnx" or output.is_dir():
        raise InputError(f"-o {output}: give a file name ending in .onnx")
    if output.exists() and Path(model.source).exists() and output.samefile(model.source):
        raise InputError(f"-o {output} is the model being exported; give another file name")
    model.dynamic_dims()  # a malformed --dynamic fails before the framework starts
    model = sources.resolve(model)
    timed = Timer(step)
    with tempfile.TemporaryDirectory(prefix="mlc-export-") as scratch:
        source = sources.to_onnx(model, Path(scratch), timed)
        onnx_frontend.load(source.path)  # a broken export is reported here, not written out
        conversion, error = None, ""
        converted = source.converted
        if converted is not None:
            with timed("reference", "Running the export with ONNX Runtime"):
                try:
                    ort = onnx_frontend.onnxruntime_reference(source.path, converted.feeds).outputs
                    conversion = compare(converted.eager, ort, atol=atol, rtol=rtol)
                    conversion.reference = f"{converted.framework} {converted.framework_version} eager"
                except InputError as e:
                    error = str(e)
        staging = output.with_name(f".{output.name}.{os.getpid()}.tmp")  # beside it: the moves below are renames
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            staging.mkdir()
            # weights over 2 GB are external data (OUTPUT.data), moved in before the model that names them
            for written in onnx_weights.copy_model(source.path, staging / output.name):
                written.replace(output.with_name(written.name))
        except OSError as e:  # as the artifact store says it
            raise InputError(f"cannot write to {output.parent}: {e.strerror or e}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    info = source.info
    if not info.sha256:
        info.sha256 = thin_runtime.sha256_file(output)
    return ExportResult(output, info, conversion, error)
