"""`mlc compile`, step by step: plan (every option checked before heavy work), prepare (ONNX, shapes, passes,
reference), build with TVM (once, or once per bucket), package, verify."""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from mlc import artifacts, child_process, compiler, frontends, targets
from mlc.artifacts.manifest import Manifest
from mlc.check import CheckResult
from mlc.compiler import cuda_binary, runtimes
from mlc.compiler.contract import CompileRequest, ScheduleRequest
from mlc.compiler.contract import CompileResult as WorkerCompileResult
from mlc.compiler.contract import texts
from mlc.frontends import onnx as onnx_frontend
from mlc.frontends import onnx_weights
from mlc.errors import (CompilerError, InputError, MissingDependencyError, MlcError, NodeConversionError,
                        TargetError, UnsupportedModelError)
from mlc.passes.registry import QUANTIZE_MODES
from mlc.pipeline import buckets as bucketing
from mlc.pipeline import schedules as tuning_records
from mlc.pipeline import source as sources
from mlc.pipeline import strings as string_ops
from mlc.pipeline.options import Buckets, CompileOptions, ModelSpec, recipe, worker_options
from mlc.pipeline.package import KERNELS, LIBRARY, OBJECTS, default_output, package
from mlc.pipeline.prepare import (Prepared, References, bind_to_reference, drop_quantization, dynamic_ranges, prepare,
                                  references)
from mlc.pipeline.run import check
from mlc.pipeline.steps import StepReporter, Timer, quiet_step
from mlc.runtime import runner as thin_runtime


@dataclass
class CompileResult:
    path: Path
    manifest: Manifest
    check: Optional[CheckResult]  # None when the artifact cannot run here (no emulator)
    archive: Optional[Path] = None
    notes: list[str] = field(default_factory=list)


def prepare_target(preset: targets.Target) -> tuple[runtimes.RuntimeFiles, Optional[str]]:
    """The runtime files and cross compiler a target needs (fetched or built now, or an error)."""
    runtime = runtimes.runtime_files(preset.runtime_arch, preset.device, preset.runtime_os)
    if preset.device == "cuda":  # the GPU code ships compiled: without NVRTC the artifact could never load
        problem = cuda_binary.missing()
        if problem:
            raise MissingDependencyError(f"compiling for {preset.name} needs NVRTC and nvFatbin here, and {problem}; "
                                         f"install them: {cuda_binary.INSTALL}")
    cross = None
    if preset.runtime_arch != runtimes.HOST_ARCH and preset.runtime_os != "macos":
        cross = runtimes.toolchain(preset.runtime_arch).compiler
    return runtime, cross


@dataclass(frozen=True)
class CompilePlan:
    """What a compile does, decided before any heavy work."""

    model: ModelSpec  # its framework resolved
    options: CompileOptions
    preset: targets.Target
    dynamic: Optional[dict]  # --dynamic parsed
    ranges: dict  # the --dynamic dims given a range
    buckets: Optional[Buckets]
    schedules: Optional[ScheduleRequest]  # what the worker schedules with (CPU targets)
    steps: list  # the pass plan
    runtime: runtimes.RuntimeFiles
    cross: Optional[str]  # cross compiler
    output: Path


