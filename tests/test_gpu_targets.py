"""GPU targets built here without a GPU: the artifact holds its kernels compiled (a fatbin: a cubin for its
architecture and PTX for later ones), says it is unverified, and refuses to run where no such device is (exit 4).
A stand-in for the NVIDIA driver (tests/data/fake_libcuda.c) checks the runtime's driver and GPU checks and that
TVM's CUDA runtime reads the shipped code. Running on a GPU is for a GPU machine (marked `gpu`: prebuilt artifacts
from $MLC_GPU_ARTIFACTS, see benchmarks/gpu/)."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import assert_clean_error, run_mlc
from mlc.compiler import cuda_binary
from mlc.runtime import runner as thin
from mlc.runtime.runner import device_present

FATBIN_MAGIC, FATBIN_ELF, FATBIN_PTX = 0xBA55ED50, 2, 1


@pytest.fixture(scope="module")
def cuda_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "mlp-cuda-h100"
    proc = run_mlc("compile", "zoo:mlp", "--target", "cuda-h100", "-o", out)
    assert proc.returncode == 0, proc.stderr
    if not device_present("cuda"):
        assert "not verified: no CUDA device here" in proc.stderr
    return out


def test_cuda_artifact_contains_its_kernels_and_runtime(cuda_artifact):
    manifest = json.loads((cuda_artifact / "manifest.json").read_text())
    assert manifest["target"]["tvm"]["kind"] == "cuda" and manifest["target"]["tvm"]["arch"] == "sm_90"
    assert manifest["target"]["device"] == "cuda"
    kernels = manifest["compile"]["kernels"]["cuda"]
    assert kernels and all(re.fullmatch(r"\w+_kernel\w*", k) for k in kernels)
    assert len(set(kernels)) == len(kernels)  # each kernel once (the source declares it, then defines it)
    source = (cuda_artifact / "kernels/cuda.cu").read_text()
    library = (cuda_artifact / "model.so").read_bytes()
    for kernel in kernels:
        assert f" {kernel}(" in source  # the generated CUDA C, kept for reading
        assert kernel.encode() in library  # the compiled module's function table, embedded in the library
    assert "runtime/libtvm_runtime_cuda.so" in manifest["runtime"]["device_libraries"]
    assert set(manifest["files"]) >= set(manifest["runtime"]["device_libraries"])


def library_blob(library: Path) -> bytes:
    """The serialized modules a library holds (its __tvm_ffi__library_bin symbol), read with binutils' readelf."""
    symbols = subprocess.run(["readelf", "-sW", str(library)], capture_output=True, text=True, check=True).stdout
    fields = next(line.split() for line in symbols.splitlines() if line.endswith("__tvm_ffi__library_bin"))
    address, size = int(fields[1], 16), int(fields[2], 0)
    segments = subprocess.run(["readelf", "-lW", str(library)], capture_output=True, text=True, check=True).stdout
    for line in segments.splitlines():
        parts = line.split()
        if parts[:1] == ["LOAD"]:
            offset, start, length = int(parts[1], 16), int(parts[2], 16), int(parts[4], 16)
            if start <= address < start + length:
                return library.read_bytes()[offset + address - start:][:size]
    raise AssertionError("no segment holds the library's modules")


def fatbin_entries(fatbin: bytes) -> list[tuple[int, int]]:
    """(kind, sm number) of each entry of a fatbin (kind 2: a cubin, 1: PTX)."""
    magic, _, header, size = struct.unpack_from("<IHHQ", fatbin, 0)
    assert magic == FATBIN_MAGIC
    entries, at = [], header
    while at < header + size:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", fatbin, at)
        entries.append((kind, struct.unpack_from("<I", fatbin, at + 28)[0]))
        at += entry_header + payload
    return entries


def test_cuda_artifact_ships_a_cubin_for_its_arch_and_ptx(cuda_artifact):
    """No CUDA source to compile where it runs: the library's CUDA module is a fatbin with an sm_90 cubin and
    compute_90 PTX (which the driver JIT-compiles on GPUs after Hopper); the manifest says so."""
    blob = library_blob(cuda_artifact / "model.so")
    modules = [(kind, start, end) for kind, start, end in cuda_binary.serialized_modules(blob) if kind == b"cuda"]
    assert len(modules) == 1
    _, start, end = modules[0]
    value = blob[start + 8:end]
    assert cuda_binary.cuda_format(value) == "fatbin"
    fatbin = value[value.index(struct.pack("<I", FATBIN_MAGIC)):]
    assert sorted(fatbin_entries(fatbin)) == [(FATBIN_PTX, 90), (FATBIN_ELF, 90)]
    assert b"extern \"C\" __global__" not in blob  # no source left
    gpu_code = json.loads((cuda_artifact / "manifest.json").read_text())["runtime"]["gpu_code"]
    assert gpu_code == {"format": "fatbin", "cubin": "sm_90", "ptx": "compute_90", "cuda": "13.0"}


