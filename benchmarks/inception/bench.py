"""Inception v1/v2 (benchmarks/inception/build_models.py): mlc artifacts against OpenVINO fp32 (LATENCY hint) and
ONNX Runtime, interleaved call by call in one process at a fixed thread count (the order rotating each round).
Several artifacts of one model (a before and an after build) are timed in the same rounds, so their ratio is read
on the same machine state.

    .venv/bin/python benchmarks/inception/bench.py --onnx inception_v1.onnx --artifact before=ART0 \
        --artifact after=ART1 --threads 1 --label "v1" -o benchmarks/inception/results/x.json   # appends a row
    .venv/bin/python benchmarks/inception/bench.py --onnx inception_v1.onnx --artifact now=ART --profile \
        -o benchmarks/inception/results/profile.json   # per-kernel (mlc) and per-layer (OpenVINO) times
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root


def _args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--artifact", action="append", required=True, help="NAME=DIR (repeatable)")
    parser.add_argument("--label", default="")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--ov-precision", default="f32", help="OpenVINO's inference precision for --profile (bf16: "
                                                              "its default on CPUs that have it)")
    parser.add_argument("-o", "--output", type=Path, required=True)
    return parser.parse_args()


def _timers(args):
    import onnxruntime as ort

    from mlc.bench.baselines import openvino_model
    from mlc.runtime.runner import Runner

    timers, runners, feeds = {}, {}, None
    for spec in args.artifact:
        name, _, path = spec.partition("=")
        runner = runners[name] = Runner(Path(path))
        if feeds is None:
            with np.load(Path(path) / runner.manifest["reference"]["inputs"]) as npz:
                feeds = {k: npz[k] for k in npz.files}
        timers[name] = lambda runner=runner, feeds=feeds: runner.measure(feeds, warmup=0, repeat=1)[1]["mean_ms"] / 1e3
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    session = ort.InferenceSession(str(args.onnx), options, providers=["CPUExecutionProvider"])

    def time_ort() -> float:
        start = time.perf_counter()
        session.run(None, feeds)
        return time.perf_counter() - start

    compiled, precision = openvino_model(args.onnx, args.threads, "f32")
    assert precision == "f32", precision
    request = compiled.create_infer_request()

    def time_ov() -> float:
        start = time.perf_counter()
        request.infer(feeds)
        return time.perf_counter() - start

    timers.update(ort=time_ort, openvino_fp32=time_ov)
    return timers, runners, feeds, (args.onnx, args.threads)


def _profile(runners, feeds, ov_model, precision: str) -> dict:
    import openvino as ov

    compiled = ov.Core().compile_model(str(ov_model[0]), "CPU", {
        "INFERENCE_NUM_THREADS": ov_model[1], "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision,
        "PERF_COUNT": True})
    request = compiled.create_infer_request()
    for _ in range(5):
        request.infer(feeds)
    totals: dict = {}
    for _ in range(10):
        request.infer(feeds)
        for info in request.get_profiling_info():
            key = (info.node_name, info.node_type, info.exec_type)
            totals[key] = totals.get(key, 0.0) + info.real_time.total_seconds() * 1e3 / 10
    ov_rows = sorted(({"name": k[0], "type": k[1], "exec": k[2], "ms": round(v, 4)} for k, v in totals.items()
                      if v > 0), key=lambda r: -r["ms"])
    return {f"openvino_{precision}": ov_rows,
            **{name: [dict(r, ms=round(r["ms"], 4)) for r in runner.profile(feeds, runs=10)]
               for name, runner in runners.items()}}


def main() -> None:
    args = _args()
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    from mlc.bench.machine import load_average, machine_info

    timers, runners, feeds, ov_model = _timers(args)
    if args.profile:
        doc = {"machine": machine_info(), "load_average": load_average(), "threads": args.threads,
               "onnx": args.onnx.name, "profiles": _profile(runners, feeds, ov_model, args.ov_precision)}
        args.output.write_text(json.dumps(doc, indent=1) + "\n")
        return
    names = list(timers)
    for _ in range(args.warmup):
        [timers[n]() for n in names]
    times = {n: [] for n in names}
    load_start = load_average()
    for i in range(args.rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for n in order:
            times[n].append(timers[n]())
    t = {n: np.array(v) for n, v in times.items()}
    row = {"label": args.label, "onnx": args.onnx.name, "threads": args.threads, "rounds": args.rounds,
           "p50_ms": {n: round(float(np.median(v)) * 1e3, 3) for n, v in t.items()},
           "load_average": [load_start, load_average()]}

    def ratio(a, b):
        r = t[a] / t[b]
        return {"median": round(float(np.median(r)), 3),
                "p10_p90": [round(float(np.percentile(r, q)), 3) for q in (10, 90)]}

    mlc_names = [n for n in names if n in runners]
    row["ratios"] = {f"{a}/{b}": ratio(a, b) for a in mlc_names for b in ("openvino_fp32", "ort")}
    row["ratios"].update({f"{a}/{b}": ratio(a, b) for i, a in enumerate(mlc_names) for b in mlc_names[:i]})
    machine = machine_info()
    row.update(commit=machine.get("commit"), date=machine["date"])
    doc = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "inception", "rows": []}
    doc["machine"] = machine
    doc["rows"].append(row)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
