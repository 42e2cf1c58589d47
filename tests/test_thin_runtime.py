"""The artifact runs in a fresh virtual environment holding only numpy and apache-tvm-ffi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv

import numpy as np
import pytest

TVM_FFI = "apache-tvm-ffi==0.1.14.post1"


@pytest.fixture(scope="module")
def thin_python(tmp_path_factory):
    env_dir = tmp_path_factory.mktemp("thin-venv")
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "numpy", TVM_FFI], check=True)
    return python


def test_thin_venv_has_no_compiler(thin_python):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a developer's checkout is not in the venv
    listed = subprocess.run([thin_python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True, env=env)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"numpy", "apache-tvm-ffi"} <= names
    assert not names & {"apache-tvm", "onnx", "onnxruntime", "mlc", "torch"}


def test_run_py_in_thin_venv(thin_python, mlp_artifact, tmp_path):
    proc = subprocess.run([thin_python, mlp_artifact / "run.py", "-o", tmp_path / "out.npz", "--repeat", "3"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    reference = np.load(mlp_artifact / "reference/outputs.npz")["y"]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], reference, rtol=1e-3, atol=1e-4)


def test_runner_api_in_thin_venv(thin_python, mlp_artifact):
    script = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1] + '/runtime');"
        "from mlc_runtime import Runner; r = Runner(sys.argv[1]);"
        "y = r.run({'x': np.ones((5, 16), np.float32)})['y']; print(y.shape);"
        "import tvm_ffi; print('tvm' in sys.modules)"
    )
    proc = subprocess.run([thin_python, "-c", script, mlp_artifact], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["(5,", "4)", "False"]
    assert sys.executable != str(thin_python)
