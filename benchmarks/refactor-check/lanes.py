"""What one table of CPU capabilities changed (#38, dd87294): before it, the schedules read the vector width from a
substring list that gave 8 lanes to AVX-512 CPUs the presets treated as AVX-512. Builds zoo:mlp for each such CPU at
two commits and counts the 512-bit (zmm) instructions in model.so.

    .venv/bin/python benchmarks/refactor-check/lanes.py --before dd87294~1 --after HEAD -o results/lanes.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MLC = str(Path(sys.executable).with_name("mlc"))
# The CPUs dd87294's commit message lists as changed, and one that did not change (skylake-avx512: AVX-512 both times)
CPUS = ["tigerlake", "rocketlake", "emeraldrapids", "graniterapids", "cannonlake", "skx", "skylake-avx512"]


def _tree(rev: str, scratch: Path) -> Path:
    tree = scratch / rev.replace("~", "_")
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True, capture_output=True)
    return tree


def _zmm(tree: Path, cpu: str, out: Path) -> int | str:
    target = json.dumps({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": cpu})
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [MLC, "compile", "zoo:mlp", "--target", target, "-o", str(out), "--no-check"]
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if "No such option" in proc.stderr:  # before --no-check (560d215): the check may fail on this CPU's code
        proc = subprocess.run(command[:-1], cwd=tree, env=env, capture_output=True, text=True)
    if not (out / "model.so").is_file():
        return f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1][:200]}"
    listing = subprocess.run(["objdump", "-d", str(out / "model.so")], capture_output=True, text=True).stdout
    return len(re.findall(r"%zmm\d+", listing))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="dd87294~1")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mlc-lanes-"))
    trees = []
    try:
        trees = [_tree(args.before, scratch), _tree(args.after, scratch)]
        rows = {}
        for cpu in CPUS:
            rows[cpu] = {side: _zmm(tree, cpu, scratch / f"{cpu}-{side}")
                         for side, tree in zip(("before", "after"), trees)}
            print(cpu, json.dumps(rows[cpu]), flush=True)
    finally:
        for tree in trees:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    from mlc.bench.machine import machine_info

    record = {"before": args.before, "after": args.after, "zmm_operands_in_model_so": rows, "machine": machine_info(),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if args.output:
        Path(args.output).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
