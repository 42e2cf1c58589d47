"""mlc untuned vs default schedules vs tuned vs ONNX Runtime (vs PyTorch eager where the model has
a PyTorch source), side by side in one run, with the tuning time and budget.

    .venv/bin/python benchmarks/tuning/tuning.py --models zoo:transformer,zoo:cnn --budget 10m

Models are mlc model specs (zoo:NAME or a path to .onnx). Each model gets its own tuning database
under --work (kept, so a rerun with a larger budget continues it)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
from mlc.bench.machine import machine_info

import mlc.api as api
from mlc import tuning


def _stats(times_s: list[float]) -> dict:
    ms = np.array(times_s) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 4), "mean_ms": round(float(ms.mean()), 4),
            "p90_ms": round(float(np.percentile(ms, 90)), 4), "runs": len(ms)}


def ort_latency(model_path: str, feeds: dict, warmup: int, repeat: int, threads: int) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in wanted}
    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return _stats(times)


def mlc_latency(artifact: Path, warmup: int, repeat: int) -> dict:
    result = api.run(artifact, None, warmup=warmup, repeat=repeat)
    return {"p50_ms": round(result.latency["p50_ms"], 4), "mean_ms": round(result.latency["mean_ms"], 4),
            "p90_ms": round(result.latency["p90_ms"], 4), "runs": result.latency["runs"]}


def bench_model(spec: str, work: Path, budget: str, trials: int | None, warmup: int, repeat: int, threads: int) -> dict:
    name = api.model_name(spec)
    row: dict = {"model": spec}
    builds = {}
    for variant, kwargs in (("untuned", {"default_schedules": False}), ("default", {})):
        start = time.perf_counter()
        result = api.compile(spec, output=work / f"{name}-{variant}", db=None, **kwargs)
        builds[variant] = result
        row[f"mlc_{variant}"] = {**mlc_latency(result.path, warmup, repeat),
                                 "compile_s": round(time.perf_counter() - start, 1),
                                 "check_passed": result.check.passed if result.check else None}
    db = work / f"{name}-db"
    tuned = tuning.tune(spec, db=db, trials=trials, budget=budget)
    row["tuning"] = {"budget": budget, "trials_per_kernel": trials, "seconds": round(tuned.seconds, 1),
                     "trials_this_run": tuned.trials, "failed_trials": tuned.errors, "records_in_db": tuned.records,
                     "records_from_earlier_runs": tuned.records - tuned.trials,
                     "stopped_by": tuned.reason, "kernels": len(tuned.tasks)}
    start = time.perf_counter()
    result = api.compile(spec, output=work / f"{name}-tuned", db=db)
    row["mlc_tuned"] = {**mlc_latency(result.path, warmup, repeat), "compile_s": round(time.perf_counter() - start, 1),
                        "check_passed": result.check.passed if result.check else None,
                        "kernels": {k: len(v) for k, v in (result.manifest.compile.schedules or {}).items()}}
    # ORT on the model as given, at the tuned artifact's (static) reference inputs.
    manifest = result.manifest
    feeds = api.read_npz(result.path / manifest.reference.inputs)
    source = work / f"{name}.onnx"
    if spec.startswith("zoo:"):
        from mlc.models import get

        source.write_bytes(get(spec).build().SerializeToString())
    else:
        source = Path(spec)
    row["onnxruntime"] = ort_latency(str(source), feeds, warmup, repeat, threads)
    row["pytorch_eager"] = None  # the zoo's ONNX-built models have no PyTorch source
    row["inputs"] = {i.name: i.shape for i in manifest.inputs}
    ort_ms = row["onnxruntime"]["p50_ms"]
    row["speedup_vs_ort"] = {v: round(ort_ms / row[f"mlc_{v}"]["p50_ms"], 3) for v in ("untuned", "default", "tuned")}
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="zoo:transformer,zoo:cnn")
    parser.add_argument("--budget", default="10m", help="tuning wall time per model")
    parser.add_argument("--trials", type=int, default=None,
                        help="trials per kernel (with --budget: whichever ends first)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("benchmarks/work-tuning"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "tuning.json")
    args = parser.parse_args()
    from mlc.targets import resolve, usable_cores

    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.models.split(","):
        rows.append(bench_model(spec, args.work, args.budget, args.trials, args.warmup, args.repeat, usable_cores()))
        print(json.dumps(rows[-1], indent=1), flush=True)
    result = {"benchmark": "tuning", "machine": machine_info(), "target": resolve("x86").tvm,
              "note": "mlc artifacts run through the thin Python runtime; p50 of --repeat runs after --warmup",
              "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
