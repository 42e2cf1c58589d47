"""Target presets as data. A preset resolves to a `Target` whose `tvm` field is the TVM target
JSON dict (TVM 0.27 accepts only JSON dicts or tags, never hand-built strings)."""

from __future__ import annotations

import difflib
import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable

from mlc.errors import TargetError
from mlc.targets import cpu_features
from mlc.runtime.runner import HOST_ARCH, host_cpu_flags


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    tvm: dict[str, Any]  # TVM target JSON
    runtime_arch: str  # machine the artifact runs on, as `platform.machine()` says it
    device: str = "cpu"  # runtime device kind
    runtime_os: str = "linux"  # "linux" or "macos"
    # CPU features the generated code needs (as /proc/cpuinfo names them); checked before loading
    # so a machine that lacks them gets a clear error instead of SIGILL.
    required_cpu_features: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tvm": self.tvm,
            "runtime_arch": self.runtime_arch,
            "runtime_os": self.runtime_os,
            "device": self.device,
            "required_cpu_features": list(self.required_cpu_features),
        }


# mcpu by x86 feature level, newest first: (features that must all be present, LLVM cpu name).
_X86_LEVELS: list[tuple[tuple[str, ...], str]] = [
    (("amx_tile", "avx512_fp16"), "sapphirerapids"),
    (("avx512_bf16", "avx512_vnni"), "cooperlake"),
    (("avx512_vnni",), "cascadelake"),
    (("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"), "skylake-avx512"),
    (("avx2", "fma", "bmi2"), "haswell"),
]
_AVX2 = ("avx2", "fma", "bmi2")
_AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd")


def host_cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _amd_cpu(flags: set[str]) -> str | None:
    """LLVM's scheduling model for AMD Zen cores (family 0x17: Zen 1/2, 0x19: Zen 3/4, 0x1a: Zen 5); the feature
    levels above name Intel cores, which Zen 4 matches as "cooperlake" with the wrong instruction costs."""
    info = _cpuinfo_fields(("vendor_id", "cpu family", "model"))
    if info.get("vendor_id") != "AuthenticAMD" or not info.get("cpu family", "").isdigit():
        return None
    family, model = int(info["cpu family"]), int(info.get("model") or 0)
    if family == 0x1A:
        return "znver5"
    if family == 0x19:
        return "znver4" if "avx512f" in flags else "znver3"
    if family == 0x17:
        return "znver2" if model >= 0x30 else "znver1"
    return None


def _cpuinfo_fields(names: tuple[str, ...]) -> dict[str, str]:
    """The first value of each named field in /proc/cpuinfo (empty where unknown)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in names and key.strip() not in found:
                    found[key.strip()] = value.strip()
                if len(found) == len(names):
                    break
    except OSError:
        pass
    return found


def _detect_x86() -> Target:
    if platform.machine() not in ("x86_64", "AMD64"):
        raise TargetError(
            f"target 'x86' means this host's CPU, but this host is {platform.machine()}; "
            "use a portable preset (x86-avx2, x86-avx512) to cross-compile"
        )
    flags = host_cpu_flags()
    mcpu, needed = "x86-64", ()
    for level, (features, cpu) in enumerate(_X86_LEVELS):
        if all(f in flags for f in features):
            # A level implies the ones below it: the code may use all of their features.
            mcpu = cpu
            needed = tuple(dict.fromkeys(f for feats, _ in _X86_LEVELS[level:] for f in feats))
            break
    mcpu = _amd_cpu(flags) or mcpu
    return Target(
        name="x86",
        description=f"this host: {host_cpu_name()} ({mcpu}, {usable_cores()} cores)",
        tvm={"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu, "num-cores": usable_cores()},
        runtime_arch="x86_64",
        required_cpu_features=tuple(needed),
    )


def _portable_x86(name: str, mcpu: str, features: tuple[str, ...], what: str) -> Callable[[], Target]:
    def make() -> Target:
        return Target(
            name=name,
            description=f"portable x86_64 build for any {what} CPU ({mcpu})",
            tvm={"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu, "num-cores": usable_cores()},
            runtime_arch="x86_64",
            required_cpu_features=features,
        )

    return make


def _arm(name: str, mcpu: str, mattr: list[str], what: str, features: tuple[str, ...]) -> Callable[[], Target]:
    """A 64-bit ARM Linux board or instance. TVM 0.27 has tags for some Raspberry Pis but none
    for Graviton, so all are written out here the same way."""

    def make() -> Target:
        return Target(
            name=name,
            description=f"{what}; cross-compiled, verified here under qemu",
            # num-cores: what MetaSchedule tunes for; 4 matches the boards and a c7g.xlarge.
            tvm={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": mcpu, "mattr": mattr, "num-cores": 4},
            runtime_arch="aarch64",
            required_cpu_features=features,
        )

    return make


# What TVM's nvidia/* tags carry (the L4 has no tag in 0.27); "arch" is added per GPU.
_CUDA_LIMITS = {"max_num_threads": 1024, "thread_warp_size": 32, "max_shared_memory_per_block": 49152,
                "max_threads_per_block": 1024, "registers_per_block": 65536}
# Host code of GPU artifacts runs on the GPU server's CPU: generic x86-64, not this machine's.
_GPU_SERVER_HOST = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"}
_DEFAULT_CUDA_ARCH = "sm_80"
_MAC_HOST = {"kind": "llvm", "mtriple": "arm64-apple-macos", "mcpu": "apple-m1"}


def local_cuda_arch() -> str | None:
    """sm_XY of the first visible NVIDIA GPU, or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
    return "sm_" + first.replace(".", "") if first.replace(".", "").isdigit() else None


