"""The last compile step: the artifact's files (compiled library, thin runtime, reference data) and its sealed
manifest."""

from __future__ import annotations

import datetime as dt
import hashlib
import mmap
import re
import shutil
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from mlc import __version__, artifacts, targets
from mlc import check as check_package
from mlc.artifacts.manifest import (BucketInfo, CompileInfo, Manifest, ReferenceInfo, RuntimeInfo, TargetInfo,
                                    TensorSpec, WeightsInfo)
from mlc.compiler import runtimes
from mlc.compiler.contract import CompileResult
from mlc.compiler.weights import SUFFIX as WEIGHTS_SUFFIX
from mlc.errors import CompilerError, UnsupportedModelError
from mlc.pipeline.options import Recipe
from mlc.pipeline.prepare import Prepared, References
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


def default_output(model_name: str, target_name: str, root: Path = DEFAULT_OUTPUT_ROOT) -> Path:
    return root / f"{model_name}-{target_name}"


def package(staged: Path, *, runtime: runtimes.RuntimeFiles, preset: targets.Target, prepared: Prepared,
            references: References, result: CompileResult, pass_records: list[dict], timings: dict, recipe: Recipe,
            buckets: Optional[BucketInfo] = None, bucket_axes: Sequence[list[int]] = (),
            ranges: Optional[dict] = None, weights: Optional[dict[str, dict]] = None) -> Manifest:
    """Write the runtime and the reference next to the compiled library in `staged`, and seal the manifest.
    `result`: the TVM worker's (merged) result; `bucket_axes`: per output, the axes carrying the bucketed dim;
    `weights`: library -> the weights file the worker wrote beside it."""
    precision = result.precision  # what was built: fp32 where TVM failed on the asked precision
    runtime_info, library = _copy_runtime(staged, runtime, preset)
    runtime_info.gpu_code = result.gpu_code
    _check_runtime_functions(staged, runtime_info)
    reference_info = _write_reference(staged, references)
    reference_info.user_inputs = prepared.samples
    inputs = [
        TensorSpec(name=s.name, dtype=s.dtype, shape=prepared.fixed.get(s.name, s.shape), value_range=s.value_range,
                   model_shape=_model_shape(s.shape, prepared.fixed.get(s.name, s.shape)))
        for s in prepared.specs
    ]
    if buckets:  # the bucketed dim stays symbolic in the specs; the runtime pads it
        library = buckets.libraries[str(max(buckets.sizes))]
        for spec, s in zip(inputs, prepared.specs):
            spec.shape = [buckets.dim if d == buckets.dim else size for d, size in zip(s.shape, spec.shape)]
            spec.model_shape = _model_shape(s.shape, spec.shape)
    out_names = list(references.expected.outputs)
    if len(out_names) != len(result.outputs):
        raise CompilerError(f"TVM's module returns {len(result.outputs)} outputs where the model has "
                            f"{len(out_names)}")
    outputs = [
        TensorSpec(name=n, dtype=sig["dtype"], shape=sig["shape"]) for n, sig in zip(out_names, result.outputs)
    ]
    for spec, axes in zip(outputs, bucket_axes):
        spec.shape = [buckets.dim if a in axes else d for a, d in enumerate(spec.shape)]
    manifest = Manifest(
        mlc_version=__version__,
        tvm_version=result.tvm_version,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        source=prepared.source,
        target=TargetInfo(**_target_info(preset, recipe, precision, bool(prepared.quantization))),
        library=library,
        runtime=runtime_info,
        reference=reference_info,
        inputs=inputs,
        outputs=outputs,
        compile=CompileInfo(options=recipe.options, timings_s=timings, passes=pass_records,
                            kernels=result.kernels, schedules=result.schedules,
                            recipe=recipe.command, onnx_nodes={"before": len(prepared.model.graph.node),
                                                               "after": len(prepared.cleaned.graph.node)}),
        buckets=buckets,
        dynamic_ranges=ranges or {},
        precision=precision,
        quantization=prepared.quantization,
        weights={library: WeightsInfo(**info) for library, info in (weights or {}).items()},
        frozen={name: frozen_record(value) for name, value in prepared.frozen.items()},
    )
    return artifacts.seal(staged, manifest)


FROZEN_VALUE_LIMIT = 64  # elements: a frozen shape or axes is written out; a larger tensor by its sha256


def frozen_record(value) -> dict:
    value = np.asarray(value)
    record = {"dtype": str(value.dtype), "shape": list(value.shape)}
    if value.size <= FROZEN_VALUE_LIMIT:
        record["value"] = value.tolist()
    else:
        record["sha256"] = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
    return record


def _model_shape(declared: list, fixed: list) -> Optional[list]:
    """The model's declared shape where the artifact fixes a dim the model leaves open, else None."""
    return list(declared) if any(isinstance(d, str) and isinstance(f, int) for d, f in zip(declared, fixed)) else None


