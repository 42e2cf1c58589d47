"""Batched throughput on #39's broad CPU list: mlc's fp32 artifact compiled at batch N, one batched call at a time,
against OpenVINO fp32 with its THROUGHPUT hint (its optimal number of infer requests in flight on an
AsyncInferQueue, one stream per core) and ONNX Runtime fp32 (intra-op threads = --threads, one call at a time), all
on the same batch-N ONNX file, in one process, in samples/s.

Each round runs each engine once on `--per-round` batches (OpenVINO: as many requests, in flight together), the
starting engine rotating; ratios are medians of the per-round ratios, with their min and max.

    .venv-suites/bin/python benchmarks/throughput/throughput.py --work /tmp/throughput --batches 8,32 --threads 2 \
        -o benchmarks/throughput/results/throughput-COMMIT.json

The batch-N ONNX files: torch and transformers models are exported again at batch N (`mlc export --input-shape`);
the Caffe2 graphs, fixed at batch 1 with the batch in their Reshape shapes, are re-batched here and checked against
ONNX Runtime sample by sample (`rebatch`)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repo root
sys.path.insert(0, str(HERE.parent / "precision"))

import broad_models  # noqa: E402
from model_set import _geomean, _run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/throughput"), help="exports and artifacts")
    parser.add_argument("--models", help="comma-separated labels of broad_models.MODELS (default: all)")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-round", type=int, default=2, help="batches each engine runs per round")
    parser.add_argument("--compile-timeout", type=int, default=1800)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--summary-only", action="store_true", help="only render the record's table")
    parser.add_argument("-o", "--output", type=Path, default=HERE / "results" / "throughput.json")
    parser.add_argument("--row", nargs=3, metavar=("LABEL", "BATCH", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        label, batch, folder = args.row
        _time_row(label, int(batch), Path(folder), int(args.threads), args.rounds, args.per_round, args.output)
        return
    labels = args.models.split(",") if args.models else list(broad_models.MODELS)
    for label in [] if args.summary_only else labels:
        for batch in (int(b) for b in args.batches.split(",")):
            folder = args.work / f"{label.replace(' ', '-')}-b{batch}"
            error = _build(label, batch, folder, args.compile_timeout)
            if args.build_only:
                continue
            for threads in args.threads.split(","):
                if not error:
                    error = _run([sys.executable, __file__, "--row", label, str(batch), str(folder), "--threads",
                                  threads, "--rounds", str(args.rounds), "--per-round", str(args.per_round),
                                  "-o", str(args.output)])
                if error:
                    _record(args.output, {"label": label, "batch": batch, "threads": int(threads), "missing": error})
    if not args.build_only:
        summary = args.output.with_suffix(".md")
        summary.write_text(render(json.loads(args.output.read_text()), list(broad_models.MODELS)))
        print(summary.read_text())


def batched_flags(flags: list[str], batch: int) -> list[str]:
    """`--input-shape=NAME:1x...` flags at batch `batch`."""
    return [re.sub(r"^(--input-shape=[^:]+:)1x", rf"\g<1>{batch}x", f) for f in flags]


def _build(label: str, batch: int, folder: Path, timeout: int) -> str:
    """The batch-`batch` ONNX file and mlc's fp32 artifact of it in `folder` (reused where they exist); '' or why
    one could not be made."""
    source, export_flags, compile_flags = broad_models.MODELS[label]
    onnx_path, artifact = folder / "model.onnx", folder / "fp32"
    folder.mkdir(parents=True, exist_ok=True)
    if not onnx_path.exists():
        if source.startswith("caffe2:"):
            error = _run([sys.executable, __file__.replace("throughput.py", "rebatch.py"), source[7:], str(batch),
                          str(onnx_path)], timeout)
        else:
            error = _run([sys.executable, "-m", "mlc", "export", source, *batched_flags(export_flags, batch),
                          "-o", str(onnx_path)], timeout)
        if error:
            return f"export: {error}"
    if not artifact.exists():
        error = _run([sys.executable, "-m", "mlc", "compile", str(onnx_path), *batched_flags(compile_flags, batch),
                      "-o", str(artifact)], timeout)
        if error:
            return f"mlc compile: {error}"
    return ""


def _time_row(label: str, batch: int, folder: Path, threads: int, rounds: int, per_round: int,
              output: Path) -> None:
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):  # before any thread pool starts
        os.environ[name] = str(threads)
    import openvino as ov

    from mlc.bench.baselines import openvino_model, ort_session
    from mlc.bench.machine import load_average, machine_info
    from mlc.runtime.runner import Runner

    runner = Runner(folder / "fp32")
    with np.load(folder / "fp32" / runner.manifest["reference"]["inputs"]) as npz:
        feeds = {k: npz[k] for k in npz.files}

    def mlc_fp32() -> None:
        for _ in range(per_round):
            runner.run(feeds)

    session = ort_session(folder / "model.onnx", threads, spinning=False)
    ort_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}

    def onnxruntime() -> None:
        for _ in range(per_round):
            session.run(None, ort_feeds)

    compiled, ran_at = openvino_model(folder / "model.onnx", threads, "f32", hint="THROUGHPUT")
    requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    queue = ov.AsyncInferQueue(compiled, requests)
    ov_feeds = {n: feeds[n] for port in compiled.inputs for n in port.get_names() if n in feeds}

    def openvino_throughput() -> None:
        for _ in range(per_round):
            queue.start_async(ov_feeds)
        queue.wait_all()

    engines = {"mlc fp32": mlc_fp32, "openvino fp32 THROUGHPUT": openvino_throughput,
               "onnxruntime fp32": onnxruntime}
    names = list(engines)
    for name in names:  # warm-up: first calls allocate and, for OpenVINO, fill every request's buffers
        engines[name]()
    rates: dict[str, list[float]] = {name: [] for name in names}
    load_start = load_average()
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            engines[name]()
            rates[name].append(batch * per_round / (time.perf_counter() - start))

    def ratio(over: str) -> dict:
        r = np.array(rates["mlc fp32"]) / np.array(rates[over])
        return {"median": round(float(np.median(r)), 3), "min": round(float(r.min()), 3),
                "max": round(float(r.max()), 3)}

    row = {"label": label, "batch": batch, "threads": threads, "rounds": rounds, "batches_per_round": per_round,
           "inputs": {k: list(v.shape) for k, v in feeds.items()},
           "samples_per_s_median": {k: round(float(np.median(v)), 2) for k, v in rates.items()},
           "samples_per_s_max": {k: round(max(v), 2) for k, v in rates.items()},
           "mlc_over_openvino_throughput": ratio("openvino fp32 THROUGHPUT"),
           "mlc_over_onnxruntime": ratio("onnxruntime fp32"),
           "openvino": {"precision": ran_at, "infer_requests": requests,
                        "streams": int(compiled.get_property("NUM_STREAMS"))},
           "unscheduled_kernels": len((runner.manifest["compile"].get("schedules") or {}).get("unscheduled") or []),
           "load_average": [load_start, load_average()], "machine": machine_info()}
    _record(output, row)
    print(json.dumps(row, indent=1))


def _record(output: Path, row: dict) -> None:
    """`row` replaces the record's row of the same model, batch and threads."""
    doc = json.loads(output.read_text()) if output.exists() else {"benchmark": "throughput", "rows": []}
    key = (row["label"], row["batch"], row["threads"])
    doc["rows"] = [r for r in doc["rows"] if (r["label"], r["batch"], r["threads"]) != key] + [row]
    if "machine" in row:
        doc["machine"] = row["machine"]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(doc, indent=1) + "\n")


