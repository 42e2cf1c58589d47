"""Comparison statistics and per-dtype tolerances."""

import numpy as np

from mlc.check import compare, tolerance_for


def test_default_tolerances_by_dtype():
    assert (tolerance_for("float32").atol, tolerance_for("float32").rtol) == (1e-4, 1e-3)
    assert (tolerance_for("float16").atol, tolerance_for("float16").rtol) == (1e-2, 5e-2)
    assert (tolerance_for("int64").atol, tolerance_for("int64").rtol) == (0.0, 0.0)
    assert tolerance_for("float32", atol=0.5).atol == 0.5


def test_identical_outputs_pass_with_exact_statistics():
    ref = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    stats = compare({"y": ref}, {"y": ref.copy()}).outputs[0]
    assert stats.passed and stats.max_abs_error == 0.0 and stats.mismatch_fraction == 0.0
    assert abs(stats.cosine_similarity - 1.0) < 1e-12


def test_small_error_passes_large_error_fails_with_counts():
    ref = np.ones((10,), np.float32)
    act = ref.copy()
    act[:3] += 1e-5  # within atol
    assert compare({"y": ref}, {"y": act}).passed
    act[7] += 0.5
    result = compare({"y": ref}, {"y": act})
    stats = result.outputs[0]
    assert not result and not stats.passed
    assert abs(stats.max_abs_error - 0.5) < 1e-6 and abs(stats.max_rel_error - 0.5) < 1e-6
    assert stats.mismatch_fraction == 0.1


def test_relative_error_ignores_references_below_atol():
    ref = np.array([1e-30, 0.0, 2.0], np.float32)
    stats = compare({"y": ref}, {"y": ref + np.float32(1e-7)}).outputs[0]
    assert stats.passed and stats.max_rel_error < 1.0  # not 1e-7 / 1e-30


def test_integers_are_exact():
    ref = np.arange(6, dtype=np.int64)
    assert compare({"i": ref}, {"i": ref.copy()}).passed
    off = ref.copy()
    off[2] += 1
    assert not compare({"i": ref}, {"i": off}).passed


def test_nan_and_inf_must_agree():
    ref = np.array([1.0, np.nan, np.inf], np.float32)
    assert compare({"y": ref}, {"y": ref.copy()}).passed
    stats = compare({"y": ref}, {"y": np.array([1.0, 2.0, np.inf], np.float32)}).outputs[0]
    assert not stats.passed and stats.nonfinite_mismatch == 1
    stats = compare({"y": ref}, {"y": np.array([1.0, np.nan, -np.inf], np.float32)}).outputs[0]
    assert not stats.passed and stats.nonfinite_mismatch == 1


def test_shape_dtype_and_missing_outputs_fail_with_reason():
    ref = np.zeros((2, 3), np.float32)
    assert "shape" in compare({"y": ref}, {"y": np.zeros((3, 2), np.float32)}).outputs[0].problem
    assert "dtype" in compare({"y": ref}, {"y": np.zeros((2, 3), np.float64)}).outputs[0].problem
    missing = compare({"y": ref}, {})
    assert not missing and missing.outputs[0].problem == "output missing"
    assert not compare({}, {})  # nothing compared is not a pass


def test_cosine_detects_sign_flip():
    ref = np.linspace(-1, 1, 100).astype(np.float32)
    stats = compare({"y": ref}, {"y": -ref}).outputs[0]
    assert stats.cosine_similarity < -0.99 and not stats.passed


def test_default_atol_scales_down_for_small_outputs():
    """Logits of a seeded model can all be below 1e-3: a fixed atol of 1e-4 would pass a 50% error."""
    ref = (np.random.default_rng(0).standard_normal(1000) * 1e-3).astype(np.float32)
    wrong = ref * 1.5
    stats = compare({"y": ref}, {"y": wrong}).outputs[0]
    assert not stats.passed and stats.atol < 1e-6
    assert compare({"y": ref}, {"y": wrong}, atol=1e-2).passed  # an explicit --atol is taken as given
    assert compare({"y": ref}, {"y": ref + 1e-9}).passed


def test_all_nan_reference_fails_because_nothing_was_compared():
    nan = np.full((2, 3), np.nan, dtype=np.float32)
    stats = compare({"y": nan}, {"y": nan.copy()}).outputs[0]
    assert not stats.passed and "every reference value is NaN" in stats.problem
    some_nan = np.array([np.nan, 1.0], dtype=np.float32)
    assert compare({"y": some_nan}, {"y": some_nan.copy()}).passed


def test_default_atol_grows_slowly_for_huge_outputs():
    """Seeded deep nets (paddle resnet101) reach logits of ~1e7, where the framework's own fp32 rounding is ~10 on
    the smallest ones: the default atol grows a tenth as fast as the peak past 10, and not at all below it."""
    ref = np.array([1e7, 5.0, -3.0], np.float32)
    assert compare({"y": ref}, {"y": ref + np.array([0, 12, 0], np.float32)}).passed
    assert not compare({"y": ref}, {"y": ref + np.array([0, 1000, 0], np.float32)}).passed
    assert not compare({"y": ref}, {"y": ref + np.array([0, 12, 0], np.float32)}, atol=1e-4).passed
    small = np.array([10.0, 0.5], np.float32)
    assert not compare({"y": small}, {"y": small + np.array([0, 1e-3], np.float32)}).passed
