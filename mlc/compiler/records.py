"""Tuning records that read back (issue #41). TVM's JSONDatabase parses every record when it opens a database,
applying each record's trace to its kernel, and one record that fails makes the whole database unusable
("parallel_for_dynamic error"). So `mlc tune` keeps only records that pass that same parse (`checked`), and
`mlc compile --db` skips those that do not (`open_readable`), counting them. Imports tvm."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

WORKLOADS, RECORDS = "database_workload.json", "database_tuning_record.json"
SET_ASIDE = "unreadable_tuning_records.json"  # where `mlc tune` moves them: kept, out of TVM's way


def _parse():
    """TVM's JSON parser, the one JSONDatabase reads its files with."""
    import tvm

    return tvm.get_global_func("ffi.json.Parse")


def _reason(error: BaseException, record_json=None, workload=None) -> str:
    """TVM's one line; a ScheduleError says only "(not rendered)": the trace is replayed again to render it."""
    from mlc.compiler.log import summarize

    why = summarize(error)
    if "not rendered" in why and record_json is not None and workload is not None:
        from tvm.s_tir.schedule import Schedule, Trace

        try:
            Trace.apply_json_to_schedule(record_json[0], Schedule(workload.mod, error_render_level="detail"))
        except Exception as e:  # the same failure, rendered
            why = summarize(e).removeprefix("Error message: ")
    return f"its trace does not apply to its kernel: {why}" if record_json is not None else why


def _kernel_writer(folder: Path, mod):
    """(`folder`, a JSONDatabase there that holds the kernel `mod` alone), or why TVM cannot write it."""
    from tvm.s_tir import meta_schedule as ms

    try:
        folder.mkdir(parents=True, exist_ok=True)
        writer = ms.database.JSONDatabase(work_dir=str(folder), module_equality="structural")
        writer.commit_workload(mod)
        return folder, writer
    except Exception as e:  # TVM cannot write this kernel: none of its records reads
        return f"its kernel cannot be written: {_reason(e)}"


def _read_back_failure(folder: Path, db, record) -> Optional[str]:
    """Why `record`, written alone into `folder` by its kernel's JSONDatabase `db`, does not read back; None if
    it does."""
    from tvm.s_tir import meta_schedule as ms

    (folder / RECORDS).write_text("")  # the one record below only (each commit appends a line)
    try:
        db.commit_tuning_record(record)
        ms.database.JSONDatabase(work_dir=str(folder), module_equality="structural", allow_missing=False)
    except Exception as e:  # TVM says only "parallel_for_dynamic error": ask per record
        return readable_lines(folder)[3] or _reason(e)
    return None