def _matmul_onnx(folder: Path) -> Path:
    """x[batch, 128, 256] @ w[256, 256], seeded."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 128, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 128, 256])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "matmul.onnx")
    return folder / "matmul.onnx"


def test_fp16_matmuls_for_hopper_run_on_tensor_cores(tmp_path):
    """cuda-h100 builds fp16 matmuls on tensor cores (wmma): its arch is sm_90, which TVM's dlight Matmul rule reads
    as 90 (it read "sm_90a" as -1 and gave no tensor cores); NVRTC compiles the wmma kernels (crt/mma.h)."""
    out = tmp_path / "matmul-cuda"
    run_mlc("compile", _matmul_onnx(tmp_path), "--target", "cuda-h100", "--precision", "fp16", "-o", out, check=True)
    assert "wmma::mma_sync" in (out / "kernels/cuda.cu").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "fp16" and manifest["runtime"]["gpu_code"]["cubin"] == "sm_90"


def test_bf16_matmuls_for_ampere_run_on_bf16_tensor_cores(tmp_path):
    """--precision bf16 on sm_80: the matmul reads bf16 operands into bf16 wmma fragments and accumulates in fp32
    (TVM registers no bf16 wmma intrinsics and dlight tensorized fp16 only: mlc.compiler.tvm_patches); NVRTC compiles
    them into the sm_80 cubin. Below sm_80 there are no bf16 tensor cores: one line, exit 1."""
    out = tmp_path / "matmul-bf16"
    proc = run_mlc("compile", _matmul_onnx(tmp_path), "--target", "cuda-a100", "--precision", "bf16", "-o", out,
                   check=True)
    assert "built without" not in proc.stderr
    source = (out / "kernels/cuda.cu").read_text()
    assert "wmma::mma_sync" in source
    fragments = set(re.findall(r"wmma::fragment<nvcuda::wmma::(\w+), 16, 16, 16, (\w+)", source))
    assert fragments == {("matrix_a", "nv_bfloat16"), ("matrix_b", "nv_bfloat16"), ("accumulator", "float")}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "bf16" and manifest["runtime"]["gpu_code"]["cubin"] == "sm_80"
    assert manifest["compile"]["schedules"] == {"tensor_cores": ["matmul_kernel"], "cuda_cores": []}
    assert "CUDA cores" not in proc.stderr
    assert manifest["outputs"][0]["dtype"] == "float32"
    for target in ("cuda-t4", "metal"):
        assert_clean_error(run_mlc("compile", "zoo:mlp", "--target", target, "--precision", "bf16"), 1,
                           "--precision bf16")


def test_a_conv_dlight_cannot_tensorize_stays_fp16_and_is_named(tmp_path):
    """dlight's tensor-core schedule raises (compute-at) on a 3x3 conv with a dynamic batch at fp16: that kernel is
    scheduled without tensor cores and the build stays fp16 (the whole build fell back to fp32, resnet18 among them).
    The compile says so, naming the kernel, and the manifest lists it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((128, 128, 3, 3)).astype(np.float32),
                                     "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 128, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 128, 28, 28])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "conv.onnx")
    out = tmp_path / "conv-cuda"
    proc = run_mlc("compile", tmp_path / "conv.onnx", "--target", "cuda-h100", "--precision", "fp16", "--dynamic",
                   "batch", "-o", out, check=True)
    assert "built without" not in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "fp16"
    (conv,) = manifest["compile"]["schedules"]["cuda_cores"]
    assert "conv2d" in conv and not manifest["compile"]["schedules"]["tensor_cores"]
    assert f"1 of 1 matmul/conv kernels run on CUDA cores, not tensor cores: {conv}" in proc.stderr


def test_cuda_graphs_capture_the_static_kernels_and_keep_the_weights_beside(tmp_path):
    """--cuda-graphs: the library calls TVM's CUDA-graph builtins for the kernels between input and output, the
    weights stay in model.weights (lifted before the capture, not taken into the library); refused off CUDA."""
    graphs, plain = tmp_path / "graphs", tmp_path / "plain"
    for out, flags in ((graphs, ["--cuda-graphs"]), (plain, [])):
        run_mlc("compile", "zoo:mlp", "--target", "cuda-h100", "--input-shape", "x:4x64", *flags, "-o", out,
                check=True)
    library = (graphs / "model.so").read_bytes()
    assert b"vm.builtin.cuda_graph.run_or_capture" in library and b"main_cuda_graph_capture" in library
    assert b"cuda_graph" not in (plain / "model.so").read_bytes()
    assert (graphs / "model.weights").stat().st_size == (plain / "model.weights").stat().st_size > 0
    assert json.loads((graphs / "manifest.json").read_text())["compile"]["recipe"].endswith("--cuda-graphs")
    assert_clean_error(run_mlc("compile", "zoo:mlp", "--cuda-graphs", "-o", tmp_path / "x86"), 1,
                       "--cuda-graphs is for CUDA targets")


