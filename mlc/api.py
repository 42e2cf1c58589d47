"""The Python API. Each CLI command is a thin layer over one function here."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Optional, Sequence

import numpy as np
import onnx

from mlc import __version__, artifacts, compiler, models, targets, tuning
from mlc.pipeline import buckets as bucketing
from mlc.artifacts.manifest import (
    BucketCheck,
    BucketInfo,
    CompileInfo,
    Manifest,
    ReferenceInfo,
    RuntimeInfo,
    SourceInfo,
    TargetInfo,
    TensorSpec,
)
from mlc.check import CheckResult, compare, compare_one, localize, tolerance_for
from mlc import frontends
from mlc.compiler import runtimes
from mlc import passes as graph_passes
from mlc.frontends import onnx as onnx_frontend
from mlc.passes import onnx as onnx_passes
from mlc.errors import (AccuracyError, CompilerError, InputError, IntegrityError, MissingDependencyError, TargetError,
                        UnsupportedModelError)
from mlc.runtime import runner as thin_runtime

DEFAULT_OUTPUT_ROOT = Path("artifacts")
LIBRARY = {"linux": "model.so", "macos": "model.dylib"}
OBJECTS = "model"  # macOS: the objects that link.sh links into model.dylib on the Mac
LINK_SCRIPT = "link.sh"
RUNTIME_MODULE = "runtime/mlc_runtime.py"
NATIVE_RUNNER = "runtime/mlc_runner"
KERNELS = "kernels"  # generated GPU source, for reading and for upstream bug reports
RUN_ENTRY = "run.py"
REFERENCE_INPUTS = "reference/inputs.npz"
REFERENCE_OUTPUTS = "reference/outputs.npz"
REFERENCE_ONNXRUNTIME = "reference/onnxruntime.npz"  # framework models: ONNX Runtime on the export

# A step reporter: called with a description, returns a context manager around the step.
StepReporter = Callable[[str], ContextManager[object]]


def _quiet_step(_: str) -> ContextManager[object]:
    return contextlib.nullcontext()


@dataclass
class CompileResult:
    path: Path
    manifest: Manifest
    check: Optional[CheckResult]  # None when the artifact cannot run here (no emulator)
    archive: Optional[Path] = None
    notes: list[str] = field(default_factory=list)


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare_target(preset: targets.Target) -> tuple[runtimes.RuntimeFiles, Optional[str]]:
    """The runtime files and cross compiler a target needs (fetched or built now, or an error)."""
    runtime = runtimes.runtime_files(preset.runtime_arch, preset.device, preset.runtime_os)
    cross = None
    if preset.runtime_arch != runtimes.HOST_ARCH and preset.runtime_os != "macos":
        cross = runtimes.toolchain(preset.runtime_arch).compiler
    return runtime, cross


def _check_tolerances(atol: Optional[float], rtol: Optional[float]) -> None:
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and not (value >= 0 and np.isfinite(value)):
            raise InputError(f"--{name} must be a finite number >= 0, got {value}")


def default_output(model_name: str, target_name: str, root: Path = DEFAULT_OUTPUT_ROOT) -> Path:
    return root / f"{model_name}-{target_name}"


def model_name(source: str) -> str:
    if models.is_zoo(source):
        return models.get(source).name
    factory = source.rpartition(":")
    return Path(factory[0]).stem if factory[0].endswith(".py") else Path(source).stem


def _source_files(source: str) -> list[Path]:
    """The files a model spec reads (a file, a folder's files, a Paddle prefix's pair, a factory's .py)."""
    path = Path(source.rpartition(":")[0] if frontends.detect(source) == "torch" and ".py:" in source else source)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    if path.is_file():
        return [path]
    return sorted(p for p in path.parent.glob(path.name + ".*") if p.is_file())  # a prefix


def source_sha256(source: str) -> str:
    """sha256 of a model file; of the per-file hashes for a folder or prefix."""
    files = _source_files(source)
    if len(files) == 1:
        return thin_runtime.sha256_file(files[0])
    return _sha256_bytes("".join(f"{p.name}:{thin_runtime.sha256_file(p)}\n" for p in files).encode())


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


def _resolve_source(source: str, workdir: Path, framework: str, dynamic: Optional[dict], input_shapes: Sequence[str],
                    exporter: str, timed: "_Timer") -> tuple[Path, SourceInfo, Optional[frontends.Converted]]:
    """A model spec to an ONNX file on disk, its description, and (framework models) the conversion."""
    zoo = models.is_zoo(source)
    name = models.get(source).name if zoo else Path(source).stem
    if framework == frontends.ONNX:
        if zoo:
            path = workdir / f"{name}.onnx"
            data = models.get(source).build().SerializeToString()
            path.write_bytes(data)
            return path, SourceInfo(name=name, path=source, format="onnx", sha256=_sha256_bytes(data)), None
        path = Path(source)
        return path, SourceInfo(name=path.stem, path=str(path.resolve()), format="onnx", sha256=""), None
    display = frontends.FRAMEWORKS[framework].display
    with timed("export", f"Exporting the {display} model to ONNX and running it eagerly"):
        converted = frontends.convert(source, framework, workdir, dynamic=None if dynamic is None else list(dynamic),
                                      input_shapes=input_shapes, exporter=exporter)
    sha = thin_runtime.sha256_file(converted.onnx_path) if zoo else source_sha256(source)
    info = SourceInfo(name=name, path=source if zoo or ".py:" in source else str(Path(source).resolve()),
                      format=framework, sha256=sha, framework_version=converted.framework_version,
                      exporter=converted.exporter, dynamic=converted.dynamic)
    return converted.onnx_path, info, converted


class _Timer:
    """Times named steps into `timings` and shows each through the step reporter."""

    def __init__(self, step: StepReporter):
        self.step = step
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, key: str, description: str):
        start = time.perf_counter()
        with self.step(description):
            yield
        self.timings[key] = round(time.perf_counter() - start, 4)


