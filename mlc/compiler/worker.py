"""The compile worker: the only process that imports tvm. Run as

    python -m mlc.compiler.worker REQUEST.json

The request names a cleaned ONNX model and a target; the worker imports it into Relax, compiles
it, and optionally exports the library and/or runs it on an .npz of inputs (used by `mlc debug`).
It writes its result beside the request for the parent (mlc.child_process). Running TVM in a child
process keeps a TVM crash (abort, segfault) from taking mlc down with it, and keeps TVM's C++
log lines in a log file rather than on the user's terminal."""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from mlc import child_process
from mlc.compiler.contract import CompileFailure, CompileRequest, CompileResult, FailureKind, Note, NoteKind
from mlc.compiler.log import summarize


def _run(executable, weights: list, inputs_path: str, outputs_path: str) -> None:
    """Run the compiled model on in_0, in_1, ... of an .npz (graph input order) and its `weights`; save out_0, ...
    (flattened output order). Positional keys: tensor names may hold '/' or ':'."""
    import numpy as np
    import tvm

    from mlc.runtime.runner import request_amx

    request_amx()  # AMX kernels (compiler.amx) need the process's tile state; harmless elsewhere
    with np.load(inputs_path, allow_pickle=False) as data:
        # tvm.runtime.tensor copies into TVM-allocated (aligned) memory.
        args = [tvm.runtime.tensor(data[f"in_{i}"]) for i in range(len(data.files))]
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    result = vm["main"](*args, *weights)
    flat = [result] if hasattr(result, "numpy") else list(result)
    np.savez(outputs_path, **{f"out_{i}": t.numpy() for i, t in enumerate(flat)})