def test_cuda_graphs_tvm_fails_on_are_left_out_with_a_note(tmp_path, monkeypatch):
    """The first rung of the fallback ladder: a build that fails with CUDA graphs is built without them, and says so."""
    import mlc.api as api
    from mlc.compiler import worker

    build = worker._build

    def graphs_fail(mod, request, default_schedules, notes, use_db=True, cuda_graphs=False):
        if cuda_graphs:
            raise RuntimeError("Check failed: capture blew up (injected)")
        return build(mod, request, default_schedules, notes, use_db, cuda_graphs)

    monkeypatch.setattr(worker, "_build", graphs_fail)
    out = tmp_path / "mlp"
    result = api.compile("zoo:mlp", target="cuda-h100", input_shapes=["x:4x64"], cuda_graphs=True, output=out,
                         isolate=False)
    assert [n for n in result.notes if "built without CUDA graphs: TVM failed with them" in n and "blew up" in n]
    assert b"cuda_graph" not in (out / "model.so").read_bytes()


@pytest.mark.skipif(device_present("cuda"), reason="this machine has a GPU")
def test_cuda_artifact_refuses_to_run_without_gpu(cuda_artifact):
    assert_clean_error(run_mlc("check", cuda_artifact), 4, "runs on a CUDA device and none is usable here")
    proc = subprocess.run([sys.executable, cuda_artifact / "run.py", "--check"], capture_output=True, text=True)
    assert_clean_error(proc, 4, "runs on a CUDA device and none is usable here")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    """A folder holding a stand-in libcuda.so.1 (tests/data/fake_libcuda.c) for LD_LIBRARY_PATH."""
    folder = tmp_path_factory.mktemp("fake-driver")
    source = Path(__file__).parent / "data" / "fake_libcuda.c"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", folder / "libcuda.so.1", source], check=True)
    return folder


def run_py_on_fake_gpu(artifact: Path, driver: Path, spec: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LD_LIBRARY_PATH": str(driver), "FAKE_CUDA": spec}
    return subprocess.run([sys.executable, artifact / "run.py", *args], capture_output=True, text=True, env=env)


@pytest.mark.skipif(device_present("cuda"), reason="this machine has a real NVIDIA driver")
@pytest.mark.parametrize("spec, args, code, message", [
    ("12040,1,9.0", (), 1, "the NVIDIA driver here supports CUDA 12.4, and this artifact's CUDA runtime is 13.0: "
                           "install NVIDIA driver 580 or newer"),
    ("13000,1,7.5", (), 1, "this GPU (Fake GPU 0 (sm_75), sm_75) cannot load this artifact's code (sm_90 cubin, "
                           "compute_90 PTX"),
    ("13000,1,9.0", ("--device", "cuda:1"), 4, "cuda:1 was asked for, and this machine has 1 GPU(s)"),
    ("13000,2,9.0", ("--device", "gpu:1"), 1, "device 'gpu:1' does not fit this cuda artifact"),
    # past every check, TVM's CUDA runtime reads the library's fatbin module; the stand-in driver then fails the
    # first allocation (through libcudart), which is one line too
    ("13000,1,9.0", (), 1, "the model cannot start on cuda:0: CUDA Runtime Error"),
], ids=["old-driver", "older-gpu", "no-second-gpu", "bad-device", "loads"])
def test_run_py_says_in_one_line_why_a_gpu_cannot_run_the_artifact(cuda_artifact, fake_driver, spec, args, code,
                                                                    message):
    assert_clean_error(run_py_on_fake_gpu(cuda_artifact, fake_driver, spec, *args), code, message)


@pytest.mark.parametrize("cubin, ptx, capability, loads", [
    ("sm_90a", "compute_90", (9, 0), True),
    ("sm_90a", "compute_90", (10, 0), True),  # through the PTX
    ("sm_90a", "compute_90", (8, 9), False),
    ("sm_90a", "compute_90a", (10, 0), False),  # arch-specific PTX: Hopper only
    ("sm_80", "compute_80", (8, 6), True),  # a cubin runs on later minors of its major
    ("sm_80", "compute_80", (9, 0), True),
    ("sm_80", "compute_80", (7, 5), False),
    ("sm_86", None, (9, 0), False),
])
def test_gpu_code_loads_where_its_cubin_or_ptx_fits(cubin, ptx, capability, loads):
    assert thin.gpu_code_loads({"cubin": cubin, "ptx": ptx}, *capability) is loads


@pytest.mark.skipif(device_present("cuda"), reason="this machine has a real NVIDIA driver")
def test_profile_times_calls_on_the_gpu_between_events_on_the_default_stream(fake_driver):
    """`mlc run --profile` on a GPU: each call's device time is the time between CUDA events recorded before and
    after it on the stream TVM launches on (the stand-in's clock moves 0.25 ms a record), for spans that nest (a
    captured CUDA graph runs its kernels inside one call); the events are reused run after run."""
    code = """if True:
        from mlc.runtime.runner import CudaDriver, CudaEvents
        events = CudaEvents(CudaDriver())
        points = [events.record() for _ in range(4)]
        print(points, events.elapsed_ms([(0, 3), (1, 2)]))
        print(events.record(), events.elapsed_ms([]), len(events._events))
        events.close()
    """
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_driver), "FAKE_CUDA": "13000,1,9.0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert proc.stdout.splitlines() == ["[0, 1, 2, 3] [0.75, 0.25]", "0 [] 4"]