@dataclass
class _Prepared:
    """A model loaded, checked, with its inputs decided and its graph cleaned for TVM."""

    path: Path  # the ONNX file as the user gave it (or the zoo model written out)
    source: SourceInfo
    model: onnx.ModelProto
    specs: list
    fixed: dict[str, list[int]]
    feeds: dict[str, np.ndarray]
    cleaned: onnx.ModelProto
    cleaned_path: Path
    notes: list[str]
    converted: Optional[frontends.Converted] = None  # framework models: the export and eager outputs
    pass_records: list[dict] = field(default_factory=list)  # what each graph pass did


def _prepare(source: str, input_shapes: Sequence[str], workdir: Path, timed: _Timer,
             feeds: Optional[Mapping[str, np.ndarray]] = None, framework: Optional[str] = None,
             dynamic: Optional[dict] = None, exporter: str = "auto", static: bool = False,
             steps: Optional[list] = None, dump_ir: Optional[str] = None) -> _Prepared:
    framework = resolve_framework(source, framework)
    model_path, source_info, converted = _resolve_source(source, workdir, framework, dynamic, input_shapes,
                                                         exporter, timed)
    if converted is not None and feeds is None:
        feeds = converted.feeds  # the inputs the framework ran on
    with timed("load", "Loading the model"):
        model = onnx_frontend.load(model_path)
        if not source_info.sha256:
            source_info.sha256 = thin_runtime.sha256_file(model_path)
        source_info.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        if steps is None:
            steps = graph_passes.plan(device="cpu")
        compiler.check_supported(model, rewritten=graph_passes.RNN_OPS if any(s.name == "lower_rnn" for s in steps) else ())  # ops no pass rewrites fail here, before any work
        specs = onnx_frontend.input_specs(model)
        fixed = onnx_frontend.resolve_input_shapes(specs, list(input_shapes))
        if static:  # tuning records match static kernels only: symbolic dims take the reference sizes
            fixed = onnx_frontend.concrete_shapes(specs, fixed)
        if feeds is None:
            feeds = onnx_frontend.make_inputs(specs, onnx_frontend.concrete_shapes(specs, fixed))
        if converted is not None:
            # Exports keep every dim the model has symbolic: compile for the shapes the framework
            # ran on (static kernels are faster), but for the dims --dynamic names.
            fixed = {s.name: list(np.shape(feeds[s.name])) for s in specs}
        if dynamic:
            _check_dynamic(dynamic, specs, feeds)
            # A --dynamic dim stays symbolic even where --input-shape gave it a size (the reference's).
            fixed = {s.name: [d if isinstance(d, str) and d in dynamic else size
                              for d, size in zip(s.shape, fixed[s.name])] for s in specs if s.name in fixed}
    with timed("onnx_passes", "Running ONNX graph passes"):
        cleaned, records, notes = onnx_passes.run(onnx_frontend.fix_input_shapes(model, fixed), steps,
                                                  Path(dump_ir) if dump_ir else None)
        compiler.check_supported(cleaned, notes=notes)  # after the passes: lower_rnn makes LSTMs importable
        cleaned_path = workdir / "cleaned.onnx"
        onnx.save(cleaned, str(cleaned_path))
    notes = (converted.notes if converted else []) + notes
    return _Prepared(model_path, source_info, model, specs, fixed, dict(feeds), cleaned, cleaned_path, notes, converted,
                     records)


def _check_dynamic(dynamic: dict, specs: list, feeds: Mapping[str, np.ndarray]) -> None:
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


def _reference(prepared: _Prepared) -> tuple[onnx_frontend.Reference, Optional[dict[str, np.ndarray]], Optional[str]]:
    """The reference the artifact is checked against: ONNX Runtime for ONNX models; for framework
    models the framework's eager outputs, plus ONNX Runtime's outputs (or its error) on the export."""
    converted = prepared.converted
    if converted is None:
        return onnx_frontend.onnxruntime_reference(prepared.path, prepared.feeds), None, None
    eager = onnx_frontend.Reference(producer=f"{converted.framework} {converted.framework_version} eager",
                                    inputs=prepared.feeds, outputs=converted.eager)
    try:
        return eager, onnx_frontend.onnxruntime_reference(prepared.path, prepared.feeds).outputs, None
    except InputError as e:  # the export may be broken; TVM may still get it right, and the check decides
        return eager, None, str(e)


