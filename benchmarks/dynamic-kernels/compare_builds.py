"""Several builds of one model timed interleaved call by call in one process (1 thread; process CPU time, the
minimum of --rounds batches of --min-time seconds), per size: symbolic builds (e.g. before and after a change)
against the static build of that size. Nothing is profiled (a VM instrument adds a Python call per VM call).

    PYTHONPATH=$PWD python benchmarks/dynamic-kernels/compare_builds.py --dim seq --onnx /tmp/bert/model.onnx \\
        --symbolic before=/tmp/sym-before --symbolic after=/tmp/sym-after \\
        --static 8=/tmp/static-8 --static 16=/tmp/static-16 -o benchmarks/dynamic-kernels/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from symbolic_vs_static import _cpu_time, _feeds, _inputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnx", required=True, help="the model (for its inputs)")
    parser.add_argument("--dim", required=True)
    parser.add_argument("--symbolic", action="append", required=True, help="LABEL=DIR")
    parser.add_argument("--static", action="append", required=True, help="SIZE=DIR")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    from mlc.bench import machine
    from mlc.runtime.runner import Runner

    inputs = _inputs(args.onnx)
    symbolic = {label: Runner(path) for label, path in (s.split("=", 1) for s in args.symbolic)}
    doc = {"machine": machine.machine_info(), "command": " ".join(sys.argv), "dim": args.dim, "results": []}
    for size, path in (s.split("=", 1) for s in args.static):
        static = Runner(path)
        feeds = _feeds(inputs, args.dim, int(size))
        variants = {**symbolic, "static": static}
        reference = static.run(feeds)
        diff = {label: max(float(np.max(np.abs(r.run(feeds)[k] - reference[k]))) for k in reference)
                for label, r in symbolic.items()}
        number = max(1, int(args.min_time / max(_cpu_time(static, feeds, 2), 1e-6)))
        times: dict[str, list[float]] = {label: [] for label in variants}
        for _ in range(args.rounds):
            for label, runner in variants.items():
                times[label].append(_cpu_time(runner, feeds, number))
        best = {label: min(t) * 1e3 for label, t in times.items()}
        row = {"size": int(size), "ms": best, "median_ms": {k: float(np.median(t)) * 1e3 for k, t in times.items()},
               "over_static": {label: best[label] / best["static"] for label in symbolic},
               "max_abs_diff_vs_static": diff, "number": number, "rounds": args.rounds,
               "load_average": machine.load_average()}
        doc["results"].append(row)
        print(f"{args.dim} {int(size):4d}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in best.items()) + "; / static: "
              + ", ".join(f"{k} {v:.3f}" for k, v in row["over_static"].items()), flush=True)
        del static
        if args.output:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