def portable_ptx_arch(arch: str) -> str:
    """compute_XY for sm_XY[a|f]: the PTX an artifact ships beside its cubin. The "a"/"f" variants' PTX would
    JIT-compile on that one architecture (family) only."""
    return "compute_" + re.sub(r"[a-z]+$", "", arch.split("_", 1)[1])


def cuda_loads_on(arch: str) -> str:
    """Which GPUs run an artifact built for `arch` (mlc.compiler.cuda_binary ships a cubin and PTX)."""
    number = arch.split("_", 1)[1]
    cubin = f"sm_{number.rstrip('abcdefghijklmnopqrstuvwxyz')} GPUs only" if not number.isdigit() \
        else f"sm_{number} and later sm_{number[:-1]}x GPUs"
    return f"ships an {arch} cubin (runs on {cubin}) and {portable_ptx_arch(arch)} PTX (the driver compiles it on " \
           "every later GPU)"


def _cuda(name: str, arch: str | None, what: str) -> Callable[[], Target]:
    def make() -> Target:
        sm, how = arch, what
        if sm is None:
            local = local_cuda_arch()
            sm = local or _DEFAULT_CUDA_ARCH
            how = f"this machine's GPU ({sm})" if local else f"no GPU visible here: {sm} (A100 class) by default"
        return Target(name=name, description=f"NVIDIA {how}; {cuda_loads_on(sm)}; kernels scheduled with TVM's "
                                             "dlight GPU rules",
                      tvm={"kind": "cuda", "arch": sm, **_CUDA_LIMITS, "host": _GPU_SERVER_HOST},
                      runtime_arch="x86_64", device="cuda")

    return make


def _metal() -> Target:
    # The apple/m1-gpu tag's limits; the host part runs on the Mac's CPU.
    return Target(
        name="metal",
        description="Apple M1/M2/M3 GPUs (Metal), host arm64 macOS; built here, linked in one step on the Mac",
        tvm={"kind": "metal", "max_threads_per_block": 1024, "max_shared_memory_per_block": 32768,
             "thread_warp_size": 32, "max_num_threads": 256, "max_function_args": 31,
             "host": _MAC_HOST},
        runtime_arch="aarch64", runtime_os="macos", device="metal",
    )


