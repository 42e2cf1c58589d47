"""Tuning records in a compile: the database folder `mlc tune` writes and `mlc compile --db` reads
(MetaSchedule's JSON database), what the compile worker is asked to schedule with, and what the user is told."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from mlc.compiler.contract import ScheduleRequest
from mlc.errors import InputError, TargetError

DB_FILES = ("database_workload.json", "database_tuning_record.json")


def check_db_dir(db: Path, create: bool) -> Path:
    """A usable database folder (created when `create`); repairs a record line cut short by a kill."""
    if db.exists() and not db.is_dir():
        raise InputError(f"--db {db} is a file; give a folder for the tuning database")
    if not db.exists():
        if not create:
            raise InputError(f"--db {db} does not exist; run `mlc tune MODEL --db {db}` first")
        try:
            db.mkdir(parents=True)
        except OSError as e:
            raise InputError(f"--db {db}: cannot create the folder ({e.strerror})") from None
    if not os.access(db, os.W_OK | os.X_OK) and create:
        raise InputError(f"--db {db} is not writable")
    if not create and not any((db / name).is_file() for name in DB_FILES):
        raise InputError(f"--db {db} holds no tuning database ({DB_FILES[1]}); run `mlc tune` into it first")
    for name in DB_FILES:
        _repair(db / name)
    return db


def _repair(path: Path) -> None:
    """Drop a final line that a killed writer left incomplete; any other bad line is corruption."""
    if not path.is_file():
        return
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    good = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError:
            if number == len(lines):
                break
            raise InputError(f"{path} line {number} is not a tuning record; the database is corrupt "
                             "(remove the line or the file, or use another --db)") from None
        good.append(line if line.endswith("\n") else line + "\n")
    if len(good) != sum(1 for ln in lines if ln.strip()) or (lines and not lines[-1].endswith("\n")):
        tmp = path.with_suffix(".repair")
        tmp.write_text("".join(good))
        tmp.replace(path)


DEFAULT_KERNELS = "default_kernels.json"  # the kernels `mlc tune` left to mlc's default schedule, by name


def default_kernels(db: Path) -> set[str]:
    try:
        return set(json.loads((Path(db) / DEFAULT_KERNELS).read_text()))
    except (OSError, ValueError, TypeError):
        return set()


def add_default_kernels(db: Path, names) -> None:
    """Remember kernels `mlc tune` does not tune, so a --db build does not ask for them to be tuned."""
    known = default_kernels(db) | set(names)
    tmp = Path(db) / (DEFAULT_KERNELS + ".tmp")
    tmp.write_text(json.dumps(sorted(known)) + "\n")
    tmp.replace(Path(db) / DEFAULT_KERNELS)


def record_count(db: Path) -> int:
    path = db / DB_FILES[1]
    return sum(1 for ln in path.read_text().splitlines() if ln.strip()) if path.is_file() else 0


# What `mlc tune` gained over mlc's default schedules on the zoo models.
TUNING_GAIN_NOTE = "see benchmarks/tuning/results/tuning.json for what tuning gained on the zoo models"


def schedule_request(preset, db: Optional[str | Path], default: bool) -> Optional[ScheduleRequest]:
    """What the compile worker is asked to schedule with, or None for TVM's own pipeline (GPU:
    rule-based dlight schedules; only CPU builds use tuning records and mlc's default rules)."""
    if preset.tvm.get("kind") != "llvm":
        if db is not None:
            raise TargetError(f"--db applies to CPU targets; {preset.name} builds use rule-based GPU schedules")
        return None
    return ScheduleRequest(db=str(check_db_dir(Path(db), create=False).resolve()) if db is not None else None,
                           default=default)


def _few(names: list[str]) -> str:
    """The first four names in order, and how many more."""
    names = sorted(names)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def unscheduled_note(names: list[str]) -> Optional[str]:
    """The warning for kernels left with TVM's unscheduled loop nest (serial scalar code), naming a few."""
    if not names:
        return None
    return (f"{len(names)} kernel(s) unscheduled, running TVM's serial scalar loops (slow): {_few(names)}; the "
            "manifest's compile.schedules.unscheduled lists them all")


def tensor_core_note(report: Optional[dict], precision: str) -> Optional[str]:
    """The warning for a GPU build's fp16/bf16 matmul and conv kernels that do not run on tensor cores, naming a
    few (mlc.compiler.worker reads it off their CUDA code)."""
    slow = (report or {}).get("cuda_cores", [])
    if precision not in ("fp16", "bf16") or not slow:
        return None
    total = len(slow) + len((report or {}).get("tensor_cores", []))
    return (f"{len(slow)} of {total} matmul/conv kernels run on CUDA cores, not tensor cores: {_few(slow)} (TVM's "
            "dlight rule tensorizes a kernel whose fixed dims all exceed 64, and fails on some convs over a symbolic "
            "batch); the manifest's compile.schedules.cuda_cores lists them all")


def schedule_notes(report: Optional[dict], source: str, target: str, db: Optional[str | Path],
                   default: bool = True) -> list[str]:
    """Tell the user whether the build is tuned and what to run if it is not, and which kernels are unscheduled
    though mlc's default schedules were asked for (`default`)."""
    if not report:
        return []
    kinds = ("tuned", "default", "unscheduled")
    total = sum(len(report.get(k, [])) for k in kinds)
    tuned = len(report.get("tuned", []))
    if db is not None:  # not tuned on purpose (a concatenation's copies, ...): no reason to tune again
        total -= len(set(report.get("default", [])) & default_kernels(Path(db)))
    unscheduled = unscheduled_note(report.get("unscheduled", [])) if default else None
    notes = [unscheduled] if unscheduled else []
    if report.get("tuned_at"):
        twins = sorted({entry.split(": ", 1)[1] for entry in report["tuned_at"]})
        notes.append(f"{len(report['tuned_at'])} kernels over symbolic dims took the records of their static twins "
                     f"(tuned at {'; '.join(twins)}); the manifest's compile.schedules.tuned_at lists them")
    if tuned == total:
        return notes
    hint = f"`mlc tune {source} --target {target} --db DIR` then `mlc compile ... --db DIR`"
    if db is None:
        return notes + [f"untuned build: {len(report.get('default', []))} of {total} kernels use mlc's default CPU "
                        f"schedules; {hint} tunes them ({TUNING_GAIN_NOTE})"]
    return notes + [f"{tuned} of {total} kernels were tuned (records in {db}); the other {total - tuned} use default "
                    f"schedules: tune this model into the database to cover them ({hint})"]
