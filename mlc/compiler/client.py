"""The parent side of the TVM compile worker (compile_in_worker: a CompileRequest, run through mlc.child_process, its
CompileResult or an MlcError back), and the checks that need no tvm. Only the worker imports tvm."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from mlc import child_process
from mlc.compiler.contract import CompileFailure, CompileRequest, CompileResult, FailureKind, Note, NoteKind
from mlc.errors import CompilerError, NodeConversionError, TargetError, UnsupportedModelError


def check_supported(model, *, rewritten: Sequence[str] = (), notes: Sequence[Note] = ()) -> None:
    """Raise UnsupportedModelError listing every op type TVM cannot import (all of them at once), but for the
    `rewritten` ones a pending pass replaces; a skipped pass (a PASS_SKIPPED note) is named in the error."""
    from mlc.compiler.importer import unsupported_ops

    missing = {op: info for op, info in unsupported_ops(model).items() if op not in rewritten}
    if missing:
        skipped = [n.text for n in notes if n.kind is NoteKind.PASS_SKIPPED]
        raise UnsupportedModelError(format_unsupported(missing) + (f" ({'; '.join(skipped)})" if skipped else ""))


def format_unsupported(ops: dict[str, dict]) -> str:
    parts = [f"{op} x{info['count']} (first: {', '.join(info['first_nodes'])})" for op, info in ops.items()]
    return (
        f"the model uses {len(ops)} op type(s) that TVM's ONNX importer cannot convert: {'; '.join(parts)}. "
        "Replace or decompose them in the source model before compiling"
    )


def compile_in_worker(request: CompileRequest, isolate: bool = True) -> CompileResult:
    """Import + build (+ export to `request.library`) (+ run on `request.run`) with TVM.

    With `isolate` (the default) this happens in a child process whose log goes to a file that
    is kept, and named in the error, only when the step fails (mlc.child_process runs it). `isolate=False` runs
    in this process (tests use it to patch TVM). Returns the worker's CompileResult or raises an MlcError. A
    mandatory step that fails writes its smallest failing subgraph beside `request.onnx`."""
    from mlc.compiler import worker

    onnx_path = Path(request.onnx)
    request = dataclasses.replace(request, reproducer=str(onnx_path.with_name(onnx_path.stem + ".reproducer.onnx")))
    if not isolate:
        # through JSON as from the child: the same contract either way
        return _check_result(worker.as_worker_result(worker.compile_request(CompileRequest.from_json(
            request.to_json()))), None)
    request_path = onnx_path.with_name(onnx_path.stem + ".request.json")
    result, log_path = child_process.run("mlc.compiler.worker", request.to_json(), request_path,
                                         "the TVM compile process")
    return _check_result(result, log_path)


# A failure of these kinds is the model's or the user's: the log holds nothing worth keeping.
_USER_KINDS = (FailureKind.UNSUPPORTED, FailureKind.UNSUPPORTED_NODE, FailureKind.UNSUPPORTED_OUTPUT,
               FailureKind.TARGET, FailureKind.PASS)


def _check_result(result: child_process.WorkerResult, log_path: Optional[Path]) -> CompileResult:
    """The compile worker's CompileResult, or the MlcError its failure means."""
    if log_path is not None and (result.ok or result.kind in _USER_KINDS or result.kind == child_process.ERROR):
        log_path.unlink(missing_ok=True)
    if result.ok:
        return CompileResult.from_json(result.payload)
    # a failure of the worker's own kinds carries a CompileFailure; mlc.child_process's (ERROR, EXCEPTION) their
    # error class
    own = result.kind in {k.value for k in FailureKind}
    details = CompileFailure.from_json(result.payload) if own else CompileFailure()
    if result.kind == FailureKind.UNSUPPORTED:
        raise UnsupportedModelError(format_unsupported(details.ops or {}))
    if result.kind == FailureKind.UNSUPPORTED_OUTPUT:
        raise UnsupportedModelError(f"the model returns something other than tensors ({result.message}); "
                                    "only tensor outputs are supported")
    if result.kind == FailureKind.UNSUPPORTED_NODE:  # TVM's converter for an op cannot convert this node
        raise NodeConversionError(result.message)
    if result.kind == FailureKind.PASS:  # a pass the user asked for cannot handle the model
        raise UnsupportedModelError(result.message)
    if result.kind == FailureKind.TARGET:
        raise TargetError(f"TVM rejects the target: {result.message}")
    if result.kind == child_process.ERROR:  # an MlcError raised in the worker
        raise result.error(default=CompilerError)
    notes = [f"full log: {log_path}"] if log_path else []
    reproducer = _keep_reproducer(details, log_path)
    if reproducer:
        notes.append(f"smallest failing subgraph ({details.reproducer_nodes} of {details.model_nodes} nodes): "
                     f"{reproducer}")
    where = f" ({'; '.join(notes)})" if notes else ""
    during = f" during {result.stage}" if result.stage else ""
    raise CompilerError(f"TVM failed{during}: {result.message}{where}", stage=result.stage, detail=result.message)


def _keep_reproducer(details: CompileFailure, log_path: Optional[Path]) -> Optional[Path]:
    """The worker's reproducer moved out of the compile's scratch folder: beside the log (LOG.onnx), or without
    one into the temp folder."""
    written = details.reproducer
    if not written or not Path(written).is_file():
        return None
    if log_path is not None:
        kept = log_path.with_suffix(".onnx")
    else:
        handle, name = tempfile.mkstemp(prefix="mlc-reproducer-", suffix=".onnx")
        os.close(handle)
        kept = Path(name)
    shutil.move(written, kept)
    return kept
