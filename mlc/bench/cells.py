"""What every benchmark cell needs, whichever experiment runs it: the result schema, the child process a cell
runs in, its one-line error, and the framework a zoo model is exported from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from mlc import child_process, models
from mlc.bench.contract import RESULTS, BenchRequest
from mlc.errors import MlcError

SCHEMA = "mlc-bench/1"
SOURCE_FRAMEWORK = "torch"  # zoo models are exported from torch where they exist in it


def source_framework(model: models.ZooModel, override: Optional[str]) -> str:
    if override:
        from mlc.frontends import resolve_framework

        name = resolve_framework(override)
        model.builder(name)  # InputError when the model is not built for it
        return name
    return SOURCE_FRAMEWORK if SOURCE_FRAMEWORK in model.frameworks else model.default_framework


def run_child(job: BenchRequest, workdir: Path, tag: str, what: str, timeout: Optional[float] = None):
    """One job in mlc.bench.worker; its typed result (mlc.bench.contract), or CellError (log kept and named for an
    unforeseen error)."""
    result, log = child_process.run("mlc.bench.worker", job.to_json(), workdir / f"{tag}.request.json", what,
                                    timeout=timeout)
    keep = not result.ok and result.kind == child_process.EXCEPTION
    if not keep:
        log.unlink(missing_ok=True)
    if result.ok:
        return RESULTS[type(job)].from_json(result.payload)
    raise CellError(result.message + (f" (log: {log})" if keep else ""))


class CellError(Exception):
    """A failure recorded in a cell (the run goes on)."""


def error_text(e: BaseException) -> str:
    return str(e) if isinstance(e, (MlcError, CellError)) else child_process.one_line(e)


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)