def compile(  # noqa: A001 - the verb users know
    source: str,
    target: str = "x86",
    output: Optional[str | Path] = None,
    input_shapes: Sequence[str] = (),
    archive: bool = False,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    step: StepReporter = _quiet_step,
    isolate: bool = True,
    framework: Optional[str] = None,
    dynamic: Sequence[str] = (),
    exporter: str = "auto",
    db: Optional[str | Path] = None,
    default_schedules: bool = True,
    pass_options: graph_passes.Options = graph_passes.Options(),
    buckets: Sequence[str] = (),
) -> CompileResult:
    """Compile a model (ONNX, PyTorch, TensorFlow, Paddle, or zoo:NAME) for a target into a
    verified artifact directory. Framework models are checked against the framework's eager outputs.

    CPU targets get tuned schedules from the tuning database `db` (see `mlc tune`; symbolic
    input dims then take the reference sizes, as when tuning) and mlc's default schedules for
    the other kernels (`default_schedules=False`: TVM's unscheduled loops, for comparison).

    Raises MlcError subclasses for anything the user can fix; AccuracyError (exit 3) is not
    raised here: the artifact is written and `result.check` says whether it matches.
    `isolate=False` runs TVM in this process (faster for many small models; a TVM crash then
    takes the process down). `pass_options`: -O level and pass choices (see `mlc passes`).
    `buckets` (["8,16,32"] or ["seq=8,16,32"]): one static build per length of that dim in one
    artifact; the runtime pads inputs to the next bucket and slices the outputs back."""
    timed = _Timer(step)
    _check_tolerances(atol, rtol)
    dynamic_dims = frontends.parse_dynamic(dynamic)
    requested_buckets = bucketing.parse(buckets)
    if requested_buckets and dynamic:
        raise InputError("--buckets and --dynamic are two answers to the same problem; give one of them")
    framework = resolve_framework(source, framework)
    frontends.check_exporter(framework, exporter)
    preset = targets.resolve(target)
    schedules = tuning.schedule_request(preset, db, default_schedules)
    steps = pass_options.plan(preset.device)
    runtime, cross = prepare_target(preset)  # a missing toolchain or runtime fails before any heavy work
    macos = preset.runtime_os == "macos"
    final = Path(output) if output else default_output(model_name(source), preset.name)
    artifacts.check_replaceable(final)
    with tempfile.TemporaryDirectory(prefix="mlc-compile-") as scratch:
        prepared = _prepare(source, input_shapes, Path(scratch), timed, framework=framework, dynamic=dynamic_dims,
                            exporter=exporter, static=db is not None and not dynamic_dims, steps=steps,
                            dump_ir=pass_options.dump_ir)
        ranges = {name: bounds for name, bounds in (dynamic_dims or {}).items() if bounds}
        with timed("reference", "Computing reference outputs with ONNX Runtime"):
            reference = _reference(prepared)
        plan = bucketing.plan(requested_buckets, prepared.specs) if requested_buckets else None
        builds = [(LIBRARY[preset.runtime_os], prepared.cleaned_path, "")]
        if plan:
            if macos or preset.device != "cpu":
                raise TargetError(f"--buckets builds CPU shared libraries (linux); target {preset.name} is not one")
            builds = _bucket_builds(plan, prepared, steps, Path(scratch), timed)
        with artifacts.staging_dir(final) as staged:
            results = {}
            for library, cleaned_path, what in builds:
                with timed(f"tvm{what}", f"Compiling{what} with TVM for {preset.name} "
                                         f"({preset.tvm.get('mcpu', preset.tvm['kind'])})"):
                    try:
                        results[library] = compiler.compile_in_worker(
                            cleaned_path, preset.tvm, library=staged / library, isolate=isolate,
                            cross_compiler=cross, kernels_dir=staged / KERNELS,
                            object_dir=staged / OBJECTS if macos else None, schedules=schedules,
                            relax_passes=[s.to_json() for s in steps], dump_ir=pass_options.dump_ir,
                            dim_upper_bounds={name: hi for name, (_, hi) in ranges.items()})
                    except (CompilerError, UnsupportedModelError) as e:
                        node_failed = "importer cannot convert a " in str(e)  # one node TVM's converter failed on
                        if isinstance(e, UnsupportedModelError) and not (dynamic_dims and node_failed):
                            raise  # an op TVM cannot import at all (static shapes would not help)
                        if dynamic_dims and ("during import" in str(e) or node_failed):
                            raise UnsupportedModelError(
                                f"TVM cannot import this model with {', '.join(dynamic_dims)} symbolic ({e}); compile "
                                "it without --dynamic (static shapes) or serve the lengths with --buckets") from None
                        if reference[2] is None:
                            raise
                        # ONNX Runtime failed on the export too: the export is broken, not TVM.
                        raise UnsupportedModelError(
                            f"the ONNX export ({prepared.source.exporter}) is broken at the compiled shapes: "
                            f"{reference[2]}; TVM: {e}. Try another --exporter or other --input-shape") from None
            result = _merge_results(list(results.values()))
            bucket_info = None
            if plan:
                bucket_info, result["bucket_axes"] = _bucket_info(plan, prepared, results, staged)
            prepared.pass_records.extend(result["passes"]["records"])
            prepared.notes.extend(result["passes"]["notes"])
            timed.timings.update({f"tvm_{k}": round(v, 4) for k, v in result["timings"].items()})
            with timed("package", "Packaging the artifact"):
                manifest = _package(staged, runtime, preset, prepared, reference, result, timed.timings,
                                    _recipe(source, target, framework, input_shapes, dynamic, exporter, db,
                                            pass_options, buckets), bucket_info, ranges)
                artifacts.publish(staged, final)
    check_result: Optional[CheckResult] = None
    arch = preset.runtime_arch
    prepared.notes.extend(runtime.notes)
    prepared.notes.extend(tuning.schedule_notes(result.get("schedules"), source, target, db))
    if db is not None and dynamic_dims:
        prepared.notes.append("tuning records match static kernels: the symbolic-shape kernels of --dynamic use "
                              "mlc's default schedules; for tuned kernels per length use --buckets with --db")
    if preset.device != "cpu" and not thin_runtime.device_present(preset.device):
        prepared.notes.append(f"not verified: no {preset.device.upper()} device here; run `mlc check {final}` "
                              "(or `python run.py`) on a machine with one")
    elif arch == runtimes.HOST_ARCH or thin_runtime.emulator_command(arch):
        how = "" if arch == runtimes.HOST_ARCH else " under qemu emulation"
        with timed("check", f"Checking the artifact against the reference{how}"):
            check_result = check(final, atol=atol, rtol=rtol)
    else:
        prepared.notes.append(f"not verified: this {runtimes.HOST_ARCH} machine cannot run {arch} code "
                              "(apt-get install qemu-user); run `mlc check` or `python run.py` on the device")
    archive_path = artifacts.archive(final) if archive else None
    return CompileResult(final, manifest, check_result, archive_path, prepared.notes)


