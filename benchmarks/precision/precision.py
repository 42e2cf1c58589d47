"""mlc fp32 and bf16 artifacts vs OpenVINO at fp32 and at its default precision, interleaved call by call in one
process at a fixed thread count, with each backend's accuracy against the fp32 eager reference.

Every round times one call of each backend, the starting backend rotating, so all see the same machine (these
VMs drift 20-30 % over minutes). Accuracy: each backend on `--samples` inputs, every output against an fp32
reference: the artifact's reference inputs against the framework's eager outputs, then seeded inputs (as
`mlc compile` makes them) against ONNX Runtime fp32 on the same ONNX. Per output: the mean and worst of the max abs
error over the peak |reference| and of the cosine, and whether each input passes the bf16 gate (mlc.check.gate).
One input's max error is one draw: bert-base s128's pooler put mlc's bf16 behind OpenVINO's on the reference
input and ahead on 10 of the next 16 (and on the mean), so model_set.py compares the inputs paired.

    mlc export zoo:bert-base -f torch --input-shape input_ids:1x128 --input-shape attention_mask:1x128 -o bert.onnx
    mlc compile zoo:bert-base -f torch --input-shape input_ids:1x128 --input-shape attention_mask:1x128 -o fp32
    mlc compile ... --precision bf16 -o bf16
    .venv/bin/python benchmarks/precision/precision.py --fp32 fp32 --bf16 bf16 --onnx bert.onnx \
        --label "bert-base b1 s128" -o benchmarks/precision/results/precision.json   # appends a row"""

from __future__ import annotations

import argparse
import functools
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
    parser.add_argument("--bf16", type=Path, help="the mlc --precision bf16 artifact (none: fp32 rows only)")
    parser.add_argument("--ort", action="store_true", help="also time ONNX Runtime fp32 (intra-op = --threads)")
    parser.add_argument("--onnx", type=Path, required=True, help="the same model as ONNX, for OpenVINO")
    parser.add_argument("--label", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--samples", type=int, default=16, help="inputs the accuracy figures average over")
    parser.add_argument("--peak", action="store_true",
                        help="also each backend's share of the peak of --threads cores at its precision (peak.py)")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):  # before any thread pool starts
        os.environ[name] = str(args.threads)

    from mlc.bench.baselines import openvino_model
    from mlc.bench.machine import load_average, machine_info
    from mlc.runtime.runner import Runner

    fp32 = Runner(args.fp32)
    with np.load(args.fp32 / fp32.manifest["reference"]["inputs"]) as npz:
        feeds = {k: npz[k] for k in npz.files}
    with np.load(args.fp32 / fp32.manifest["reference"]["outputs"]) as npz:
        reference = {k: npz[k] for k in npz.files}
    runners = {"mlc fp32": fp32.run}  # feeds -> outputs, for the accuracy inputs
    ran_at = {"mlc fp32": "fp32"}
    artifacts = {"mlc fp32": fp32}
    if args.bf16:
        bf16 = artifacts["mlc bf16"] = Runner(args.bf16)
        runners["mlc bf16"] = bf16.run
        ran_at["mlc bf16"] = bf16.manifest.get("precision", "fp32")
    backends = {name: functools.partial(run, feeds) for name, run in runners.items()}
    for name, hint in (("openvino fp32", "f32"), ("openvino default", None)):
        compiled, precision = openvino_model(args.onnx, args.threads, hint)
        runners[name] = _openvino(compiled, list(reference))
        backends[name] = functools.partial(runners[name], feeds)
        ran_at[name] = precision

    accuracy = _accuracy(runners, args.onnx, feeds, reference, args.samples)
    if args.ort:  # timed only: its numbers are the accuracy's reference for the seeded inputs
        backends["onnxruntime fp32"] = _onnxruntime(args.onnx, args.threads, feeds)
        ran_at["onnxruntime fp32"] = "fp32"

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
           **({"over_onnxruntime_median": {k: round(float(np.median(np.array(s) / np.array(samples[
               "onnxruntime fp32"]))), 3) for k, s in samples.items()}} if args.ort else {}),
           "accuracy_vs_fp32": accuracy,
           "unscheduled_kernels": {name: len((runner.manifest["compile"].get("schedules") or {}).get("unscheduled")
                                                 or []) for name, runner in artifacts.items()},
           "reference": f"{fp32.manifest['reference']['producer']} on the artifact's inputs, else onnxruntime fp32",
           **(_shares(samples, ran_at, args.onnx, feeds, args.threads) if args.peak else {}),
           "load_average": [load_start, load_average()]}
    doc = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "precision", "rows": []}
    doc["machine"] = machine_info()
    doc["rows"] = [r for r in doc["rows"] if (r["label"], r.get("threads", 1)) != (args.label, args.threads)] + [row]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(row, indent=1))