# Device code kinds whose source is kept in the artifact, and its file suffix.
_DEVICE_SOURCES = {"cuda": ".cu", "metal": ".metal"}
# A kernel's definition in TVM's CUDA source (its body follows); group 1 is its name
_CUDA_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^)]*\)\s*\{')


def _write_device_sources(executable, out_dir: str) -> dict[str, list[str]]:
    """Save the generated GPU source (CUDA C, Metal Shading Language) of every device module;
    returns the kernel names per kind. Metal gets one file per kernel (TVM marks each with a
    '// Function: NAME' line); CUDA one file for the module."""
    kernels: dict[str, list[str]] = {}
    folder = Path(out_dir)
    for module in _modules(executable.mod):
        if module.kind not in _DEVICE_SOURCES:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        source = module.inspect_source()
        suffix = _DEVICE_SOURCES[module.kind]
        chunks = re.split(r"^// Function: (\S+)\n", source, flags=re.M)
        names = chunks[1::2]
        if module.kind == "metal" and names:
            for name, body in zip(names, chunks[2::2]):
                (folder / f"{name}{suffix}").write_text(f"// Function: {name}\n{body}")
        else:
            (folder / f"{module.kind}{suffix}").write_text(source)
            names = names or _CUDA_KERNEL.findall(source)  # definitions (the source declares each kernel first)
        kernels.setdefault(module.kind, []).extend(names)
    return kernels


def _export_objects(executable, folder: Path) -> None:
    """Object files instead of a shared library, for hosts we cannot link for here (macOS): TVM
    writes them into a .tar (compiled by LLVM for the host triple), unpacked into `folder`."""
    import tarfile
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "objects.tar"
        executable.export_library(str(archive))
        with tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")


# The symbol tvm-ffi reads a library's serialized modules (the VM executable) from.
_LIBRARY_BIN = "__tvm_ffi__library_bin"
_EM_X86_64, _SHF_X86_64_LARGE = 62, 0x10000000


def _elf_object(path: Path, symbol: str, blob, like: Path) -> bool:
    """Write a relocatable ELF object defining `symbol` as read-only data `blob` (any buffer), for the machine of
    the object `like` (TVM's lib0.o). False, writing nothing, where `like` is not 64-bit ELF."""
    import struct

    header = like.read_bytes()[:64] if like.is_file() else b""
    if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:
        return False
    end = "<" if header[5] == 1 else ">"
    machine, = struct.unpack(end + "H", header[18:20])
    flags, = struct.unpack(end + "I", header[48:52])
    size = len(memoryview(blob).cast("B"))
    # x86-64: a large-data section, which the linker places after the code and the small data, so that a blob
    # over 2 GB (M2M100's weights) does not push their 32-bit PC-relative references out of range
    large = machine == _EM_X86_64
    data_name = b".lrodata" if large else b".rodata"
    names = b"\0" + data_name + b"\0.note.GNU-stack\0.symtab\0.strtab\0.shstrtab\0"
    strtab = b"\0" + symbol.encode() + b"\0"
    # the null symbol, then `symbol`: global object in section 1 at offset 0
    symtab = bytes(24) + struct.pack(end + "IBBHQQ", 1, 0x11, 0, 1, 0, size)
    offset = 64 + size  # .rodata right after the header (64-byte aligned)
    sections = [(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                (names.index(data_name), 1, 2 | (_SHF_X86_64_LARGE if large else 0), 0, 64, size, 0, 0, 64, 0),
                (names.index(b".note.GNU-stack"), 1, 0, 0, offset, 0, 0, 0, 1, 0),  # a non-executable stack
                (names.index(b".symtab"), 2, 0, 0, offset, len(symtab), 4, 1, 8, 24),
                (names.index(b".strtab"), 3, 0, 0, offset + len(symtab), len(strtab), 0, 0, 1, 0),
                (names.index(b".shstrtab"), 3, 0, 0, offset + len(symtab) + len(strtab), len(names), 0, 0, 1, 0)]
    tail = symtab + strtab + names
    tail += bytes(-(offset + len(tail)) % 8)
    section_headers = offset + len(tail)
    with open(path, "wb") as f:
        f.write(b"\x7fELF" + bytes([2, header[5], 1, 0]) + bytes(8)
                + struct.pack(end + "HHIQQQIHHHHHH", 1, machine, 1, 0, 0, section_headers, flags, 64, 0, 0, 64,
                              len(sections), len(sections) - 1))
        f.write(blob)
        f.write(tail)
        for entry in sections:
            f.write(struct.pack(end + "IIQQQQIIQQ", *entry))
    return True


def _pack_imports(module, is_system_lib: bool, prefix: str, workspace_dir: str, device_code=None) -> str:
    """export_library's fpack_imports: the serialized imports (the VM executable; its weights are lifted out, see
    mlc.compiler.weights, unless that step was skipped) written straight into an ELF object (else an assembler
    `.incbin` of them). TVM's default builds an LLVM module holding them as one constant, which held weights three
    times over (bert-base: +1.3 GB peak) and took 5 s. The library is the same: one read-only symbol.
    `device_code(blob)`: the blob with its GPU source compiled (mlc.compiler.cuda_binary), or None to keep it."""
    import numpy as np
    from tvm.runtime import _ffi_api

    if is_system_lib or prefix:  # a system library registers its blob under a prefix: TVM's own way
        host = module._collect_dso_modules()[0]  # TVM's export_library does the same
        packed = _ffi_api.ModulePackImportsToLLVM(module, is_system_lib, host.get_function("_get_target_string")(),
                                                  prefix)
        path = str(Path(workspace_dir) / f"{prefix}devc.o")
        packed.write_to_file(path)
        return path
    workspace = Path(workspace_dir)
    packed = _ffi_api.ModulePackImportsToTensor(module)
    data = np.from_dlpack(packed)  # a view: no copy of the weights
    compiled = device_code(data) if device_code is not None else None
    if compiled is not None:
        data = np.frombuffer(compiled, dtype=np.uint8)
    host_objects = sorted(workspace.glob("lib*.o"))  # what export_library wrote for the host code
    if host_objects and _elf_object(workspace / "devc.o", _LIBRARY_BIN, data, host_objects[0]):
        return str(workspace / "devc.o")
    blob = workspace / "devc.bin"
    data.tofile(blob)
    del data, packed
    source = Path(workspace_dir) / "devc.S"
    # '%' rather than '@' type prefixes: on ARM '@' starts a comment. The GNU-stack note keeps the stack
    # non-executable (without it the linker marks the whole library so).
    source.write_text(f"""  .section .rodata
  .globl {_LIBRARY_BIN}
  .type {_LIBRARY_BIN}, %object
  .balign 64
{_LIBRARY_BIN}:
  .incbin "{blob}"
  .size {_LIBRARY_BIN}, .-{_LIBRARY_BIN}
  .section .note.GNU-stack,"",%progbits
""")
    return str(source)


def _cuda_code(executable, request: CompileRequest, record: dict):
    """export_library's device_code for a CUDA target: its CUDA source compiled to a fatbin for the target's arch
    (mlc.compiler.cuda_binary); what was compiled goes into `record`."""
    from mlc.compiler import cuda_binary
    from mlc.compiler.runtimes import cache_dir

    sources = [m.inspect_source() for m in _modules(executable.mod) if m.kind == "cuda"]

    def compile_source(source: str) -> bytes:
        fatbin, code = cuda_binary.compile_fatbin(source, request.target["arch"], cache_dir())
        record.update(code.to_json())
        return fatbin

    return lambda blob: cuda_binary.rewrite(blob, sources, compile_source)


def _modules(module):
    yield module
    for child in module.imports:
        yield from _modules(child)


def _build(mod, request: CompileRequest, default_schedules: bool, notes: list[Note], use_db: bool = True,
           cuda_graphs: bool = False):
    """The executable, the schedule report, and the weights its `main` takes after the inputs."""
    from mlc.compiler import build

    lifted: list = []
    if request.schedules:  # CPU: tuning records and/or default schedules (mlc.compiler.schedules)
        from mlc.compiler import schedules

        db = request.schedules.db if use_db else None
        executable, report = schedules.build(mod, request.target, db, default_schedules, notes, lifted)
        return executable, report, lifted
    executable = build.build(mod, request.target, lifted, cuda_graphs=cuda_graphs)
    return executable, _tensor_core_report(executable), lifted


# TVM names a fused kernel after its ops; these are the ones tensor cores compute
_TENSOR_CORE_OPS = re.compile(r"matmul|conv|dense")
_TENSOR_CORE_CODE = re.compile(r"wmma::mma_sync|mma\.sync|ldmatrix")


def _tensor_core_report(executable) -> Optional[dict[str, list[str]]]:
    """A CUDA build's matmul and conv kernels, by whether their code runs on tensor cores (wmma/mma) or not; None
    for other builds."""
    report: dict[str, list[str]] = {"tensor_cores": [], "cuda_cores": []}
    for module in _modules(executable.mod):
        if module.kind != "cuda":
            continue
        source = module.inspect_source()
        kernels = list(_CUDA_KERNEL.finditer(source))
        for kernel, following in zip(kernels, [*kernels[1:], None]):
            if _TENSOR_CORE_OPS.search(kernel.group(1)):
                body = source[kernel.end():following.start() if following else len(source)]
                report["tensor_cores" if _TENSOR_CORE_CODE.search(body) else "cuda_cores"].append(kernel.group(1))
    return report if any(report.values()) else None


def _build_with_fallbacks(passed: "_Passed", request: CompileRequest):
    """Build `passed.mod`; where TVM fails, build again without the optional steps, the likeliest culprit first:
    CUDA graphs (--cuda-graphs), the tuning records (--db: records an older mlc wrote broke builds, #41), mlc's
    default CPU schedules, then the Relax passes (where one changed the module; `passed.imported()` makes the module
    without them), then the precision step (`passed.at_fp32()` makes the module without it). Each step left out
    stays out of the later tries; --quantize's rung is the last (compile_request).
    A fallback that builds adds a note naming the steps left out and TVM's reason, and their names to
    `passed.left_out`; when every try fails, the first error is raised (a mandatory step failed). Returns the
    executable, the schedule report, the lifted weights and whether the precision step was left out."""
    default = bool(request.schedules and request.schedules.default)
    db = request.schedules and request.schedules.db
    graphs = request.cuda_graphs
    also, graphs_out = (" and CUDA graphs", ["cuda_graphs"]) if graphs else ("", [])
    mod = passed.mod
    # (module, mlc's default schedules, the steps left out: (text, names), tuning records, CUDA graphs)
    attempts = [(lambda: mod, default, None, True, graphs)]
    if graphs:
        attempts.append((lambda: mod, default, ("CUDA graphs", graphs_out), True, False))
    if db:
        attempts.append((lambda: mod, default, (f"the tuning records (--db {db})", ["tuning_records"]), False, False))
    if default:
        attempts.append((lambda: mod, False, ("mlc's default CPU schedules", ["default_schedules"]), True, False))
    if passed.applied:
        attempts.append((passed.imported, False, ("the Relax passes" + (" and mlc's default CPU schedules" if default
                                                                        else "") + also,
                                                  ["relax_passes"] + ["default_schedules"] * default + graphs_out),
                         True, False))
    if passed.at_fp32 is not None:
        step = passed.precision_step
        attempts.append((passed.at_fp32, default, (f"{step['requested']} (the artifact is fp32)" + also,
                                                   [step["name"]] + graphs_out), True, False))
    first = None
    for module, default_schedules, skipped, use_db, cuda_graphs in attempts:
        tried: list[Note] = []
        try:
            executable, report, lifted = _build(module(), request, default_schedules, tried, use_db, cuda_graphs)
        except Exception as e:  # TVM raises many kinds; the last try re-raises the first
            traceback.print_exc()  # into the log file
            first = first or e
            continue
        passed.notes.extend(n for n in tried if n not in passed.notes)
        if skipped:
            passed.notes.append(Note(NoteKind.FALLBACK, f"built without {skipped[0]}: TVM failed with them: "
                                                        f"{summarize(first)}"))
            passed.left_out.extend(skipped[1])
        return executable, report, lifted, module is passed.at_fp32
    raise first


def as_worker_result(outcome: CompileResult | child_process.WorkerResult) -> child_process.WorkerResult:
    """compile_request's outcome as mlc.child_process sends it: a success carries the CompileResult's JSON."""
    return child_process.WorkerResult.success(outcome.to_json()) if isinstance(outcome, CompileResult) else outcome


def _serve(data: dict) -> child_process.WorkerResult:
    """The child's handler: the request parsed once, here."""
    return as_worker_result(compile_request(CompileRequest.from_json(data)))


class _Failed(Exception):
    """A failure of a FailureKind in one of compile_request's stages (not a bug: the model's or the request's)."""

    def __init__(self, kind: FailureKind, message: str = "", details: CompileFailure | None = None):
        super().__init__(message or f"no converter for {', '.join((details and details.ops) or ())}")
        self.result = child_process.WorkerResult.failure(kind.value, message, None,
                                                         **(details or CompileFailure()).to_json())


def compile_request(request: CompileRequest) -> CompileResult | child_process.WorkerResult:
    """Compile as `request` says: its CompileResult, or a failure of a FailureKind. `stage` names the step a bug
    fails in (a reproducer is searched for the mandatory ones)."""
    import onnx

    from mlc.compiler import importer, reproducer

    timings: dict[str, float] = {}
    child_process.large_blocks_mapped()
    at = {"stage": "load", "onnx": request.onnx}  # where a failure happened, for the reproducer
    try:
        start = time.perf_counter()
        from mlc.runtime.runner import import_without_torch

        tvm = import_without_torch("tvm")  # TVM's ONNX import and build never use torch
        timings["tvm_import"] = time.perf_counter() - start
        at["stage"] = "target"
        try:
            tvm.target.Target(request.target)
        except Exception as e:  # TVM raises ValueError/TVMError/AttributeError for bad JSON targets
            raise _Failed(FailureKind.TARGET, summarize(e)) from None
        outputs, passed, (executable, schedule_report, lifted) = _build_quantized_or_not(request, timings, at)
        written, gpu_code = None, {}
        if request.library:
            at["stage"] = "export"
            start = time.perf_counter()
            written = _export(executable, lifted, request, gpu_code)
            timings["export"] = time.perf_counter() - start
        if request.run:
            at["stage"] = "run"
            start = time.perf_counter()
            _run(executable, lifted, request.run.inputs, request.run.outputs)
            timings["run"] = time.perf_counter() - start
        kernels = _write_device_sources(executable, request.kernels_dir) if request.kernels_dir else {}
        return CompileResult(tvm_version=tvm.__version__, outputs=outputs, timings=timings,
                             pass_records=passed.records, notes=passed.notes, kernels=kernels,
                             schedules=schedule_report, weights=written, precision=passed.precision,
                             left_out=passed.left_out, gpu_code=gpu_code or None)
    except _Failed as e:
        return e.result
    except importer.ConversionError as e:  # a valid model TVM cannot import: exit 1 naming the op, not 70
        return _Failed(FailureKind.UNSUPPORTED_NODE, str(e)).result
    except Exception as e:
        traceback.print_exc()  # into the log file the parent points the user to
        message, found = summarize(e), CompileFailure()
        if request.reproducer and at["stage"] in reproducer.STAGES:  # a mandatory step failed: exit 70
            found = reproducer.write(onnx.load(at["onnx"]), dataclasses.replace(request, onnx=at["onnx"]),
                                     at["stage"], message, compile_request)
        return child_process.WorkerResult.failure(FailureKind.COMPILE.value, message, at["stage"], **found.to_json())


def _build_quantized_or_not(request: CompileRequest, timings: dict[str, float], at: dict):
    """The model imported, through the passes and built: its outputs' signature, the _Passed and what _build_passed
    returns. --quantize is the last rung of the fallback ladder: where TVM fails on the quantised graph (to import
    it, or on every build of it), the graph as it was before --quantize is built (fp32), with a note."""
    try:
        return _import_and_build(request.onnx, request, timings, at)
    except Exception as e:  # TVM raises many kinds; a failure of the fp32 graph is raised as the compile's
        if request.unquantized_onnx is None:
            raise
        traceback.print_exc()  # into the log file
        why = str(e) if isinstance(e, _Failed) else summarize(e)
    outputs, passed, built = _import_and_build(request.unquantized_onnx, request, timings, at)
    quantize = next(s for s in request.relax_passes if s["name"] == "quantize")
    passed.notes.insert(0, Note(NoteKind.FALLBACK, f"built without {quantize['requested']} (the artifact is fp32): "
                                                   f"TVM failed with it: {why}"))
    passed.left_out.append("quantize")
    return outputs, passed, built


def _import_and_build(onnx_path: str, request: CompileRequest, timings: dict[str, float], at: dict):
    import onnx

    at.update(stage="import", onnx=onnx_path)
    model = onnx.load(onnx_path, load_external_data=False)  # its weights are read as they are converted
    mod, outputs = _import(model, onnx_path, request, timings)
    del model  # its weights are TVM's now; a reproducer search reads the file again
    child_process.release_memory()
    at["stage"] = "passes"
    passed = _run_passes(mod, onnx_path, request)
    del mod
    at["stage"] = "build"
    start = time.perf_counter()
    built = _build_passed(passed, request)
    timings["build"] = time.perf_counter() - start
    child_process.release_memory()
    return outputs, passed, built


def _import(model, onnx_path: str, request: CompileRequest, timings: dict[str, float]):
    """The Relax module of `model` (ops TVM has no converter for: a failure naming them), and its outputs' signature."""
    from mlc.compiler import build, importer

    missing = importer.unsupported_ops(model)
    if missing:
        raise _Failed(FailureKind.UNSUPPORTED, details=CompileFailure(ops=missing))
    start = time.perf_counter()
    mod = importer.to_relax(model, request.dim_upper_bounds, Path(onnx_path).parent)
    timings["relax_import"] = time.perf_counter() - start
    try:
        return mod, build.output_signature(mod)
    except TypeError as e:  # e.g. an output that is a shape, not a tensor
        raise _Failed(FailureKind.UNSUPPORTED_OUTPUT, str(e)) from None


@dataclasses.dataclass
class _Passed:
    """The module after the Relax passes (the precision step among them), with what the build's fallbacks need."""

    mod: Any
    records: list  # the passes', in the order they ran
    notes: list[Note]
    precision: str  # what the module computes in: the request's, or fp32 where TVM failed on its step (noted)
    precision_step: Optional[dict]  # --precision's step (Step.to_json()), where it applied
    applied: bool  # a Relax pass other than the precision step changed the module
    imported: Callable[[], Any]  # the module imported again, with the precision step only
    at_fp32: Optional[Callable[[], Any]]  # with the passes and without the precision step
    left_out: list[str] = dataclasses.field(default_factory=list)  # the optional steps the build left out


def _run_passes(mod, onnx_path: str, request: CompileRequest) -> _Passed:
    import onnx

    from mlc.compiler import importer, relax_passes

    steps = request.relax_passes
    # mlc.compiler.schedules' CPU build legalizes and fuses itself (its tuning keys are the kernels it fuses)
    mod, passes = relax_passes.run(mod, steps, request.target, request.dump_ir, fused_by_build=bool(request.schedules))
    if passes["error"]:
        raise _Failed(FailureKind.PASS, passes["error"])
    records = passes["records"]
    applied = {r["name"] for r in records if r["status"] == "applied"}
    # --precision's step (--quantize's runs on the ONNX graph, before the worker)
    precision_step = next((s for s in steps if s["level"] == "relax" and s.get("requested") and s["name"] in applied),
                          None)

    def again(chosen: list[dict]):
        """The module imported again, through the `chosen` steps: kept through the build, the module without the
        passes held each weight a pass replaced (the Q, K and V weights that combine_parallel_matmul concatenates)
        twice."""
        imported = importer.to_relax(onnx.load(onnx_path, load_external_data=False), request.dim_upper_bounds,
                                     Path(onnx_path).parent)
        return relax_passes.run(imported, chosen, request.target, fused_by_build=bool(request.schedules))[0]

    at_fp32 = None
    if precision_step:
        at_fp32 = functools.partial(again, [s for s in steps if s is not precision_step])
    return _Passed(mod, records, passes["notes"], request.precision if precision_step else "fp32", precision_step,
                   bool(applied - {precision_step and precision_step["name"]}),
                   functools.partial(again, [precision_step] if precision_step else []), at_fp32)


def _build_passed(passed: _Passed, request: CompileRequest):
    """The executable (built with the fallbacks), its schedule report and the weights its `main` takes; a precision
    the build had to leave out is fp32 in `passed`."""
    executable, schedule_report, lifted, fp32 = _build_with_fallbacks(passed, request)
    if fp32:  # recorded as left out, as a step that failed on its own is
        step = passed.precision_step
        passed.records = [{**r, "status": "skipped", "reason": f"{step['requested']}: every build with it failed"}
                          if r["name"] == step["name"] else r for r in passed.records]
        passed.precision = "fp32"
    passed.mod = None  # `lifted` holds the weights main needs (packed ones replace the originals)
    return executable, schedule_report, lifted


def _export(executable, lifted: list, request: CompileRequest, gpu_code: dict) -> Optional[dict]:
    """The library (or, for macOS, its objects) and the weights file beside it: the weights' manifest entry."""
    from mlc.compiler import weights

    fcompile = None
    if request.cross_compiler:
        from tvm.support import cc

        fcompile = cc.cross_compiler(request.cross_compiler)
    if request.object_dir:
        _export_objects(executable, Path(request.object_dir))
    else:
        pack = _pack_imports
        if request.target.get("kind") == "cuda":
            pack = functools.partial(_pack_imports, device_code=_cuda_code(executable, request, gpu_code))
        executable.export_library(request.library, fcompile=fcompile, fpack_imports=pack)
    path = Path(request.library).with_suffix(weights.SUFFIX)
    return {"file": path.name, "tensors": weights.write(lifted, path)} if lifted else None


def main(argv: list[str]) -> int:
    from mlc.runtime.runner import import_without_torch

    import_without_torch("tvm_ffi")  # loading it installs TVM's SIGSEGV handler, which serve() then replaces
    return child_process.serve(argv, _serve, describe=summarize)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