def compile(model: ModelSpec, options: CompileOptions, step: StepReporter = quiet_step
            ) -> CompileResult:
    """Compile `model` into a verified artifact directory (see mlc.api.compile)."""
    timed = Timer(step)
    child_process.large_blocks_mapped()
    plan = plan_compile(model, options)
    with tempfile.TemporaryDirectory(prefix="mlc-compile-") as scratch:
        workdir = Path(scratch)
        strings = string_ops.split(plan.model, options, workdir)  # string ops run on the host around the rest
        prepared = prepare(strings.numeric if strings else plan.model, workdir, timed,
                           static=options.db is not None and not plan.dynamic, steps=plan.steps,
                           dump_ir=options.pass_options.dump_ir, calibration=options.calibration)
        if prepared.declared_dynamic:  # a .pt2's own dynamic dims, as if given with --dynamic
            plan = dataclasses.replace(plan, dynamic=prepared.declared_dynamic,
                                       ranges={d: r for d, r in prepared.declared_dynamic.items() if r})
        # cleaned.onnx is written: ONNX Runtime and TVM read the weights from the files.
        _release_weights(prepared, "cleaned")
        with timed("reference", "Computing reference outputs with ONNX Runtime"):
            refs = references(prepared)
        bucket_plan, builds = _plan_builds(plan, prepared, workdir, timed)
        _release_weights(prepared, "model")  # the buckets' graph passes ran on it
        with artifacts.staging_dir(plan.output) as staged:
            results = _build(plan, prepared, refs, builds, staged, timed)
            if refs.gate_cases and not prepared.quantization:  # built without --quantize: an fp32 artifact
                refs = dataclasses.replace(refs, gate_cases=[], gate_judges_reference=True)
            changed = onnx_weights.changed_files(workdir)  # the weights were read from them all along
            if changed:
                raise InputError(f"{', '.join(changed)} changed during the compile (its weights were read from it "
                                 "as the compile went); compile again once it is written")
            manifest, result = _package(plan, prepared, refs, bucket_plan, results, staged, timed, strings)
    notes = texts(prepared.notes) + texts(result.notes) + _schedule_notes(plan, result)
    notes += [string_ops.note(manifest.host)] if strings else []
    check_result, verify_notes = _verify(plan, timed)
    if check_result is not None and check_result.gate is not None:  # the gate's figures go into the manifest
        manifest = artifacts.seal(plan.output, manifest.model_copy(update={"gate": check_result.gate.to_json()}))
    archive_path = artifacts.archive(plan.output) if options.archive else None
    return CompileResult(plan.output, manifest, check_result, archive_path, notes + verify_notes)


def build_settings(preset: targets.Target, options: CompileOptions) -> tuple[list, Optional[ScheduleRequest]]:
    """The pass plan and the worker's schedule request: what a compile builds with (and so `mlc debug` too)."""
    return (options.pass_options.plan(preset.device, options.precision, options.quantize),
            tuning_records.schedule_request(preset, options.db, options.default_schedules))


def plan_compile(model: ModelSpec, options: CompileOptions) -> CompilePlan:
    """Check every option, resolve the target, fetch its runtime and toolchain: what is missing or wrong fails
    here, before any heavy work (each option's own value was checked when the options were made)."""
    dynamic = model.dynamic_dims()
    requested_buckets = model.buckets
    if requested_buckets and model.dynamic:
        raise InputError("--buckets and --dynamic are two answers to the same problem; give one of them")
    model = sources.resolve(model)
    frontends.check_exporter(model.framework, model.exporter)
    preset = targets.resolve(options.target)
    precision_supported(preset, options.precision, options.emulated)
    if options.cuda_graphs and preset.device != "cuda":
        raise TargetError(f"--cuda-graphs is for CUDA targets; {preset.name} runs on {preset.device}")
    quantize_supported(preset, options.quantize, options.emulated, options.precision)
    if options.quantize and requested_buckets:
        raise InputError("--quantize and --buckets cannot be combined yet (each bucket would need its own "
                         "calibration); quantise a static or --dynamic build")
    if model.freeze and not model.inputs:
        raise InputError(f"--freeze {', '.join(model.freeze)} folds the input's value into the graph: give that value "
                         "with --inputs FILE.npz (one array per input name)")
    if model.inputs and requested_buckets:
        raise InputError("--inputs fixes the shapes at the samples' and --buckets builds one per length; give one "
                         "of them")
    if options.calibration and options.quantize != "int8":
        raise InputError("--calibration calibrates --quantize int8; give --quantize int8 with it")
    steps, schedules = build_settings(preset, options)
    runtime, cross = prepare_target(preset)
    output = options.output or default_output(sources.model_name(model.source), preset.name)
    artifacts.check_replaceable(output)
    return CompilePlan(model, options, preset, dynamic, dynamic_ranges(model), requested_buckets, schedules, steps,
                runtime, cross, output)