def _shares(samples: dict, ran_at: dict, onnx_path: Path, feeds: dict, threads: int) -> dict:
    """Each backend's model GFLOP/s at its fastest round over the peak of `threads` cores at its precision."""
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
                       "share_of_peak_at_min": round(rate / (threads * peak[precision]), 3)}
    return {"model_gflop": round(flops / 1e9, 3), "peak_gflops_per_core": peak, "peak_readings": readings,
            "share_of_peak": share}


def _accuracy(runners: dict, onnx_path: Path, feeds: dict, reference: dict, samples: int) -> dict:
    """Per backend and output, the error figures over `samples` inputs: the artifact's own (against its eager
    reference), then seeded ones against ONNX Runtime fp32."""
    import onnx

    from mlc.check import gate
    from mlc.frontends import onnx as onnx_frontend

    specs = onnx_frontend.input_specs(onnx.load(str(onnx_path), load_external_data=False))
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    cases = [(feeds, reference)]
    for k in range(1, samples):
        extra = onnx_frontend.make_inputs(specs, shapes, seed=onnx_frontend.REFERENCE_SEED + 1000 + k)
        cases.append((extra, onnx_frontend.onnxruntime_reference(onnx_path, extra).outputs))
    figures: dict = {name: {} for name in runners}
    for inputs, expected in cases:
        for name, run in runners.items():
            for o in gate(expected, run(inputs), "bf16").outputs:
                figures[name].setdefault(o.name, []).append(o)
    return {name: {"inputs": len(cases), "outputs": {output: _summary(per_input) for output, per_input in
                                                      outputs.items()}} for name, outputs in figures.items()}


def _summary(per_input: list) -> dict:
    errors = [o.rel_error for o in per_input]
    cosines = [o.cosine_similarity for o in per_input]
    top1 = [o.top1_agreement for o in per_input if o.top1_agreement is not None]
    return {"error_over_peak_mean": float(f"{np.mean(errors):.4g}"),
            "error_over_peak_worst": float(f"{max(errors):.4g}"),
            "cosine_mean": round(float(np.mean(cosines)), 8), "cosine_worst": round(min(cosines), 8),
            "top1_mean": round(float(np.mean(top1)), 4) if top1 else None,
            "inputs_passing_bf16_gate": sum(o.passed for o in per_input),
            "error_over_peak": [float(f"{e:.5g}") for e in errors],  # per input, for paired comparisons
            "cosine": [round(c, 10) for c in cosines]}


def _onnxruntime(onnx_path: Path, threads: int, feeds: dict):
    """One ORT call on `feeds` (its inputs only), its idle workers not spinning: at 2 threads they took the cores of
    the backend timed next (mlc fp32 ran 3-10x slower)."""
    from mlc.bench.baselines import ort_session

    session = ort_session(onnx_path, threads, spinning=False)
    wanted = {i.name for i in session.get_inputs()}
    return functools.partial(session.run, None, {k: v for k, v in feeds.items() if k in wanted})


def _openvino(compiled, names):
    """feeds -> one inference's outputs by the reference's names (ports in order where names differ)."""
    request = compiled.create_infer_request()
    wanted = {n for port in compiled.inputs for n in port.get_names()}

    def run(feeds: dict) -> dict[str, np.ndarray]:
        results = request.infer({k: v for k, v in feeds.items() if k in wanted})
        out = {}
        for position, port in enumerate(compiled.outputs):
            name = next((n for n in port.get_names() if n in names), names[position] if position < len(names) else "")
            out[name] = np.asarray(results[port])
        return out

    return run


if __name__ == "__main__":
    main()