def checked(database, scratch: str | Path):
    """A Database that hands everything to `database` but keeps a tuning record only if it reads back: each is
    first written by a JSONDatabase of its kernel alone in `scratch` and read back by a fresh one (TVM's own
    writer and reader, trace applied). `.commit_checked(record)` commits and returns None, or returns why it did
    not; of the records TVM's search commits, `.dropped` counts those not kept and `.last_reason` says why."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm_ffi import structural_hash

    @derived_object
    class CheckedDatabase(ms.database.PyDatabase):
        def __init__(self):
            super().__init__()
            self.inner = database
            self.dropped = 0
            self.last_reason: Optional[str] = None
            self.writers: dict = {}  # kernel hash -> (folder, its JSONDatabase) or why it cannot be written

        def has_workload(self, mod):
            return self.inner.has_workload(mod)

        def commit_workload(self, mod):
            return self.inner.commit_workload(mod)

        def _writer(self, mod):
            key = structural_hash(mod)
            if key not in self.writers:
                self.writers[key] = _kernel_writer(Path(scratch) / f"{key & 0xFFFFFFFFFFFF:012x}", mod)
            return self.writers[key]

        def commit_checked(self, record) -> Optional[str]:
            writer = self._writer(record.workload.mod)
            if isinstance(writer, str):
                return writer
            why = _read_back_failure(*writer, record)
            if why is None:
                self.inner.commit_tuning_record(record)
            return why

        def commit_tuning_record(self, record):  # the search's records
            why = self.commit_checked(record)
            if why is not None:
                self.dropped += 1
                self.last_reason = why

        def get_top_k(self, workload, top_k):
            return self.inner.get_top_k(workload, top_k)

        def get_all_tuning_records(self):
            return self.inner.get_all_tuning_records()

        def __len__(self):
            return len(self.inner)

    return CheckedDatabase()


def readable_lines(db_dir: str | Path) -> tuple[list[str], list[str], int, Optional[str]]:
    """(workload lines, readable record lines, records skipped, the first skip's reason) of a database folder,
    each record parsed as JSONDatabase parses it."""
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    loads = _parse()
    folder = Path(db_dir)
    workload_lines = _lines(folder / WORKLOADS)
    workloads: list = []
    for line in workload_lines:
        try:
            workloads.append(Workload.from_json(loads(line)))
        except Exception as e:  # its records are skipped with it
            workloads.append(f"its kernel does not read back: {_reason(e)}")
    kept, skipped, reason = [], 0, None
    for line in _lines(folder / RECORDS):
        try:
            index, record = loads(line)
            workload = workloads[int(index)] if int(index) >= 0 else "no such kernel"
        except Exception as e:  # not [workload index, record]
            workload = f"not a record: {_reason(e)}"
        if isinstance(workload, str):
            why = workload
        else:
            try:
                TuningRecord.from_json(record, workload)
                why = None
            except Exception as e:  # TVM raises many kinds
                why = _reason(e, record, workload) if reason is None else "-"  # rendering replays: once
        if why is not None:
            skipped += 1
            reason = reason or why
            continue
        kept.append(line)
    return workload_lines, kept, skipped, reason


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []


def open_readable(db_dir: str | Path, notes: list[str], repair: bool = False):
    """The JSONDatabase of `db_dir`; where TVM cannot open it, one of its readable records only, with a note that
    counts the records skipped. The folder is left as it is, unless `repair` (mlc tune, which appends to it): then
    the unreadable records move to SET_ASIDE in it."""
    from tvm.s_tir import meta_schedule as ms

    try:
        return ms.database.JSONDatabase(work_dir=str(db_dir), module_equality="structural", allow_missing=repair)
    except Exception:  # one unreadable record fails the whole load: find it below
        pass
    workload_lines, kept, skipped, reason = readable_lines(db_dir)
    folder = Path(db_dir)
    if repair:
        readable = set(kept)
        dropped = [ln for ln in _lines(folder / RECORDS) if ln not in readable]
        with open(folder / SET_ASIDE, "a") as f:
            f.write("".join(ln + "\n" for ln in dropped))
        tmp = folder / (RECORDS + ".tmp")
        tmp.write_text("".join(ln + "\n" for ln in kept))
        tmp.replace(folder / RECORDS)
        database = ms.database.JSONDatabase(work_dir=str(folder), module_equality="structural")
        if skipped:
            notes.append(f"moved {skipped} tuning records that TVM cannot read ({reason}) from {folder / RECORDS} to "
                         f"{folder / SET_ASIDE}")
        return database
    with tempfile.TemporaryDirectory(prefix="mlc-db-") as tmp:
        (Path(tmp) / WORKLOADS).write_text("".join(ln + "\n" for ln in workload_lines))
        (Path(tmp) / RECORDS).write_text("".join(ln + "\n" for ln in kept))
        database = ms.database.JSONDatabase(work_dir=tmp, module_equality="structural")  # read into memory here
    if skipped:
        notes.append(f"skipped {skipped} of the {skipped + len(kept)} tuning records in {db_dir} that TVM cannot read "
                     f"({reason}); built with the other {len(kept)}")
    return database
