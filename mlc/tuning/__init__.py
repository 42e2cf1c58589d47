"""`mlc tune`: MetaSchedule search into a resumable database (the search itself runs in
mlc.compiler.metaschedule, a child process)."""

from mlc.tuning.tune import (DB_FILES, DEFAULT_TRIALS_PER_TASK, TaskState, TuneResult, check_db_dir, parse_budget,
                             record_count, schedule_notes, schedule_request, tune)

__all__ = ["DB_FILES", "DEFAULT_TRIALS_PER_TASK", "TaskState", "TuneResult", "check_db_dir", "parse_budget",
           "record_count", "schedule_notes", "schedule_request", "tune"]
