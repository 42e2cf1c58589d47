"""Typed options: what model to read and how (ModelSpec), and how to compile it (CompileOptions). The artifact's
rebuild recipe is serialised from them."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from mlc import frontends, passes
from mlc.errors import InputError


@dataclass(frozen=True)
class ModelSpec:
    """The model and the options that decide its inputs, shared by compile, export, debug and tune."""

    source: str  # a model file or folder, file.py:factory, or zoo:NAME
    framework: Optional[str] = None  # onnx, torch, tensorflow, paddle; None: detected (zoo:NAME: its first)
    input_shapes: tuple[str, ...] = ()  # NAME:1x128 (or 1x128 for a single input)
    dynamic: tuple[str, ...] = ()  # dims kept symbolic: batch,seq or seq=1..512
    exporter: str = "auto"  # PyTorch's ONNX exporter: auto, dynamo, torchscript
    buckets: tuple[str, ...] = ()  # one static build per length: 8,16,32 or seq=8,16,32
    inputs: Optional[str] = None  # the user's sample inputs (.npz by input name): the reference, and the shapes
    freeze: tuple[str, ...] = ()  # inputs folded into the graph as constants, at their value in `inputs`

    def __post_init__(self):  # callers pass lists; the spec keeps tuples so it stays immutable
        if self.inputs is not None:
            object.__setattr__(self, "inputs", str(self.inputs))
        for name in ("input_shapes", "dynamic", "buckets", "freeze"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def with_framework(self, framework: str) -> "ModelSpec":
        return dataclasses.replace(self, framework=framework)

    def dynamic_dims(self) -> Optional[dict[str, Optional[tuple[int, int]]]]:
        """--dynamic parsed: {dim: (min, max) or None}; None when not given."""
        return frontends.parse_dynamic(self.dynamic)


@dataclass(frozen=True)
class CompileOptions:
    """How to compile: target, output, schedules, passes, the check's tolerances, packaging."""

    target: str = "x86"  # a preset (see `mlc targets`) or TVM target JSON
    output: Optional[Path] = None  # the artifact directory; None: artifacts/MODEL-TARGET
    db: Optional[str | Path] = None  # tuning database written by `mlc tune` (CPU targets)
    default_schedules: bool = True  # False: TVM's unscheduled loops for kernels the db does not cover
    pass_options: passes.Options = passes.Options()
    atol: Optional[float] = None  # the check's tolerances; None: by dtype
    rtol: Optional[float] = None
    archive: bool = False  # also write DIR.tar.gz
    isolate: bool = True  # run TVM in a child process
    precision: str = "fp32"  # fp32, bf16 (CPU) or fp16 (CUDA): matmul/conv inputs and weights, fp32 accumulation
    emulated: bool = False  # allow a precision the target has no instructions for (slow; for accuracy studies)
    quantize: Optional[str] = None  # int8 (calibrated static) or int8-dynamic: matmul/conv on int8 (CPU)
    calibration: tuple[str, ...] = ()  # --quantize int8: .npz files of inputs keyed by input name

    def __post_init__(self):  # callers pass lists; the options keep tuples so they stay immutable
        object.__setattr__(self, "calibration", tuple(str(c) for c in self.calibration))


def check_tolerances(atol: Optional[float], rtol: Optional[float]) -> None:
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and not (value >= 0 and np.isfinite(value)):
            raise InputError(f"--{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class Recipe:
    options: dict  # the manifest's compile.options
    command: str  # the `mlc compile` command line that passes them


def recipe(model: ModelSpec, options: CompileOptions) -> Recipe:
    """The options that rebuild an artifact, and the command line; `model.framework` is the resolved one.
    The key and flag order is the manifest's (artifacts record it; keep it stable)."""
    recorded = {"target": options.target, "framework": model.framework, "input_shapes": list(model.input_shapes),
                "dynamic": list(model.dynamic), "exporter": model.exporter, "passes": options.pass_options.to_json()}
    argv = ["mlc", "compile", model.source, "--target", options.target]
    if model.framework != frontends.ONNX:
        argv += ["--framework", model.framework]
    argv += [a for s in model.input_shapes for a in ("--input-shape", s)]
    argv += [a for d in model.dynamic for a in ("--dynamic", d)]
    if model.exporter != "auto":
        argv += ["--exporter", model.exporter]
    if model.inputs:  # the samples decide shapes and the reference: the rebuild needs the same file
        recorded["inputs"] = str(Path(model.inputs).resolve())
        argv += ["--inputs", model.inputs]
    if model.freeze:
        recorded["freeze"] = list(model.freeze)
        argv += [a for n in model.freeze for a in ("--freeze", n)]
    if options.db is not None:
        recorded["db"] = str(Path(options.db).resolve())
        argv += ["--db", str(options.db)]
    if model.buckets:
        recorded["buckets"] = list(model.buckets)
        argv += [a for b in model.buckets for a in ("--buckets", b)]
    if options.precision != "fp32":
        recorded["precision"] = options.precision
        argv += ["--precision", options.precision]
    if options.quantize:
        recorded["quantize"] = options.quantize
        argv += ["--quantize", options.quantize]
        if options.calibration:
            recorded["calibration"] = [str(Path(c).resolve()) for c in options.calibration]
            argv += [a for c in options.calibration for a in ("--calibration", c)]
    if options.emulated and (options.precision != "fp32" or options.quantize):
        recorded["emulated"] = True
        argv.append("--emulated")
    return Recipe(recorded, shlex.join(argv + options.pass_options.cli_args()))