def _recipe(source: str, target: str, framework: str, input_shapes: Sequence[str], dynamic: Sequence[str],
            exporter: str, db: Optional[str | Path] = None,
            pass_options: graph_passes.Options = graph_passes.Options(), buckets: Sequence[str] = ()) -> dict:
    """The options that rebuild the artifact, and the command line that passes them."""
    options = {"target": target, "framework": framework, "input_shapes": list(input_shapes), "dynamic": list(dynamic),
               "exporter": exporter, "passes": pass_options.to_json()}
    argv = ["mlc", "compile", source, "--target", target]
    if framework != frontends.ONNX:
        argv += ["--framework", framework]
    argv += [a for s in input_shapes for a in ("--input-shape", s)] + [a for d in dynamic for a in ("--dynamic", d)]
    if exporter != "auto":
        argv += ["--exporter", exporter]
    if db is not None:
        options["db"] = str(Path(db).resolve())
        argv += ["--db", str(db)]
    if buckets:
        options["buckets"] = list(buckets)
        argv += [a for b in buckets for a in ("--buckets", b)]
    return {"options": options, "command": shlex.join(argv + pass_options.cli_args())}


def _package(staged: Path, runtime: runtimes.RuntimeFiles, preset: targets.Target, prepared: _Prepared,
             reference: tuple, result: dict, timings: dict, recipe: dict,
             buckets: Optional[BucketInfo] = None, ranges: Optional[dict] = None) -> Manifest:
    (staged / "runtime").mkdir()
    runtime_library, ffi_library = f"runtime/{runtime.tvm_runtime.name}", f"runtime/{runtime.tvm_ffi.name}"
    shutil.copyfile(runtime.tvm_runtime, staged / runtime_library)
    shutil.copyfile(runtime.tvm_ffi, staged / ffi_library)
    if runtime.native_runner:
        shutil.copy(runtime.native_runner, staged / NATIVE_RUNNER)  # keeps the executable bit
    library, link = LIBRARY[preset.runtime_os], None
    if preset.runtime_os == "macos":
        link = LINK_SCRIPT
        objects = " ".join(sorted(f"{OBJECTS}/{p.name}" for p in (staged / OBJECTS).iterdir()))
        (staged / link).write_text(
            "#!/bin/sh\n# Run once on the Mac (Xcode command line tools): links the compiled objects into "
            f"{library}.\nset -e\ncd \"$(dirname \"$0\")\"\n"
            f"clang++ -dynamiclib -undefined dynamic_lookup -o {library} {objects}\n")
        (staged / link).chmod(0o755)
    device_libraries = []
    for device_library in runtime.device_libraries:
        shutil.copyfile(device_library, staged / "runtime" / device_library.name)
        device_libraries.append(f"runtime/{device_library.name}")
    shutil.copyfile(Path(thin_runtime.__file__), staged / RUNTIME_MODULE)
    shutil.copyfile(Path(thin_runtime.__file__).with_name("run_entry.py"), staged / RUN_ENTRY)
    reference, onnxruntime_outputs, onnxruntime_error = reference
    (staged / "reference").mkdir(exist_ok=True)
    thin_runtime.save_npz(staged / REFERENCE_INPUTS, reference.inputs)
    thin_runtime.save_npz(staged / REFERENCE_OUTPUTS, reference.outputs)
    if onnxruntime_outputs is not None:
        thin_runtime.save_npz(staged / REFERENCE_ONNXRUNTIME, onnxruntime_outputs)

    inputs = [
        TensorSpec(name=s.name, dtype=s.dtype, shape=prepared.fixed.get(s.name, s.shape), value_range=s.value_range)
        for s in prepared.specs
    ]
    if buckets:  # the bucketed dim stays symbolic in the specs; the runtime pads it
        library = buckets.libraries[str(max(buckets.sizes))]
        for spec, s in zip(inputs, prepared.specs):
            spec.shape = [buckets.dim if d == buckets.dim else size for d, size in zip(s.shape, spec.shape)]
    out_names = list(reference.outputs)
    if len(out_names) != len(result["outputs"]):
        raise CompilerError(f"TVM's module returns {len(result['outputs'])} outputs where the model has {len(out_names)}")
    outputs = [
        TensorSpec(name=n, dtype=sig["dtype"], shape=sig["shape"]) for n, sig in zip(out_names, result["outputs"])
    ]
    for spec, axes in zip(outputs, result.get("bucket_axes", [])):
        spec.shape = [buckets.dim if a in axes else d for a, d in enumerate(spec.shape)]
    manifest = Manifest(
        mlc_version=__version__,
        tvm_version=result["tvm_version"],
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        source=prepared.source,
        target=TargetInfo(**preset.to_json()),
        library=library,
        runtime=RuntimeInfo(library=runtime_library, module=RUNTIME_MODULE, entry=RUN_ENTRY,
                            requires=["numpy", "apache-tvm-ffi==0.1.14.post1"],
                            ffi_library=ffi_library, native_runner=NATIVE_RUNNER if runtime.native_runner else None,
                            device_libraries=device_libraries, link=link),
        reference=ReferenceInfo(producer=reference.producer, inputs=REFERENCE_INPUTS,
                                outputs=REFERENCE_OUTPUTS, seed=reference.seed,
                                onnxruntime=REFERENCE_ONNXRUNTIME if onnxruntime_outputs is not None else None,
                                onnxruntime_error=onnxruntime_error),
        inputs=inputs,
        outputs=outputs,
        compile=CompileInfo(options=recipe["options"], timings_s=timings, passes=prepared.pass_records,
                            kernels=result.get("kernels", {}), schedules=result.get("schedules"),
                            recipe=recipe["command"], onnx_nodes={"before": len(prepared.model.graph.node),
                                                          "after": len(prepared.cleaned.graph.node)}),
        buckets=buckets,
        dynamic_ranges=ranges or {},
    )
    return artifacts.seal(staged, manifest)


