"""`mlc bench` and `mlc report`: the benchmark matrix (matrix.py, one process per cell: worker.py), the lengths
experiment (lengths.py), baselines (baselines.py), the machine record (machine.py) and reports (report.py)."""

from mlc.bench.cells import SCHEMA, CellError, write_json
from mlc.bench.matrix import BenchConfig, command_line, config_from, pick_models, run, validate

__all__ = ["SCHEMA", "BenchConfig", "CellError", "command_line", "config_from", "pick_models", "run", "validate",
           "write_json"]
