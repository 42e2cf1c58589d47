"""Where an int8 artifact's time goes, per kernel (the VM's instrument: every call timed one by one, mlc's
`Runner.profile`), grouped by kind: convs that end in a uint8 requantise (their kernel's output is uint8), other
convs and matmuls, stand-alone quantise / clamp / cast kernels, the rest. Several artifacts are profiled in turn,
round by round in one process, so they see the same machine; each kernel's time is its fastest round.

    .venv/bin/python benchmarks/int8/profile.py --artifact before=DIR --artifact after=DIR -o results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root


def kind(name: str) -> str:
    """From the fused kernel's name (FuseOps joins its ops' names): a requantise ends in the clamp and the cast."""
    if "conv2d" in name:
        return "conv + requantise (uint8 out)" if "minimum" in name else "conv"
    if "matmul" in name:
        return "matmul"
    if name.startswith("vm.builtin"):
        return "VM builtins"
    if "minimum" in name or name.startswith(("fused_cast", "fused_divide")):
        return "stand-alone quantise / clamp / cast"
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", action="append", required=True, help="LABEL=DIR (repeatable)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=1, help="model runs per profile call")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = "1"

    from mlc.bench.machine import machine_info
    from mlc.runtime.runner import Runner

    runners = {}
    for item in args.artifact:
        label, path = item.split("=", 1)
        runner = Runner(Path(path))
        with np.load(Path(path) / runner.manifest["reference"]["inputs"]) as npz:
            runners[label] = (runner, {k: npz[k] for k in npz.files})
    totals: dict[str, dict[str, list]] = {label: {} for label in runners}
    for _ in range(args.rounds):
        for label, (runner, feeds) in runners.items():
            for row in runner.profile(feeds, runs=args.runs):
                totals[label].setdefault(row["name"], [row["calls"], []])[1].append(row["ms"])
    report = {"benchmark": "int8 per-kernel profile", "rounds": args.rounds, "runs_per_round": args.runs,
              "artifacts": {}, "machine": machine_info()}
    for label, rows in totals.items():
        # the fastest round: on a shared machine the slow ones are other jobs' time
        kernels = sorted(({"name": n, "calls": c, "ms": round(float(np.min(ms)), 3),
                           "median_ms": round(float(np.median(ms)), 3), "kind": kind(n)}
                          for n, (c, ms) in rows.items()), key=lambda r: -r["ms"])
        whole = sum(k["ms"] for k in kernels)
        kinds: dict[str, dict] = {}
        for k in kernels:
            entry = kinds.setdefault(k["kind"], {"kernels": 0, "calls": 0, "ms": 0.0})
            entry["kernels"] += 1
            entry["calls"] += k["calls"]
            entry["ms"] = round(entry["ms"] + k["ms"], 3)
        for entry in kinds.values():
            entry["share"] = round(entry["ms"] / whole, 3)
        calls = sum(k["calls"] for k in kernels)
        report["artifacts"][label] = {"path": dict(a.split("=", 1) for a in args.artifact)[label],
                                      "sum_of_kernels_ms": round(whole, 3), "kernel_calls": calls,
                                      "by_kind": kinds, "kernels": kernels}
        print(f"{label}: {whole:.1f} ms over {len(kernels)} callees, {calls} calls")
        for name, entry in sorted(kinds.items(), key=lambda kv: -kv[1]["ms"]):
            print(f"  {name:40s} {entry['ms']:8.2f} ms {entry['share']:6.1%}  ({entry['calls']} calls)")
        for k in kernels[:12]:
            print(f"    {k['ms']:7.2f} ms x{k['calls']:<3d} {k['name'][:100]}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
