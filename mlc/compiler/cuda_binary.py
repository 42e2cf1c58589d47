"""CUDA device code shipped compiled. TVM 0.27's CUDA codegen keeps CUDA C source in the library, and its runtime
compiles that source when the module loads, through a callback only the full `tvm` package registers: a thin runtime
could never load it. So at export the source is compiled here, with no GPU: NVRTC makes a cubin for the target's
sm_XY and PTX for its compute_XY (the driver JIT-compiles that on later GPUs), nvFatbin packs both into one fatbin,
and the library's serialized CUDA module is rewritten to hold the fatbin (cuModuleLoadData picks the cubin or the
PTX). The compilers come from the `cuda` extra: NVRTC, nvFatbin, the CUDA headers and cuda-bindings, all 13.0.x, the
release of the libcudart the artifact ships, so driver 580+ (CUDA 13.0) can JIT its PTX."""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import platform
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from mlc.targets.presets import portable_ptx_arch

INSTALL = "pip install 'mlc[cuda]'"
# The kind under which a CUDA module is serialized in a library's import blob (tvm-ffi's ProcessLibraryBin).
_CUDA_KIND = b"cuda"
FORMAT = "fatbin"  # what the rewritten module's data is (anything but "cuda" is handed to cuModuleLoadData)


@dataclass(frozen=True)
class GpuCode:
    """What an artifact's CUDA module holds, recorded in its manifest (runtime.gpu_code)."""

    format: str  # fatbin
    cubin: str  # sm_XY[a]: loads on that architecture (and, without the "a", later minors of its major)
    ptx: str  # compute_XY: JIT-compiled by the driver on that architecture and every later one
    cuda: str  # release of the compiler and of the shipped libcudart (the driver must support it)

    def to_json(self) -> dict:
        return asdict(self)


def _header_dir(library: str) -> Optional[Path]:
    from cuda.pathfinder import find_nvidia_header_directory

    try:
        found = find_nvidia_header_directory(library)
    except Exception:  # pathfinder raises per-platform errors; none means "not here"
        return None
    return Path(found) if found else None


def missing() -> Optional[str]:
    """Why CUDA code cannot be compiled here (None when it can): what of the `cuda` extra is absent."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None \
            or importlib.util.find_spec("cuda.pathfinder") is None:
        return "cuda-bindings (NVRTC's Python API) is not installed"
    from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib

    for library, package in (("nvrtc", "nvidia-cuda-nvrtc"), ("nvfatbin", "nvidia-nvfatbin")):
        try:
            load_nvidia_dynamic_lib(library)
        except DynamicLibNotFoundError:
            return f"lib{library} ({package}) is not installed"
    runtime, cccl = _header_dir("cudart"), _header_dir("cccl")
    if runtime is None or not (runtime / "cuda_runtime.h").is_file():
        return "the CUDA runtime headers (nvidia-cuda-runtime) are not installed"
    if cccl is None or not (cccl / "cuda" / "std").is_dir():
        return "libcu++'s headers (nvidia-cuda-cccl) are not installed"
    if not (runtime / "crt" / "mma.h").is_file():
        return "the CUDA compiler's device headers (nvidia-cuda-crt) are not installed"
    return None


def _cuda_tree(cache: Path) -> Path:
    """A CUDA_PATH for tvm.support.nvcc's NVRTC call, which reads CUDA_PATH/include and libcu++ at
    CUDA_PATH/targets/<triple>/include/cccl, over the pip wheels' nvidia/cu13/include: a folder of links."""
    runtime, cccl = _header_dir("cudart"), _header_dir("cccl")
    key = hashlib.sha256(f"{runtime}|{cccl}".encode()).hexdigest()[:12]
    tree = cache / f"cuda-headers-{key}"
    target = tree / "targets" / f"{platform.machine()}-linux" / "include"
    if not (target / "cccl").exists():
        target.mkdir(parents=True, exist_ok=True)
        for link, to in ((tree / "include", runtime), (target / "cccl", cccl)):
            if not link.exists():
                tmp = link.with_name(f".{link.name}.{os.getpid()}")
                tmp.symlink_to(to)
                os.replace(tmp, link)
    return tree


def _arch_number(arch: str) -> str:
    """'sm_90a' -> '90a', 'compute_80' -> '80'."""
    return arch.split("_", 1)[1]