# name -> factory (detection is lazy: listing presets must not fail on another architecture)
PRESETS: dict[str, Callable[[], Target]] = {
    "x86": _detect_x86,
    "x86-avx2": _portable_x86("x86-avx2", "haswell", _AVX2, "AVX2 (Haswell or newer)"),
    "x86-avx512": _portable_x86("x86-avx512", "skylake-avx512", _AVX512, "AVX-512 (Skylake-SP or newer)"),
    "graviton2": _arm("graviton2", "neoverse-n1", ["+neon"], "AWS Graviton2 (Neoverse N1)", ("asimd",)),
    "graviton3": _arm("graviton3", "neoverse-v1", ["+neon", "+sve"], "AWS Graviton3 (Neoverse V1, SVE)",
                      ("asimd", "sve")),
    "graviton4": _arm("graviton4", "neoverse-v2", ["+neon", "+sve2"], "AWS Graviton4 (Neoverse V2, SVE2)",
                      ("asimd", "sve2")),
    "rpi3": _arm("rpi3", "cortex-a53", ["+neon"], "Raspberry Pi 3, 64-bit OS (Cortex-A53)", ("asimd",)),
    "rpi4": _arm("rpi4", "cortex-a72", ["+neon"], "Raspberry Pi 4, 64-bit OS (Cortex-A72)", ("asimd",)),
    "rpi5": _arm("rpi5", "cortex-a76", ["+neon", "+dotprod"], "Raspberry Pi 5, 64-bit OS (Cortex-A76)",
                 ("asimd", "asimddp")),
    "cuda": _cuda("cuda", None, ""),
    "cuda-t4": _cuda("cuda-t4", "sm_75", "T4 (Turing, sm_75)"),
    "cuda-a10g": _cuda("cuda-a10g", "sm_86", "A10G (Ampere, sm_86)"),
    "cuda-l4": _cuda("cuda-l4", "sm_89", "L4 (Ada, sm_89)"),
    "cuda-a100": _cuda("cuda-a100", "sm_80", "A100 (Ampere, sm_80)"),
    # sm_90, not sm_90a: TVM's dlight Matmul rule tensorizes (wmma) only where check_sm_version reads a number, and
    # it reads "sm_90a" as -1; TVM emits no sm_90a-only instruction, so the "a" bought nothing but lost tensor cores.
    "cuda-h100": _cuda("cuda-h100", "sm_90", "H100/H200 (Hopper, sm_90)"),
    "metal": _metal,
}


def resolve(name: str) -> Target:
    """A preset name to a Target; unknown names get the preset list and the nearest match."""
    factory = PRESETS.get(name.strip().lower())
    if factory is not None:
        return factory()
    if name.lstrip().startswith("{"):
        return from_json(name)
    near = difflib.get_close_matches(name.lower(), PRESETS, n=1, cutoff=0.4)
    hint = f"did you mean '{near[0]}'? " if near else ""
    raise TargetError(f"unknown target {name!r}; {hint}known targets: {', '.join(PRESETS)} (see `mlc targets`)")


