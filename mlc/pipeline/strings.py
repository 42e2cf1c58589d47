"""ONNX models that compute on strings (tokenising splits, label encoding, regex matches): TVM compiles their numeric
part, and the artifact's runtime runs the string ops on the host before and after it (mlc.frontends.onnx_strings,
mlc.runtime.host_ops). The artifact's inputs, outputs and reference stay the model's own."""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import onnx

from mlc import artifacts, frontends
from mlc.artifacts.manifest import HostInfo, Manifest, SourceInfo, TensorSpec
from mlc.errors import InputError
from mlc.frontends import onnx as onnx_frontend
from mlc.frontends import onnx_strings, onnx_weights
from mlc.pipeline.options import CompileOptions, DynamicDims, ModelSpec
from mlc.runtime import host_ops
from mlc.runtime import runner as thin_runtime

HOST_MODULE = "runtime/mlc_host_ops.py"  # the name the thin runtime imports it by in an artifact
NUMERIC_MODEL, NUMERIC_INPUTS = "numeric.onnx", "numeric_inputs.npz"


@dataclass
class StringModel:
    """A string model's split, and the compile of its numeric part as a model spec."""

    numeric: ModelSpec  # what the usual pipeline compiles: the numeric part, on the host's results as --inputs
    program: dict  # the host's ops (mlc.runtime.host_ops)
    inputs: list[TensorSpec]  # the model's, as it declares them (the compiled part's fix their shapes)
    reference: onnx_frontend.Reference  # the whole model's outputs on its inputs
    source: SourceInfo  # the model's file
    samples: Optional[dict]  # --inputs: {"file", "sha256"} of the user's samples