def test_profile_rows_sum_each_callee_per_run_slowest_first():
    rows = thin.per_callee(["matmul", "relu", "matmul", "matmul", "relu", "matmul"],
                           [0.003, 0.001, 0.005, 0.003, 0.001, 0.005], runs=2)
    assert [(r["name"], r["calls"], round(r["ms"], 6), round(r["share"], 6)) for r in rows] == \
        [("matmul", 2, 8.0, 0.888889), ("relu", 1, 1.0, 0.111111)]


def test_sync_waits_on_the_default_stream_through_tvms_device_api():
    """The stream is 0 (TVM launches on the default stream), never None: TVM's FFI refuses None for its int
    stream argument, which failed every timed CUDA call. The CPU device takes the same call as a no-op."""
    tvm_ffi = thin.import_without_torch("tvm_ffi")
    import tvm  # noqa: F401 - registers the device API

    thin.sync(tvm_ffi, tvm_ffi.device("cpu", 0))


def test_cuda_compile_without_nvrtc_says_what_to_install(tmp_path, monkeypatch):
    from mlc import api
    from mlc.errors import MissingDependencyError

    monkeypatch.setattr(cuda_binary, "missing", lambda: "libnvrtc (nvidia-cuda-nvrtc) is not installed")
    with pytest.raises(MissingDependencyError, match=r"needs NVRTC and nvFatbin here, and libnvrtc .* is not "
                                                     r"installed; install them: pip install 'mlc\[cuda\]'"):
        api.compile("zoo:mlp", target="cuda-h100", output=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_runner_returns_device_tensors_that_torch_takes_without_a_copy(tmp_path):
    """Runner.run(device_outputs=True): the outputs as tvm_ffi tensors (DLPack), here on the CPU."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "mlp"
    run_mlc("compile", "zoo:mlp", "--target", "x86", "-o", out, check=True)
    runner = thin.Runner(out)
    feeds = thin.load_npz(out / "reference" / "inputs.npz")
    expected = runner.run(feeds)
    tensors = runner.run({k: torch.from_numpy(v) for k, v in feeds.items()}, device_outputs=True)
    for name, tensor in tensors.items():
        assert not isinstance(tensor, np.ndarray)
        np.testing.assert_array_equal(torch.from_dlpack(tensor).numpy(), expected[name])


@pytest.mark.gpu
@pytest.mark.skipif(not os.environ.get("MLC_GPU_ARTIFACTS"), reason="needs prebuilt CUDA artifacts "
                    "($MLC_GPU_ARTIFACTS, see benchmarks/gpu/) and an NVIDIA GPU")
def test_prebuilt_cuda_artifacts_pass_their_check_on_the_gpu():
    """On a GPU machine with only the driver, numpy and apache-tvm-ffi: each artifact checks itself."""
    artifacts = sorted(p.parent for p in Path(os.environ["MLC_GPU_ARTIFACTS"]).glob("*/manifest.json"))
    assert artifacts
    for artifact in artifacts:
        proc = subprocess.run([sys.executable, artifact / "run.py", "--check"], capture_output=True, text=True)
        assert proc.returncode == 0, (artifact.name, proc.stdout, proc.stderr)


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
