"""The second step: the ONNX model loaded and checked, its input shapes and dynamic ranges decided, its graph
cleaned by the ONNX passes, and the reference outputs the compiled model is checked against."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

import numpy as np
import onnx

from mlc import compiler
from mlc import passes as graph_passes
from mlc.artifacts.manifest import SourceInfo
from mlc.compiler.contract import Note, NoteKind
from mlc.errors import CompilerError, InputError, MlcError, UnsupportedModelError
from mlc.frontends import onnx as onnx_frontend
from mlc.frontends import onnx_values, onnx_weights
from mlc.passes import control_flow
from mlc.passes import onnx as onnx_passes
from mlc.passes import quantize as quantizing
from mlc.pipeline import source as sources
from mlc.pipeline.convert import Converted
from mlc.pipeline.options import ModelSpec
from mlc.pipeline.steps import Timer
from mlc.runtime import runner as thin_runtime


@dataclass
class Prepared:
    """A model loaded, checked, with its inputs decided and its graph cleaned for TVM."""

    path: Path  # the ONNX file as the user gave it (or the zoo model written out, or the export)
    source: SourceInfo
    model: onnx.ModelProto
    specs: list
    fixed: dict[str, list[int]]
    feeds: dict[str, np.ndarray]
    cleaned: onnx.ModelProto
    cleaned_path: Path
    notes: list[Note]
    converted: Optional[Converted] = None  # framework models: the export and eager outputs
    pass_records: list[dict] = field(default_factory=list)  # what each graph pass did
    quantization: Optional[dict] = None  # --quantize: what it did (the manifest's record)
    calibration: list = field(default_factory=list)  # --quantize int8: the calibration feeds
    unquantized_path: Optional[Path] = None  # --quantize: the cleaned graph before it, built where TVM fails on int8
    # The dims kept symbolic because the model declares them dynamic (a .pt2's Dims) where --dynamic was not given,
    # {dim: (min, max) or None}: the compile's --dynamic then.
    declared_dynamic: Optional[dict] = None
    frozen: dict = field(default_factory=dict)  # --freeze: {input: value} folded into the graph (not an input now)
    samples: Optional[dict] = None  # --inputs: {"file", "sha256"} of the user's sample inputs (the reference's)


def prepare(model: ModelSpec, workdir: Path, timed: Timer, *, feeds: Optional[Mapping[str, np.ndarray]] = None,
            static: bool = False, steps: Optional[list] = None, dump_ir: Optional[str] = None,
            calibration: tuple = ()) -> Prepared:
    """`model` to a cleaned ONNX graph in `workdir`. `feeds`: the reference inputs (default: the framework's, else
    seeded random ones); `static`: symbolic dims take the reference sizes (tuning records match static kernels);
    `steps`: the pass plan (default: the CPU plan); `dump_ir`: a folder for the graph after each pass;
    `calibration`: the .npz files the plan's quantize step calibrates on (else seeded inputs)."""
    model = sources.resolve(model)
    dynamic = model.dynamic_dims()
    source = sources.to_onnx(model, workdir, timed)
    converted = source.converted
    if converted is not None and feeds is None:
        feeds = converted.feeds  # the inputs the framework ran on
    declared = None
    if dynamic is None and not static and converted is not None and converted.declared_dynamic:
        declared = dynamic = {d: tuple(r) if r else None for d, r in converted.declared_dynamic.items()}
    with timed("load", "Loading the model"):
        onnx_model = onnx_frontend.load(source.path, weights_dir=workdir)  # the weights stay in their files
        if not source.info.sha256:
            source.info.sha256 = thin_runtime.sha256_file(source.path)
        source.info.opset = next((o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx")), None)
        onnx_values.refuse_strings(onnx_model)
        if steps is None:
            steps = graph_passes.plan(device="cpu")
        # Ops no pass rewrites fail here, before any work.
        planned = {s.name for s in steps}
        compiler.check_supported(onnx_model, rewritten=(graph_passes.RNN_OPS if "lower_rnn" in planned else ())
                                 + (control_flow.UNROLLED if "static_control_flow" in planned else ()))
        as_tensors: list[str] = []  # what sequence and optional values were compiled as
        onnx_model, path = _inputs_as_tensors(onnx_model, model, source.path, workdir, as_tensors)
        inputs = _decide_inputs(model, onnx_model, path, converted, feeds, static, dynamic)
        path = _outputs_as_tensors(onnx_model, inputs, path, workdir, as_tensors)
    with timed("onnx_passes", "Running ONNX graph passes"):
        cleaned, records, said = onnx_passes.run(onnx_frontend.fix_input_shapes(inputs.model, inputs.fixed), steps,
                                                 Path(dump_ir) if dump_ir else None, workdir)
        notes = _skipped_passes(said)
        compiler.check_supported(cleaned, notes=notes)  # after the passes: lower_rnn makes LSTMs importable
    quantization, calibration_feeds, unquantized_path = None, [], None
    quantize = next((s.config for s in steps if s.name == "quantize"), None)
    if quantize:
        unquantized_path = workdir / "unquantized.onnx"
        onnx_passes.save(cleaned, unquantized_path)
        with timed("quantize", f"Quantising matmul/conv to {quantize['mode']}"):
            cleaned, quantization, calibration_feeds = _quantize(cleaned, quantize, inputs, calibration, records,
                                                                 notes, workdir, dump_ir)
    cleaned_path = workdir / "cleaned.onnx"
    onnx_passes.save(cleaned, cleaned_path)  # the weights it reads by reference stay where they are
    notes = (list(converted.notes) if converted else []) + notes  # the frontend's: NoteKind.FRONTEND
    notes += [Note(NoteKind.AS_TENSORS, text) for text in as_tensors]
    feeds = {n: v for n, v in inputs.feeds.items() if n not in inputs.frozen}
    if inputs.samples is None and converted is None:
        notes.extend(_chosen_values_note(inputs.specs, feeds))
    return Prepared(path, source.info, inputs.model, inputs.specs, inputs.fixed, feeds, cleaned, cleaned_path,
                    notes, converted, records, quantization, calibration_feeds, unquantized_path, declared,
                    inputs.frozen, inputs.sample_info)


_AS_TENSORS = "as_tensors.onnx"  # the model with its sequence and optional inputs and outputs made tensors


def _inputs_as_tensors(onnx_model: onnx.ModelProto, model: ModelSpec, path: Path, workdir: Path, said: list[str]
                       ) -> tuple[onnx.ModelProto, Path]:
    """The model with its sequence and optional inputs made tensors (mlc.frontends.onnx_values) from the samples,
    and the file that holds it (the reference runs on it); as it was where every input is a tensor."""
    if not onnx_values.non_tensor(onnx_model.graph.input):
        return onnx_model, path
    samples = None
    if model.inputs:
        try:
            samples = thin_runtime.load_npz(model.inputs)
        except thin_runtime.FeedError as e:
            raise InputError(f"--inputs: {e}") from None
    onnx_model = onnx_values.inputs_as_tensors(onnx_model, samples, said)
    onnx_passes.save(onnx_model, workdir / _AS_TENSORS)
    return onnx_model, workdir / _AS_TENSORS


def _outputs_as_tensors(onnx_model: onnx.ModelProto, inputs: "_Inputs", path: Path, workdir: Path, said: list[str]
                        ) -> Path:
    """`onnx_model` (the model at `path`) with its sequence and optional outputs made tensors (their counts from an
    ONNX Runtime run on the reference inputs), saved as the file the reference runs on, which still takes the
    --freeze inputs; `inputs.model` becomes it with them folded in. `path` where every output is a tensor."""
    if not onnx_values.non_tensor(onnx_model.graph.output):
        return path
    got = onnx_values.probe(path, {**inputs.feeds, **inputs.frozen})
    onnx_model = onnx_values.outputs_as_tensors(onnx_model, got, said)
    onnx_passes.save(onnx_model, workdir / _AS_TENSORS)
    inputs.model = onnx_frontend.freeze_inputs(onnx_model, inputs.frozen)
    return workdir / _AS_TENSORS


@dataclass
class _Inputs:
    """The model's inputs as decided: their specs, shapes (a dim --dynamic names stays symbolic) and the reference
    feeds."""

    model: onnx.ModelProto  # the --freeze inputs folded in
    specs: list
    fixed: dict[str, list]
    feeds: dict[str, np.ndarray]
    frozen: dict  # --freeze: {input: value}
    samples: Optional[dict]  # --inputs: the user's sample inputs
    sample_info: Optional[dict]


def _decide_inputs(model: ModelSpec, onnx_model: onnx.ModelProto, source_path: Path, converted: Optional[Converted],
                   feeds: Optional[Mapping[str, np.ndarray]], static: bool, dynamic: Optional[dict]) -> _Inputs:
    """From --input-shape, --inputs, --freeze, --dynamic and what the framework ran on (`converted`); `feeds`: the
    caller's reference inputs, if any."""
    specs = onnx_frontend.input_specs(onnx_model)
    fixed = onnx_frontend.resolve_input_shapes(specs, [str(s) for s in model.input_shapes])
    samples, sample_info = None, None
    if model.inputs:
        samples = read_samples(model.inputs, specs, fixed)
        sample_info = {"file": str(Path(model.inputs).resolve()), "sha256": thin_runtime.sha256_file(model.inputs)}
        if feeds is None or converted is not None:  # a framework's feeds are these samples already
            feeds = samples
        fixed = {s.name: list(np.shape(samples[s.name])) for s in specs}  # --dynamic's dims are opened below
    frozen = frozen_values(model.freeze, specs, samples)
    if frozen:  # folded into the graph: no longer an input of the model TVM compiles, nor of the artifact
        onnx_model = onnx_frontend.freeze_inputs(onnx_model, frozen)
        specs = [s for s in specs if s.name not in frozen]
        fixed = {n: shape for n, shape in fixed.items() if n not in frozen}
    if static:  # tuning records match static kernels only: symbolic dims take the reference sizes
        fixed = onnx_frontend.concrete_shapes(specs, fixed)
    if feeds is None:
        feeds = onnx_frontend.make_inputs(specs, onnx_frontend.concrete_shapes(specs, fixed))
    if converted is not None:
        # Exports keep every dim the model has symbolic: compile for the shapes the framework
        # ran on (static kernels are faster), but for the dims --dynamic names.
        fixed = {s.name: list(np.shape(feeds[s.name])) for s in specs}
    related = {}
    if dynamic:
        check_dynamic(dynamic, specs, feeds)
        if samples is not None or converted is not None:  # other symbolic dims would be fixed at one size
            related = relate_dims(source_path, specs, {**feeds, **frozen}, dynamic)
        # A --dynamic dim stays symbolic even where --input-shape gave it a size (the reference's); a dim that
        # moves with it becomes its expression (total -> past+1)
        fixed = {s.name: [related.get(d, d) if isinstance(d, str) and (d in dynamic or d in related) else size
                          for d, size in zip(s.shape, fixed[s.name])] for s in specs if s.name in fixed}
    return _Inputs(onnx_model, specs, fixed, feeds, frozen, samples, sample_info)


def _quantize(cleaned: onnx.ModelProto, config: dict, inputs: _Inputs, calibration: tuple, records: list,
              notes: list[Note], workdir: Path, dump_ir: Optional[str]):
    """The cleaned graph quantised as the quantize step's `config` says (its record appended to `records`; a note
    when calibrated on seeded inputs): the graph, the manifest's quantization record and the calibration feeds."""
    calibration_feeds, how = calibration_inputs(inputs.specs, inputs.feeds, calibration, config["mode"])
    if how == "seeded":
        notes.append(Note(NoteKind.CALIBRATION,
                          f"--quantize {config['mode']}: calibrated on {len(calibration_feeds)} seeded random "
                          "inputs; real inputs calibrate better (--calibration FILE.npz, repeatable)"))
    cleaned = onnx_weights.materialized(cleaned, workdir)  # it reads every weight, and ONNX Runtime runs it
    cleaned, quantization, record = quantize_graph(cleaned, config, calibration_feeds, how)
    records.append(record)
    if dump_ir:  # numbered after the ONNX passes' dumps
        onnx.save(cleaned, str(Path(dump_ir) / f"onnx_{len(records):02d}_quantize.onnx"))
    return cleaned, quantization, calibration_feeds


def _chosen_values_note(specs: list, feeds: Mapping[str, np.ndarray]) -> list[Note]:
    """A note where the model takes parameters (sizes, flags) and mlc chose their values: the check judged one."""
    hint = onnx_frontend.parameter_hint(specs)
    if not hint:
        return []
    chosen = ", ".join(f"{s.name}={feeds[s.name].tolist()}" for s in specs if s.parameter and feeds[s.name].size <= 8)
    return [Note(NoteKind.INPUTS, f"{hint}: the check ran on a value mlc chose ({chosen}); give real inputs with "
                                  "--inputs FILE.npz, and --freeze the ones that are constant")]


def _skipped_passes(said: list[str]) -> list[Note]:
    """mlc.passes.onnx.run's notes: it notes nothing but the passes it skipped."""
    return [Note(NoteKind.PASS_SKIPPED, text) for text in said]


def read_samples(path: str, specs: list, fixed: dict[str, list[int]]) -> dict[str, np.ndarray]:
    """--inputs FILE: the user's sample inputs, checked against the model's inputs and --input-shape."""
    try:
        data = thin_runtime.load_npz(path, [s.name for s in specs])
    except thin_runtime.FeedError as e:
        raise InputError(f"--inputs: {e}") from None
    data = {k: v for k, v in data.items() if not onnx_values.is_empty_sequence(k)}  # compiled as SequenceEmpty
    samples = onnx_frontend.check_samples(specs, data, f"--inputs {path}")
    for name, shape in fixed.items():
        if list(samples[name].shape) != list(shape):
            raise InputError(f"--input-shape {name}:{'x'.join(map(str, shape))} conflicts with --inputs {path}, "
                             f"whose '{name}' has shape {list(samples[name].shape)}; give one of them")
    return samples


def frozen_values(names: tuple, specs: list, samples: Optional[dict]) -> dict:
    """--freeze NAME: the input's value from --inputs (required: mlc never invents the value of a constant)."""
    if not names:
        return {}
    known = [s.name for s in specs]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"--freeze {', '.join(unknown)}: the model has no such input; its inputs are: "
                         f"{', '.join(known)}")
    if samples is None:
        raise InputError(f"--freeze {', '.join(names)} folds the input's value into the graph: give that value with "
                         "--inputs FILE.npz (one array per input name)")
    return {n: samples[n] for n in dict.fromkeys(names)}


def _resized(feeds: Mapping[str, np.ndarray], specs: list, grow: dict[str, int]) -> dict[str, np.ndarray]:
    """`feeds` with the axes of the dims in `grow` one longer (edge values repeated: ids and masks stay valid)."""
    out = dict(feeds)
    for s in specs:
        pad = [(0, grow.get(d, 0)) if isinstance(d, str) else (0, 0) for d in s.shape]
        if any(after for _, after in pad):
            value = out[s.name]
            out[s.name] = np.pad(value, pad, mode="edge" if value.size else "constant")
    return out


def relate_dims(path: Path, specs: list, feeds: Mapping[str, np.ndarray], dynamic: dict) -> dict[str, str]:
    """The symbolic dims that must move with a --dynamic dim (a KV cache's total = past + seq): learnt from the
    model, by running it with ONNX Runtime with the dynamic dim one longer, alone and then with each other dim.
    {dim: "past+1"}; a dim is never assumed equal to another."""
    sizes = {d: np.shape(feeds[s.name])[axis] for s in specs for axis, d in enumerate(s.shape) if isinstance(d, str)}
    free = [d for d in sizes if d not in dynamic]  # fixed at the samples' size unless related
    related: dict[str, str] = {}
    if not free:
        return related

    def runs(grow: dict[str, int]) -> bool:
        try:
            onnx_frontend.onnxruntime_reference(path, _resized(feeds, specs, grow), fallbacks=False)
            return True
        except InputError:
            return False

    for x in (d for d in dynamic if d in sizes):
        if runs({x: 1}):
            continue
        for d in free:
            if d not in related and runs({x: 1, d: 1}):
                offset = sizes[d] - sizes[x]
                related[d] = x if offset == 0 else f"{x}{'+' if offset > 0 else '-'}{abs(offset)}"
                break
    return related


def calibration_inputs(specs: list, feeds: Mapping[str, np.ndarray], files: tuple, mode: str
                       ) -> tuple[list[dict], Optional[str]]:
    """The calibration feeds and their source: the user's .npz files (keyed by input name, like `mlc run -i`), else
    seeded inputs other than the reference's (the gate judges on those); none for int8-dynamic."""
    if mode != "int8":
        if files:
            raise InputError(f"--calibration is for --quantize int8; --quantize {mode} computes its scales at run "
                             "time")
        return [], None
    if not files:
        shapes = {s.name: list(np.shape(feeds[s.name])) for s in specs}
        return [onnx_frontend.make_inputs(specs, shapes, seed=onnx_frontend.REFERENCE_SEED + 1 + k)
                for k in range(quantizing.SEEDED_CALIBRATION)], "seeded"
    out = []
    for path in files:
        try:
            data = thin_runtime.load_npz(path, [s.name for s in specs])
        except thin_runtime.FeedError as e:
            raise InputError(f"--calibration: {e}") from None
        missing = [s.name for s in specs if s.name not in data]
        extra = sorted(set(data) - {s.name for s in specs})
        if missing or extra:
            raise InputError(f"--calibration {path}: the model's inputs are {', '.join(s.name for s in specs)}; "
                             f"the file {'lacks ' + ', '.join(missing) if missing else 'has ' + ', '.join(extra)}")
        out.append({s.name: np.asarray(data[s.name]).astype(s.dtype, copy=False) for s in specs})
    return out, "user"


def quantize_graph(cleaned: onnx.ModelProto, config: dict, calibration: list, how: Optional[str]
                   ) -> tuple[onnx.ModelProto, dict, dict]:
    """The cleaned graph quantised as the quantize step's `config` says; the manifest's quantisation record and the
    pass record."""
    start = time.perf_counter()
    before = onnx_passes.op_counts(cleaned)
    mode = config["mode"]
    quantized, info = quantizing.quantize(cleaned, mode, calibration, how, config["attention"])
    if not info.quantized:
        kept = "; ".join(f"{why} x{n}" for why, n in info.kept_fp32.items()) or "it has no MatMul, Gemm or Conv"
        raise UnsupportedModelError(f"--quantize {mode}: nothing to quantise in this model ({kept})")
    after = onnx_passes.op_counts(quantized)
    record = {"name": "quantize", "level": "onnx", "status": "applied", "ops_before": len(cleaned.graph.node),
              "ops_after": len(quantized.graph.node), "op_changes": onnx_passes.changes(before, after),
              "time_s": round(time.perf_counter() - start, 4),
              "reason": f"--quantize {mode}: " + ", ".join(f"{op} x{n}" for op, n in info.quantized.items())}
    return quantized, info.to_json(), record


def check_dynamic(dynamic: dict, specs: list, feeds: Mapping[str, np.ndarray]) -> None:
    """--dynamic names the model's symbolic dims, and the reference inputs lie in its ranges."""
    symbolic = {d: np.shape(feeds[s.name])[axis] for s in specs for axis, d in enumerate(s.shape)
                if isinstance(d, str)}
    for name, bounds in dynamic.items():
        if name not in symbolic:
            known = ", ".join(symbolic) or "none"
            raise InputError(f"--dynamic {name}: the model has no dim named {name!r}; its symbolic dims: {known}")
        if bounds and not bounds[0] <= symbolic[name] <= bounds[1]:
            raise InputError(f"--dynamic {name}={bounds[0]}..{bounds[1]}: the reference inputs have {name}="
                             f"{symbolic[name]}; widen the range or give --input-shape inside it")


def dynamic_ranges(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """The --dynamic dims given a range, {dim: (min, max)}: the manifest's, and TVM's upper bounds."""
    return {name: bounds for name, bounds in (model.dynamic_dims() or {}).items() if bounds}


@dataclass(frozen=True)
class References:
    """What the artifact is checked against."""

    expected: onnx_frontend.Reference  # ONNX Runtime's outputs (ONNX models) or the framework's eager outputs
    onnxruntime: Optional[dict[str, np.ndarray]] = None  # framework models: ONNX Runtime on the export
    onnxruntime_error: Optional[str] = None  # framework models: why ONNX Runtime could not run the export
    gate_cases: list = field(default_factory=list)  # --quantize: (feeds, fp32 outputs) on more inputs
    gate_judges_reference: bool = True  # False where the gate cases are the user's calibration inputs


GATE_CASES = 7  # --quantize: seeded inputs the gate judges besides the reference's (or 1 + 7 of the user's)
GATE_SEED = 100  # their first seed (the calibration's are 1..8)


def references(prepared: Prepared) -> References:
    """The reference the artifact is checked against: ONNX Runtime for ONNX models; for framework
    models the framework's eager outputs, plus ONNX Runtime's outputs (or its error) on the export."""
    converted = prepared.converted
    cases = gate_cases(prepared) if prepared.quantization else []
    # Calibrated on the user's data, the gate judges that data: seeded inputs (the reference's too) lie outside
    # the calibrated ranges and saturate (a trained resnet50: cosine 0.93 on noise, 0.99998 on held-out images)
    on_reference = not (prepared.quantization and prepared.quantization["calibration"]["source"] == "user" and cases)
    full = {**prepared.feeds, **prepared.frozen}  # the model as given still takes the frozen inputs
    if converted is None:
        try:
            expected = onnx_frontend.onnxruntime_reference(prepared.path, full)
        except InputError as e:
            hint = "" if prepared.samples else onnx_frontend.parameter_hint(prepared.specs)
            if not hint:
                raise
            raise InputError(f"{hint}, and mlc cannot choose a valid value for it: give the model's inputs with "
                             f"--inputs FILE.npz ({e})") from None
        expected.inputs = dict(prepared.feeds)  # the artifact's inputs: the frozen ones are constants in it
        return References(expected, gate_cases=cases, gate_judges_reference=on_reference)
    eager = onnx_frontend.Reference(producer=f"{converted.framework} {converted.framework_version} eager",
                                    inputs=prepared.feeds, outputs=converted.eager)
    try:
        return References(eager, onnx_frontend.onnxruntime_reference(prepared.path, full).outputs,
                          gate_cases=cases, gate_judges_reference=on_reference)
    except InputError as e:  # the export may be broken; TVM may still get it right, and the check decides
        return References(eager, onnxruntime_error=str(e))


def gate_cases(prepared: Prepared) -> list[tuple[dict, dict]]:
    """The inputs the int8 gate judges besides the reference's, and the fp32 model's outputs on them (ONNX Runtime):
    the first 1 + GATE_CASES of the user's --calibration inputs, else seeded ones (none of them the calibration's);
    none when ONNX Runtime cannot run the model: the gate then judges the reference inputs alone."""
    if prepared.quantization["calibration"]["source"] == "user":
        inputs = prepared.calibration[:1 + GATE_CASES]
    else:
        shapes = {s.name: list(np.shape(prepared.feeds[s.name])) for s in prepared.specs}
        inputs = [onnx_frontend.make_inputs(prepared.specs, shapes, seed=GATE_SEED + k) for k in range(GATE_CASES)]
    cases = []
    for feeds in inputs:
        try:
            outputs = onnx_frontend.onnxruntime_reference(prepared.path, {**feeds, **prepared.frozen}).outputs
            cases.append(({n: v for n, v in feeds.items() if n not in prepared.frozen}, outputs))
        except InputError:
            return []
    return cases


def drop_quantization(prepared: Prepared) -> None:
    """The worker built the graph as it was before --quantize (fp32: TVM failed on the quantised one, and its note
    says why): the manifest then records no quantisation and the artifact is checked as fp32."""
    prepared.notes = [n for n in prepared.notes if n.kind is not NoteKind.CALIBRATION]
    prepared.pass_records = [r for r in prepared.pass_records if r["name"] != "quantize"]
    prepared.cleaned_path = prepared.unquantized_path
    prepared.cleaned = onnx.load(str(prepared.cleaned_path), load_external_data=False)
    prepared.quantization, prepared.calibration = None, []


def bind_to_reference(prepared: Prepared, steps: list, error: MlcError) -> bool:
    """TVM could not import the model with its symbolic dims: fix them at the reference inputs' sizes
    (graph passes again), with a note and a record among the manifest's passes. False: none to fix."""
    symbolic = {d: np.shape(prepared.feeds[s.name])[axis] for s in prepared.specs
                for axis, d in enumerate(prepared.fixed.get(s.name, s.shape)) if isinstance(d, str)}
    if not symbolic:
        return False
    start = time.perf_counter()
    prepared.fixed = {s.name: list(np.shape(prepared.feeds[s.name])) for s in prepared.specs}
    workdir = prepared.cleaned_path.parent
    model = prepared.model if prepared.model.graph.initializer else onnx_frontend.freeze_inputs(
        onnx_frontend.load(prepared.path, workdir), prepared.frozen)  # read again: --freeze's values folded again
    cleaned, records, said = onnx_passes.run(onnx_frontend.fix_input_shapes(model, prepared.fixed),
                                             [s for s in steps if s.level == "onnx"], weights_dir=workdir)
    if prepared.quantization:  # quantised again, on the same calibration feeds
        config = next(s.config for s in steps if s.name == "quantize")
        onnx_passes.save(cleaned, prepared.unquantized_path)
        cleaned = onnx_weights.materialized(cleaned, workdir)
        cleaned, prepared.quantization, record = quantize_graph(cleaned, config, prepared.calibration,
                                                                prepared.quantization["calibration"]["source"])
        records.append(record)
    onnx_passes.save(cleaned, prepared.cleaned_path)
    bound = ", ".join(f"{d}={n}" for d, n in symbolic.items())
    # TVM's own message: a CompilerError's text adds the stage and where the log is
    why = (error.detail if isinstance(error, CompilerError) else None) or str(error)
    reason = f"TVM's importer could not keep them symbolic ({why[:160]}{'...' if len(why) > 160 else ''})"
    prepared.notes += _skipped_passes(said) + [Note(NoteKind.BOUND_DIMS,
                                                    f"compiled for {bound} (the reference sizes): {reason}; other "
                                                    "sizes need another compile with --input-shape, or --buckets")]
    prepared.pass_records = records + [{
        "name": "bind_symbolic_dims", "level": "onnx", "status": "applied",
        "ops_before": len(prepared.cleaned.graph.node), "ops_after": len(cleaned.graph.node), "op_changes": {},
        "time_s": round(time.perf_counter() - start, 4), "reason": f"{bound}: {reason}"}]
    prepared.cleaned = cleaned
    return True
