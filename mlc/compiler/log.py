"""What a TVM failure says, in one line, for notes, results and logs (worker, tuning, schedules and records all
report TVM errors the same way)."""

from __future__ import annotations


def summarize(error: BaseException) -> str:
    """The line of a (possibly multi-line) TVM error that says what went wrong."""
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    for line in reversed(lines):
        if not line.startswith(("File ", "Traceback", "^", "at ")):
            return line[:400]
    return type(error).__name__