def plan_targets(model: ModelSpec, options: CompileOptions, target_list: Sequence[str]) -> list[CompilePlan]:
    """A plan for each of several targets (`options` but the target), every one made (its options checked, its
    runtime and toolchain fetched) before any compiles. With several, `options.output` is the folder that receives
    MODEL-TARGET for each."""
    plans = []
    for target in dict.fromkeys(target_list):
        output = options.output
        if output is not None and len(set(target_list)) > 1:
            output = default_output(sources.model_name(model.source), targets.resolve(target).name, root=output)
        plans.append(plan_compile(model, dataclasses.replace(options, target=target, output=output)))
    return plans


def precision_supported(preset: targets.Target, precision: str, emulated: bool) -> None:
    """A reduced precision needs the target's instructions for it; --emulated builds it anyway (slowly)."""
    if precision == "bf16" and preset.device == "cuda" and targets.cuda_arch_number(preset) < 80:
        raise TargetError(f"--precision bf16 on a GPU needs bf16 tensor cores (sm_80, Ampere, or newer); target "
                          f"{preset.name} is {preset.tvm.get('arch', 'of no arch')}: use --precision fp16 there")
    if precision == "fp32" or emulated:
        return
    if precision == "bf16" and preset.device == "cpu" and not targets.has_bf16_dot(preset):
        raise TargetError(f"--precision bf16: target {preset.name} ({preset.tvm.get('mcpu', preset.tvm['kind'])}) "
                          "has no bf16 dot-product instructions (x86 AVX512-BF16: cooperlake, sapphirerapids, znver4 "
                          "or newer; ARM BF16: graviton3, graviton4); --emulated builds it anyway, converting in "
                          "software (slow)")
    if precision == "bf16" and preset.device not in ("cpu", "cuda"):
        raise TargetError(f"--precision bf16 is for CPU and CUDA targets; use --precision fp32 on {preset.name}")
    if precision == "fp16" and preset.device != "cuda":
        raise TargetError(f"--precision fp16 needs a GPU with fp16 arithmetic (cuda); target {preset.name} has none "
                          "mlc uses (bf16 on CPUs with AVX512-BF16 or ARM BF16); --emulated builds it anyway (slow)")


def quantize_supported(preset: targets.Target, quantize: Optional[str], emulated: bool,
                       precision: str = "fp32") -> None:
    """--quantize is a mode mlc knows, alone (no --precision), on a CPU target with int8 dot-product instructions
    (x86 VNNI, ARM dotprod) unless --emulated."""
    if not quantize:
        return
    if quantize not in QUANTIZE_MODES:
        raise InputError(f"--quantize {quantize}: choose one of {', '.join(QUANTIZE_MODES)}")
    if precision != "fp32":
        raise InputError(f"--quantize {quantize} and --precision {precision} both set what matmul/conv compute in; "
                         "give one of them")
    if preset.device != "cpu":
        raise TargetError(f"--quantize {quantize} is CPU-only for now; target {preset.name} is {preset.device}")
    if not emulated and not targets.has_int8_dot(preset):
        raise TargetError(f"--quantize {quantize}: target {preset.name} ({preset.tvm.get('mcpu', preset.tvm['kind'])}) "
                          "has no int8 dot-product instructions (x86 AVX512-VNNI/AVX-VNNI: cascadelake, icelake, "
                          "alderlake, sapphirerapids, znver4 or newer; ARM dotprod: neoverse-n1/v1 or newer); "
                          "--emulated builds it anyway (slow)")


def _plan_builds(plan: CompilePlan, prepared: Prepared, workdir: Path, timed: Timer
                 ) -> tuple[Optional[bucketing.Plan], list[bucketing.Build]]:
    """One build of the cleaned graph, or with --buckets one per bucket."""
    if not plan.buckets:
        return None, [bucketing.Build(LIBRARY[plan.preset.runtime_os], prepared.cleaned_path)]
    bucket_plan = bucketing.plan(plan.buckets, prepared.specs)
    if plan.preset.runtime_os == "macos" or plan.preset.device != "cpu":
        raise TargetError(f"--buckets builds CPU shared libraries (linux); target {plan.preset.name} is not one")
    return bucket_plan, bucketing.builds(bucket_plan, prepared, plan.steps, workdir, timed)