def _target_info(preset: targets.Target, recipe: Recipe, precision: str, quantized: bool) -> dict:
    """The preset, and for a bf16 or int8 build on the dot-product instructions the CPU feature they need (a JSON target
    names no features: without it, a host lacking them would die of SIGILL instead of being told)."""
    info = preset.to_json()
    bf16 = targets.bf16_dot_feature(preset)
    if precision == "bf16" and not recipe.options.get("emulated") and bf16:  # vdpbf16ps, bfdot; AMX's tdpbf16ps
        amx = ["amx_tile", "amx_bf16"] if targets.has_amx(preset) else []
        info["required_cpu_features"] = list(dict.fromkeys(info["required_cpu_features"] + [bf16] + amx))
    int8 = targets.int8_dot_feature(preset)
    if quantized and not recipe.options.get("emulated") and int8:  # vpdpbusd, sdot/udot; AMX's tdpbusd
        amx = ["amx_tile", "amx_int8"] if targets.has_amx(preset) else []
        info["required_cpu_features"] = list(dict.fromkeys(info["required_cpu_features"] + [int8] + amx))
    return info


def _copy_runtime(staged: Path, runtime: runtimes.RuntimeFiles, preset: targets.Target) -> tuple[RuntimeInfo, str]:
    """The TVM runtime libraries, the thin runtime and its entry point (and on macOS the link script);
    returns the manifest's runtime and the library the runtime loads."""
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
    for shipped, module in thin_runtime.ACCURACY_MODULES.items():  # what `run.py --check` judges with
        shutil.copyfile(Path(check_package.__file__).with_name(module), staged / "runtime" / shipped)
    shutil.copyfile(Path(thin_runtime.__file__).with_name("run_entry.py"), staged / RUN_ENTRY)
    info = RuntimeInfo(library=runtime_library, module=RUNTIME_MODULE, entry=RUN_ENTRY,
                       requires=["numpy", "apache-tvm-ffi==0.1.14.post1"],
                       ffi_library=ffi_library, native_runner=NATIVE_RUNNER if runtime.native_runner else None,
                       device_libraries=device_libraries, link=link)
    return info, library


# Packed functions compiled code can call by name (TVM's extern kernels): some live only in TVM's compiler
# library or in libtvm_runtime_extra, which artifacts do not ship (the model built, then failed when run).
_PACKED_CALL = re.compile(rb"(?:relax\.run|tvm\.contrib)\.[A-Za-z0-9_.]+")
_PACKED_OPS = {b"tvm.contrib.sort": "a sort (TopK, NonMaxSuppression, ...)"}


def _packed_calls(path: Path) -> set[bytes]:
    """_PACKED_CALL.findall over the file, from the places its literal prefixes occur: the regex alone took 7 s on
    a model.so with bert-base's weights in it, bytes.find takes milliseconds."""
    if path.stat().st_size == 0:
        return set()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        starts = []
        for prefix in (b"relax.run.", b"tvm.contrib."):
            at = data.find(prefix)
            while at >= 0:
                starts.append(at)
                at = data.find(prefix, at + 1)
        found, end = set(), 0
        for at in sorted(starts):  # leftmost, non-overlapping: as findall
            match = _PACKED_CALL.match(data, at) if at >= end else None
            if match:
                found.add(match.group())
                end = match.end()
    return found


def _check_runtime_functions(staged: Path, runtime: RuntimeInfo) -> None:
    """A one-line error (exit 1) when the compiled code calls a packed function the shipped runtime lacks and the
    thin Python runtime does not provide (its HOST_FUNCTIONS, recorded in the manifest)."""
    shipped = b"".join((staged / lib).read_bytes() for lib in [runtime.library, *runtime.device_libraries])
    compiled = [p for p in staged.rglob("model*") if p.is_file() and p.suffix != WEIGHTS_SUFFIX]  # code only
    called = {m for p in compiled for m in _packed_calls(p) if m not in shipped}
    runtime.host_functions = sorted(m.decode() for m in called if m.decode() in thin_runtime.HOST_FUNCTIONS)
    missing = sorted(m for m in called if m.decode() not in thin_runtime.HOST_FUNCTIONS)
    if missing:
        name = missing[0].decode()
        op = next((op for prefix, op in _PACKED_OPS.items() if missing[0].startswith(prefix)), "an op")
        raise UnsupportedModelError(f"TVM compiles {op} of this model into a call to {name}, a function of TVM's "
                                    "compiler that the artifact's runtime does not have; replace or remove that op")


def _write_reference(staged: Path, references: References) -> ReferenceInfo:
    expected = references.expected
    (staged / "reference").mkdir(exist_ok=True)
    thin_runtime.save_npz(staged / REFERENCE_INPUTS, expected.inputs)
    thin_runtime.save_npz(staged / REFERENCE_OUTPUTS, expected.outputs)
    if references.onnxruntime is not None:
        thin_runtime.save_npz(staged / REFERENCE_ONNXRUNTIME, references.onnxruntime)
    cases = []
    for k, (feeds, outputs) in enumerate(references.gate_cases, 1):
        case = {"inputs": f"reference/gate_{k}_inputs.npz", "outputs": f"reference/gate_{k}_outputs.npz"}
        thin_runtime.save_npz(staged / case["inputs"], feeds)
        thin_runtime.save_npz(staged / case["outputs"], outputs)
        cases.append(case)
    return ReferenceInfo(producer=expected.producer, inputs=REFERENCE_INPUTS, outputs=REFERENCE_OUTPUTS,
                         seed=expected.seed,
                         onnxruntime=REFERENCE_ONNXRUNTIME if references.onnxruntime is not None else None,
                         onnxruntime_error=references.onnxruntime_error, gate_cases=cases,
                         gate_judges_reference=references.gate_judges_reference)
