"""The thin runtime: runs an mlc artifact with nothing but the standard library, numpy and
apache-tvm-ffi. This file is copied into every artifact (as runtime/mlc_runtime.py), so it must
never import mlc, tvm or anything else.

    from mlc_runtime import Runner
    outputs = Runner("artifacts/mlp-x86").run({"x": x})
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

try:  # optional: bf16 inputs and outputs as ml_dtypes.bfloat16 arrays, as ONNX Runtime's users give them
    import ml_dtypes as _ml_dtypes
except ImportError:
    _ml_dtypes = None

# Newest manifest schema this runtime understands; bump together with mlc.artifacts.manifest.
# 2: bucketed artifacts (manifest "buckets": one static library per length, inputs padded).
# 3: weights in a file beside each library (manifest "weights"), passed to `main` after the inputs.
# 4: CUDA code compiled into the library (manifest runtime.gpu_code), checked against the GPU before loading.
# 5: string ops run on the host around the compiled part (manifest "host"; inputs/outputs are then the model's).
SCHEMA_VERSION = 5
MANIFEST = "manifest.json"
# DLDeviceType codes the VM is initialised with.
_DEVICE_TYPES = {"cpu": 1, "cuda": 2, "metal": 8}
# A global function each device runtime registers: present when that runtime is loaded.
_DEVICE_API = {"cpu": "device_api.cpu", "cuda": "device_api.cuda", "metal": "device_api.metal"}
_POOLED_ALLOCATOR = 2
# TVM kernels declare their buffers 64-byte aligned and use aligned vector loads: an unaligned
# numpy buffer handed over zero-copy through DLPack segfaults inside the kernel.
_ALIGNMENT = 64


HOST_ARCH = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
# User-mode emulators (Debian's qemu-user) and the sysroot of the cross toolchain, per architecture.
_EMULATORS = {"aarch64": ("qemu-aarch64", "/usr/aarch64-linux-gnu")}


class ArtifactError(Exception):
    """The artifact cannot be used: missing or tampered files, wrong machine, newer schema."""


class EmulatorMissing(ArtifactError):
    """The artifact is for another architecture and nothing here can emulate it."""


class DeviceMissing(ArtifactError):
    """The artifact runs on a GPU this machine does not have."""


class FeedError(ValueError):
    """The inputs given do not match what the artifact expects."""


class RunnerClosed(ValueError):
    """The runner was closed (close(), or the end of its `with` block): what it loaded is gone."""


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def safe_member(root: Path, rel: str) -> Path:
    """`root/rel`, refusing names that would leave `root` (absolute paths, '..', symlinks out)."""
    if not rel or os.path.isabs(rel) or ".." in Path(rel).parts:
        raise ArtifactError(f"manifest names a file outside the artifact: {rel!r}; refusing to use it")
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ArtifactError(f"file {rel!r} points outside the artifact; refusing to use it")
    return path


def read_manifest(artifact_dir: str | os.PathLike) -> dict[str, Any]:
    root = Path(artifact_dir)
    path = root / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{root} is not an mlc artifact (no {MANIFEST}); pass the directory `mlc compile` wrote")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path} is not valid JSON ({e}); recompile the artifact") from None
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int):
        raise ArtifactError(f"{path} has no schema_version; it was not written by mlc")
    if version > SCHEMA_VERSION:
        raise ArtifactError(
            f"artifact schema version {version} is newer than this runtime understands ({SCHEMA_VERSION}); "
            "upgrade mlc (pip install -U mlc) or use the runtime shipped inside the artifact"
        )
    return manifest


def verify_files(artifact_dir: str | os.PathLike, manifest: Mapping[str, Any]) -> None:
    """Every file listed in the manifest exists and has its recorded sha256."""
    root = Path(artifact_dir)
    for rel, expected in manifest.get("files", {}).items():
        path = safe_member(root, rel)
        if not path.is_file():
            raise ArtifactError(f"artifact file {rel} is missing; the artifact is incomplete, recompile it")
        if sha256_file(path) != expected:
            raise ArtifactError(
                f"artifact file {rel} fails its sha256 check (modified or corrupted); recompile the artifact"
            )


def host_cpu_flags() -> set[str]:
    """CPU feature flags of this machine as /proc/cpuinfo names them (empty where unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def emulator_command(arch: str) -> list[str] | None:
    """How to run `arch` binaries on this machine under emulation, or None if we cannot."""
    if arch == HOST_ARCH or arch not in _EMULATORS:
        return None
    qemu, sysroot = _EMULATORS[arch]
    if shutil.which(qemu) is None or not Path(sysroot).is_dir():
        return None
    return [qemu, "-L", sysroot]


def device_present(device: str) -> bool:
    """Whether a `device` ("cpu", "cuda", "metal") is usable here (for CUDA: a driver and a GPU)."""
    if device == "cpu":
        return True
    if device == "cuda":
        try:
            return CudaDriver().count() > 0
        except DeviceMissing:
            return False
    return device == "metal" and platform.system() == "Darwin"


def parse_device(device: str | None, kind: str) -> int:
    """The index of `device` ("cuda", "cuda:1", "1"; None: 0) for an artifact that runs on `kind`."""
    if device is None:
        return 0
    name, _, index = device.partition(":") if not device.isdigit() else (kind, ":", device)
    if name != kind or (index and not index.isdigit()):
        raise FeedError(f"device {device!r} does not fit this {kind} artifact; give {kind} or {kind}:N (N from 0)")
    return int(index or 0)


class CudaDriver:
    """The NVIDIA driver (libcuda.so.1) through ctypes: which GPUs there are and the CUDA release the driver
    supports, asked before TVM loads an artifact, so that a mismatch is one line instead of a CUDA error mid-run."""

    _COMPUTE_MAJOR, _COMPUTE_MINOR = 75, 76  # CUdevice_attribute

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            raise DeviceMissing("no NVIDIA driver here (libcuda.so.1 is not on the loader's path)") from None
        status = self.lib.cuInit(0)
        if status != 0:
            raise DeviceMissing(f"the NVIDIA driver does not start (cuInit error {status}): no usable GPU here")

    def _ask(self, function: str, *args: Any) -> None:
        status = getattr(self.lib, function)(*args)
        if status != 0:
            raise DeviceMissing(f"the NVIDIA driver failed on {function} (error {status})")

    def version(self) -> int:
        """The newest CUDA release the driver supports, as 1000 * major + 10 * minor (13000: CUDA 13.0)."""
        value = ctypes.c_int()
        self._ask("cuDriverGetVersion", ctypes.byref(value))
        return value.value

    def count(self) -> int:
        value = ctypes.c_int()
        self._ask("cuDeviceGetCount", ctypes.byref(value))
        return value.value

    def describe(self, index: int) -> tuple[str, int, int]:
        """(name, compute capability major, minor) of GPU `index`."""
        device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self._ask("cuDeviceGet", ctypes.byref(device), index)
        self._ask("cuDeviceGetAttribute", ctypes.byref(major), self._COMPUTE_MAJOR, device)
        self._ask("cuDeviceGetAttribute", ctypes.byref(minor), self._COMPUTE_MINOR, device)
        name = ctypes.create_string_buffer(256)
        self._ask("cuDeviceGetName", name, 256, device)
        return name.value.decode(errors="replace"), major.value, minor.value


class CudaEvents:
    """Points recorded on the GPU's default stream (stream 0, where TVM launches kernels) with the driver's events:
    the GPU time between two points is what the work queued between them took on the device, with no host sync in
    between (a sync around each call adds its own latency to every kernel's time)."""

    def __init__(self, driver: CudaDriver) -> None:
        self.driver, self._events, self._recorded = driver, [], 0
        # CUDA 12.8 made cuEventElapsedTime_v2 the header's name; older drivers export only the first
        self._elapsed = "cuEventElapsedTime_v2" if hasattr(driver.lib, "cuEventElapsedTime_v2") else \
            "cuEventElapsedTime"

    def record(self) -> int:
        """Record a point after the work queued so far; its number (from 0 since the last `elapsed_ms`)."""
        if self._recorded == len(self._events):
            event = ctypes.c_void_p()
            self.driver._ask("cuEventCreate", ctypes.byref(event), 0)
            self._events.append(event)
        self.driver._ask("cuEventRecord", self._events[self._recorded], None)
        self._recorded += 1
        return self._recorded - 1

    def elapsed_ms(self, spans: list[tuple[int, int]]) -> list[float]:
        """Once the GPU has reached the last point: the milliseconds between the points of each (start, end) span.
        Numbering starts over after it."""
        if self._recorded:
            self.driver._ask("cuEventSynchronize", self._events[self._recorded - 1])
        ms, times = ctypes.c_float(), []
        for start, end in spans:
            self.driver._ask(self._elapsed, ctypes.byref(ms), self._events[start], self._events[end])
            times.append(ms.value)
        self._recorded = 0
        return times

    def close(self) -> None:
        for event in self._events:
            self.driver.lib.cuEventDestroy_v2(event)
        self._events, self._recorded = [], 0


def _release(version: str) -> int:
    major, _, minor = version.partition(".")
    return 1000 * int(major) + 10 * int(minor or 0)


# The first driver branch of each CUDA major release (its .0): what `gpu_code["cuda"]` needs at least.
_MIN_DRIVER = {12: "525", 13: "580"}


def gpu_code_loads(gpu_code: Mapping[str, str], major: int, minor: int) -> bool:
    """Whether a GPU of compute capability major.minor loads the cubin or JIT-compiles the PTX of `gpu_code`. A
    cubin sm_XY runs on X.Y and later minors of X; PTX compute_XY on X.Y and later; an "a" variant (sm_90a) only on
    exactly its own."""
    def split(arch: str) -> tuple[int, int, bool]:
        number = arch.split("_", 1)[1]
        digits = number.rstrip("abcdefghijklmnopqrstuvwxyz")
        return int(digits[:-1]), int(digits[-1]), digits != number

    def fits(arch: str | None, same_major: bool) -> bool:
        if not arch:
            return False
        want_major, want_minor, specific = split(arch)
        if specific:
            return (major, minor) == (want_major, want_minor)
        if same_major and major != want_major:
            return False
        return (major, minor) >= (want_major, want_minor)

    return fits(gpu_code.get("cubin"), True) or fits(gpu_code.get("ptx"), False)


def check_gpu(manifest: Mapping[str, Any], index: int) -> None:
    """One line for what would keep this CUDA artifact from running on GPU `index`: no such GPU, a driver older
    than the CUDA release the artifact ships, a GPU whose architecture its code does not cover, or an artifact
    with CUDA source (built before GPU code was shipped compiled)."""
    gpu_code = manifest["runtime"].get("gpu_code")
    if not gpu_code:
        raise ArtifactError("this CUDA artifact holds CUDA source, which only TVM's compiler can load; recompile "
                            "it with this mlc, which ships the GPU code compiled")
    driver = CudaDriver()
    count = driver.count()
    if index >= count:
        raise DeviceMissing(f"cuda:{index} was asked for, and this machine has {count} GPU(s) (cuda:0..{count - 1})")
    need, have = _release(gpu_code["cuda"]), driver.version()
    if have < need:
        driver_branch = _MIN_DRIVER.get(need // 1000)
        raise ArtifactError(f"the NVIDIA driver here supports CUDA {have // 1000}.{have % 1000 // 10}, and this "
                            f"artifact's CUDA runtime is {gpu_code['cuda']}: install NVIDIA driver "
                            f"{driver_branch + ' or newer' if driver_branch else 'of that release'}")
    name, major, minor = driver.describe(index)
    if not gpu_code_loads(gpu_code, major, minor):
        raise ArtifactError(f"this GPU ({name}, sm_{major}{minor}) cannot load this artifact's code "
                            f"({gpu_code['cubin']} cubin, {gpu_code['ptx']} PTX for it and later GPUs); recompile "
                            f"with --target cuda on this machine")


def physical_cores(sys_root: Path = Path("/sys")) -> int | None:
    """The cores this process may run on, hyper-threads of one core counted once (they share its vector units),
    and at most the cgroup's CPU quota; None where the OS does not say (not Linux)."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return None
    cores = set()
    for cpu in cpus:
        topology = sys_root / f"devices/system/cpu/cpu{cpu}/topology"
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    count = len(cores)
    try:  # a container's CPU limit (cgroup v2): "max 100000" or "200000 100000" (2 CPUs)
        quota, period = (sys_root / "fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            count = min(count, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(count, 1)


def logical_cpus() -> int | None:
    """The logical CPUs this process may run on (its affinity mask); None where the OS does not say."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def default_threads() -> int | None:
    """The CPU threads an artifact runs with unless told: TVM_NUM_THREADS or OMP_NUM_THREADS where the user set
    one, else one per physical core. TVM's own default is half the machine's logical CPUs on x86 (to skip
    hyper-threads): half the cores where there are none, and the host's count inside a container limited to
    fewer. None: TVM's default (not Linux, or a value that is no count)."""
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            return int(value) if value.isdigit() else None
    return physical_cores()


def set_threads(threads: int | None = None) -> int | None:
    """Start TVM's thread pool with `threads` (default: `default_threads()`); returns the count. TVM reads
    TVM_NUM_THREADS when its pool starts, at the first parallel call in this process: later it has no effect."""
    count = threads if threads is not None else default_threads()
    cpus = logical_cpus()
    if threads is not None and cpus and threads > cpus:
        # TVM's pool spins one thread per count: past the CPUs it only slows down; very many abort the process.
        raise FeedError(f"--threads must be between 1 and the {cpus} logical CPUs this process may use, got {threads}")
    if count is not None:
        os.environ["TVM_NUM_THREADS"] = str(count)
    return count


def _check_machine(manifest: Mapping[str, Any]) -> None:
    target = manifest.get("target", {})
    arch = target.get("runtime_arch")
    if arch and arch != HOST_ARCH:
        raise ArtifactError(f"artifact was compiled for {arch} but this machine is {HOST_ARCH}")
    flags = host_cpu_flags()
    missing = [f for f in target.get("required_cpu_features", []) if flags and f not in flags]
    if missing:
        raise ArtifactError(
            f"this CPU lacks {', '.join(missing)} which the artifact's code uses "
            f"(target {target.get('name')}); recompile with a more portable target"
        )


AMX_FEATURES = ("amx_tile", "amx_int8", "amx_bf16")
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158


def request_amx() -> None:
    """Ask Linux for AMX tile state for this process (arch_prctl ARCH_REQ_XCOMP_PERM; kernel 5.16+): an AMX
    instruction before that is SIGILL. Idempotent; a no-op off x86-64 Linux and on CPUs without AMX (whose code
    has no AMX instruction: `_check_machine` refuses an artifact that needs it)."""
    if platform.system() != "Linux" or HOST_ARCH != "x86_64" or "amx_tile" not in host_cpu_flags():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        raise ArtifactError(f"this artifact's kernels use AMX, and Linux refused this process AMX state "
                            f"({os.strerror(ctypes.get_errno())}; kernel 5.16 or newer is needed); "
                            "recompile for a target without AMX (e.g. --target x86-avx512)")


def _load_tvm_runtime(library: Path, device_libraries: list[Path], device: str) -> None:
    import tvm_ffi

    # A process that imported the full `tvm` package already has a runtime; loading a second
    # copy aborts the process on duplicate global registrations.
    if tvm_ffi.get_global_func("device_api.cpu", allow_missing=True) is None:
        # Where the same runtime is installed with the compiler, load that file instead of the
        # copy, so a later `import tvm` in this process finds it loaded rather than loading twice.
        installed = _installed_tvm_runtime()
        if installed is not None and installed.stat().st_size == library.stat().st_size \
                and sha256_file(installed) == sha256_file(library):
            library = installed
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    if device == "cpu" or tvm_ffi.get_global_func(_DEVICE_API[device], allow_missing=True) is not None:
        return
    for extra in device_libraries:
        try:
            ctypes.CDLL(str(extra), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise DeviceMissing(f"cannot load the {device} runtime ({e}); this artifact needs a {device.upper()} "
                                "device and its driver") from None


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _nonzero(x):
    return np.stack(np.atleast_1d(np.from_dlpack(x)).nonzero(), axis=0)


def _unique(x, is_sorted, return_index, return_inverse, return_counts, axis=None):
    """ONNX Unique's outputs (values, then the requested indices, inverse indices and counts), in first-occurrence
    order unless sorted, as ONNX defines them (inverse indices flat, whatever the input's rank)."""
    data = np.from_dlpack(x)
    values, first, inverse, counts = np.unique(data, return_index=True, return_inverse=True, return_counts=True,
                                               axis=axis)
    inverse = inverse.reshape(-1)
    if not is_sorted:  # reorder by first occurrence
        order = np.argsort(first, kind="stable")
        values, first, counts = np.take(values, order, axis=axis if axis is not None else 0), first[order], \
            counts[order]
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        inverse = rank[inverse]
    wanted = [values] + [a for a, flag in ((first, return_index), (inverse, return_inverse),
                                          (counts, return_counts)) if flag]
    return wanted[0] if len(wanted) == 1 else tuple(wanted)


# Packed functions that TVM's compiler package registers in Python (numpy) for ops whose output shape depends on
# the values; compiled models call them by name, and artifacts do not ship TVM's compiler.
HOST_FUNCTIONS = {"relax.run.nonzero": _nonzero, "relax.run.unique": _unique}


def register_host_functions(tvm_ffi, names=tuple(HOST_FUNCTIONS)) -> None:
    """Register HOST_FUNCTIONS[name] for `names`, over TVM's own where it registered them (TVM's unique returns
    numpy 2's N-D inverse indices where ONNX wants them flat). TVM registers its own when the `tvm` package is
    imported and fails if the name is taken, so a process that has tvm installed imports it first."""
    def wrap(function):
        def call(*args):
            result = function(*args)
            results = result if isinstance(result, tuple) else (result,)
            tensors = tuple(tvm_ffi.from_dlpack(aligned(np.ascontiguousarray(r))) for r in results)
            return tensors if isinstance(result, tuple) else tensors[0]
        return call

    for name in names:
        tvm_ffi.register_global_func(name, wrap(HOST_FUNCTIONS[name]), override=True)


def _installed_tvm_runtime() -> Path | None:
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libtvm_runtime.so"
    return path if path.is_file() else None


def _bind_dims(spec: Mapping[str, Any], array: np.ndarray, dims: dict[str, int]) -> None:
    name, shape = spec["name"], spec["shape"]
    if array.ndim != len(shape):
        raise FeedError(f"input '{name}' expects rank {len(shape)} {_fmt_shape(shape)}, got shape {array.shape}")
    for axis, (want, got) in enumerate(zip(shape, array.shape)):
        if isinstance(want, int):
            if want != got:
                raise FeedError(f"input '{name}' expects shape {_fmt_shape(shape)}, got {array.shape} (axis {axis})")
        else:
            bound = dims.setdefault(want, got)
            if bound != got:
                raise FeedError(f"dimension '{want}' is {bound} in one input but {got} in '{name}'")


def spec_dtype(name: str) -> np.dtype:
    """numpy's dtype for a manifest dtype; bfloat16 is ml_dtypes' (raw 2-byte values without it)."""
    if name == "bfloat16":
        return np.dtype(_ml_dtypes.bfloat16) if _ml_dtypes is not None else np.dtype("V2")
    return np.dtype(name)


def as_bfloat16(array: np.ndarray) -> np.ndarray:
    """A 2-byte void array (what np.save writes for ml_dtypes.bfloat16) as bf16 again; others unchanged."""
    if array.dtype.kind == "V" and array.dtype.itemsize == 2 and array.dtype.names is None:
        return array.view(spec_dtype("bfloat16"))
    return array


def host_tensor(tvm_ffi: Any, array: np.ndarray) -> Any:
    """An ffi Tensor on the CPU sharing `array`'s memory; numpy's DLPack has no bf16: export the bits, view them."""
    if array.dtype.itemsize != 2 or array.dtype.kind != "V":
        return tvm_ffi.from_dlpack(array)
    bits = tvm_ffi.from_dlpack(array.view(np.uint16))
    return tvm_ffi.get_global_func("runtime.TVMTensorCreateView")(bits, tvm_ffi.Shape(list(array.shape)),
                                                                   "bfloat16", 0)


def host_array(tvm_ffi: Any, tensor: Any) -> np.ndarray:
    """A numpy copy of a CPU ffi Tensor; bf16 through its bits (ml_dtypes.bfloat16, or raw 2-byte values)."""
    if str(tensor.dtype) != "bfloat16":
        return np.from_dlpack(tensor).copy()
    bits = tvm_ffi.get_global_func("runtime.TVMTensorCreateView")(tensor, tvm_ffi.Shape(list(tensor.shape)),
                                                                   "uint16", 0)
    return np.from_dlpack(bits).copy().view(spec_dtype("bfloat16"))


def aligned(array: np.ndarray) -> np.ndarray:
    """`array` itself when C-contiguous, writeable (DLPack cannot export a read-only one) and 64-byte aligned,
    else an aligned copy."""
    if array.size == 0:  # numpy gives empty arrays zero strides; TVM checks for the compact ones
        strides = [int(np.prod(array.shape[i + 1:])) * array.itemsize for i in range(array.ndim)]
        return np.lib.stride_tricks.as_strided(np.empty(1, array.dtype), array.shape, strides)
    if array.flags.c_contiguous and array.flags.writeable and array.ctypes.data % _ALIGNMENT == 0:
        return array
    raw = np.empty(array.nbytes + _ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def _fmt_shape(shape: list[Any]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _flatten(value: Any) -> list[Any]:
    if hasattr(value, "__dlpack__"):
        return [value]
    out: list[Any] = []
    for item in value:  # tuple outputs come back as an ffi Array
        out.extend(_flatten(item))
    return out


def latency_stats(seconds: list[float], batch: int = 1) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    mean = float(ms.mean())
    return {
        "runs": len(ms),
        "mean_ms": mean,
        "std_ms": float(ms.std()),
        "min_ms": float(ms.min()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "throughput_per_s": 1e3 / mean if mean > 0 else math.inf,
        "samples_per_s": batch * 1e3 / mean if mean > 0 else math.inf,
    }


def copy_tensor(tensor: Any, device: Any) -> Any:
    """A copy of an ffi Tensor on `device` (TVM runtime functions; works between any devices)."""
    import tvm_ffi

    out = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")(
        tvm_ffi.Shape(list(tensor.shape)), tensor.dtype, device, None)
    tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")(tensor, out)
    return out


def validate_feeds(specs: list[dict[str, Any]], feeds: Mapping[str, np.ndarray],
                   ranges: Mapping[str, Any] | None = None, frozen: Mapping[str, Any] | None = None
                   ) -> tuple[list[np.ndarray], list[str]]:
    """Check feeds against the manifest's input specs and the ranges of its symbolic dims;
    returns the arrays in call order (C-order, 64-byte aligned) and warnings. `frozen`: the manifest's --freeze
    record; a feed of a frozen input is refused (the artifact computes with the frozen value only)."""
    expected = [spec["name"] for spec in specs]
    for name, record in (frozen or {}).items():
        if name in feeds:
            value = record.get("value", f"sha256 {str(record.get('sha256'))[:12]}")
            raise FeedError(f"input '{name}' was frozen at compile time (--freeze) to {value}; this artifact computes "
                            f"with that value only: leave '{name}' out of the feeds, or compile without --freeze")
    unknown = [k for k in feeds if k not in expected]
    missing = [k for k in expected if k not in feeds]
    if unknown or missing:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if unknown:
            parts.append(f"unexpected {', '.join(unknown)}")
        raise FeedError(f"input names do not match ({'; '.join(parts)}); the model takes: {', '.join(expected)}")
    arrays, warnings, dims = [], [], {}
    for spec in specs:
        array = np.asarray(feeds[spec["name"]])
        if spec["dtype"] == "bfloat16":
            array = as_bfloat16(array)
        if spec["dtype"] == STRING:  # run by the host's ops, not handed to compiled code
            if array.dtype.kind not in "UOS":
                raise FeedError(f"input '{spec['name']}' expects strings, got {array.dtype}")
            arrays.append(_host_ops().as_strings(array))
            _bind_dims(spec, array, dims)
            continue
        if array.dtype != spec_dtype(spec["dtype"]):
            raise FeedError(f"input '{spec['name']}' expects dtype {spec['dtype']}, got {array.dtype}")
        _bind_dims(spec, array, dims)
        if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
            warnings.append(f"input '{spec['name']}' contains NaN or Inf")
        bounds = spec.get("value_range")
        if bounds is not None and array.size:
            lo, hi = bounds
            if array.min() < lo or array.max() > hi:
                raise FeedError(
                    f"input '{spec['name']}' has values in [{array.min()}, {array.max()}] but the model "
                    f"indexes a table with it and accepts only [{lo}, {hi}]"
                )
        arrays.append(aligned(array))
    check_ranges(dims, ranges)
    return arrays, warnings


def check_ranges(dims: Mapping[str, int], ranges: Mapping[str, Any] | None) -> None:
    """Each symbolic dim's size (bound from the inputs) within the range the artifact was compiled for, and a dim
    compiled as an expression of another (a KV cache's total as "past+1", from the user's --inputs) equal to it."""
    for dim, size in dims.items():
        base, sign, offset = dim.partition("+") if "+" in dim else dim.partition("-")
        if offset.isdigit() and base in dims and size != dims[base] + int(sign + offset):
            raise FeedError(f"dimension '{dim}' must be {base}{sign}{offset}: the inputs give {base}={dims[base]} "
                            f"but {size} for it")
    for dim, (lo, hi) in (ranges or {}).items():
        if dim in dims and not lo <= dims[dim] <= hi:
            raise FeedError(f"dimension '{dim}' is {dims[dim]}, outside the compiled range {lo}..{hi}; "
                            f"recompile with --dynamic {dim}={min(lo, dims[dim])}..{max(hi, dims[dim])}")


def pad_to_bucket(buckets: Mapping[str, Any], specs: list[dict[str, Any]], arrays: list[np.ndarray]
                  ) -> tuple[list[np.ndarray], int, int]:
    """Pad (with 0: token ids, type ids, and the attention mask, so padding is masked out) every
    input axis carrying the bucketed dim up to the smallest bucket that fits. Returns the padded
    arrays, the real length and the bucket."""
    dim, sizes = buckets["dim"], sorted(buckets["sizes"])
    axes = [[axis for axis, d in enumerate(spec["shape"]) if d == dim] for spec in specs]
    length = next(a.shape[ax[0]] for a, ax in zip(arrays, axes) if ax)
    bucket = next((b for b in sizes if b >= length), None)
    if bucket is None:
        raise FeedError(f"'{dim}' is {length} but the largest bucket is {sizes[-1]}; truncate the input to "
                        f"{sizes[-1]} or recompile with a larger bucket (--buckets ...,{length})")
    padded = []
    for array, ax in zip(arrays, axes):
        if ax and bucket != length:
            width = [(0, bucket - length) if i in ax else (0, 0) for i in range(array.ndim)]
            array = aligned(np.pad(array, width))
        padded.append(array)
    return padded, length, bucket


def slice_outputs(dim: str, specs: list[dict[str, Any]], outputs: dict[str, np.ndarray], length: int
                  ) -> dict[str, np.ndarray]:
    """Cut the padding off every output axis that carries the bucketed dim."""
    sliced = {}
    for spec in specs:
        value = outputs[spec["name"]]
        index = tuple(slice(0, length) if d == dim else slice(None) for d in spec["shape"])
        sliced[spec["name"]] = np.ascontiguousarray(value[index])
    return sliced


def per_callee(calls: list[str], seconds: list[float], runs: int) -> list[dict[str, Any]]:
    """Rows of a profile: each callee's calls per run, milliseconds per run and share of the total, slowest first."""
    totals: dict[str, list[float]] = {}
    for name, spent in zip(calls, seconds, strict=True):
        entry = totals.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += spent
    whole = sum(spent for _, spent in totals.values()) or 1.0
    rows = [{"name": name, "calls": count // runs, "ms": spent * 1e3 / runs, "share": spent / whole}
            for name, (count, spent) in totals.items()]
    return sorted(rows, key=lambda row: -row["ms"])


def sync(tvm_ffi: Any, device: Any) -> None:
    """Wait for the work queued on `device` on its default stream (0: where TVM launches kernels; the CPU's is a
    no-op)."""
    tvm_ffi.get_global_func("runtime.Device_StreamSync")(device, 0)


def _on_device(value: Any) -> bool:
    """Whether `value` is a DLPack tensor on a GPU (torch.cuda, cupy), not host memory."""
    if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack_device__"):
        return False
    return int(value.__dlpack_device__()[0]) not in (1, 3)  # kDLCPU, kDLCUDAHost


class _Shaped:
    """The shape of a device tensor, as _bind_dims reads an array's."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape, self.ndim = shape, len(shape)


class _ArtifactRunner:
    """What both runners share: the manifest (read and verified), the input/output specs, input
    validation, and `measure`, which validates once and returns outputs and latency together."""

    def __init__(self, artifact_dir: str | os.PathLike, verify: bool, threads: int | None = None):
        self.closed = False
        self.root = Path(artifact_dir)
        self.threads = set_threads(threads)
        self.manifest = read_manifest(self.root)
        if verify:
            verify_files(self.root, self.manifest)
        self.device_kind = self.manifest["target"].get("device", "cpu")
        if not device_present(self.device_kind):
            raise DeviceMissing(f"this artifact runs on a {self.device_kind.upper()} device and none is usable here "
                                f"(target {self.manifest['target'].get('name')})")
        self.inputs: list[dict[str, Any]] = self.manifest["inputs"]  # the model's: what a user feeds
        self.outputs: list[dict[str, Any]] = self.manifest["outputs"]
        # String ops run on the host (mlc.runtime.host_ops) before and after the compiled part, which then takes and
        # gives core_inputs and core_outputs.
        self.host: dict[str, Any] | None = self.manifest.get("host")
        self.core_inputs = self.host["core_inputs"] if self.host else self.inputs
        self.core_outputs = self.host["core_outputs"] if self.host else self.outputs
        self.buckets: dict[str, Any] | None = self.manifest.get("buckets")
        self.last_bucket: tuple[int, int] | None = None  # (length, bucket) of the last bucketed run

    def close(self) -> None:
        """Release what the runner loaded (the compiled model, its VM, weights and device memory); a second call
        does nothing, and running afterwards raises RunnerClosed."""
        if not self.closed:
            self.closed = True
            self._release()

    def _release(self) -> None:
        """What close() frees; the runner subclass holds it."""

    def __enter__(self):
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise RunnerClosed(f"this runner of {self.root} is closed; open the artifact again to run it")

    def prepare(self, feeds: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], list[str]]:
        return validate_feeds(self.inputs, feeds, self.manifest.get("dynamic_ranges"), self.manifest.get("frozen"))

    def _measure(self, arrays: list[np.ndarray], warmup: int, repeat: int, bucket: int | None = None
                 ) -> tuple[dict[str, np.ndarray], list[float]]:
        raise NotImplementedError

    def measure(self, feeds: Mapping[str, np.ndarray], warmup: int = 3, repeat: int = 50
                ) -> tuple[dict[str, np.ndarray], dict[str, Any] | None, list[str]]:
        """Outputs, latency statistics (None when repeat is 0) and input warnings, in one pass.
        Bucketed artifacts: inputs are padded to the smallest bucket that fits, outputs sliced back."""
        self._check_open()
        arrays, warnings = self.prepare(feeds)
        if self.host:
            outputs, times = self._measure_with_host(arrays, warmup, repeat)
            return outputs, latency_stats(times) if times else None, warnings
        bucket = None
        if self.buckets:
            arrays, length, bucket = pad_to_bucket(self.buckets, self.inputs, arrays)
            self.last_bucket = (length, bucket)
        outputs, times = self._measure(arrays, warmup, repeat, bucket)
        if bucket is not None:
            outputs = slice_outputs(self.buckets["dim"], self.outputs, outputs, length)
        batch = int(arrays[0].shape[0]) if arrays and arrays[0].ndim else 1
        return outputs, latency_stats(times, batch) if times else None, warnings

    def core_arrays(self, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """The compiled part's inputs for the model's (validated) `arrays`, the host's ops before it run first; and
        every value computed so far, by name."""
        values = {spec["name"]: array for spec, array in zip(self.inputs, arrays)}
        if not self.host:
            return arrays, values
        _host_ops().run(self.host, "before", values)
        try:
            core = validate_feeds(self.core_inputs, {spec["name"]: values[spec["name"]] for spec in self.core_inputs},
                                  self.manifest.get("dynamic_ranges"))[0]
        except FeedError as e:
            raise FeedError(f"after the model's string ops, the compiled part's {e}") from None
        return core, values

    def _measure_with_host(self, arrays: list[np.ndarray], warmup: int, repeat: int
                           ) -> tuple[dict[str, np.ndarray], list[float]]:
        """The whole model timed call by call: the host's string ops, the compiled part, the copies between."""
        def call() -> dict[str, np.ndarray]:
            core, values = self.core_arrays(arrays)
            values.update(self._measure(core, 0, 0)[0])
            _host_ops().run(self.host, "after", values)
            return {spec["name"]: values[spec["name"]] for spec in self.outputs}

        outputs = call()
        for _ in range(warmup):
            call()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return outputs, times

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.measure(feeds, 0, 0)[0]

    def benchmark(self, feeds: Mapping[str, np.ndarray], warmup: int = 3, repeat: int = 50) -> dict[str, Any] | None:
        return self.measure(feeds, warmup, repeat)[1]


def import_without_torch(module: str) -> Any:
    """Import `module` (tvm_ffi, or tvm) with torch hidden where torch is not imported yet: tvm_ffi imports torch
    first whenever it is installed (against a symbol clash seen on Windows only), which took 3-4 s and 190 MB
    in every process that ran an artifact. torch imports as usual afterwards."""
    import sys

    if "torch" in sys.modules or sys.platform == "win32":
        return importlib.import_module(module)
    sys.modules["torch"] = None  # makes `import torch` raise ImportError, which tvm_ffi expects without torch
    try:
        return importlib.import_module(module)
    finally:
        if sys.modules.get("torch", False) is None:
            del sys.modules["torch"]


class Runner(_ArtifactRunner):
    """Loads an artifact's compiled model once, in this process, and runs it on numpy inputs, or on DLPack tensors
    (torch) that stay on the GPU. `device`: which GPU ("cuda:1"; default the first)."""

    def __init__(self, artifact_dir: str | os.PathLike, verify: bool = True, threads: int | None = None,
                 device: str | None = None):
        super().__init__(artifact_dir, verify, threads)
        _check_machine(self.manifest)
        if any(f in AMX_FEATURES for f in self.manifest["target"].get("required_cpu_features", [])):
            request_amx()
        kind = self.device_kind
        if kind not in _DEVICE_TYPES:
            raise ArtifactError(f"device '{kind}' is not supported by this runtime "
                                f"(supported: {', '.join(_DEVICE_TYPES)})")
        index = parse_device(device, kind)
        if kind == "cuda":
            check_gpu(self.manifest, index)
        tvm_ffi = import_without_torch("tvm_ffi")
        self._tvm_ffi = tvm_ffi
        runtime = self.manifest["runtime"]
        host_functions = runtime.get("host_functions") or []
        if host_functions and importlib.util.find_spec("tvm") is not None:
            import tvm  # noqa: F401 - registers TVM's relax.run.* now, not later over ours (which would fail)
        _load_tvm_runtime(safe_member(self.root, runtime["library"]),
                          [safe_member(self.root, rel) for rel in runtime.get("device_libraries", [])], kind)
        register_host_functions(tvm_ffi, host_functions)
        libraries = {None: self.manifest["library"]}
        if self.buckets:  # one static library per bucket
            libraries = {int(size): rel for size, rel in self.buckets["libraries"].items()}
        self.device = tvm_ffi.device(kind, index)
        self._mapped: dict[str, np.memmap] = {}
        try:
            self._vms = {bucket: self._load_vm(rel, runtime, _DEVICE_TYPES[kind], index)
                         for bucket, rel in libraries.items()}
            self._mains = {bucket: self._main(self._vms[bucket], self._load_weights(rel))
                           for bucket, rel in libraries.items()}
        except RuntimeError as e:  # TVM's device runtime (a CUDA error): its own line says what
            if kind == "cpu":
                raise
            raise ArtifactError(f"the model cannot start on {self.device}: {_first_line(e)}") from None

    def _load_vm(self, rel: str, runtime: Mapping[str, Any], code: int, index: int) -> Any:
        library_path = safe_member(self.root, rel)
        if not library_path.is_file() and runtime.get("link"):
            raise ArtifactError(f"{library_path.name} is not linked yet: run ./{runtime['link']} in the artifact once")
        vm = self._tvm_ffi.load_module(str(library_path))["vm_load_executable"]()
        # (device type, id, allocator) for the compute device, then the same for the host.
        vm["vm_initialization"](code, index, _POOLED_ALLOCATOR, 1, 0, _POOLED_ALLOCATOR)
        return vm

    def _load_weights(self, library: str) -> list[Any]:
        """The weights `library`'s main takes after the inputs: views of the mapped file on CPU (copy-on-write, so
        DLPack can export them; the kernels never write them), copied once to a GPU."""
        info = self.manifest.get("weights", {}).get(library)
        if not info:
            return []
        if info["file"] not in self._mapped:  # buckets share one file
            self._mapped[info["file"]] = np.memmap(safe_member(self.root, info["file"]), dtype=np.uint8, mode="c")
        data = self._mapped[info["file"]]
        view = self._tvm_ffi.get_global_func("runtime.TVMTensorCreateView")
        tensors = []
        for spec in info["tensors"]:
            start = spec["offset"]
            if start % _ALIGNMENT or start + spec["nbytes"] > data.size:
                raise ArtifactError(f"{info['file']} does not hold the weights the manifest lists (truncated or "
                                    "replaced); recompile the artifact")
            raw = self._tvm_ffi.from_dlpack(data[start:start + spec["nbytes"]])
            tensor = view(raw, self._tvm_ffi.Shape(spec["shape"]), spec["dtype"], 0)
            tensors.append(tensor if self.device.dlpack_device_type() == 1 else copy_tensor(tensor, self.device))
        return tensors

    @staticmethod
    def _main(vm: Any, weights: list[Any]) -> Any:
        main = vm["main"]
        if not weights:
            return main
        return lambda *inputs: main(*inputs, *weights)

    def profile(self, feeds: Mapping[str, np.ndarray], runs: int = 3) -> list[dict[str, Any]]:
        """Where the time goes: every call the model makes (kernels, the VM's allocations), timed
        one by one over `runs` runs after a warm-up, summed per callee, slowest first. On a GPU each
        call's time is the device's, between CUDA events recorded before and after it on the stream."""
        self._check_open()
        arrays = self.core_arrays(self.prepare(feeds)[0])[0]
        bucket = None
        if self.buckets:
            arrays, _, bucket = pad_to_bucket(self.buckets, self.inputs, arrays)
        vm, main = self._vms[bucket], self._mains[bucket]
        tensors = [self._to_device(a) for a in arrays]
        main(*tensors)
        events = CudaEvents(CudaDriver()) if self.device_kind == "cuda" else None
        clock: list[float] = []  # elsewhere: perf_counter at each point, the device synchronised first (Metal)

        def point() -> int:
            if events:
                return events.record()
            self._sync()
            clock.append(time.perf_counter())
            return len(clock) - 1

        open_calls: list[tuple[str, int]] = []  # a call can run others (a captured CUDA graph's): a stack
        spans: list[tuple[str, int, int]] = []  # callee, its first point, its last point

        def instrument(_func, symbol, before, _result, *_args) -> int:
            if before:
                open_calls.append((str(symbol), point()))
            else:
                name, start = open_calls.pop()
                spans.append((name, start, point()))
            return 0  # VMInstrumentReturnKind.NoOp: run the call

        calls: list[str] = []
        seconds: list[float] = []
        vm["set_instrument"](instrument)
        try:
            for _ in range(runs):
                main(*tensors)
                pairs = [(start, end) for _, start, end in spans]
                seconds += [ms / 1e3 for ms in events.elapsed_ms(pairs)] if events else \
                    [clock[end] - clock[start] for start, end in pairs]
                calls += [name for name, _, _ in spans]
                spans.clear()
                clock.clear()
        finally:
            vm["set_instrument"](None)  # a no-op Python callback cost ~3 us per VM call from then on
            if events:
                events.close()
        return per_callee(calls, seconds, runs)

    def _release(self) -> None:
        # The entry points hold the weights (on the GPU: copies there), the VMs the loaded libraries and their
        # memory pools, the maps the weight files: dropped, TVM and numpy free them.
        self._mains, self._vms, self._mapped = {}, {}, {}

    def _to_device(self, array: np.ndarray) -> Any:
        host = host_tensor(self._tvm_ffi, array)
        return host if self.device.dlpack_device_type() == 1 else copy_tensor(host, self.device)

    def _to_host(self, tensor: Any) -> np.ndarray:
        if self.device.dlpack_device_type() != 1:
            tensor = copy_tensor(tensor, self._tvm_ffi.device("cpu", 0))
        # Copy: the VM's pooled allocator may reuse these buffers on the next call.
        return host_array(self._tvm_ffi, tensor)

    def _sync(self) -> None:
        if self.device.dlpack_device_type() != 1:
            sync(self._tvm_ffi, self.device)

    def run(self, feeds: Mapping[str, Any], device_outputs: bool = False) -> dict[str, Any]:
        """The outputs for `feeds`: numpy arrays, or DLPack tensors (torch, cupy); tensors on the artifact's device
        are used where they are, with no copy. `device_outputs`: return tvm_ffi tensors left on the device
        (torch.from_dlpack takes them without a copy) instead of numpy arrays."""
        self._check_open()
        if not device_outputs and not any(_on_device(value) for value in feeds.values()):
            return super().run(feeds)
        if self.buckets or self.host:
            what = "a bucketed artifact pads its inputs" if self.buckets else "this model runs string ops"
            raise FeedError(f"{what} on the host: give numpy arrays")
        tensors = self._device_feeds(feeds)
        results = _flatten(self._mains[None](*tensors))
        if device_outputs:
            return {spec["name"]: tensor for spec, tensor in zip(self.core_outputs, results)}
        return {spec["name"]: self._to_host(tensor) for spec, tensor in zip(self.core_outputs, results)}

    def _device_feeds(self, feeds: Mapping[str, Any]) -> list[Any]:
        """The feeds as tensors on the artifact's device: those there already as they are, the others checked by
        validate_feeds and copied; names, dtypes, shapes and dynamic ranges checked across both."""
        on_device = {k: self._tvm_ffi.from_dlpack(v) for k, v in feeds.items() if _on_device(v)}
        host_specs = [spec for spec in self.inputs if spec["name"] not in on_device]
        unknown = [k for k in on_device if k not in {spec["name"] for spec in self.inputs}]
        if unknown:
            raise FeedError(f"input names do not match (unexpected {', '.join(unknown)}); the model takes: "
                            f"{', '.join(spec['name'] for spec in self.inputs)}")
        arrays, _ = validate_feeds(host_specs, {k: v for k, v in feeds.items() if k not in on_device},
                                   frozen=self.manifest.get("frozen"))
        dims: dict[str, int] = {}
        for spec in self.inputs:
            tensor = on_device.get(spec["name"])
            if tensor is not None:
                if tensor.device.dlpack_device_type() != self.device.dlpack_device_type() \
                        or tensor.device.index != self.device.index:
                    raise FeedError(f"input '{spec['name']}' is on {tensor.device}; this artifact runs on "
                                    f"{self.device}")
                if str(tensor.dtype) != spec["dtype"]:
                    raise FeedError(f"input '{spec['name']}' expects dtype {spec['dtype']}, got {tensor.dtype}")
            _bind_dims(spec, _Shaped(tuple(tensor.shape)) if tensor is not None
                       else arrays[host_specs.index(spec)], dims)
        check_ranges(dims, self.manifest.get("dynamic_ranges"))
        host = iter(arrays)
        return [on_device[spec["name"]] if spec["name"] in on_device else self._to_device(next(host))
                for spec in self.inputs]

    def _measure(self, arrays: list[np.ndarray], warmup: int, repeat: int, bucket: int | None = None
                 ) -> tuple[dict[str, np.ndarray], list[float]]:
        main = self._mains[bucket]

        def call(tensors: list[Any]) -> list[Any]:
            return _flatten(main(*tensors))

        tensors = [self._to_device(a) for a in arrays]  # transfers are not timed
        outputs = {spec["name"]: self._to_host(r) for spec, r in zip(self.core_outputs, call(tensors))}
        for _ in range(warmup):
            call(tensors)
        self._sync()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            call(tensors)
            self._sync()
            times.append(time.perf_counter() - start)
        return outputs, times


class NativeRunner(_ArtifactRunner):
    """Runs an artifact through its native runner (runtime/mlc_runner, no Python on the device
    side), under user-mode emulation when it was built for another architecture. Same interface
    as Runner; latency measured under emulation is not a measurement of the device."""

    def __init__(self, artifact_dir: str | os.PathLike, verify: bool = True, threads: int | None = None):
        super().__init__(artifact_dir, verify, threads)
        runtime = self.manifest["runtime"]
        if self.device_kind != "cpu":
            raise ArtifactError("the native runner runs CPU artifacts only; use run.py (Python) for GPU artifacts")
        if not runtime.get("native_runner"):
            raise ArtifactError("this artifact has no native runner; recompile it with a newer mlc")
        if runtime.get("host_functions"):
            raise ArtifactError(f"this artifact calls {', '.join(runtime['host_functions'])}, which the Python runtime "
                                "provides and the native runner does not: run it with run.py (Python)")
        self.runner = safe_member(self.root, runtime["native_runner"])
        arch = self.manifest["target"]["runtime_arch"]
        self.prefix = emulator_command(arch) or []
        if arch != HOST_ARCH and not self.prefix:
            qemu = _EMULATORS.get(arch, ("an emulator",))[0]
            raise EmulatorMissing(f"artifact is for {arch}; to run it on this {HOST_ARCH} machine install {qemu} "
                                "(apt-get install qemu-user) and the cross toolchain's sysroot, "
                                "or run it on the device")
        self.emulated = bool(self.prefix)
        if self.buckets:
            raise ArtifactError("the native runner runs one static library and this artifact has one per bucket; "
                                "run it with run.py (Python) on the device, or compile without --buckets")

    def _measure(self, arrays: list[np.ndarray], warmup: int, repeat: int, bucket: int | None = None
                 ) -> tuple[dict[str, np.ndarray], list[float]]:
        """One process: the first call's outputs, then warmup + repeat timed calls."""
        with tempfile.TemporaryDirectory(prefix="mlc-native-") as tmp:
            inputs, outputs = Path(tmp) / "in", Path(tmp) / "out"
            inputs.mkdir()
            outputs.mkdir()
            for i, array in enumerate(arrays):
                np.save(inputs / f"in_{i}.npy", np.ascontiguousarray(array))
            proc = subprocess.run([*self.prefix, str(self.runner), str(self.root), str(inputs), str(outputs),
                                   str(warmup + repeat)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                reason = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
                raise ArtifactError(f"the native runner failed: {reason}")
            times = json.loads(proc.stdout.strip().splitlines()[-1])["times_ms"]
            results = {spec["name"]: np.load(outputs / f"out_{i}.npy", allow_pickle=False)
                       for i, spec in enumerate(self.core_outputs)}
        return results, [t / 1e3 for t in times[warmup:]]

    def measure(self, feeds, warmup=3, repeat=50):
        outputs, stats, warnings = super().measure(feeds, warmup, repeat)
        if self.emulated:
            warnings.append("ran under qemu emulation: the latency is not a measurement of the device")
            if stats:
                stats["emulated"] = True
        return outputs, stats, warnings


STRING = "string"  # a string tensor's dtype in the manifest


def _host_ops() -> Any:
    """mlc.runtime.host_ops where mlc is installed, else the copy an artifact with string ops ships beside this file."""
    try:
        from mlc.runtime import host_ops
    except ImportError:
        import mlc_host_ops as host_ops  # type: ignore[no-redef]
    return host_ops


def _accuracy() -> tuple[Any, Any]:
    """mlc.check's compare and gate: mlc's own where mlc is installed, else the copies an artifact ships beside this
    file (ACCURACY_MODULES: numpy only)."""
    try:
        from mlc.check import compare, gate
    except ImportError:
        from mlc_compare import compare  # type: ignore[no-redef]
        from mlc_gate import gate  # type: ignore[no-redef]
    return compare, gate


# mlc.check's modules an artifact ships in runtime/ for `run.py --check`, by the names it imports them as.
ACCURACY_MODULES = {"mlc_compare.py": "compare.py", "mlc_gate.py": "gate.py"}


def check_outputs(runner: _ArtifactRunner, actual: Mapping[str, np.ndarray], atol: float | None = None,
                  rtol: float | None = None) -> Any:
    """`actual` (the outputs on the reference inputs) judged against the reference outputs as `mlc check` judges
    them: per-dtype tolerances (or atol/rtol); a reduced-precision build by its accuracy gate, and a quantised one
    over its gate cases too; each bucket at its most padded length. Returns mlc.check's CheckResult."""
    compare, gate = _accuracy()
    info = runner.manifest["reference"]
    reference = load_npz(runner.root / info["outputs"])
    result = compare(reference, actual, atol=atol, rtol=rtol)
    result.reference = info["producer"]
    precision = runner.manifest.get("precision", "fp32")
    if runner.manifest.get("quantization"):  # --quantize: the int8 gate, judged on all its inputs together
        precision = runner.manifest["quantization"]["mode"]
        on_reference = info.get("gate_judges_reference", True)
        expected, got = ([reference], [actual]) if on_reference else ([], [])
        for case in info.get("gate_cases", []):
            expected.append(load_npz(runner.root / case["outputs"]))
            got.append(runner.run(load_npz(runner.root / case["inputs"])))
        result.gate = gate(*stacked(expected, got), precision)
        result.gate.inputs, result.gate.calibration_inputs = len(expected), not on_reference
    elif precision != "fp32":  # judged by the reduced-precision gate against the same fp32 reference
        result.gate = gate(reference, actual, precision)
    for case in (runner.buckets or {}).get("checks", []):  # each bucket at its most padded length
        expected = load_npz(runner.root / case["outputs"])
        got = runner.run(load_npz(runner.root / case["inputs"]))
        where = f" [{runner.buckets['dim']}={case['length']} in bucket {case['bucket']}]"
        for stats in compare(expected, got, atol=atol, rtol=rtol).outputs:
            stats.name += where
            result.outputs.append(stats)
        if result.gate is not None:
            for figures in gate(expected, got, precision).outputs:
                figures.name += where
                result.gate.outputs.append(figures)
    return result


def stacked(expected: list[dict], got: list[dict]) -> tuple[dict, dict]:
    """Each output's values over several inputs, joined along the first axis (a classifier's rows add up)."""
    names = [n for n in expected[0] if all(n in e for e in expected) and all(n in g for g in got)
             and len({np.shape(e[n])[1:] for e in expected + got}) == 1 and np.ndim(expected[0][n])]
    reference = {n: np.concatenate([e[n] for e in expected]) for n in names}
    actual = {n: np.concatenate([np.asarray(g[n]) for g in got]) for n in names}
    reference.update({n: v for n, v in expected[0].items() if n not in reference})
    actual.update({n: v for n, v in got[0].items() if n not in actual})
    return reference, actual


def refuse_artifact_file(root: str | os.PathLike, manifest: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Outputs may not be written over a file of the artifact that made them: that would break the artifact."""
    target, root = Path(path).resolve(), Path(root).resolve()
    if target == root / MANIFEST or any(target == (root / rel).resolve() for rel in manifest.get("files", {})):
        raise FeedError(f"-o {path} is a file of the artifact {root.name}; writing the outputs there would break it: "
                        "choose another path")


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """Write arrays as an .npz (what np.savez writes), atomically, with any tensor names: np.savez
    takes them as keyword arguments, which breaks on names like 'file'."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, array in arrays.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    array = np.asanyarray(array)
                    if array.dtype == object:  # strings as ONNX Runtime gives them: unicode, never pickled
                        array = _host_ops().as_strings(array)
                    np.lib.format.write_array(member, array, allow_pickle=False)
        os.replace(tmp, path)
    except OSError as e:
        raise FeedError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # a read-only folder refuses even the unlink of a file it never held
            pass


def load_npz(path: str | os.PathLike, names: list[str] | tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Arrays from an .npz file; never unpickles (object arrays are refused). A single .npy array is accepted for
    a model with one input, `names` being the model's input names."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.ndarray):
            with data:
                return {k: as_bfloat16(data[k]) for k in data.files}
    except FileNotFoundError:
        raise FeedError(f"input file not found: {path}") from None
    except (ValueError, OSError, EOFError):  # includes zipfile.BadZipFile and pickled arrays
        if zipfile.is_zipfile(path):  # an .npz that holds object arrays (numpy would unpickle them)
            raise FeedError(f"cannot read {path}: it holds object arrays; save plain numeric arrays with numpy.savez"
                            ) from None
        raise FeedError(f"cannot read {path}: not an .npz file; write inputs with numpy.savez(path, name=array, ...)"
                        ) from None
    if len(names) == 1:  # a .npy: the one input of a one-input model
        return {names[0]: as_bfloat16(data)}
    inputs = f"the model's inputs are {', '.join(names)}: " if names else ""
    raise FeedError(f"{path} is a single .npy array, which feeds only a model with one input; {inputs}"
                    "write inputs to an .npz with numpy.savez(path, name=array, ...)")


def main(argv: list[str] | None = None, artifact_dir: str | os.PathLike | None = None) -> int:
    """`python run.py` inside an artifact: run it on .npz inputs (default: its reference inputs); with --check,
    judge the outputs against the artifact's reference as `mlc check` does. Exit 0, 1 (bad input or artifact),
    3 (--check failed), 4 (no device or emulator for it here)."""
    import argparse
    import sys

    root = Path(artifact_dir or Path(__file__).resolve().parent.parent)
    parser = argparse.ArgumentParser(description=f"Run the mlc artifact in {root}")
    parser.add_argument("-i", "--inputs", help=".npz with one array per model input, or a .npy for a one-input "
                        "model (default: reference inputs)")
    parser.add_argument("-o", "--outputs", help="write the outputs to this .npz")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print latency as JSON")
    parser.add_argument("--threads", type=int, help="CPU threads (default: TVM_NUM_THREADS, else one per core)")
    parser.add_argument("--device", help="the GPU to run on, e.g. cuda:1 (default: the first)")
    parser.add_argument("--check", action="store_true",
                        help="compare the outputs on the reference inputs with the artifact's reference (exit 3 if "
                             "they differ), by the tolerances or the accuracy gate `mlc check` uses")
    parser.add_argument("--atol", type=float, help="--check: absolute tolerance (default: by dtype)")
    parser.add_argument("--rtol", type=float, help="--check: relative tolerance (default: by dtype)")
    args = parser.parse_args(argv)
    if args.check and args.inputs:
        parser.error("--check runs the reference inputs; leave out --inputs")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    try:
        runner = Runner(root, threads=args.threads, device=args.device)
        if args.outputs:
            refuse_artifact_file(root, runner.manifest, args.outputs)
        feeds = load_npz(args.inputs or root / runner.manifest["reference"]["inputs"],
                         [i["name"] for i in runner.inputs])
        outputs, stats, _ = runner.measure(feeds, args.warmup, args.repeat)
        if args.outputs:
            save_npz(args.outputs, outputs)
        checked = check_outputs(runner, outputs, args.atol, args.rtol) if args.check else None
    except (DeviceMissing, EmulatorMissing) as e:
        print(f"error: {e}", file=sys.stderr)
        return 4
    except (ArtifactError, FeedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"outputs": {k: list(v.shape) for k, v in outputs.items()}, "latency": stats,
                          "threads": runner.threads}))
    else:
        for name, value in outputs.items():
            print(f"{name}: shape {value.shape} dtype {value.dtype}")
        if stats:
            print(
                f"latency over {stats['runs']} runs: mean {stats['mean_ms']:.3f} ms, p50 {stats['p50_ms']:.3f}, "
                f"p90 {stats['p90_ms']:.3f}, p99 {stats['p99_ms']:.3f}; {stats['throughput_per_s']:.1f} runs/s"
                + (f"; {runner.threads} thread(s)" if runner.threads else "")
            )
    if checked is not None:
        _print_check(checked, runner.device)
        return 0 if checked.passed else 3
    return 0


def _print_check(result: Any, device: Any) -> None:
    """One line per output (and per gate figure), then the verdict."""
    for stats in result.outputs:
        print(f"check {stats.name}: max abs error {stats.max_abs_error:.3g}, {stats.mismatch_fraction:.2%} of values "
              f"outside atol {stats.atol:.3g} + rtol {stats.rtol:.3g}" + (f" ({stats.problem})" if stats.problem
                                                                             else ""))
    if result.gate is not None:
        for figures in result.gate.outputs:
            print(f"gate {result.gate.precision} {figures.name}: cosine {figures.cosine_similarity:.6f}, max error "
                  f"{figures.rel_error:.2%} of the peak" + (f"; {'; '.join(figures.problems)}" if figures.problems
                                                             else ""))
    verdict = "passed" if result.passed else f"FAILED for {', '.join(result.failed())}"
    print(f"check {verdict} on {device} against {result.reference}")
