"""Which CPU features each LLVM cpu name has, for the features mlc's kernels choose by: the vector width, int8 and
bf16 dot products, AMX. One table (`llvm_cpu_table.py`), generated from the LLVM inside the pinned TVM, serves the
client (which does not import TVM) and the compile worker alike. Regenerate after a TVM upgrade:
`python -c 'from mlc.compiler import cpu_table; cpu_table.write()'` (a test fails until it is done)."""

from __future__ import annotations

from mlc.targets.llvm_cpu_table import CPUS_WITH

# LLVM feature names, by architecture, that the table records
FEATURES = {"x86_64": ("avx512f", "avx512vnni", "avxvnni", "avx512bf16", "amx-tile"),
            "aarch64": ("dotprod", "bf16")}
# Names LLVM accepts but leaves out of its cpu list (aliases); mlc's presets use apple-m1
ALIASES = {"x86_64": (), "aarch64": ("apple-m1", "apple-m2", "apple-m3")}


def has(mcpu: str, mattr: list[str], feature: str, arm: bool) -> bool:
    """Whether an LLVM target has `feature`: its cpu has it in LLVM's tables or its mattr adds it, and mattr does
    not take it away."""
    cpus = CPUS_WITH["aarch64" if arm else "x86_64"][feature]
    return f"-{feature}" not in mattr and (mcpu in cpus or f"+{feature}" in mattr)


def vector_lanes(mcpu: str, mattr: list[str], arm: bool) -> int:
    """fp32 lanes of the widest vector mlc's kernels use: 16 with AVX-512, 8 with AVX2, 4 on ARM NEON."""
    if arm:
        return 4
    return 16 if has(mcpu, mattr, "avx512f", arm) else 8
