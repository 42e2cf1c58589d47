"""Tolerances and output comparison (compare.py); localisation of the first diverging node (localize.py)."""

from mlc.check.compare import EXACT, CheckResult, OutputStats, Tolerance, compare, compare_one, tolerance_for

__all__ = ["EXACT", "CheckResult", "OutputStats", "Tolerance", "compare", "compare_one", "tolerance_for"]
