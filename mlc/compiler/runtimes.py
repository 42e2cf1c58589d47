"""The runtime files an artifact carries, per target architecture: libtvm_runtime.so and
libtvm_ffi.so (from the apache-tvm / apache-tvm-ffi wheels of that architecture, at the exact
versions installed here) and the native runner (runtime/native/mlc_runner.cc, compiled for it).

The host's come from the installed packages; others are fetched once with pip for that platform
and cached in $MLC_CACHE_DIR (default ~/.cache/mlc)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Optional

from mlc.compiler.tvm_install import tvm_package_dir
from mlc.errors import MissingDependencyError
from mlc.runtime.runner import HOST_ARCH

NATIVE_SOURCE = Path(__file__).resolve().parent.parent / "runtime" / "native" / "mlc_runner.cc"
# pip platform tags of the wheels, per (architecture, OS)
_PLATFORMS = {
    ("aarch64", "linux"): ["manylinux_2_28_aarch64", "manylinux2014_aarch64"],
    ("aarch64", "macos"): ["macosx_11_0_arm64"],
}
_SUFFIX = {"linux": ".so", "macos": ".dylib"}


@dataclass(frozen=True)
class Toolchain:
    compiler: str  # C++ compiler executable
    package: str  # Debian package that provides it


TOOLCHAINS = {"aarch64": Toolchain("aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu")}
TOOLCHAINS[HOST_ARCH] = Toolchain("g++", "g++")  # on an aarch64 host, its own g++


@dataclass(frozen=True)
class RuntimeFiles:
    tvm_runtime: Path
    tvm_ffi: Path
    native_runner: Optional[Path]  # None where we cannot build it (macOS)
    device_libraries: tuple[Path, ...] = ()  # loaded after tvm_runtime, in this order
    notes: tuple[str, ...] = ()


def cache_dir() -> Path:
    return Path(os.environ.get("MLC_CACHE_DIR", Path.home() / ".cache" / "mlc"))


def toolchain(arch: str) -> Toolchain:
    chain = TOOLCHAINS.get(arch)
    if chain is None:
        raise MissingDependencyError(f"no cross toolchain is known for {arch}")
    if shutil.which(chain.compiler) is None:
        raise MissingDependencyError(
            f"{chain.compiler} (the C++ compiler for {arch}) is not installed; run: apt-get install {chain.package}"
        )
    return chain


def _versions() -> tuple[str, str]:
    return metadata.version("apache-tvm"), metadata.version("apache-tvm-ffi")


def _host_libraries() -> tuple[Path, Path]:
    import importlib.util

    ffi = importlib.util.find_spec("tvm_ffi")
    ffi_dir = Path(list(ffi.submodule_search_locations)[0]) if ffi and ffi.submodule_search_locations else None
    runtime = tvm_package_dir() / "lib" / "libtvm_runtime.so"
    if ffi_dir is None or not (ffi_dir / "lib" / "libtvm_ffi.so").is_file() or not runtime.is_file():
        raise MissingDependencyError("apache-tvm / apache-tvm-ffi are incomplete; reinstall: "
                                     "pip install --force-reinstall apache-tvm==0.27.0.post1 "
                                     "apache-tvm-ffi==0.1.14.post1")
    return runtime, ffi_dir / "lib" / "libtvm_ffi.so"


def _fetch_libraries(arch: str, os_name: str, dest: Path, names: dict[str, str]) -> dict[str, Path]:
    """Download this TVM's wheels for (`arch`, `os_name`) and keep the libraries in `names`
    (wheel member -> file name), cached in `dest`."""
    wanted = {member: dest / name for member, name in names.items()}
    if all(path.is_file() for path in wanted.values()):
        return {Path(member).name: path for member, path in wanted.items()}
    tvm_version, ffi_version = _versions()
    with tempfile.TemporaryDirectory(prefix="mlc-wheels-") as tmp:
        platforms = [arg for tag in _PLATFORMS[(arch, os_name)] for arg in ("--platform", tag)]
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   *platforms, "--python-version", "3.11", "-d", tmp,
                   f"apache-tvm=={tvm_version}", f"apache-tvm-ffi=={ffi_version}"]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise MissingDependencyError(
                f"cannot download the {arch} {os_name} TVM runtime (apache-tvm=={tvm_version}, "
                f"apache-tvm-ffi=={ffi_version}): {last}; put {', '.join(names.values())} in {dest}")
        dest.mkdir(parents=True, exist_ok=True)
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as zf:
                for member in set(zf.namelist()) & set(names):
                    # temp file beside the cache entry, then rename: never a truncated library there
                    partial = dest / f".{names[member]}.{os.getpid()}.tmp"
                    partial.write_bytes(zf.read(member))
                    os.replace(partial, wanted[member])
    missing = [str(p.name) for p in wanted.values() if not p.is_file()]
    if missing:
        raise MissingDependencyError(f"the {arch} {os_name} wheels hold no {', '.join(missing)}")
    return {Path(member).name: path for member, path in wanted.items()}


def _native_runner(arch: str, tvm_ffi_lib: Path, dest: Path) -> Path:
    """Compile the native runner for `arch` (cached by source and tvm-ffi version)."""
    source = NATIVE_SOURCE.read_bytes()
    key = hashlib.sha256(source + _versions()[1].encode()).hexdigest()[:16]
    runner = dest / f"mlc_runner-{key}"
    if runner.is_file():
        return runner
    chain = toolchain(arch)
    include = tvm_ffi_lib.parent.parent / "include" if arch == HOST_ARCH else _ffi_include()
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{runner.name}.{os.getpid()}.tmp"
    proc = subprocess.run(
        [chain.compiler, "-std=c++17", "-O2", f"-I{include}", str(NATIVE_SOURCE), "-o", str(tmp),
         f"-L{tvm_ffi_lib.parent}", "-l:libtvm_ffi.so", "-ldl", "-Wl,-rpath,$ORIGIN"],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise MissingDependencyError(f"building the native runner with {chain.compiler} failed: "
                                     f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    os.replace(tmp, runner)
    return runner


def _ffi_include() -> Path:
    _, ffi = _host_libraries()
    return ffi.parent.parent / "include"  # headers are the same on every architecture


def _cuda_libraries() -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """TVM's CUDA runtime plugin and the CUDA runtime (libcudart) it was linked against. The
    driver (libcuda.so.1) belongs to the GPU machine and is never shipped."""
    plugin = tvm_package_dir() / "lib" / "libtvm_runtime_cuda.so"
    if not plugin.is_file():
        raise MissingDependencyError(f"this TVM has no CUDA runtime ({plugin} is missing)")
    proc = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True)
    cudart = next((Path(line.split("=>")[1].split("(")[0].strip()) for line in proc.stdout.splitlines()
                   if "libcudart.so" in line and "=>" in line and "not found" not in line), None)
    if cudart is None or not cudart.is_file():  # not on the loader's path: the `cuda` extra's (nvidia-cuda-runtime)
        cudart = _pip_cudart()
    if cudart is None:
        wanted = next((line.split()[0] for line in proc.stdout.splitlines() if "libcudart" in line), "libcudart")
        return (plugin,), (f"{wanted} (the CUDA runtime) was not found here; the GPU machine must provide it",)
    return (cudart.resolve(), plugin), ()


def _pip_cudart() -> Optional[Path]:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return Path(load_nvidia_dynamic_lib("cudart").abs_path)
    except Exception:  # not installed (ImportError) or not found: the caller says so
        return None


def runtime_files(arch: str, device: str = "cpu", os_name: str = "linux") -> RuntimeFiles:
    """Everything an artifact for `arch`/`os_name` needs to run, building or fetching what is missing."""
    device_libraries: tuple[Path, ...] = ()
    notes: tuple[str, ...] = ()
    if device == "cuda" and (arch, os_name) != (HOST_ARCH, "linux"):
        raise MissingDependencyError(f"CUDA artifacts for {arch} {os_name} hosts are not supported yet")
    if (arch, os_name) == (HOST_ARCH, "linux"):
        runtime, ffi = _host_libraries()
        native = _native_runner(arch, ffi, cache_dir() / "native" / arch)
        if device == "cuda":
            device_libraries, notes = _cuda_libraries()
    elif (arch, os_name) in _PLATFORMS:
        tvm_version, ffi_version = _versions()
        base = cache_dir() / "runtimes" / f"{arch}-{os_name}-tvm{tvm_version}-ffi{ffi_version}"
        suffix = _SUFFIX[os_name]
        names = {f"tvm/lib/libtvm_runtime{suffix}": f"libtvm_runtime{suffix}",
                 f"tvm_ffi/lib/libtvm_ffi{suffix}": f"libtvm_ffi{suffix}"}
        if device != "cpu":
            names[f"tvm/lib/libtvm_runtime_{device}{suffix}"] = f"libtvm_runtime_{device}{suffix}"
        libs = _fetch_libraries(arch, os_name, base, names)
        runtime, ffi = libs[f"libtvm_runtime{suffix}"], libs[f"libtvm_ffi{suffix}"]
        device_libraries = tuple(p for name, p in libs.items() if name.startswith(f"libtvm_runtime_{device}"))
        # No Apple toolchain here: macOS artifacts run through Python (run.py), not the native runner.
        native = _native_runner(arch, ffi, base) if os_name == "linux" else None
    else:
        raise MissingDependencyError(f"no TVM runtime is available for {arch} {os_name}")
    return RuntimeFiles(runtime, ffi, native, device_libraries, notes)
