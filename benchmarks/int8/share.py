"""Share of the int8 peak (#22): int8 artifacts timed in turn, call by call in one process (--rounds each, 1
thread), each at its fastest call (the call least slowed by other jobs, like the peak's best reading); the model's
matmul/conv ops (benchmarks/precision/peak.py's model_flops, 2 x multiply-adds) over that time, against one core's
vpdpbusd peak measured now (peak.c, best of --runs readings).

    .venv/bin/python benchmarks/int8/share.py --artifact "resnet50 before=DIR" --onnx "resnet50=r.onnx" ... \
        -o benchmarks/int8/results/peak-share.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repo root
sys.path.insert(0, str(HERE.parent / "precision"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", action="append", required=True, help="LABEL=DIR (repeatable)")
    parser.add_argument("--onnx", action="append", required=True, help="PREFIX=PATH: the model of the labels so named")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = "1"

    from peak import instruction_peaks, model_flops, one_clock

    from mlc.bench.machine import load_average, machine_info
    from mlc.runtime.runner import Runner

    models = dict(item.split("=", 1) for item in args.onnx)
    runners = {}
    for item in args.artifact:
        label, path = item.split("=", 1)
        runner = Runner(Path(path))
        with np.load(Path(path) / runner.manifest["reference"]["inputs"]) as npz:
            feeds = {k: npz[k] for k in npz.files}
        runner.run(feeds)  # warm-up
        runners[label] = (runner, feeds)
    times: dict[str, list[float]] = {label: [] for label in runners}
    load = [load_average()]
    for _ in range(args.rounds):
        for label, (runner, feeds) in runners.items():
            start = time.perf_counter()
            runner.run(feeds)
            times[label].append(time.perf_counter() - start)
    load.append(load_average())
    peaks = one_clock(instruction_peaks(args.runs))
    rows = []
    for label, (runner, _) in runners.items():
        model = next(k for k in models if label.startswith(k))
        shapes = {i["name"]: tuple(i["shape"]) for i in runner.manifest["inputs"]}
        gop = model_flops(Path(models[model]), shapes) / 1e9
        fastest, median = min(times[label]), float(np.median(times[label]))
        rows.append({"label": label, "gop": round(gop, 2), "min_ms": round(fastest * 1e3, 2),
                     "p50_ms": round(median * 1e3, 2), "gops_at_min": round(gop / fastest, 1),
                     "share_of_int8_peak": round(gop / fastest / peaks["int8"], 3)})
        print(rows[-1])
    report = {"benchmark": "int8 share of peak", "rounds": args.rounds, "threads": 1, "peak_gops": peaks,
              "load_average": load, "rows": rows, "machine": machine_info()}
    args.output.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