class _Fatbin:
    """nvFatbin's C API (cuda-bindings has no wrapper for it): a fatbin from a cubin and PTX."""

    def __init__(self) -> None:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        self.lib = ctypes.CDLL(load_nvidia_dynamic_lib("nvfatbin").abs_path)
        self.lib.nvFatbinGetErrorString.restype = ctypes.c_char_p

    def _call(self, name: str, *args) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise RuntimeError(f"nvFatbin {name} failed: {self.lib.nvFatbinGetErrorString(status).decode()}")

    def pack(self, cubin: bytes, cubin_arch: str, ptx: bytes, ptx_arch: str) -> bytes:
        handle = ctypes.c_void_p()
        self._call("nvFatbinCreate", ctypes.byref(handle), None, ctypes.c_size_t(0))
        try:
            self._call("nvFatbinAddCubin", handle, cubin, ctypes.c_size_t(len(cubin)),
                       _arch_number(cubin_arch).encode(), b"mlc")
            self._call("nvFatbinAddPTX", handle, ptx, ctypes.c_size_t(len(ptx)), _arch_number(ptx_arch).encode(),
                       b"mlc", None)
            size = ctypes.c_size_t()
            self._call("nvFatbinSize", handle, ctypes.byref(size))
            buffer = ctypes.create_string_buffer(size.value)
            self._call("nvFatbinGet", handle, buffer)
            return buffer.raw
        finally:
            self.lib.nvFatbinDestroy(ctypes.byref(handle))


def compile_fatbin(source: str, arch: str, cache: Path) -> tuple[bytes, GpuCode]:
    """`source` (TVM's CUDA C) as a fatbin: a cubin for `arch` (sm_XY) and PTX for its compute_XY."""
    os.environ["CUDA_PATH"] = str(_cuda_tree(cache))  # read by tvm.support.nvcc (this is the worker process)
    from tvm.support import nvcc

    cubin = bytes(nvcc.compile_cuda(source, target_format="cubin", arch=arch, compiler="nvrtc"))
    ptx_arch = portable_ptx_arch(arch)
    try:
        ptx = bytes(nvcc.compile_cuda(source, target_format="ptx", arch=ptx_arch, compiler="nvrtc"))
    except RuntimeError:  # code that needs the arch-specific features (sm_90a's wgmma): PTX for that arch only
        ptx_arch = "compute_" + _arch_number(arch)
        ptx = bytes(nvcc.compile_cuda(source, target_format="ptx", arch=ptx_arch, compiler="nvrtc"))
    version = re.search(rb"release (\d+\.\d+)", ptx)
    return _Fatbin().pack(cubin, arch, ptx, ptx_arch), GpuCode(FORMAT, arch, ptx_arch,
                                                               version.group(1).decode() if version else "?")


# The library's import blob (tvm-ffi's ProcessLibraryBin): <nbytes: u64> <indptr: vec<u64>> <children: vec<u64>>,
# then per module <kind: str> and, but for "_lib", <bytes: str>; a str or vec is <count: u64> then the items, all
# little-endian. A CUDA module's bytes are <format: str> <function table> <data: str>: for format "cuda" the data is
# the source. The function table has no length of its own; the data, known from the module, is found at the end.

def _read_str(blob, at: int) -> tuple[memoryview, int]:
    size = struct.unpack_from("<Q", blob, at)[0]
    return memoryview(blob)[at + 8:at + 8 + size], at + 8 + size


def _str(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def serialized_modules(blob) -> list[tuple[bytes, int, int]]:
    """(kind, start, end) of each module's serialized bytes (the str after its kind) in an import blob."""
    count = struct.unpack_from("<Q", blob, 8)[0]  # indptr has one entry more than there are modules
    at = 16 + 8 * count
    at += 8 + 8 * struct.unpack_from("<Q", blob, at)[0]  # the children
    found = []
    for _ in range(count - 1):
        kind, at = _read_str(blob, at)
        if kind != b"_lib":
            start = at
            _, at = _read_str(blob, at)
            found.append((bytes(kind), start, at))
    return found


def cuda_format(value) -> str:
    """The format of a serialized CUDA module ("cuda": source; "fatbin", "cubin", "ptx": compiled)."""
    return bytes(_read_str(value, 0)[0]).decode()


def rewrite(blob, sources: list[str], compile_source: Callable[[str], bytes]) -> Optional[bytes]:
    """The import blob with each CUDA module that holds one of `sources` holding `compile_source(it)` in FORMAT
    instead; None when there is none."""
    pieces, last = [], 0
    for kind, start, end in serialized_modules(blob):
        value = memoryview(blob)[start + 8:end]
        if kind != _CUDA_KIND or cuda_format(value) != "cuda":
            continue
        table_start = 8 + len(_read_str(value, 0)[0])
        source = next((s for s in sources if bytes(value[len(value) - len(s.encode()) - 8:]) == _str(s.encode())),
                      None)
        if source is None:
            raise ValueError("a CUDA module in the library holds source TVM did not report")
        table_end = len(value) - len(source.encode()) - 8
        body = _str(FORMAT.encode()) + bytes(value[table_start:table_end]) + _str(compile_source(source))
        pieces += [bytes(memoryview(blob)[last:start]), _str(body)]
        last = end
    if not pieces:
        return None
    pieces.append(bytes(memoryview(blob)[last:]))
    payload = b"".join(pieces)[8:]
    return struct.pack("<Q", len(payload)) + payload