def _bucket_builds(plan: "bucketing.Plan", prepared: _Prepared, steps, workdir: Path, timed: _Timer
                   ) -> list[tuple[str, Path, str]]:
    """Per bucket: (library, the graph with that length fixed and cleaned, a label)."""
    concrete = onnx_frontend.concrete_shapes(prepared.specs, prepared.fixed)
    length = next(concrete[s.name][s.shape.index(plan.dim)] for s in prepared.specs if plan.dim in s.shape)
    if length > plan.sizes[-1]:
        raise InputError(f"the reference inputs have {plan.dim}={length}, longer than the largest bucket "
                         f"{plan.sizes[-1]}; add a bucket >= {length} or give shorter inputs with --input-shape")
    builds = []
    for size in plan.sizes:
        shapes = {s.name: [size if d == plan.dim else n for d, n in zip(s.shape, concrete[s.name])]
                  for s in prepared.specs}
        with timed(f"onnx_passes_{plan.dim}{size}", f"Running ONNX graph passes for {plan.dim}={size}"):
            cleaned, _, _ = onnx_passes.run(onnx_frontend.fix_input_shapes(prepared.model, shapes), steps, None)
            path = workdir / f"cleaned-{plan.dim}{size}.onnx"
            onnx.save(cleaned, str(path))
        builds.append((plan.library(size), path, f" {plan.dim}={size}"))
    return builds


def _merge_results(results: list[dict]) -> dict:
    """One worker result for several builds (buckets): timings summed, kernel lists united."""
    merged = dict(results[0])
    merged["timings"] = {k: sum(r["timings"].get(k, 0.0) for r in results) for k in results[0]["timings"]}
    if results[0].get("schedules"):
        merged["schedules"] = {k: sorted({n for r in results for n in r["schedules"].get(k, [])})
                               for k in results[0]["schedules"]}
    return merged


def _bucket_info(plan: "bucketing.Plan", prepared: _Prepared, results: dict, staged: Path
                 ) -> tuple[BucketInfo, list[list[int]]]:
    """The manifest's buckets, with reference runs at the shortest length of each bucket (the most
    padding): ONNX Runtime on the model as given (for framework models: the export, whose
    conversion `mlc check` reports against the framework at the reference shapes)."""
    shapes = {size: [o["shape"] for o in results[plan.library(size)]["outputs"]] for size in plan.sizes}
    onnx_names = [[d.dim_param or None for d in o.type.tensor_type.shape.dim] for o in prepared.model.graph.output]
    axes = bucketing.output_axes(plan, shapes, onnx_names)
    concrete = onnx_frontend.concrete_shapes(prepared.specs, prepared.fixed)
    checks = []
    for length, size in plan.check_lengths():
        shapes_l = {s.name: [length if d == plan.dim else n for d, n in zip(s.shape, concrete[s.name])]
                    for s in prepared.specs}
        ref = onnx_frontend.onnxruntime_reference(prepared.path, onnx_frontend.make_inputs(prepared.specs, shapes_l))
        stem = f"reference/{plan.dim}{length}"
        (staged / "reference").mkdir(exist_ok=True)
        thin_runtime.save_npz(staged / f"{stem}.inputs.npz", ref.inputs)
        thin_runtime.save_npz(staged / f"{stem}.outputs.npz", ref.outputs)
        checks.append(BucketCheck(length=length, bucket=size, inputs=f"{stem}.inputs.npz",
                                  outputs=f"{stem}.outputs.npz", producer=f"{ref.producer} on {prepared.path.name}"))
    return BucketInfo(dim=plan.dim, sizes=plan.sizes, libraries={str(b): plan.library(b) for b in plan.sizes},
                      mask=plan.mask, checks=checks), axes  # axes: per output, those carrying the dim


