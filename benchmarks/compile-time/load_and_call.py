"""Two artifacts of one model (e.g. weights inside the library, and beside it): each one's load in a fresh process
(wall time and peak RSS), then both timed interleaved call by call in one process (1 thread, process CPU time per
call, the minimum over --rounds batches of --calls calls).

    PYTHONPATH=$PWD python benchmarks/compile-time/load_and_call.py before=/tmp/bb-base after=/tmp/bb-main \\
        -o benchmarks/compile-time/results/weights-beside.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mlc.bench.machine import machine_info
from mlc.runtime.runner import Runner, load_npz

_LOAD = """
import resource, sys, time
from mlc.runtime.runner import Runner, load_npz
start = time.perf_counter()
runner = Runner(sys.argv[1], verify=False)
loaded = time.perf_counter() - start
runner.run(load_npz(runner.root / runner.manifest["reference"]["inputs"]))
print(loaded, time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def load_in_fresh_process(artifact: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", _LOAD, artifact], env=env, capture_output=True, text=True, check=True)
    load_s, first_call_s, peak_mb = map(float, out.stdout.split())
    return {"load_s": round(load_s, 3), "load_and_first_call_s": round(first_call_s, 3), "peak_rss_mb": round(peak_mb)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifacts", nargs="+", help="LABEL=DIR")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    labels = dict(a.split("=", 1) for a in args.artifacts)
    result = {"benchmark": "artifact load and per-call time, interleaved", "artifacts": labels,
              "load": {k: load_in_fresh_process(v) for k, v in labels.items()}}
    calls = {}
    for label, path in labels.items():
        runner = Runner(path, verify=False)
        feeds = load_npz(Path(path) / runner.manifest["reference"]["inputs"])
        tensors = [runner._to_device(a) for a in runner.prepare(feeds)[0]]  # timing the call alone
        calls[label] = (runner._mains[None], tensors)
    best = {label: float("inf") for label in labels}
    for _ in range(args.rounds):
        for label, (main, tensors) in calls.items():
            main(*tensors)
            start = time.process_time()
            for _ in range(args.calls):
                main(*tensors)
            best[label] = min(best[label], (time.process_time() - start) / args.calls)
    result["call_ms"] = {k: round(v * 1e3, 4) for k, v in best.items()}
    first = next(iter(labels))
    result["call_ratio_to_" + first] = {k: round(v / best[first], 4) for k, v in best.items()}
    result["machine"] = machine_info()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))


if __name__ == "__main__":
    main()
