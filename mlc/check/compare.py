"""Comparing outputs with a reference: per-dtype tolerances and per-output error statistics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Mapping, Optional

import numpy as np

if TYPE_CHECKING:  # numpy only at run time: artifacts ship this file for `run.py --check` (mlc.runtime.runner)
    from mlc.check.gate import GateResult


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    # Default tolerances scale atol with the output's peak |value|: down for outputs whose values are all small
    # (logits of seeded models below 1e-3, which a fixed atol would pass whatever they held), and up, a tenth as
    # fast, past a peak of 10 (seeded deep nets reach 1e6-1e7, where the framework's own fp32 rounding misses a
    # fixed atol on the smallest elements). --atol is exact.
    scaled: bool = False

    def effective_atol(self, reference: np.ndarray) -> float:
        if not self.scaled:
            return self.atol
        finite = np.abs(reference[np.isfinite(reference)])
        peak = float(finite.max()) if finite.size else 1.0
        return self.atol * max(min(1.0, max(peak, 1e-3)), peak / 10)


# Defaults by dtype: elements pass where |actual - ref| <= atol + rtol * |ref| (numpy.isclose).
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-6),
    "float32": Tolerance(1e-4, 1e-3),
    "float16": Tolerance(1e-2, 5e-2),
    "bfloat16": Tolerance(5e-2, 1e-1),
}
EXACT = Tolerance(0.0, 0.0)  # integers and booleans


def tolerance_for(dtype: str, atol: Optional[float] = None, rtol: Optional[float] = None) -> Tolerance:
    base = DEFAULT_TOLERANCES.get(str(dtype), EXACT)
    return Tolerance(base.atol if atol is None else atol, base.rtol if rtol is None else rtol, scaled=atol is None)


@dataclass
class OutputStats:
    name: str
    dtype: str
    shape: list[int]
    atol: float
    rtol: float
    max_abs_error: float
    max_rel_error: float  # |actual - ref| / max(|ref|, atol)
    cosine_similarity: float
    mismatch_fraction: float  # share of elements outside tolerance
    nonfinite_mismatch: int  # elements where NaN/Inf disagree between actual and reference
    passed: bool
    problem: str = ""  # set when shapes or dtypes differ


@dataclass
class CheckResult:
    outputs: list[OutputStats] = field(default_factory=list)
    reference: str = ""  # what computed the reference outputs, e.g. "torch 2.13.0 eager"
    # For a model exported from a framework: ONNX Runtime on the exported ONNX against the same
    # reference (the conversion step's error), or why ONNX Runtime could not run it.
    conversion: Optional["CheckResult"] = None
    conversion_error: str = ""
    # A reduced-precision build (--precision bf16/fp16) is judged by its gate; the float outputs' fp32 figures
    # above are then for information (integer outputs must still match exactly).
    gate: Optional[GateResult] = None

    @property
    def passed(self) -> bool:
        if self.gate is not None:
            return bool(self.outputs) and self.gate.passed and all(
                o.passed for o in self.outputs if not o.dtype.startswith(("float", "bfloat")))
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def failed(self) -> list[str]:
        """The outputs that fail (the gate's, for a reduced-precision build)."""
        if self.gate is not None:
            return self.gate.failed() + [o.name for o in self.outputs
                                         if not o.passed and not o.dtype.startswith(("float", "bfloat"))]
        return [o.name for o in self.outputs if not o.passed]

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict:
        result = {"passed": self.passed, "reference": self.reference, "outputs": [asdict(o) for o in self.outputs]}
        if self.conversion is not None or self.conversion_error:
            result["conversion"] = {"error": self.conversion_error or None,
                                    **(self.conversion.to_json() if self.conversion else {"passed": False})}
        if self.gate is not None:
            result["gate"] = self.gate.to_json()
        return result


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel(), b.ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def compare_one(name: str, reference: np.ndarray, actual: np.ndarray, tol: Tolerance) -> OutputStats:
    def failed(problem: str) -> OutputStats:
        nan = float("nan")
        return OutputStats(name, str(reference.dtype), list(reference.shape), tol.atol, tol.rtol,
                           nan, nan, nan, 1.0, 0, False, problem)

    if actual.shape != reference.shape:
        return failed(f"shape {actual.shape} differs from reference {reference.shape}")
    if reference.size == 0:
        return OutputStats(name, str(reference.dtype), list(reference.shape), tol.atol, tol.rtol,
                           0.0, 0.0, 1.0, 0.0, 0, True)
    if reference.dtype.kind in "UOS":  # strings: equal or not
        if actual.dtype.kind not in "UOS":
            return failed(f"dtype {actual.dtype} differs from reference (strings)")
        mismatches = int(np.count_nonzero(reference.astype(str) != actual.astype(str)))
        return OutputStats(name, "string", list(reference.shape), 0.0, 0.0, 0.0, 0.0, 1.0,
                           mismatches / reference.size, 0, mismatches == 0,
                           "" if mismatches == 0 else f"{mismatches} of {reference.size} strings differ")
    ref = reference.astype(np.float64)
    act = actual.astype(np.float64)
    if np.isnan(ref).all():
        # NaN matches NaN, so an all-NaN reference would pass anything that also NaNs: it proves nothing.
        return failed("every reference value is NaN, so nothing was compared: give real inputs (--inputs)")
    tol = Tolerance(tol.effective_atol(ref), tol.rtol)
    ref_finite, act_finite = np.isfinite(ref), np.isfinite(act)
    # NaN matches NaN and +Inf matches +Inf; anything else non-finite on one side is a mismatch.
    same_nonfinite = (~ref_finite) & (~act_finite) & ((np.isnan(ref) & np.isnan(act)) | (ref == act))
    nonfinite_mismatch = int(np.count_nonzero((~ref_finite | ~act_finite) & ~same_nonfinite))
    both = ref_finite & act_finite
    diff = np.abs(act - ref)
    within = np.where(both, diff <= tol.atol + tol.rtol * np.abs(ref), same_nonfinite)
    finite_diff = diff[both]
    # Relative to |ref|, but never to less than atol: a reference of 1e-300 would otherwise report
    # an error of 1e+299 for a difference the tolerance calls zero.
    rel = finite_diff / np.maximum(np.abs(ref[both]), max(tol.atol, np.finfo(np.float64).tiny))
    mismatches = int(np.count_nonzero(~within))
    return OutputStats(
        name=name,
        dtype=str(reference.dtype),
        shape=list(reference.shape),
        atol=tol.atol,
        rtol=tol.rtol,
        max_abs_error=float(finite_diff.max()) if finite_diff.size else 0.0,
        max_rel_error=float(rel.max()) if rel.size else 0.0,
        cosine_similarity=_cosine(np.where(both, act, 0.0), np.where(both, ref, 0.0)),
        mismatch_fraction=mismatches / reference.size,
        nonfinite_mismatch=nonfinite_mismatch,
        passed=mismatches == 0 and actual.dtype == reference.dtype,
        problem=("" if actual.dtype == reference.dtype
                 else f"dtype {actual.dtype} differs from reference {reference.dtype}"),
    )


def compare(
    reference: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
) -> CheckResult:
    """Compare every reference output with the actual output of the same name."""
    result = CheckResult()
    for name, ref in reference.items():
        tol = tolerance_for(str(ref.dtype), atol, rtol)
        if name not in actual:
            stats = compare_one(name, ref, np.empty((0,)), tol)
            stats.problem = "output missing"
        else:
            stats = compare_one(name, ref, np.asarray(actual[name]), tol)
        result.outputs.append(stats)
    return result
