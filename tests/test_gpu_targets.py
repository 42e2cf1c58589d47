"""GPU targets built here without a GPU: the artifact holds its kernels and runtime pieces, says it
is unverified, and refuses to run where no such device is (exit 4). Running them is for a GPU
machine (marked `gpu`)."""

from __future__ import annotations

import json
import re

import pytest

from helpers import assert_clean_error, run_mlc
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


MACHO_ARM64 = (b"\xcf\xfa\xed\xfe", 0x0100000C)  # 64-bit Mach-O magic, CPU_TYPE_ARM64


def is_macho_arm64(path) -> bool:
    header = path.read_bytes()[:8]
    return header[:4] == MACHO_ARM64[0] and int.from_bytes(header[4:8], "little") == MACHO_ARM64[1]


@pytest.fixture(scope="module")
def metal_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("metal") / "mlp-metal"
    proc = run_mlc("compile", "zoo:mlp", "--target", "metal", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "not verified: no METAL device here" in proc.stderr
    return out


def test_metal_artifact_holds_mac_objects_msl_and_link_step(metal_artifact):
    manifest = json.loads((metal_artifact / "manifest.json").read_text())
    assert manifest["target"]["runtime_os"] == "macos" and manifest["target"]["device"] == "metal"
    assert manifest["library"] == "model.dylib" and manifest["runtime"]["link"] == "link.sh"
    assert manifest["runtime"]["native_runner"] is None
    objects = sorted((metal_artifact / "model").iterdir())
    assert objects and all(is_macho_arm64(o) for o in objects)
    link = (metal_artifact / "link.sh").read_text()
    assert "clang++ -dynamiclib" in link and all(f"model/{o.name}" in link for o in objects)
    for rel in ("runtime/libtvm_runtime.dylib", "runtime/libtvm_ffi.dylib", "runtime/libtvm_runtime_metal.dylib"):
        assert is_macho_arm64(metal_artifact / rel), rel
        assert rel in manifest["files"]
    kernels = manifest["compile"]["kernels"]["metal"]
    assert kernels and sorted(p.stem for p in (metal_artifact / "kernels").glob("*.metal")) == sorted(kernels)
    for kernel in kernels:  # one Metal Shading Language file per kernel
        source = (metal_artifact / "kernels" / f"{kernel}.metal").read_text()
        assert "#include <metal_stdlib>" in source and f"kernel void {kernel}(" in source
        assert kernel.encode() in (metal_artifact / "model/devc.o").read_bytes()


def test_metal_artifact_refuses_to_run_off_a_mac(metal_artifact):
    assert_clean_error(run_mlc("check", metal_artifact), 4, "runs on a METAL device")