def _release_weights(prepared: Prepared, *names: str) -> None:
    """Drop the initializers of this process's copies of the model (`names`: "model", as read, and "cleaned", after
    the passes) once files hold what ONNX Runtime and TVM read: most are references into those files already, but a
    quantised graph holds its weights, and so does a model the light load could not walk."""
    for name in names:
        model = getattr(prepared, name)
        if not model.graph.initializer:
            continue
        del model.graph.initializer[:]
        light = type(model)()  # a new message: protobuf frees a message's memory only with the whole message
        light.CopyFrom(model)
        setattr(prepared, name, light)
    child_process.release_memory()


def _build(plan: CompilePlan, prepared: Prepared, refs: References, builds: list[bucketing.Build], staged: Path,
           timed: Timer) -> dict[str, WorkerCompileResult]:
    """Compile each build with TVM into `staged`; the worker's result per library."""
    preset, options = plan.preset, plan.options
    macos = preset.runtime_os == "macos"
    results = {}
    for build in builds:
        with timed(f"tvm{build.label}", f"Compiling{build.label} with TVM for {preset.name} "
                                        f"({preset.tvm.get('mcpu', preset.tvm['kind'])})"):
            def compile_(onnx_path: Path, library: str = build.library) -> WorkerCompileResult:
                dump_ir = options.pass_options.dump_ir
                return compiler.compile_in_worker(CompileRequest(
                    onnx=str(onnx_path), target=preset.tvm, library=str(staged / library), cross_compiler=plan.cross,
                    unquantized_onnx=str(prepared.unquantized_path) if prepared.quantization else None,
                    kernels_dir=str(staged / KERNELS), object_dir=str(staged / OBJECTS) if macos else None,
                    schedules=plan.schedules, relax_passes=[s.to_json() for s in plan.steps],
                    dump_ir=str(dump_ir) if dump_ir else None,
                    dim_upper_bounds={name: hi for name, (_, hi) in plan.ranges.items()},
                    **worker_options(options)), isolate=options.isolate)

            def compile_bound(onnx_path: Path) -> WorkerCompileResult:
                try:
                    return compile_(onnx_path)
                except (CompilerError, NodeConversionError) as e:
                    # A dim TVM cannot keep symbolic (no --dynamic asked for it): compile at the reference sizes.
                    imported = isinstance(e, NodeConversionError) or e.stage == "import"
                    if not imported or plan.dynamic or plan.buckets or not bind_to_reference(prepared, plan.steps, e):
                        raise
                    return compile_(prepared.cleaned_path)

            try:
                results[build.library] = compile_bound(build.onnx)
                if "quantize" in results[build.library].left_out:  # the worker built the fp32 graph (noted)
                    drop_quantization(prepared)
            except CompilerError as e:
                cause = _user_cause(e, plan, prepared, refs)
                if cause is None:
                    raise
                raise cause from None
            except NodeConversionError as e:  # with --dynamic, say what helps
                hint = onnx_frontend.parameter_hint(prepared.specs)
                if hint:
                    raise UnsupportedModelError(f"{e}; {hint}: give its value with --inputs FILE.npz and "
                                                "--freeze NAME to fold it into the graph") from None
                if plan.dynamic:
                    hint = _DYNAMIC_IMPORT_HINT.format(dims=", ".join(plan.dynamic), e=e)
                    raise UnsupportedModelError(hint) from None
                raise
    return results


_DYNAMIC_IMPORT_HINT = ("TVM cannot import this model with {dims} symbolic ({e}); compile it without --dynamic "
                        "(static shapes) or serve the lengths with --buckets")


def _user_cause(e: CompilerError, plan: CompilePlan, prepared: Prepared, refs: References) -> Optional[MlcError]:
    """A TVM failure the user can act on, as the error that says how; None when it is TVM's (or mlc's) own."""
    hint = onnx_frontend.parameter_hint(prepared.specs)
    if hint:  # a shape or axes given at run time: TVM needs most of them constant, and only the user knows the value
        return UnsupportedModelError(f"TVM cannot compile this model with that input given at run time ({hint}): "
                                     "give its value with --inputs FILE.npz and --freeze NAME to fold it into the "
                                     f"graph; TVM: {e}")
    if plan.dynamic and e.stage == "import":
        return UnsupportedModelError(_DYNAMIC_IMPORT_HINT.format(dims=", ".join(plan.dynamic), e=e))
    if refs.onnxruntime_error is not None:  # ONNX Runtime failed on the export too: the export is broken, not TVM
        return UnsupportedModelError(
            f"the ONNX export ({prepared.source.exporter}) is broken at the compiled shapes: "
            f"{refs.onnxruntime_error}; TVM: {e}. Try another --exporter or other --input-shape")
    return None