@dataclass
class ExportResult:
    path: Path
    source: SourceInfo
    conversion: Optional[CheckResult]  # ONNX Runtime on the export vs the framework's eager outputs
    conversion_error: str = ""


def export(source: str, output: str | Path, framework: Optional[str] = None, dynamic: Sequence[str] = (),
           input_shapes: Sequence[str] = (), exporter: str = "auto", atol: Optional[float] = None,
           rtol: Optional[float] = None, step: StepReporter = _quiet_step) -> ExportResult:
    """Convert a framework model (or zoo:NAME) to an ONNX file, and compare ONNX Runtime on it with
    the framework's eager outputs. Stops before TVM."""
    _check_tolerances(atol, rtol)
    output = Path(output)
    if output.suffix.lower() != ".onnx" or output.is_dir():
        raise InputError(f"-o {output}: give a file name ending in .onnx")
    dynamic_dims = frontends.parse_dynamic(dynamic)
    framework = resolve_framework(source, framework)
    timed = _Timer(step)
    with tempfile.TemporaryDirectory(prefix="mlc-export-") as scratch:
        path, info, converted = _resolve_source(source, Path(scratch), framework, dynamic_dims, input_shapes,
                                                exporter, timed)
        onnx_frontend.load(path)  # a broken export is reported here, not written out
        conversion, error = None, ""
        if converted is not None:
            with timed("reference", "Running the export with ONNX Runtime"):
                try:
                    ort = onnx_frontend.onnxruntime_reference(path, converted.feeds).outputs
                    conversion = compare(converted.eager, ort, atol=atol, rtol=rtol)
                    conversion.reference = f"{converted.framework} {converted.framework_version} eager"
                except InputError as e:
                    error = str(e)
        output.parent.mkdir(parents=True, exist_ok=True)
        staged = output.with_name(f".{output.name}.{os.getpid()}.tmp")
        shutil.copyfile(path, staged)
        staged.replace(output)
    if not info.sha256:
        info.sha256 = thin_runtime.sha256_file(output)
    return ExportResult(output, info, conversion, error)


@contextlib.contextmanager
def _runtime_errors():
    """The thin runtime's exceptions (it cannot import mlc) as MlcErrors with their exit codes."""
    try:
        yield
    except thin_runtime.FeedError as e:
        raise InputError(str(e)) from None
    except (thin_runtime.EmulatorMissing, thin_runtime.DeviceMissing) as e:
        raise MissingDependencyError(str(e)) from None
    except thin_runtime.ArtifactError as e:
        raise IntegrityError(str(e)) from None


def open_runner(artifact: str | Path) -> thin_runtime.Runner | thin_runtime.NativeRunner:
    """Validate an artifact (schema + sha256) and load it for running: in this process when it
    was built for this machine, else through its native runner under emulation."""
    manifest = artifacts.load(artifact)
    with _runtime_errors():
        if manifest.target.runtime_arch == runtimes.HOST_ARCH:
            return thin_runtime.Runner(artifact, verify=False)  # just verified
        return thin_runtime.NativeRunner(artifact, verify=False)


def _read_npz(path: str | Path) -> dict[str, np.ndarray]:
    with _runtime_errors():
        return thin_runtime.load_npz(path)