# LLVM triple prefixes -> the machine the code runs on
_TRIPLE_ARCH = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def from_json(text: str) -> Target:
    """A raw TVM target JSON object (kind llvm, cuda or metal) as a Target; TVM validates the rest."""
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise TargetError(f"--target looks like JSON but does not parse ({e})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
        raise TargetError('a JSON --target must be an object with a "kind", e.g. '
                          '{"kind": "llvm", "mcpu": "cortex-a55", "mtriple": "aarch64-linux-gnu"}')
    kind = spec["kind"]
    if kind not in ("llvm", "cuda", "metal"):
        raise TargetError(f"JSON targets of kind {kind!r} are not supported yet; use llvm, cuda or metal, or a preset")
    if kind == "metal":
        spec.setdefault("host", dict(_MAC_HOST))
        return Target(name="metal-custom", description=f"custom TVM target {json.dumps(spec)}", tvm=spec,
                      runtime_arch="aarch64", runtime_os="macos", device="metal")
    cpu = spec if kind == "llvm" else spec.setdefault("host", dict(_GPU_SERVER_HOST))
    if not isinstance(cpu, dict):
        raise TargetError('the "host" of a JSON cuda target must be an llvm target object')
    triple = str(cpu.get("mtriple", ""))
    arch = _TRIPLE_ARCH.get(triple.split("-")[0]) if triple else HOST_ARCH
    if arch is None:
        raise TargetError(f"mtriple {triple!r} is for an architecture mlc cannot package a runtime for "
                          f"(supported: {', '.join(sorted(set(_TRIPLE_ARCH.values())))})")
    if kind == "cuda":
        return Target(name=f"cuda-{spec.get('arch', 'custom')}", description=f"custom TVM target {json.dumps(spec)}",
                      tvm=spec, runtime_arch=arch, device="cuda")
    spec.setdefault("num-cores", usable_cores() if arch == HOST_ARCH else 4)
    mcpu = str(spec.get("mcpu", "generic"))
    return Target(name=f"llvm-{mcpu}", description=f"custom TVM target {json.dumps(spec)}", tvm=spec, runtime_arch=arch)


def describe_all() -> list[dict[str, str]]:
    """One row per preset for `mlc targets`; a preset that does not apply here says why."""
    rows = []
    for name, factory in PRESETS.items():
        try:
            t = factory()
            rows.append({"name": name, "description": t.description, "tvm": json.dumps(t.tvm)})
        except TargetError as e:
            rows.append({"name": name, "description": f"unavailable here: {e}", "tvm": ""})
    return rows


def _llvm_cpu(target: Target) -> tuple[str, list[str], bool] | None:
    """(mcpu, mattr, whether ARM) of an LLVM target; None for another kind."""
    tvm = target.tvm
    if tvm.get("kind") != "llvm":
        return None
    mattr = tvm.get("mattr") or []
    mattr = mattr.split(",") if isinstance(mattr, str) else list(mattr)
    return str(tvm.get("mcpu", "")), mattr, str(tvm.get("mtriple", "x86_64")).startswith(("aarch64", "arm64"))


def int8_dot_feature(target: Target) -> str | None:
    """The CPU feature (its /proc/cpuinfo flag) of the target's int8 dot-product instructions, or None: x86
    avx512_vnni or avx_vnni (vpdpbusd), ARM asimddp (dotprod)."""
    cpu = _llvm_cpu(target)
    if cpu is None:
        return None
    mcpu, mattr, arm = cpu
    if arm:
        return "asimddp" if cpu_features.has(mcpu, mattr, "dotprod", arm) else None
    if cpu_features.has(mcpu, mattr, "avx512vnni", arm):
        return "avx512_vnni"
    if cpu_features.has(mcpu, mattr, "avxvnni", arm):
        return "avx_vnni"
    return None


def has_amx(target: Target) -> bool:
    """Whether the target's CPU has AMX tiles (x86 Sapphire Rapids and later: int8 and bf16 dense layers and convs
    run on them)."""
    cpu = _llvm_cpu(target)
    return cpu is not None and not cpu[2] and cpu_features.has(cpu[0], cpu[1], "amx-tile", False)


def has_int8_dot(target: Target) -> bool:
    """Whether the target's CPU has int8 dot-product instructions (--quantize)."""
    return int8_dot_feature(target) is not None


def bf16_dot_feature(target: Target) -> str | None:
    """The CPU feature (its /proc/cpuinfo flag) of the target's bf16 dot-product instructions, or None: x86
    avx512_bf16 (vdpbf16ps), ARM bf16 (bfdot)."""
    cpu = _llvm_cpu(target)
    if cpu is None:
        return None
    mcpu, mattr, arm = cpu
    if arm:
        return "bf16" if cpu_features.has(mcpu, mattr, "bf16", arm) else None
    if cpu_features.has(mcpu, mattr, "avx512bf16", arm):
        return "avx512_bf16"
    return None


def cuda_arch_number(target: Target) -> int:
    """The compute capability of a CUDA target as a number (sm_90a -> 90); 0 where it names none."""
    digits = re.match(r"sm_(\d+)", str(target.tvm.get("arch", "")))
    return int(digits.group(1)) if digits else 0


def has_bf16_dot(target: Target) -> bool:
    """Whether the target's CPU has the bf16 dot-product instructions mlc's bf16 kernels use (--precision bf16)."""
    return bf16_dot_feature(target) is not None