def _package(plan: CompilePlan, prepared: Prepared, refs: References, bucket_plan: Optional[bucketing.Plan],
             results: dict[str, WorkerCompileResult], staged: Path, timed: Timer,
             strings: Optional[string_ops.StringModel] = None) -> tuple[Manifest, WorkerCompileResult]:
    """Write the manifest (and the buckets' reference runs) and publish the artifact; returns the manifest and
    the builds' merged worker result. `strings`: the model's string ops, which the artifact runs on the host."""
    result = bucketing.merge_results(list(results.values()))
    bucket_info, bucket_axes = None, []
    if bucket_plan:
        bucket_info, bucket_axes = bucketing.manifest_info(bucket_plan, prepared, results, staged)
    timed.timings.update({f"tvm_{k}": round(v, 4) for k, v in result.timings.items()})
    weights = {library: r.weights for library, r in results.items() if r.weights}
    if bucket_plan and weights:
        weights = bucketing.share_weights(staged, weights)
    with timed("package", "Packaging the artifact"):
        manifest = package(staged, runtime=plan.runtime, preset=plan.preset, prepared=prepared, references=refs,
                           result=result, pass_records=prepared.pass_records + result.pass_records,
                           timings=timed.timings, recipe=recipe(plan.model, plan.options), buckets=bucket_info,
                           bucket_axes=bucket_axes, ranges=plan.ranges,
                           weights=weights)
        if strings:
            manifest = string_ops.attach(staged, manifest, strings)
        artifacts.publish(staged, plan.output)
    return manifest, result


def _schedule_notes(plan: CompilePlan, result: WorkerCompileResult) -> list[str]:
    db = plan.options.db
    notes = list(plan.runtime.notes)
    notes += tuning_records.schedule_notes(result.schedules, plan.model.source, plan.options.target, db,
                                           plan.options.default_schedules)
    tensor_cores = tuning_records.tensor_core_note(result.schedules, result.precision)
    notes += [tensor_cores] if tensor_cores else []
    if db is not None and plan.dynamic and not (result.schedules or {}).get("tuned_at"):
        notes.append("tuning records match static kernels: the symbolic-shape kernels of --dynamic use "
                     "mlc's default schedules; for tuned kernels per length use --buckets with --db")
    return notes


def _verify(plan: CompilePlan, timed: Timer) -> tuple[Optional[CheckResult], list[str]]:
    """Run the artifact on its reference inputs where this machine can (natively, or under qemu); else a note
    saying where to check it."""
    preset, final = plan.preset, plan.output
    arch = preset.runtime_arch
    if not plan.options.check:
        return None, [f"not verified (--no-check): run `mlc check {final}` or `python {final}/run.py --check` "
                      "where it runs; a --precision or --quantize build is judged by its accuracy gate there"]
    if preset.device != "cpu" and not thin_runtime.device_present(preset.device):
        return None, [f"not verified: no {preset.device.upper()} device here; run `python {final}/run.py --check` "
                      "(needs only numpy and apache-tvm-ffi) or `mlc check` on a machine with one"]
    if arch == runtimes.HOST_ARCH or thin_runtime.emulator_command(arch):
        how = "" if arch == runtimes.HOST_ARCH else " under qemu emulation"
        with timed("check", f"Checking the artifact against the reference{how}"):
            return check(final, atol=plan.options.atol, rtol=plan.options.rtol), []
    return None, [f"not verified: this {runtimes.HOST_ARCH} machine cannot run {arch} code "
                  "(apt-get install qemu-user); run `mlc check` or `python run.py --check` on the device"]