def render(doc: dict, order: list[str]) -> str:
    """One table per batch and thread count: samples/s of each engine and mlc's per-round ratios (above 1: mlc
    serves more samples per second), with their geometric means; a model that did not build or run is a miss."""
    machine = doc["machine"]
    lines = ["# Batched throughput: mlc fp32 vs OpenVINO fp32 THROUGHPUT and ONNX Runtime fp32", "",
             f"Machine: {machine['cpu']} ({machine['llvm_cpu']}), {machine['cores_usable']} usable cores, "
             f"{machine['date'][:10]}, commit {machine.get('commit')}. `throughput.py`: each round runs each engine "
             "on the same number of batches (OpenVINO: that many requests in flight), the starting engine rotating; "
             "ratios are the median of the per-round ratios [min, max]; above 1: mlc is faster.", ""]
    rows = sorted(doc["rows"], key=lambda r: (r["batch"], r["threads"], order.index(r["label"])
                                              if r["label"] in order else len(order)))
    for batch, threads in sorted({(r["batch"], r["threads"]) for r in rows}):
        group = [r for r in rows if (r["batch"], r["threads"]) == (batch, threads)]
        lines += [f"## batch {batch}, {threads} thread{'s' if threads > 1 else ''}", "",
                  "| model | mlc samples/s | OpenVINO THROUGHPUT samples/s | ORT samples/s | mlc / OpenVINO "
                  "| mlc / ORT | OpenVINO streams x requests | unscheduled |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        over_ov, over_ort, misses = [], [], []
        for r in group:
            if "missing" in r:
                misses.append(f"{r['label']} ({r['missing']})")
                lines.append(f"| {r['label'].replace(' b1', '')} | miss | | | | | | |")
                continue
            rate, ov, ort = r["samples_per_s_median"], r["mlc_over_openvino_throughput"], r["mlc_over_onnxruntime"]
            over_ov.append(ov["median"])
            over_ort.append(ort["median"])
            lines.append(f"| {r['label'].replace(' b1', '')} | {rate['mlc fp32']:.1f} | "
                         f"{rate['openvino fp32 THROUGHPUT']:.1f} | {rate['onnxruntime fp32']:.1f} | {_cell(ov)} | "
                         f"{_cell(ort)} | "
                         f"{r['openvino']['streams']} x {r['openvino']['infer_requests']} | "
                         f"{r['unscheduled_kernels']} |")
        behind = sum(v < 1 for v in over_ov)
        lines += [f"| **geomean** | | | | **{_geomean(over_ov):.3f}** | **{_geomean(over_ort):.3f}** | | |" if over_ov
                  else "", "", f"Behind OpenVINO THROUGHPUT on {behind} of {len(over_ov)}; misses: "
                  f"{'; '.join(misses) or 'none'}.", ""]
    return "\n".join(lines)


def _cell(ratio: dict) -> str:
    return f"{ratio['median']:.3f} [{ratio['min']:.2f}, {ratio['max']:.2f}]"


if __name__ == "__main__":
    main()
