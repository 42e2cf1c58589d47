"""GPU targets built here without a GPU: the artifact holds its kernels and runtime pieces, says it
is unverified, and refuses to run where no such device is (exit 4). Running them is for a GPU
machine (marked `gpu`)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import assert_clean_error, run_mlc
from mlc.runtime.runner import device_present


@pytest.fixture(scope="module")
def cuda_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "mlp-cuda-t4"
    proc = run_mlc("compile", "zoo:mlp", "--target", "cuda-t4", "-o", out)
    assert proc.returncode == 0, proc.stderr
    if not device_present("cuda"):
        assert "not verified: no CUDA device here" in proc.stderr
    return out


def test_cuda_artifact_contains_its_kernels_and_runtime(cuda_artifact):
    manifest = json.loads((cuda_artifact / "manifest.json").read_text())
    assert manifest["target"]["tvm"]["kind"] == "cuda" and manifest["target"]["tvm"]["arch"] == "sm_75"
    assert manifest["target"]["device"] == "cuda"
    kernels = manifest["compile"]["kernels"]["cuda"]
    assert kernels and all(re.fullmatch(r"\w+_kernel\w*", k) for k in kernels)
    source = (cuda_artifact / "kernels/cuda.cu").read_text()
    library = (cuda_artifact / "model.so").read_bytes()
    for kernel in kernels:
        assert f" {kernel}(" in source  # the generated CUDA C
        assert kernel.encode() in library  # the compiled module embedded in the library
    assert "runtime/libtvm_runtime_cuda.so" in manifest["runtime"]["device_libraries"]
    assert set(manifest["files"]) >= set(manifest["runtime"]["device_libraries"])


@pytest.mark.skipif(device_present("cuda"), reason="this machine has a GPU")
def test_cuda_artifact_refuses_to_run_without_gpu(cuda_artifact):
    assert_clean_error(run_mlc("check", cuda_artifact), 4, "runs on a CUDA device and none is usable here")


@pytest.mark.gpu
@pytest.mark.skipif(not device_present("cuda"), reason="needs an NVIDIA GPU")
def test_cuda_artifact_passes_check_on_a_gpu(cuda_artifact):
    proc = run_mlc("check", cuda_artifact, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["passed"]
