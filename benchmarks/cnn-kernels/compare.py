"""Artifacts of one model (before/after a change) vs ONNX Runtime and OpenVINO, interleaved call by call in one
process at 1 thread, plus each artifact's per-kernel profile (its runs alternated with the other artifacts').

    .venv/bin/python benchmarks/cnn-kernels/compare.py --onnx ghostnet_100.onnx --label ghostnet_100 \
        --artifact before=art-before --artifact after=art-after -o benchmarks/cnn-kernels/results/x.json

Every round times one call of each backend back to back, the order rotating; ratios are per round (the VM's speed
drifts over minutes). Inputs: the first artifact's reference inputs. Appends (replaces) the row named --label."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "precision"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--artifact", action="append", required=True, help="LABEL=DIR (repeatable)")
    parser.add_argument("--label", required=True)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--profile-rounds", type=int, default=5)
    parser.add_argument("--no-openvino", action="store_true")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[name] = "1"

    import onnxruntime as ort

    from beside_openvino import interleave, mlc_timers, timer

    from mlc.bench.machine import load_average, machine_info
    from mlc.runtime.runner import Runner

    runners = {label: Runner(Path(path)) for label, path in (a.split("=", 1) for a in args.artifact)}
    first = next(iter(runners.values()))
    with np.load(first.root / first.manifest["reference"]["inputs"]) as npz:
        feeds = {k: npz[k] for k in npz.files}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(args.onnx), options, providers=["CPUExecutionProvider"])
    ort_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}

    timers = {"ort": timer(lambda: session.run(None, ort_feeds))}
    if not args.no_openvino:
        from mlc.bench.baselines import openvino_model

        compiled, _ = openvino_model(args.onnx, 1, "f32")
        request = compiled.create_infer_request()
        wanted = {n for port in compiled.inputs for n in port.get_names()}
        ov_feeds = {k: v for k, v in feeds.items() if k in wanted}
        timers["openvino"] = timer(lambda: request.infer(ov_feeds))
    timers.update({f"mlc_{label}": t for label, t in mlc_timers(runners, feeds).items()})
    load_start = load_average()
    samples = interleave(timers, args.rounds, warmup=3)
    profiles = {label: {} for label in runners}
    for _ in range(args.profile_rounds):
        for label, runner in runners.items():
            for row in runner.profile(feeds, runs=1):
                entry = profiles[label].setdefault(row["name"], [row["calls"], []])
                entry[1].append(row["ms"])
    arrays = {name: np.array(s) for name, s in samples.items()}
    row = {"label": args.label, "rounds": args.rounds, "threads": 1,
           "p50_ms": {name: round(float(np.median(a)) * 1e3, 3) for name, a in arrays.items()},
           "load_average": [load_start, load_average()]}
    for label in runners:
        mine = arrays[f"mlc_{label}"]
        for base in ("ort", "openvino"):
            if base in arrays:
                ratio = arrays[base] / mine  # above 1: mlc faster
                row[f"speedup_{label}_vs_{base}"] = round(float(np.median(ratio)), 3)
    labels = list(runners)
    if len(labels) > 1:
        row[f"speedup_{labels[-1]}_vs_{labels[0]}"] = round(
            float(np.median(arrays[f"mlc_{labels[0]}"] / arrays[f"mlc_{labels[-1]}"])), 3)
    row["kernels"] = {label: sorted(({"name": k, "calls": c, "ms": round(float(np.median(v)), 4)}
                                     for k, (c, v) in kernels.items()), key=lambda r: -r["ms"])
                      for label, kernels in profiles.items()}
    row["kernel_calls"] = {label: sum(r["calls"] for r in rows) for label, rows in row["kernels"].items()}
    doc = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "cnn-kernels", "rows": []}
    doc["machine"] = machine_info()
    doc["rows"] = [r for r in doc["rows"] if r["label"] != args.label] + [row]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k != "kernels"}))
    for label, rows in row["kernels"].items():
        print(label, "top kernels:", ", ".join(f"{r['name']} {r['ms']:.3f}" for r in rows[:8]))


if __name__ == "__main__":
    main()
