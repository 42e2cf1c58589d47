"""The `mlc tune` progress display: a bar over trials and a live table of each kernel's best latency."""

from __future__ import annotations

import time
from typing import Optional

from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def _us(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.1f} us"


class TuneProgress:
    """Context manager; pass `update` as `mlc.tuning.tune(on_event=...)`."""

    def __init__(self, console, trials_per_task: Optional[int], budget_s: Optional[float]):
        self.console = console
        self.trials_per_task = trials_per_task
        self.budget_s = budget_s
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} trials"),
                            TimeElapsedColumn(), console=console)
        self.bar_id = self.bar.add_task("Preparing the model and extracting kernels", total=None)
        self.tasks: list = []
        self.live = Live(self._render(), console=console, refresh_per_second=2, transient=False)
        self.start = time.time()

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.update(self._render())
        result = self.live.__exit__(*exc)
        self.console.print()  # outside a terminal the last table row has no line end
        return result

    def _render(self):
        table = Table(title_justify="left", box=None, pad_edge=False)
        for column in ("kernel", "weight", "trials", "best latency"):
            table.add_column(column, justify="left" if column == "kernel" else "right")
        for t in self.tasks:
            table.add_row(escape(t.name), str(t.weight), str(t.trials), _us(t.best_us))
        return Group(self.bar, table) if self.tasks else self.bar

    def update(self, event: dict, tasks: list) -> None:
        self.tasks = tasks
        if event["event"] == "tasks":
            total = None if self.trials_per_task is None else self.trials_per_task * len(tasks)
            self.bar.update(self.bar_id, description=f"Tuning {len(tasks)} kernels", total=total,
                            completed=sum(t.trials for t in tasks))
        elif event["event"] == "measured":
            self.bar.update(self.bar_id, completed=sum(t.trials for t in tasks))
        elif event["event"] == "stopping":
            self.bar.update(self.bar_id, description="Stopping after the batch being measured (records are kept)")
        self.live.update(self._render())
