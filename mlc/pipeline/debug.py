"""`mlc debug`: where accuracy is lost. The graph clean-up is checked against the model as given, then TVM node by
node against ONNX Runtime: one build exposing every value, else bisection over prefix models; the first diverging
node can be extracted as its own model."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import numpy as np
import onnx

from mlc import artifacts, compiler, models, targets
from mlc.check import CheckResult, compare, compare_one, localize, tolerance_for
from mlc.compiler import runtimes
from mlc.compiler.contract import CompileRequest, RunFiles
from mlc.errors import InputError, TargetError
from mlc.frontends import onnx as onnx_frontend
from mlc.frontends import onnx_weights
from mlc.pipeline import source as sources
from mlc.pipeline.compile import build_settings
from mlc.pipeline.options import CompileOptions, ModelSpec, check_tolerances
from mlc.pipeline.prepare import prepare
from mlc.pipeline.run import Inputs, read_npz
from mlc.pipeline.steps import StepReporter, Timer, quiet_step
from mlc.runtime import runner as thin_runtime

METHODS = ("auto", "exposed", "bisect")


@dataclass
class DebugReport:
    """Where accuracy is lost, stage by stage: graph clean-up, then TVM node by node."""

    source: str
    target: str
    method: str  # "final-only" (healthy), "exposed" (one build, every value an output) or "bisect"
    builds: int
    values_compared: int
    cleanup: CheckResult  # ONNX Runtime on the cleaned graph vs on the model as given
    final: CheckResult  # the compiled model's outputs vs ONNX Runtime on the model as given
    divergence: localize.Divergence
    extracted: Optional[Path] = None

    @property
    def diverged(self) -> bool:
        return not self.cleanup.passed or not self.final.passed or self.divergence.first is not None

    def to_json(self) -> dict:
        d = self.divergence
        return {
            "source": self.source, "target": self.target, "method": self.method, "builds": self.builds,
            "values_compared": self.values_compared, "diverged": self.diverged,
            "cleanup": self.cleanup.to_json(), "final": self.final.to_json(),
            "first_divergence": d.first.to_json() if d.first else None,
            "first_nonfinite": d.first_nonfinite.to_json() if d.first_nonfinite else None,
            "preceding": [r.to_json() for r in d.preceding],
            "extracted": str(self.extracted) if self.extracted else None,
        }


def debug(model: ModelSpec, *, target: Optional[str] = None, inputs: Inputs = None, atol: Optional[float] = None,
          rtol: Optional[float] = None, extract: Optional[str | Path] = None, method: str = "auto",
          isolate: bool = True, step: StepReporter = quiet_step) -> DebugReport:
    """Find the first node whose compiled output differs from ONNX Runtime (see mlc.api.debug)."""
    if method not in METHODS:
        raise InputError(f"unknown method '{method}'; use auto, exposed or bisect")
    check_tolerances(atol, rtol)
    model, target, inputs = _debug_source(model, target, inputs)
    preset = targets.resolve(target)
    if (preset.runtime_arch, preset.runtime_os, preset.device) != (runtimes.HOST_ARCH, "linux", "cpu"):
        raise TargetError(f"mlc debug runs the compiled model on this machine's CPU, and target {preset.name} runs "
                          "elsewhere; debug with --target x86 (the same graph import and Relax passes) instead")
    if extract:
        artifacts.check_replaceable(Path(extract), marker="report.json")
    timed = Timer(step)
    feeds = None
    if inputs is not None:
        feeds = dict(inputs) if isinstance(inputs, Mapping) else read_npz(inputs)
    with tempfile.TemporaryDirectory(prefix="mlc-debug-") as scratch:
        workdir = Path(scratch)
        # Built exactly as `mlc compile` builds: the same passes and schedules, so a build it fails fails here too.
        steps, schedules = build_settings(preset, CompileOptions(target=preset.name))
        build = {"schedules": schedules, "relax_passes": [s.to_json() for s in steps]}
        prepared = prepare(model, workdir, timed, feeds=feeds, steps=steps)
        # ONNX Runtime runs it, and extracted nodes take their weights along: with the weights' data
        cleaned, feeds = onnx_weights.materialized(prepared.cleaned, workdir), prepared.feeds
        values = localize.computed_values(cleaned)
        with timed("reference", f"Computing {len(values)} intermediate values with ONNX Runtime"):
            # the model as given takes the --freeze inputs too (the cleaned graph holds them as constants)
            given = onnx_frontend.onnxruntime_reference(prepared.path, {**feeds, **prepared.frozen}).outputs
            # Graph inputs count as known values, so a node reading one can be reported and extracted.
            reference = {**feeds, **_ort_values(localize.with_outputs(cleaned, [v.name for v in values]), feeds)}
            cleanup = compare(given, {k: reference[k] for k in given if k in reference}, atol, rtol)
        out_names = [o.name for o in cleaned.graph.output]
        builds = 0

        def tvm_values(graph: onnx.ModelProto, tag: str, what: str) -> dict[str, np.ndarray]:
            nonlocal builds
            builds += 1
            with timed(f"build_{builds}", f"TVM build {builds}: {what}"):
                return _tvm_values(graph, feeds, preset, workdir, tag, isolate, build)

        final_values = tvm_values(cleaned, "final", "the model as compiled")
        final = compare(given, final_values, atol, rtol)
        # TVM is at fault only where it differs from ONNX Runtime on the graph TVM was given;
        # a difference from the model as given, with none here, was made by the clean-up.
        tvm_ok = compare({k: reference[k] for k in out_names}, final_values, atol, rtol).passed
        divergence, used, compared = _find_divergence(method, tvm_ok, len(out_names), cleaned, values, reference,
                                                      tvm_values, atol, rtol)
        extracted = None
        if extract and divergence.first is not None:
            extracted = _extract(Path(extract), cleaned, values[divergence.first.position], reference,
                                 divergence, preset, workdir, isolate, build)
    return DebugReport(model.source, preset.name, used, builds, compared, cleanup, final, divergence, extracted)


def _debug_source(model: ModelSpec, target: Optional[str], inputs: Inputs) -> tuple[ModelSpec, str, Inputs]:
    """For an artifact directory: its source model, framework, input shapes, target and reference inputs."""
    path = Path(model.source)
    if not (path.is_dir() and (path / thin_runtime.MANIFEST).is_file()):
        return model, target or "x86", inputs
    manifest = artifacts.load(path)
    origin = manifest.source.path
    if not models.is_zoo(origin):
        if not sources.source_files(origin):
            raise InputError(f"artifact {path} was compiled from {origin}, which is not there any more; "
                             f"run `mlc debug MODEL --target {manifest.compile.options.get('target', 'x86')}` "
                             "on the model file")
        if sources.source_sha256(origin) != manifest.source.sha256:
            raise InputError(f"{origin} has changed since artifact {path} was compiled from it; "
                             "run `mlc debug` on the model file itself")
    options = manifest.compile.options
    if inputs is None:
        inputs = path / manifest.reference.inputs
    model = dataclasses.replace(model, source=origin, framework=model.framework or manifest.source.format,
                                input_shapes=model.input_shapes or tuple(options.get("input_shapes", [])),
                                inputs=options.get("inputs"), freeze=tuple(options.get("freeze", [])))
    return model, target or options.get("target", "x86"), inputs


def _ort_values(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ONNX Runtime's value for every graph output of `model`."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        wanted = {i.name for i in session.get_inputs()}
        return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))
    except Exception as e:  # onnxruntime raises untyped errors
        raise InputError(f"ONNX Runtime cannot run the model's intermediate values: "
                         f"{str(e).splitlines()[0][:300]}") from None


def _tvm_values(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], preset: targets.Target,
                workdir: Path, tag: str, isolate: bool, build: dict) -> dict[str, np.ndarray]:
    """Compile `model` with TVM, run it on `feeds`, and name its outputs."""
    path, inputs, outputs = (workdir / f"{tag}{suffix}" for suffix in (".onnx", ".in.npz", ".out.npz"))
    onnx.save(model, str(path))
    weights = {init.name for init in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in weights]
    np.savez(inputs, **{f"in_{i}": feeds[n] for i, n in enumerate(names)})
    request = CompileRequest(onnx=str(path), target=preset.tvm, run=RunFiles(str(inputs), str(outputs)), **build)
    compiler.compile_in_worker(request, isolate=isolate)
    with np.load(outputs, allow_pickle=False) as data:
        return {v.name: data[f"out_{i}"] for i, v in enumerate(model.graph.output)}


def _find_divergence(method: str, tvm_ok: bool, output_count: int, cleaned, values, reference, tvm_values, atol,
                     rtol) -> tuple[localize.Divergence, str, int]:
    """The first diverging node, the method that found it and the values compared. "auto" searches only when TVM's
    outputs differ, and bisects only when exposing every value hid the error."""
    divergence, used, compared = localize.Divergence(), "final-only", output_count
    if method != "auto" or not tvm_ok:
        if method in ("auto", "exposed"):
            used = "exposed"
            exposed = localize.with_outputs(cleaned, [v.name for v in values])
            actual = tvm_values(exposed, "exposed", f"all {len(values)} values exposed")
            divergence = localize.scan(cleaned, values, reference, actual, atol, rtol)
            compared = len(values)
        if divergence.first is None and (method == "bisect" or not tvm_ok):
            used = "bisect"
            divergence, compared = _bisect(cleaned, values, reference, tvm_values, atol, rtol)
    return divergence, used, compared


def _bisect(cleaned, values, reference, tvm_values, atol, rtol) -> tuple[localize.Divergence, int]:
    """Binary search over prefix models, each built as the real graph up to one value."""
    probes = [i for i, v in enumerate(values) if v.name in reference]
    cache: dict[int, np.ndarray] = {}

    def prefix_value(k: int) -> np.ndarray:
        if k not in cache:
            value = values[probes[k]]
            got = tvm_values(localize.with_outputs(cleaned, [value.name]), f"prefix{k}", f"bisect at {value.node_name}")
            cache[k] = got[value.name]
        return cache[k]

    def diverges(k: int) -> bool:
        ref = reference[values[probes[k]].name]
        return not compare_one("", ref, prefix_value(k), tolerance_for(str(ref.dtype), atol, rtol)).passed

    if not probes or not diverges(len(probes) - 1):
        return localize.Divergence(), len(cache)
    found = localize.bisect(len(probes), diverges)
    culprit = values[probes[found]]
    # One more build: the culprit's inputs and outputs, to show which side of the node the error is on.
    node = cleaned.graph.node[culprit.node_index]
    weights = {init.name for init in cleaned.graph.initializer}
    around = [n for n in dict.fromkeys(list(node.input) + list(node.output))
              if n and n not in weights and n in reference]
    wanted = [v for v in values if v.name in around]
    actual = tvm_values(localize.with_outputs(cleaned, [v.name for v in wanted]), "culprit",
                        f"around {culprit.node_name}")
    divergence = localize.scan(cleaned, wanted, reference, actual, atol, rtol)
    if divergence.first is None:  # exposing its inputs changed TVM's fusion and hid the error: the prefix build's
        divergence = localize.scan(cleaned, [culprit], reference, {culprit.name: cache[found]}, atol, rtol)
    return divergence, len(cache) + len(wanted)


def _extract(dest: Path, cleaned, culprit: localize.Value, reference, divergence, preset, workdir, isolate,
             build: dict) -> Path:
    """Write the failing node as its own model with its inputs, the expected and the actual outputs."""
    single = localize.single_node_model(cleaned, culprit.node_index, reference)
    feeds = {v.name: reference[v.name] for v in single.graph.input}
    actual = _tvm_values(single, feeds, preset, workdir, "extracted", isolate, build)
    with artifacts.staging_dir(dest, marker="report.json") as staged:
        onnx.save(single, str(staged / "model.onnx"))
        thin_runtime.save_npz(staged / "inputs.npz", {f"in_{i}": v for i, v in enumerate(feeds.values())})
        thin_runtime.save_npz(staged / "expected.npz", {f"out_{i}": reference[o.name]
                                                        for i, o in enumerate(single.graph.output)
                                                        if o.name in reference})
        thin_runtime.save_npz(staged / "actual.npz", {f"out_{i}": v for i, v in enumerate(actual.values())})
        report = {
            "node": divergence.first.to_json(),
            "target": preset.to_json(),
            "inputs": [v.name for v in single.graph.input],
            "outputs": [o.name for o in single.graph.output],
            "isolated_node_matches": compare({o.name: reference[o.name] for o in single.graph.output
                                              if o.name in reference}, actual).passed,
            "files": {"model.onnx": "the node alone", "inputs.npz": "in_i: its inputs, in graph-input order",
                      "expected.npz": "out_i: ONNX Runtime's outputs", "actual.npz": "out_i: TVM's outputs"},
        }
        (staged / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        artifacts.publish(staged, dest, marker="report.json")
    return dest
