"""Shared fixtures: small models built in the tests, and artifacts compiled once per session (helpers: helpers.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers import mlp_onnx

import mlc.api as api


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def mlp_model(models_dir) -> Path:
    return mlp_onnx(models_dir / "mlp.onnx")


@pytest.fixture(scope="session")
def mlp_artifact(mlp_model, tmp_path_factory) -> Path:
    """A compiled MLP artifact shared by tests that only read it (copy it before modifying)."""
    result = api.compile(str(mlp_model), target="x86", output=tmp_path_factory.mktemp("art") / "mlp-x86")
    assert result.check.passed
    return result.path


NODE_TESTS_RUN = Path(__file__).resolve().parent.parent / "benchmarks" / "onnx_node_tests" / "run.py"


@pytest.fixture(scope="module")
def node_tests():
    """benchmarks/onnx_node_tests/run.py as a module: its run_case runs one ONNX node test through ORT and mlc."""
    spec = importlib.util.spec_from_file_location("onnx_node_tests_run", NODE_TESTS_RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
