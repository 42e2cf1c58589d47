"""Step reporting: each step of a pipeline runs inside the caller's reporter (the CLI shows a spinner and the
duration) and is timed into the manifest."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, ContextManager

# A step reporter: called with a description, returns a context manager around the step.
StepReporter = Callable[[str], ContextManager[object]]


def quiet_step(_: str) -> ContextManager[object]:
    """The reporter that shows nothing (the API's default, and the CLI's with --json)."""
    return contextlib.nullcontext()


class Timer:
    """Times named steps into `timings` and shows each through the step reporter."""

    def __init__(self, step: StepReporter = quiet_step):
        self.step = step
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, key: str, description: str):
        start = time.perf_counter()
        with self.step(description):
            yield
        self.timings[key] = round(time.perf_counter() - start, 4)
