"""Does a refactor change what mlc builds? Compile the same models at two commits and compare the artifacts (#38).

    .venv/bin/python benchmarks/refactor-check/compare.py --before 5645d67            # after = the working tree
    .venv/bin/python benchmarks/refactor-check/compare.py --before 5645d67 --after HEAD -o results/x.json

Each side is compiled by the same venv's `mlc`, with PYTHONPATH pointing at a git worktree of that commit (or at this
checkout for the working tree). Per case it compares model.so, model.weights and kernels/cuda.cu byte for byte (where
model.so differs, it names the functions whose code differs), and for artifacts this machine can run (x86), the
outputs of both on the same reference inputs, bit for bit. A CUDA
model.so also holds the GPU code NVRTC compiled, so for CUDA the generated source (kernels/cuda.cu) is the kernels.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MLC = str(Path(sys.executable).with_name("mlc"))
# (name, model, target, extra flags): the demo, a CPU CNN and MLP, an ARM compile, CUDA builds, and the reduced
# precisions (bf16 and int8 on the CPU, fp16 and bf16 on CUDA).
CASES = [
    ("demo-bert-tiny-x86", "zoo:bert-tiny", "x86", ["--framework", "torch"]),
    ("mlp-x86", "zoo:mlp", "x86", []),
    ("cnn-x86", "zoo:cnn", "x86", []),
    ("mlp-graviton2", "zoo:mlp", "graviton2", []),
    ("mlp-cuda-h100", "zoo:mlp", "cuda-h100", []),
    ("cnn-cuda-h100", "zoo:cnn", "cuda-h100", []),
    ("mlp-bf16-x86", "zoo:mlp", "x86", ["--precision", "bf16"]),
    ("cnn-int8-x86", "zoo:cnn", "x86", ["--quantize", "int8"]),
    ("bert-tiny-fp16-cuda-h100", "zoo:bert-tiny", "cuda-h100", ["--precision", "fp16"]),
    ("mlp-bf16-cuda-h100", "zoo:mlp", "cuda-h100", ["--precision", "bf16"]),
]
FILES = ("model.so", "model.weights", "kernels/cuda.cu")


def _rev(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def _source(rev: str | None, scratch: Path) -> tuple[Path, str]:
    """The tree to import mlc from, and how the record names it."""
    if rev is None:
        dirty = subprocess.run(["git", "status", "--porcelain", "mlc"], cwd=ROOT, capture_output=True, text=True)
        return ROOT, f"{_rev('HEAD')}{' + working tree' if dirty.stdout.strip() else ''}"
    tree = scratch / f"tree-{_rev(rev)}"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True, capture_output=True)
    return tree, _rev(rev)


def _compile(tree: Path, case: tuple, out: Path) -> int:
    _, model, target, flags = case
    # model.so is not byte-reproducible run to run, with any hash seed: zoo:cnn's host shape function
    # (shape_func_compute_) varies in instruction order. The record names the functions whose code differs.
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    log = out.with_suffix(".log")
    with log.open("w") as f:
        return subprocess.run([MLC, "compile", model, "--target", target, "-o", str(out), *flags], cwd=tree,
                              env=env, stdout=f, stderr=subprocess.STDOUT).returncode


def _outputs(artifact: Path) -> dict[str, np.ndarray]:
    """The artifact's outputs from its own shipped runtime (run.py), on its reference inputs."""
    out = artifact / "outputs-here.npz"
    subprocess.run([sys.executable, str(artifact / "run.py"), "-i", str(artifact / "reference" / "inputs.npz"),
                    "-o", str(out)], check=True, capture_output=True, env=dict(os.environ, TVM_NUM_THREADS="1"))
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


OBJDUMP = {"x86": "objdump", "cuda-h100": "objdump", "graviton2": "aarch64-linux-gnu-objdump"}


def _functions(library: Path, objdump: str) -> dict[str, list[str]]:
    """Each function's disassembly, its instructions without their addresses (which shift with any change before)."""
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True,
                          check=True).stdout
    functions: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.endswith(">:"):
            current = functions.setdefault(line.split("<", 1)[1][:-2], [])
        elif ":\t" in line:
            current.append(line.split(":\t", 1)[1].split("#")[0].split("<")[0].strip())
    return functions


def _differing_functions(a: Path, b: Path, target: str) -> list[str] | str:
    objdump = OBJDUMP.get(target)
    if not objdump or not shutil.which(objdump):
        return "not disassembled here"
    fa, fb = _functions(a, objdump), _functions(b, objdump)
    return sorted(name for name in fa.keys() | fb.keys() if fa.get(name) != fb.get(name))


def _compare(a: Path, b: Path, target: str) -> dict:
    row: dict = {}
    for name in FILES:
        fa, fb = a / name, b / name
        if fa.exists() or fb.exists():
            row[name] = "identical" if fa.exists() and fb.exists() and fa.read_bytes() == fb.read_bytes() else "differs"
    if row.get("model.so") == "differs" and (a / "model.so").exists() and (b / "model.so").exists():
        row["model.so functions that differ"] = _differing_functions(a / "model.so", b / "model.so", target)
    if target == "x86":
        oa, ob = _outputs(a), _outputs(b)
        same = oa.keys() == ob.keys() and all(np.array_equal(oa[k], ob[k], equal_nan=True) for k in oa)
        row["outputs"] = "bit-identical" if same else "differ"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit before the refactor")
    parser.add_argument("--after", help="a commit (default: this checkout's working tree)")
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("-o", "--output", help="write the record as JSON here")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or c[0] in args.only.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="mlc-refactor-check-"))
    trees = []
    try:
        (before, before_name), (after, after_name) = _source(args.before, scratch), _source(args.after, scratch)
        trees = [t for t in (before, after) if t != ROOT]
        rows = {}
        for case in cases:
            a, b = scratch / f"{case[0]}-before", scratch / f"{case[0]}-after"
            codes = _compile(before, case, a), _compile(after, case, b)
            rows[case[0]] = _compare(a, b, case[2]) if codes == (0, 0) else {"exit codes": list(codes)}
            print(case[0], json.dumps(rows[case[0]]), flush=True)
    finally:
        for tree in trees:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    from mlc.bench.machine import machine_info

    record = {"before": before_name, "after": after_name, "cases": rows, "machine": machine_info(),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if args.output:
        Path(args.output).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
