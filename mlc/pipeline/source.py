"""The first step of the data path: a model spec (a file, a folder, file.py:factory or zoo:NAME) to an ONNX file
on disk, its description for the manifest, and for framework models the conversion (export + eager outputs)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mlc import frontends, models
from mlc.artifacts.manifest import SourceInfo
from mlc.errors import InputError
from mlc.pipeline.convert import Converted, convert
from mlc.pipeline.options import ModelSpec
from mlc.pipeline.steps import Timer
from mlc.runtime import runner as thin_runtime


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_name(source: str) -> str:
    if models.is_zoo(source):
        return models.get(source).name
    factory = source.rpartition(":")
    return Path(factory[0]).stem if factory[0].endswith(".py") else Path(source).stem


def source_files(source: str) -> list[Path]:
    """The files a model spec reads (a file, a folder's files, a Paddle prefix's pair, a factory's .py)."""
    path = Path(source.rpartition(":")[0] if frontends.detect(source) == "torch" and ".py:" in source else source)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    if path.is_file():
        return [path]
    return sorted(p for p in path.parent.glob(path.name + ".*") if p.is_file())  # a prefix


def source_sha256(source: str) -> str:
    """sha256 of a model file; of the per-file hashes for a folder or prefix."""
    files = source_files(source)
    if len(files) == 1:
        return thin_runtime.sha256_file(files[0])
    return sha256_bytes("".join(f"{p.name}:{thin_runtime.sha256_file(p)}\n" for p in files).encode())


def resolve_framework(source: str, framework: Optional[str]) -> str:
    """The framework a model spec is read with: --framework, the zoo model's first, or detected."""
    if framework:
        name = frontends.resolve_framework(framework)
        if models.is_zoo(source):
            models.get(source).builder(name)  # raises when the zoo model does not exist in that framework
        return name
    if models.is_zoo(source):
        return models.get(source).default_framework
    detected = frontends.detect(source)
    if detected:
        return detected
    if not Path(source).exists():
        raise InputError(f"model file not found: {source}")
    if Path(source).is_file() and Path(source).suffix:
        raise InputError(f"{Path(source).name}: unrecognised model format; mlc reads ONNX (.onnx), PyTorch (.pt2, "
                         "TorchScript .pt, file.py:factory), TensorFlow (SavedModel folder, .keras, .h5) and Paddle "
                         "(jit.save prefix) models, or pass --framework")
    return frontends.ONNX  # no suffix: read as ONNX, which says clearly if it is not


def resolve(model: ModelSpec) -> ModelSpec:
    """The spec with its framework decided."""
    return model.with_framework(resolve_framework(model.source, model.framework))


@dataclass
class Source:
    """A model as an ONNX file, described for the manifest."""

    path: Path  # the ONNX file: the user's, the zoo model written out, or the framework model's export
    info: SourceInfo  # sha256 stays "" for a user's ONNX file until it is loaded (hashed once, there)
    converted: Optional[Converted] = None  # framework models: the export and the eager outputs


def to_onnx(model: ModelSpec, workdir: Path, timed: Timer) -> Source:
    """A resolved model spec (framework decided) to an ONNX file on disk; framework models are exported (and run
    eagerly) in their framework's child process."""
    source, framework = model.source, model.framework
    zoo = models.is_zoo(source)
    name = models.get(source).name if zoo else Path(source).stem
    if framework == frontends.ONNX:
        if zoo:
            path = workdir / f"{name}.onnx"
            data = models.get(source).build().SerializeToString()
            path.write_bytes(data)
            return Source(path, SourceInfo(name=name, path=source, format="onnx", sha256=sha256_bytes(data)))
        path = Path(source)
        return Source(path, SourceInfo(name=path.stem, path=str(path.resolve()), format="onnx", sha256=""))
    display = frontends.FRAMEWORKS[framework].display
    dynamic = model.dynamic_dims()
    with timed("export", f"Exporting the {display} model to ONNX and running it eagerly"):
        converted = convert(source, framework, workdir, dynamic=None if dynamic is None else list(dynamic),
                                      input_shapes=[str(s) for s in model.input_shapes], exporter=model.exporter,
                                      inputs=model.inputs)
    sha = thin_runtime.sha256_file(converted.onnx_path) if zoo else source_sha256(source)
    info = SourceInfo(name=name, path=source if zoo or ".py:" in source else str(Path(source).resolve()),
                      format=framework, sha256=sha, framework_version=converted.framework_version,
                      exporter=converted.exporter, dynamic=converted.dynamic)
    return Source(converted.onnx_path, info, converted)
