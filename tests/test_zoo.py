"""Every zoo model, in every framework it exists in, compiles for x86 and matches its reference
(the framework's eager outputs; ONNX Runtime for ONNX graphs). Slow: run with `pytest -m slow`."""

from __future__ import annotations

import pytest

import mlc.api as api
from mlc.models import ZOO

CASES = [(name, framework) for name, model in ZOO.items() for framework in model.frameworks]


@pytest.mark.slow
@pytest.mark.parametrize("name, framework", CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_zoo_model_compiles_and_matches_its_reference(name, framework, tmp_path):
    result = api.compile(f"zoo:{name}", target="x86", framework=framework, output=tmp_path / name)
    assert result.check.passed, result.check.to_json()
    if framework != "onnx":
        assert result.check.conversion is not None and result.check.conversion.passed