def load_inputs(runner: thin_runtime.Runner, inputs: Optional[str | Path | Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if inputs is None:
        return _read_npz(runner.root / runner.manifest["reference"]["inputs"])
    if isinstance(inputs, Mapping):
        return dict(inputs)
    return _read_npz(inputs)


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    latency: Optional[dict[str, float]]
    warnings: list[str]
    profile: Optional[list[dict[str, Any]]] = None


def run(artifact: str | Path, inputs=None, warmup: int = 3, repeat: int = 50, profile: bool = False) -> RunResult:
    """Run an artifact on inputs (an .npz path, a dict, or None for its reference inputs);
    `profile` also times each kernel call (Runner.profile)."""
    if warmup < 0 or repeat < 0:
        raise InputError("--warmup and --repeat must be >= 0")
    runner = open_runner(artifact)
    if profile and not isinstance(runner, thin_runtime.Runner):
        raise InputError(f"--profile needs an artifact built for this machine; {artifact} runs under emulation here")
    feeds = load_inputs(runner, inputs)
    with _runtime_errors():
        outputs, latency, warnings = runner.measure(feeds, warmup, repeat)
        kernels = runner.profile(feeds) if profile else None
    return RunResult(outputs, latency, warnings, kernels)


def save_outputs(path: str | Path, outputs: Mapping[str, np.ndarray]) -> None:
    with _runtime_errors():
        thin_runtime.save_npz(path, outputs)


def check(artifact: str | Path, atol: Optional[float] = None, rtol: Optional[float] = None) -> CheckResult:
    """Run the artifact on its reference inputs and compare with its reference outputs."""
    _check_tolerances(atol, rtol)
    runner = open_runner(artifact)
    reference = _read_npz(runner.root / runner.manifest["reference"]["outputs"])
    feeds = load_inputs(runner, None)
    try:
        with _runtime_errors():
            actual = runner.run(feeds)
    except InputError as e:  # the inputs are the artifact's own: a broken artifact, not a user mistake
        raise IntegrityError(f"the artifact's reference inputs do not fit its model: {e}") from None
    info = runner.manifest["reference"]
    result = compare(reference, actual, atol=atol, rtol=rtol)
    result.reference = info["producer"]
    if info.get("onnxruntime"):
        result.conversion = compare(reference, _read_npz(runner.root / info["onnxruntime"]), atol=atol, rtol=rtol)
    result.conversion_error = info.get("onnxruntime_error") or ""
    for case in (runner.buckets or {}).get("checks", []):  # each bucket at its most padded length
        expected = _read_npz(runner.root / case["outputs"])
        with _runtime_errors():
            got = runner.run(_read_npz(runner.root / case["inputs"]))
        for stats in compare(expected, got, atol=atol, rtol=rtol).outputs:
            stats.name = f"{stats.name} [{runner.buckets['dim']}={case['length']} in bucket {case['bucket']}]"
            result.outputs.append(stats)
    return result


def require_pass(result: CheckResult) -> None:
    if not result.passed:
        failed = [o.name for o in result.outputs if not o.passed]
        where = ""
        if result.conversion is not None and not result.conversion.passed:
            where = ("; ONNX Runtime on the exported ONNX differs from the framework too, so the export lost the "
                     "accuracy, not TVM (try another --exporter)")
        raise AccuracyError(f"accuracy check failed for output(s): {', '.join(failed)}{where}")


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
        raise InputError(f"ONNX Runtime cannot run the model's intermediate values: {str(e).splitlines()[0][:300]}") from None


def _tvm_values(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], preset: targets.Target,
                workdir: Path, tag: str, isolate: bool) -> dict[str, np.ndarray]:
    """Compile `model` with TVM, run it on `feeds`, and name its outputs."""
    path, inputs, outputs = (workdir / f"{tag}{suffix}" for suffix in (".onnx", ".in.npz", ".out.npz"))
    onnx.save(model, str(path))
    weights = {init.name for init in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in weights]
    np.savez(inputs, **{f"in_{i}": feeds[n] for i, n in enumerate(names)})
    compiler.compile_in_worker(path, preset.tvm, run=(inputs, outputs), isolate=isolate)
    with np.load(outputs, allow_pickle=False) as data:
        return {v.name: data[f"out_{i}"] for i, v in enumerate(model.graph.output)}


def _debug_source(source: str, target: Optional[str], input_shapes: Sequence[str], inputs, framework: Optional[str]):
    """For an artifact directory: its source model, target, input shapes, reference inputs and framework."""
    path = Path(source)
    if not (path.is_dir() and (path / thin_runtime.MANIFEST).is_file()):
        return source, target or "x86", list(input_shapes), inputs, framework
    manifest = artifacts.load(path)
    origin = manifest.source.path
    if not models.is_zoo(origin):
        if not _source_files(origin):
            raise InputError(f"artifact {path} was compiled from {origin}, which is not there any more; "
                             f"run `mlc debug MODEL --target {manifest.compile.options.get('target', 'x86')}` on the model file")
        if source_sha256(origin) != manifest.source.sha256:
            raise InputError(f"{origin} has changed since artifact {path} was compiled from it; "
                             "run `mlc debug` on the model file itself")
    options = manifest.compile.options
    shapes = list(input_shapes) or list(options.get("input_shapes", []))
    if inputs is None:
        inputs = path / manifest.reference.inputs
    return origin, target or options.get("target", "x86"), shapes, inputs, framework or manifest.source.format


def debug(
    source: str,
    target: Optional[str] = None,
    input_shapes: Sequence[str] = (),
    inputs: Optional[str | Path | Mapping[str, np.ndarray]] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    extract: Optional[str | Path] = None,
    method: str = "auto",
    isolate: bool = True,
    step: StepReporter = _quiet_step,
    framework: Optional[str] = None,
) -> DebugReport:
    """Find the first node whose compiled output differs from ONNX Runtime.

    `source` is a model (path or zoo:NAME) or an artifact directory (its source model, target,
    shapes and reference inputs are reused). `method`: "auto" (one normal build; if its outputs
    are wrong, one build exposing every value; if that hides the fault, bisection), "exposed" or
    "bisect"."""
    if method not in ("auto", "exposed", "bisect"):
        raise InputError(f"unknown method '{method}'; use auto, exposed or bisect")
    _check_tolerances(atol, rtol)
    source, target, input_shapes, inputs, framework = _debug_source(source, target, input_shapes, inputs, framework)
    preset = targets.resolve(target)
    if (preset.runtime_arch, preset.runtime_os, preset.device) != (runtimes.HOST_ARCH, "linux", "cpu"):
        raise TargetError(f"mlc debug runs the compiled model on this machine's CPU, and target {preset.name} runs "
                          "elsewhere; debug with --target x86 (the same graph import and Relax passes) instead")
    if extract:
        artifacts.check_replaceable(Path(extract), marker="report.json")
    timed = _Timer(step)
    feeds = None
    if inputs is not None:
        feeds = dict(inputs) if isinstance(inputs, Mapping) else _read_npz(inputs)
    with tempfile.TemporaryDirectory(prefix="mlc-debug-") as scratch:
        workdir = Path(scratch)
        prepared = _prepare(source, input_shapes, workdir, timed, feeds, framework=framework)
        cleaned, feeds = prepared.cleaned, prepared.feeds
        values = localize.computed_values(cleaned)
        with timed("reference", f"Computing {len(values)} intermediate values with ONNX Runtime"):
            given = onnx_frontend.onnxruntime_reference(prepared.path, feeds).outputs
            # Graph inputs count as known values, so a node reading one can be reported and extracted.
            reference = {**feeds, **_ort_values(localize.with_outputs(cleaned, [v.name for v in values]), feeds)}
            cleanup = compare(given, {k: reference[k] for k in given if k in reference}, atol, rtol)
        out_names = [o.name for o in cleaned.graph.output]
        builds = 0

        def tvm_values(model: onnx.ModelProto, tag: str, what: str) -> dict[str, np.ndarray]:
            nonlocal builds
            builds += 1
            with timed(f"build_{builds}", f"TVM build {builds}: {what}"):
                return _tvm_values(model, feeds, preset, workdir, tag, isolate)

        final_values = tvm_values(cleaned, "final", "the model as compiled")
        final = compare(given, final_values, atol, rtol)
        # TVM is at fault only where it differs from ONNX Runtime on the graph TVM was given;
        # a difference from the model as given, with none here, was made by the clean-up.
        tvm_ok = compare({k: reference[k] for k in out_names}, final_values, atol, rtol).passed
        divergence, used, compared = localize.Divergence(), "final-only", len(out_names)
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
        extracted = None
        if extract and divergence.first is not None:
            extracted = _extract(Path(extract), cleaned, values[divergence.first.position], reference,
                                 divergence, preset, workdir, isolate)
    return DebugReport(source, preset.name, used, builds, compared, cleanup, final, divergence, extracted)


def _bisect(cleaned, values, reference, tvm_values, atol, rtol) -> tuple[localize.Divergence, int]:
    """Binary search over prefix models, each built as the real graph up to one value."""
    probes = [i for i, v in enumerate(values) if v.name in reference]
    cache: dict[int, bool] = {}

    def diverges(k: int) -> bool:
        if k not in cache:
            value = values[probes[k]]
            got = tvm_values(localize.with_outputs(cleaned, [value.name]), f"prefix{k}", f"bisect at {value.node_name}")
            ref = reference[value.name]
            stats = compare_one(value.name, ref, got[value.name], tolerance_for(str(ref.dtype), atol, rtol))
            cache[k] = not stats.passed
        return cache[k]

    if not probes or not diverges(len(probes) - 1):
        return localize.Divergence(), len(cache)
    culprit = values[probes[localize.bisect(len(probes), diverges)]]
    # One more build: the culprit's inputs and outputs, to show which side of the node the error is on.
    node = cleaned.graph.node[culprit.node_index]
    weights = {init.name for init in cleaned.graph.initializer}
    around = [n for n in dict.fromkeys(list(node.input) + list(node.output)) if n and n not in weights and n in reference]
    wanted = [v for v in values if v.name in around]
    actual = tvm_values(localize.with_outputs(cleaned, [v.name for v in wanted]), "culprit", f"around {culprit.node_name}")
    return localize.scan(cleaned, wanted, reference, actual, atol, rtol), len(cache) + len(wanted)


def _extract(dest: Path, cleaned, culprit: localize.Value, reference, divergence, preset, workdir, isolate) -> Path:
    """Write the failing node as its own model with its inputs, the expected and the actual outputs."""
    import json

    single = localize.single_node_model(cleaned, culprit.node_index, reference)
    feeds = {v.name: reference[v.name] for v in single.graph.input}
    actual = _tvm_values(single, feeds, preset, workdir, "extracted", isolate)
    with artifacts.staging_dir(dest, marker="report.json") as staged:
        onnx.save(single, str(staged / "model.onnx"))
        thin_runtime.save_npz(staged / "inputs.npz", {f"in_{i}": v for i, v in enumerate(feeds.values())})
        thin_runtime.save_npz(staged / "expected.npz", {f"out_{i}": reference[o.name] for i, o in enumerate(single.graph.output)
                                                        if o.name in reference})
        thin_runtime.save_npz(staged / "actual.npz", {f"out_{i}": v for i, v in enumerate(actual.values())})
        report = {
            "node": divergence.first.to_json(),
            "target": preset.to_json(),
            "inputs": [v.name for v in single.graph.input],
            "outputs": [o.name for o in single.graph.output],
            "isolated_node_matches": compare({o.name: reference[o.name] for o in single.graph.output if o.name in reference},
                                             actual).passed,
            "files": {"model.onnx": "the node alone", "inputs.npz": "in_i: its inputs, in graph-input order",
                      "expected.npz": "out_i: ONNX Runtime's outputs", "actual.npz": "out_i: TVM's outputs"},
        }
        (staged / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        artifacts.publish(staged, dest, marker="report.json")
    return dest