def split(model: ModelSpec, options: CompileOptions, workdir: Path) -> Optional[StringModel]:
    """None unless `model` (resolved) is an ONNX file with string values; else the numeric part written to
    `workdir` with the host's results on the reference inputs as its --inputs."""
    if model.framework != frontends.ONNX or not Path(model.source).is_file():
        return None
    path = Path(model.source).resolve()
    try:  # the graph without its weights' bytes: a look costs milliseconds on a large model
        light = onnx_weights.load_light(path, workdir / "strings-probe")
    except Exception:  # noqa: BLE001 - not ONNX: prepare's load says so in one line
        return None
    if not onnx_strings.has_strings(light):
        return None
    onnx_model = onnx.load(path)  # with its weights: the numeric part is written out whole
    parts = onnx_strings.split(onnx_model)
    if parts is None:  # a LabelEncoder of numbers, say: nothing for the host
        return None
    _refuse_options(model, options)
    specs = onnx_frontend.input_specs(onnx_model)
    feeds = _feeds(model, specs, {i for n in onnx_model.graph.node if n.op_type in ("Cast", "CastLike")
                                  for i in n.input})
    reference = onnx_frontend.onnxruntime_reference(path, {
        k: v.astype(object) if v.dtype.kind == "U" else v for k, v in feeds.items()})
    reference.inputs = feeds
    reference.outputs = {k: host_ops.as_strings(v) if host_ops.is_strings(v) else v
                         for k, v in reference.outputs.items()}
    values = dict(feeds)
    host_ops.run(parts.program, "before", values)
    numeric_path = workdir / NUMERIC_MODEL
    onnx.save(parts.core, numeric_path)
    core_inputs = [v.name for v in parts.core.graph.input]
    numeric_inputs = None
    if core_inputs:
        numeric_inputs = workdir / NUMERIC_INPUTS
        thin_runtime.save_npz(numeric_inputs, {name: values[name] for name in core_inputs})
    # The dims the model leaves open stay open in the compiled part, as --dynamic would keep them
    declared = {d for s in specs for d in s.shape if isinstance(d, str)}
    open_dims = [d.dim_param for v in parts.core.graph.input for d in v.type.tensor_type.shape.dim
                 if d.dim_param and d.dim_param in declared]
    numeric = dataclasses.replace(model, source=str(numeric_path), inputs=str(numeric_inputs) if core_inputs else None,
                                  dynamic=(DynamicDims.parse(",".join(dict.fromkeys(open_dims))),) if open_dims else ())
    inputs = [TensorSpec(name=s.name, dtype=_dtype(feeds[s.name]), shape=s.shape) for s in specs]
    opset = next((o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx")), None)
    source = SourceInfo(name=path.stem, path=str(path), format="onnx", sha256=thin_runtime.sha256_file(path),
                        opset=opset)
    samples = {"file": str(Path(model.inputs).resolve()), "sha256": thin_runtime.sha256_file(model.inputs)} \
        if model.inputs else None
    return StringModel(numeric, parts.program, inputs, reference, source, samples)


def _refuse_options(model: ModelSpec, options: CompileOptions) -> None:
    given = [flag for flag, value in (("--input-shape", model.input_shapes), ("--dynamic", model.dynamic),
                                      ("--buckets", model.buckets), ("--freeze", model.freeze),
                                      ("--quantize", options.quantize), ("--precision", options.precision != "fp32"))
             if value]
    if given:
        raise InputError(f"{given[0]} is not supported yet for a model with string ops: compile it without (the dims "
                         "the model leaves open stay open; --inputs FILE.npz gives the reference inputs)")


def _feeds(model: ModelSpec, specs: list, cast: set[str]) -> dict[str, np.ndarray]:
    """The reference inputs: the user's --inputs, else seeded ones: string inputs are seeded words, or numbers
    written out where a Cast reads them (`cast`)."""
    if model.inputs:
        try:
            data = thin_runtime.load_npz(model.inputs, [s.name for s in specs])
        except thin_runtime.FeedError as e:
            raise InputError(f"--inputs: {e}") from None
        missing = [s.name for s in specs if s.name not in data]
        if missing:
            raise InputError(f"--inputs {model.inputs}: the file lacks {', '.join(missing)}; the model's inputs "
                             f"are: {', '.join(s.name for s in specs)}")
        return {s.name: host_ops.as_strings(data[s.name]) if host_ops.is_strings(data[s.name]) else data[s.name]
                for s in specs}
    shapes = onnx_frontend.concrete_shapes(specs, {})
    numeric = [s for s in specs if s.dtype != "object"]
    feeds = onnx_frontend.make_inputs(numeric, shapes)
    rng = np.random.default_rng(onnx_frontend.REFERENCE_SEED)
    words = np.array(["the", "model", "runs", "on", "strings", "Monday", "x86", "a.b", "mlc", "42"])
    for s in specs:
        if s.dtype == "object":
            feeds[s.name] = rng.choice(words, size=shapes[s.name]) if s.name not in cast else \
                rng.standard_normal(shapes[s.name]).astype(np.float32).astype(str)
    return feeds


def _dtype(array: np.ndarray) -> str:
    return thin_runtime.STRING if host_ops.is_strings(array) else str(array.dtype)


def attach(staged: Path, manifest: Manifest, strings: StringModel) -> Manifest:
    """The artifact of the numeric part made the model's: the host program and its runtime module, the model's
    inputs, outputs and reference, and its source. `manifest`: as package() sealed it; returns it sealed again."""
    shutil.copyfile(Path(host_ops.__file__), staged / HOST_MODULE)
    reference = strings.reference
    thin_runtime.save_npz(staged / manifest.reference.inputs, reference.inputs)
    thin_runtime.save_npz(staged / manifest.reference.outputs, reference.outputs)
    outputs = [TensorSpec(name=name, dtype=_dtype(value), shape=list(value.shape))
               for name, value in reference.outputs.items()]
    host = HostInfo(module=HOST_MODULE, before=strings.program["before"], after=strings.program["after"],
                    constants=strings.program["constants"], core_inputs=manifest.inputs, core_outputs=manifest.outputs)
    reference_info = manifest.reference.model_copy(update={"producer": reference.producer,
                                                             "user_inputs": strings.samples})
    compiled = {spec.name: spec for spec in manifest.inputs}  # the model's inputs the compiled part takes
    inputs = [compiled.get(spec.name, spec) for spec in strings.inputs]
    updated = manifest.model_copy(update={"inputs": inputs, "outputs": outputs, "host": host,
                                          "reference": reference_info, "source": strings.source, "files": {}})
    return artifacts.seal(staged, updated)


def note(host: HostInfo) -> str:
    """The compile summary's line on what runs on the host."""
    ops = [node["op"] for node in host.before + host.after]
    counts = ", ".join(f"{op} x{ops.count(op)}" for op in dict.fromkeys(ops))
    return (f"{len(ops)} string op(s) run on the host in numpy, before and after the compiled part ({counts}): TVM "
            f"compiles numbers only; the artifact's runtime ships them ({HOST_MODULE})")
