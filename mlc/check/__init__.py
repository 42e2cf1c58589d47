"""Tolerances and output comparison (compare.py); the reduced-precision gate (gate.py); localisation of the first
diverging node (localize.py)."""

from mlc.check.compare import EXACT, CheckResult, OutputStats, Tolerance, compare, compare_one, tolerance_for
from mlc.check.gate import LIMITS, PRECISIONS, QUANTIZED, GateResult, gate

__all__ = ["EXACT", "LIMITS", "PRECISIONS", "QUANTIZED", "CheckResult", "GateResult", "OutputStats", "Tolerance",
           "compare", "compare_one", "gate", "tolerance_for"]
