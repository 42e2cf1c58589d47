"""`mlc tune`: MetaSchedule search into a resumable database (the search itself runs in
mlc.compiler.metaschedule, a child process; the database folder is mlc.pipeline.schedules')."""

from mlc.pipeline.schedules import DB_FILES, check_db_dir, record_count
from mlc.tuning.tune import DEFAULT_TRIALS_PER_TASK, TaskState, TuneResult, parse_budget, tune

__all__ = ["DB_FILES", "DEFAULT_TRIALS_PER_TASK", "TaskState", "TuneResult", "check_db_dir", "parse_budget",
           "record_count", "tune"]
