"""The compiler: frontends (-> ONNX + reference), ONNX passes, and the TVM worker process that
imports ONNX into Relax and builds it. Only the worker (and modules it imports) imports tvm."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from mlc.errors import CompilerError, MissingDependencyError, TargetError, UnsupportedModelError

TVM_PIN = "apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1"


def tvm_package_dir() -> Path:
    """Where the apache-tvm package is installed, found without importing it (that takes ~6 s)."""
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"Apache TVM is not installed; run: pip install {TVM_PIN}")
    return Path(list(spec.submodule_search_locations)[0])


def check_supported(model, *, rewritten: Sequence[str] = (), notes: Sequence[str] = ()) -> None:
    """Raise UnsupportedModelError listing every op type TVM cannot import (all of them at once), but for the
    `rewritten` ones a pending pass replaces; a skipped pass (a "pass ..." note) is named in the error."""
    from mlc.compiler.importer import unsupported_ops

    missing = {op: info for op, info in unsupported_ops(model).items() if op not in rewritten}
    if missing:
        skipped = [n for n in notes if n.startswith("pass ")]
        raise UnsupportedModelError(format_unsupported(missing) + (f" ({'; '.join(skipped)})" if skipped else ""))


def format_unsupported(ops: dict[str, dict]) -> str:
    parts = [f"{op} x{info['count']} (first: {', '.join(info['first_nodes'])})" for op, info in ops.items()]
    return (
        f"the model uses {len(ops)} op type(s) that TVM's ONNX importer cannot convert: {'; '.join(parts)}. "
        "Replace or decompose them in the source model before compiling"
    )


def compile_in_worker(
    onnx_path: Path,
    target_json: dict[str, Any],
    library: Optional[Path] = None,
    run: Optional[tuple[Path, Path]] = None,
    isolate: bool = True,
    cross_compiler: Optional[str] = None,
    kernels_dir: Optional[Path] = None,
    object_dir: Optional[Path] = None,
    schedules: Optional[dict[str, Any]] = None,
    relax_passes: Optional[list[dict]] = None,
    dump_ir: Optional[Path] = None,
    dim_upper_bounds: Optional[dict[str, int]] = None,
) -> dict[str, Any]:
    """Import + build (+ export to `library`) (+ run on `run`=(inputs.npz, outputs.npz)) with TVM.

    With `isolate` (the default) this happens in a child process whose log goes to a file that
    is kept, and named in the error, only when the step fails. `isolate=False` runs in this
    process (tests use it to patch TVM). Returns the worker's result or raises an MlcError."""
    from mlc.compiler import worker

    request = {"onnx": str(onnx_path), "target": target_json, "library": str(library) if library else None,
               "run": {"inputs": str(run[0]), "outputs": str(run[1])} if run else None,
               "cross_compiler": cross_compiler, "kernels_dir": str(kernels_dir) if kernels_dir else None,
               "object_dir": str(object_dir) if object_dir else None, "schedules": schedules,
               "relax_passes": relax_passes or [], "dump_ir": str(dump_ir) if dump_ir else None,
               "dim_upper_bounds": dim_upper_bounds or {}}
    if not isolate:
        return _check_result(worker.compile_request(request), None)
    request_path = onnx_path.with_name(onnx_path.stem + ".request.json")
    result, log_path = run_worker("mlc.compiler.worker", request, request_path, "the TVM compile process")
    return _check_result(result, log_path)


def result_path(request_path: Path) -> Path:
    """Where a worker writes its result for the request at `request_path`."""
    return request_path.with_suffix(".result.json")


def write_result(request_path: Path, result: dict[str, Any]) -> None:
    """The worker side of run_worker: the result appears whole or not at all."""
    tmp = request_path.with_suffix(".result.tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(result_path(request_path))


def one_line(e: BaseException) -> str:
    """'Type: first line of the message' of an exception from code we do not control."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def serve(argv: list[str], handle) -> int:
    """A worker's main(): `handle(request)` -> result; an MlcError becomes {"error": its class name,
    "message"} for the parent to raise again; anything else is a framework error, its traceback logged."""
    import traceback

    from mlc.errors import MlcError

    request_path = Path(argv[0])
    try:
        result = handle(json.loads(request_path.read_text()))
    except MlcError as e:
        result = {"ok": False, "error": type(e).__name__, "message": str(e)}
    except Exception as e:  # a framework error we did not foresee: the log has the traceback
        traceback.print_exc()
        result = {"ok": False, "error": "framework", "message": one_line(e)}
    write_result(request_path, result)
    return 0


def run_worker(module: str, request: dict[str, Any], request_path: Path, what: str,
               timeout: Optional[float] = None) -> tuple[dict[str, Any], Path]:
    """Run `python -m module REQUEST.json` with its output in a log file; returns the result the
    worker wrote and the log's path (the caller deletes the log when it is not worth keeping).
    A crashed worker, or one still running after `timeout` seconds (then it and every process it
    started are killed), is a CompilerError naming the log."""
    request_path.write_text(json.dumps(request))
    with tempfile.NamedTemporaryFile("w", prefix="mlc-worker-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
        # Its own process group, so that a stop also ends the compiler pools it may have started.
        proc = subprocess.Popen([sys.executable, "-m", module, str(request_path)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CompilerError(f"{what} ran longer than {timeout:g} s and was stopped (log: {log_path})") from None
        except BaseException:  # interrupted: nothing to show the user
            _kill_group(proc)
            log_path.unlink(missing_ok=True)
            raise
    written = result_path(request_path)
    if proc.returncode != 0 or not written.exists():
        if proc.returncode < 0:
            how = f"was killed by {signal.Signals(-proc.returncode).name}"
        else:
            how = f"exited with status {proc.returncode}"
        tail = _log_tail(log_path)
        raise CompilerError(f"{what} {how}{': ' + tail if tail else ''} (full log: {log_path})")
    return json.loads(written.read_text()), log_path


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _check_result(result: dict[str, Any], log_path: Optional[Path]) -> dict[str, Any]:
    user_side = ("unsupported", "unsupported_node", "unsupported_output", "target", "pass")
    if log_path is not None and (result["ok"] or result["kind"] in user_side):
        log_path.unlink(missing_ok=True)
    if result["ok"]:
        return result
    if result["kind"] == "unsupported":
        raise UnsupportedModelError(format_unsupported(result["ops"]))
    if result["kind"] == "unsupported_output":
        raise UnsupportedModelError(f"the model returns something other than tensors ({result['message']}); "
                                    "only tensor outputs are supported")
    if result["kind"] == "unsupported_node":  # TVM's converter for an op cannot convert this node
        raise UnsupportedModelError(result["message"])
    if result["kind"] == "pass":  # a pass the user asked for cannot handle the model
        raise UnsupportedModelError(result["message"])
    if result["kind"] == "target":
        raise TargetError(f"TVM rejects the target: {result['message']}")
    where = f" (full log: {log_path})" if log_path else ""
    raise CompilerError(f"TVM failed during {result['stage']}: {result['message']}{where}", stage=result['stage'])


def _log_tail(log_path: Path) -> str:
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
