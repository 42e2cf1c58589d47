"""mlc fp32 and bf16 artifacts vs OpenVINO at fp32 and at its default precision, interleaved call by call in one
process at a fixed thread count, with each backend's accuracy against the fp32 eager reference.

Every round times one call of each backend, the starting backend rotating, so all see the same machine (these
VMs drift 20-30 % over minutes). Accuracy: each backend once on the artifact's reference inputs, every output
against the fp32 artifact's reference (the framework's eager outputs): max abs error, cosine, and the bf16
gate's verdict (mlc.check.gate).

    mlc export zoo:bert-base -f torch --input-shape input_ids:1x128 --input-shape attention_mask:1x128 -o bert.onnx
    mlc compile zoo:bert-base -f torch --input-shape input_ids:1x128 --input-shape attention_mask:1x128 -o fp32
    mlc compile ... --precision bf16 -o bf16
    .venv/bin/python benchmarks/precision/precision.py --fp32 fp32 --bf16 bf16 --onnx bert.onnx \
        --label "bert-base b1 s128" -o benchmarks/precision/results/precision.json   # appends a row"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fp32", type=Path, required=True, help="the mlc fp32 artifact")
    parser.add_argument("--bf16", type=Path, required=True, help="the mlc --precision bf16 artifact")
    parser.add_argument("--onnx", type=Path, required=True, help="the same model as ONNX, for OpenVINO")
    parser.add_argument("--label", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--peak", action="store_true",
                        help="also each backend's share of the core's peak at its precision (peak.py)")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):  # before any thread pool starts
        os.environ[name] = str(args.threads)

    from mlc.bench.baselines import openvino_model
    from mlc.bench.machine import load_average, machine_info
    from mlc.check import gate
    from mlc.runtime.runner import Runner

    fp32 = Runner(args.fp32)
    with np.load(args.fp32 / fp32.manifest["reference"]["inputs"]) as npz:
        feeds = {k: npz[k] for k in npz.files}
    with np.load(args.fp32 / fp32.manifest["reference"]["outputs"]) as npz:
        reference = {k: npz[k] for k in npz.files}
    backends = {"mlc fp32": (lambda: fp32.run(feeds)), "mlc bf16": _mlc(Runner(args.bf16), feeds)}
    ran_at = {"mlc fp32": "fp32", "mlc bf16": Runner(args.bf16).manifest.get("precision", "fp32")}
    for name, hint in (("openvino fp32", "f32"), ("openvino default", None)):
        compiled, precision = openvino_model(args.onnx, args.threads, hint)
        backends[name] = _openvino(compiled, feeds, list(reference))
        ran_at[name] = precision

    accuracy = {}
    for name, call in backends.items():
        outputs = call()
        figures = gate(reference, outputs, "bf16")
        accuracy[name] = {"passes_bf16_gate": figures.passed, "outputs": {
            o.name: {"max_abs_error": float(f"{o.max_abs_error:.4g}"), "cosine": round(o.cosine_similarity, 7),
                     "error_over_peak": float(f"{o.rel_error:.4g}"), "top1": o.top1_agreement,
                     "top5": o.top5_agreement} for o in figures.outputs}}

    def timed(call) -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    names = list(backends)
    for _ in range(args.warmup):
        for name in names:
            backends[name]()
    samples = {name: [] for name in names}
    load_start = load_average()
    for i in range(args.rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            samples[name].append(timed(backends[name]))
    p50 = {name: float(np.median(s)) * 1e3 for name, s in samples.items()}
    base = np.array(samples["openvino default"])
    row = {"label": args.label, "inputs": {k: list(v.shape) for k, v in feeds.items()}, "threads": args.threads,
           "rounds": args.rounds, "precision": ran_at,
           "p50_ms": {k: round(v, 3) for k, v in p50.items()},
           "min_ms": {k: round(min(s) * 1e3, 3) for k, s in samples.items()},
           "over_openvino_default_median": {k: round(float(np.median(np.array(s) / base)), 3)
                                            for k, s in samples.items()},
           "over_openvino_fp32_median": {k: round(float(np.median(np.array(s) / np.array(samples["openvino fp32"]))),
                                                  3) for k, s in samples.items()},
           "accuracy_vs_fp32_eager": accuracy, "reference": fp32.manifest["reference"]["producer"],
           **(_shares(samples, ran_at, args.onnx, feeds) if args.peak else {}),
           "load_average": [load_start, load_average()]}
    doc = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "precision", "rows": []}
    doc["machine"] = machine_info()
    doc["rows"] = [r for r in doc["rows"] if (r["label"], r.get("threads", 1)) != (args.label, args.threads)] + [row]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(row, indent=1))


def _shares(samples: dict, ran_at: dict, onnx_path: Path, feeds: dict) -> dict:
    """Each backend's model GFLOP/s at its fastest round over the core's peak at its precision."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from peak import instruction_peaks, model_flops, one_clock

    readings = instruction_peaks(3)  # a loaded machine reads low: the best of all
    peak = one_clock(readings)
    flops = model_flops(onnx_path, {k: v.shape for k, v in feeds.items()})
    share = {}
    for name, times in samples.items():
        precision = {"f32": "fp32"}.get(ran_at[name], ran_at[name])
        rate = flops / min(times) / 1e9
        share[name] = {"precision": precision, "gflops_at_min": round(rate, 1),
                       "share_of_peak_at_min": round(rate / peak[precision], 3)}
    return {"model_gflop": round(flops / 1e9, 3), "peak_gflops": peak, "peak_readings": readings,
            "share_of_peak": share}


def _mlc(runner, feeds):
    return lambda: runner.run(feeds)


def _openvino(compiled, feeds, names):
    """One inference on the feeds, outputs by the reference's names (ports in order where names differ)."""
    request = compiled.create_infer_request()
    wanted = {n for port in compiled.inputs for n in port.get_names()}
    inputs = {k: v for k, v in feeds.items() if k in wanted}

    def run() -> dict[str, np.ndarray]:
        results = request.infer(inputs)
        out = {}
        for position, port in enumerate(compiled.outputs):
            name = next((n for n in port.get_names() if n in names), names[position] if position < len(names) else "")
            out[name] = np.asarray(results[port])
        return out

    return run


if __name__ == "__main__":
    main()
