"""The artifact runs in a fresh virtual environment holding only numpy and apache-tvm-ffi."""

from __future__ import annotations

import json
import os
import subprocess
import venv

import numpy as np
import pytest

TVM_FFI = "apache-tvm-ffi==0.1.14.post1"
# A fresh venv lists pip (and setuptools on older Pythons) besides what the test installs.
INSTALLER = {"pip", "setuptools", "wheel"}
# What `pip install numpy apache-tvm-ffi` brings: the two and tvm-ffi's one dependency.
THIN = {"numpy", "apache-tvm-ffi", "typing-extensions"}


def thin_env() -> dict[str, str]:
    """The environment without a developer's checkout on the path: what the venv holds is all it can import."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def thin_python(tmp_path_factory):
    env_dir = tmp_path_factory.mktemp("thin-venv")
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "numpy", TVM_FFI], check=True, env=thin_env())
    return python


def test_thin_venv_has_no_compiler(thin_python, tmp_path):
    listed = subprocess.run([thin_python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True, env=thin_env())
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)} - INSTALLER
    assert names == THIN, names
    probe = ("import importlib.util, json; print(json.dumps("
             "{m: importlib.util.find_spec(m) is not None for m in ('tvm', 'mlc', 'onnx', 'tvm_ffi')}))")
    # cwd: `python -c` puts the working directory first on sys.path, and the repo root holds mlc/
    found = json.loads(subprocess.run([thin_python, "-c", probe], capture_output=True, text=True, check=True,
                                      env=thin_env(), cwd=tmp_path).stdout)
    assert found == {"tvm": False, "mlc": False, "onnx": False, "tvm_ffi": True}


def test_run_py_in_thin_venv(thin_python, mlp_artifact, tmp_path):
    proc = subprocess.run([thin_python, mlp_artifact / "run.py", "-o", tmp_path / "out.npz", "--repeat", "3"],
                          capture_output=True, text=True, env=thin_env())
    assert proc.returncode == 0, proc.stderr
    reference = np.load(mlp_artifact / "reference/outputs.npz")["y"]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], reference, rtol=1e-3, atol=1e-4)


def test_runner_api_in_thin_venv(thin_python, mlp_artifact, tmp_path):
    """The bundled Runner, in the thin venv, on the reference inputs: the compiled outputs, and no tvm loaded."""
    script = (
        "import sys, json, numpy as np; sys.path.insert(0, sys.argv[1] + '/runtime');"
        "from mlc_runtime import Runner; r = Runner(sys.argv[1]);"
        "feeds = dict(np.load(sys.argv[1] + '/reference/inputs.npz'));"
        "np.savez(sys.argv[2], **r.run(feeds));"
        "print(json.dumps({'prefix': sys.prefix, 'tvm': 'tvm' in sys.modules, 'mlc': 'mlc' in sys.modules}))"
    )
    out = tmp_path / "runner.npz"
    proc = subprocess.run([thin_python, "-c", script, mlp_artifact, out], capture_output=True, text=True,
                          env=thin_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ran = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ran == {"prefix": str(thin_python.parent.parent), "tvm": False, "mlc": False}
    reference = np.load(mlp_artifact / "reference/outputs.npz")
    outputs = np.load(out)
    assert sorted(outputs.files) == sorted(reference.files)
    for name in reference.files:
        np.testing.assert_allclose(outputs[name], reference[name], rtol=1e-5, atol=1e-6)
