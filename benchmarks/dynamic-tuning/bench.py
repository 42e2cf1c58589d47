"""A --dynamic build whose symbolic kernels took the records of their static twins (`mlc tune --dynamic`) against
the same build with mlc's default schedules, and against the static build tuned at the twins' length; timed
interleaved in one process, call by call (1 thread; process CPU time, the minimum of --rounds batches: the
machine is shared). Per kernel: each kernel that took a record, timed in both dynamic builds (the VM's
instrument, wall time, the minimum of --rounds profiles), so a tuned kernel slower than its default shows.

    mlc tune zoo:bert-tiny --db DB --trials 32 --threads 1 --dynamic seq=1..512 \\
        --input-shape input_ids:1x128 --input-shape attention_mask:1x128
    mlc compile zoo:bert-tiny -o A/dyn-tuned --dynamic seq=1..512 --db DB
    mlc compile zoo:bert-tiny -o A/dyn-default --dynamic seq=1..512
    mlc compile zoo:bert-tiny -o A/s128-tuned --input-shape input_ids:1x128 --input-shape attention_mask:1x128 --db DB
    PYTHONPATH=$PWD python benchmarks/dynamic-tuning/bench.py A/dyn-tuned A/dyn-default --static 128=A/s128-tuned \\
        --lengths 8,32,64,128,200,512 -o benchmarks/dynamic-tuning/results/bert-tiny.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np


def _feeds(length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(length)
    return {"input_ids": rng.integers(0, 30522, (1, length)).astype(np.int64),
            "attention_mask": np.ones((1, length), np.int64)}


def _cpu_time(runner, feeds, number: int) -> float:
    start = time.process_time()
    for _ in range(number):
        runner.run(feeds)
    return (time.process_time() - start) / number


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tuned", help="the --dynamic build with --db")
    parser.add_argument("default", help="the --dynamic build without --db")
    parser.add_argument("--static", action="append", default=[], help="LENGTH=DIR: a static build (tuned)")
    parser.add_argument("--lengths", required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    from mlc.bench import machine
    from mlc.runtime.runner import Runner

    tuned_manifest = json.loads((Path(args.tuned) / "manifest.json").read_text())
    tuned_at = dict(entry.split(": ", 1) for entry in tuned_manifest["compile"]["schedules"].get("tuned_at", []))
    runners = {"dynamic_tuned": Runner(args.tuned), "dynamic_default": Runner(args.default)}
    statics = {int(k): Runner(v) for k, v in (s.split("=", 1) for s in args.static)}
    doc = {"machine": machine.machine_info(), "command": " ".join(sys.argv), "threads": 1,
           "tuned_at": tuned_at, "results": []}
    for length in [int(x) for x in args.lengths.split(",")]:
        feeds = _feeds(length)
        variants = dict(runners)
        if length in statics:
            variants["static_tuned"] = statics[length]
        outputs = {label: r.run(feeds) for label, r in variants.items()}
        reference = outputs["dynamic_default"]
        diff = {label: max(float(np.max(np.abs(out[k] - reference[k]))) for k in reference)
                for label, out in outputs.items()}
        one = _cpu_time(variants["dynamic_default"], feeds, 2)
        number = max(1, int(args.min_time / max(one, 1e-6)))
        times: dict[str, list[float]] = {label: [] for label in variants}
        kernels: dict[str, dict[str, float]] = {"dynamic_tuned": {}, "dynamic_default": {}}
        for _ in range(args.rounds):
            for label, runner in variants.items():
                times[label].append(_cpu_time(runner, feeds, number))
            for label in kernels:
                for row in variants[label].profile(feeds, runs=3):
                    name = row["name"].removesuffix("_prepacked")  # the default rule's repacked-weight kernels
                    if name in tuned_at:
                        best = kernels[label].get(name)
                        kernels[label][name] = row["ms"] if best is None else min(best, row["ms"])
        best = {label: min(t) * 1e3 for label, t in times.items()}
        row = {"length": length, "ms": best,
               "median_ms": {label: float(np.median(t)) * 1e3 for label, t in times.items()},
               "tuned_over_default": best["dynamic_tuned"] / best["dynamic_default"],
               "kernels_ms": {name: {"tuned": kernels["dynamic_tuned"].get(name),
                                     "default": kernels["dynamic_default"].get(name)} for name in sorted(tuned_at)},
               "max_abs_diff_vs_default": diff, "number": number, "rounds": args.rounds,
               "load_average": machine.load_average()}
        if "static_tuned" in best:
            row["dynamic_tuned_over_static_tuned"] = best["dynamic_tuned"] / best["static_tuned"]
        doc["results"].append(row)
        slower = [n for n, k in row["kernels_ms"].items() if k["tuned"] and k["default"] and k["tuned"] > k["default"]]
        print(f"seq {length:4d}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in best.items())
              + f"; tuned/default {row['tuned_over_default']:.3f}; kernels slower tuned: {slower}", flush=True)
        if args.output:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
