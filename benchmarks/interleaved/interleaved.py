"""mlc artifact vs ONNX Runtime, interleaved call by call in one process at a fixed thread count.

`mlc bench` times each backend in a process of its own, one after the other: on a shared VM whose
speed drifts by 20-30% over minutes, a ratio between two cells can be mostly drift. Here every
round times one ORT call and one mlc call back to back (the order alternating), so both see the
same machine; the result is each side's p50 and the median of the per-round ratios.

    mlc export zoo:bert-base -o bert-base.onnx
    mlc compile zoo:bert-base --input-shape input_ids:1x128 --input-shape attention_mask:1x128 --db DB -o art
    .venv/bin/python benchmarks/interleaved/interleaved.py --artifact art --onnx bert-base.onnx \
        --label "bert-base b1 s128" -o benchmarks/interleaved/results/x.json   # appends a row
    .venv/bin/python benchmarks/interleaved/interleaved.py -o benchmarks/interleaved/results/x.json \
        --plot benchmarks/interleaved/plots/x.png    # only draws the recorded rows (plots/ is git-ignored)

ORT runs on the artifact's reference inputs (its static shapes); the ONNX may have dynamic dims. `--ort-int8` (for a
`--quantize` artifact) also times ONNX Runtime's own int8 build of the same ONNX: onnxruntime.quantization's QDQ
model (quantize_static, per-channel int8 weights, uint8 activations, calibrated on the seeded inputs mlc uses;
quantize_dynamic for int8-dynamic), limited to the nodes mlc quantises."""

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
    parser.add_argument("--artifact", type=Path, help="Required unless only drawing --output's rows (--plot).")
    parser.add_argument("--onnx", type=Path)
    parser.add_argument("--label")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--plot", type=Path, help="Also draw every row of --output: mlc/ORT ratio per row (PNG).")
    parser.add_argument("--openvino", action="store_true",
                        help="Also time OpenVINO at fp32 and at its default precision (bf16 on CPUs with it) in "
                             "each round; the row records the precision it ran at.")
    parser.add_argument("--ort-int8", action="store_true",
                        help="Also time ONNX Runtime's int8 QDQ build of --onnx (quantize_static/quantize_dynamic).")
    args = parser.parse_args()
    if args.artifact is None and args.plot:  # draw the recorded rows, run nothing
        plot(json.loads(args.output.read_text()), args.plot)
        return
    if args.artifact is None or args.onnx is None or args.label is None:
        parser.error("give --artifact, --onnx and --label (or only -o RESULTS.json --plot PNG to draw a record)")
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):  # before TVM's or ORT's thread pools start
        os.environ[name] = str(args.threads)

    import onnxruntime as ort

    from mlc.bench.machine import load_average, machine_info
    from mlc.runtime.runner import Runner

    runner = Runner(args.artifact)
    manifest = runner.manifest
    with np.load(args.artifact / manifest["reference"]["inputs"]) as npz:
        feeds = {k: npz[k] for k in npz.files}
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(str(args.onnx), options, providers=["CPUExecutionProvider"])
    ort_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}

    def time_ort() -> float:
        start = time.perf_counter()
        session.run(None, ort_feeds)
        return time.perf_counter() - start

    def time_mlc() -> float:
        return runner.measure(feeds, warmup=0, repeat=1)[1]["mean_ms"] / 1e3

    extra = {}  # name -> (timer, precision): OpenVINO columns
    if args.openvino:
        from mlc.bench.baselines import openvino_model

        for name, hint in (("openvino_fp32", "f32"), ("openvino_default", None)):
            compiled, precision = openvino_model(args.onnx, args.threads, hint)
            request = compiled.create_infer_request()
            wanted = {n for port in compiled.inputs for n in port.get_names()}
            ov_feeds = {k: v for k, v in feeds.items() if k in wanted}

            def time_ov(request=request, ov_feeds=ov_feeds) -> float:
                start = time.perf_counter()
                request.infer(ov_feeds)
                return time.perf_counter() - start

            extra[name] = (time_ov, precision)
    if args.ort_int8:
        int8_session, how = ort_int8_session(args.onnx, manifest, feeds, options)

        def time_ort_int8() -> float:
            start = time.perf_counter()
            int8_session.run(None, ort_feeds)
            return time.perf_counter() - start

        extra["ort_int8"] = (time_ort_int8, how)
    for _ in range(args.warmup):
        time_ort(), time_mlc(), [timer() for timer, _ in extra.values()]
    ort_s, mlc_s = [], []
    extra_s = {name: [] for name in extra}
    load_start = load_average()
    for i in range(args.rounds):
        if i % 2:
            ort_s.append(time_ort())
            mlc_s.append(time_mlc())
        else:
            mlc_s.append(time_mlc())
            ort_s.append(time_ort())
        for name, (timer, _) in extra.items():
            extra_s[name].append(timer())
    ratios = np.array(mlc_s) / np.array(ort_s)
    row = {"label": args.label, "artifact_inputs": {i["name"]: i["shape"] for i in manifest["inputs"]},
           "tuned_kernels": len((manifest["compile"].get("schedules") or {}).get("tuned", [])),
           "threads": args.threads, "rounds": args.rounds,
           "ort_p50_ms": round(float(np.median(ort_s)) * 1e3, 3), "mlc_p50_ms": round(float(np.median(mlc_s)) * 1e3, 3),
           "ort_min_ms": round(min(ort_s) * 1e3, 3), "mlc_min_ms": round(min(mlc_s) * 1e3, 3),
           "mlc_over_ort_median": round(float(np.median(ratios)), 3),
           "mlc_over_ort_p10_p90": [round(float(np.percentile(ratios, q)), 3) for q in (10, 90)],
           "load_average": [load_start, load_average()]}
    for name, (_, precision) in extra.items():
        row[f"{name}_p50_ms"] = round(float(np.median(extra_s[name])) * 1e3, 3)
        row[f"{name}_precision"] = precision
        row[f"mlc_over_{name}_median"] = round(float(np.median(np.array(mlc_s) / np.array(extra_s[name]))), 3)
    machine = machine_info()  # the file's machine is the last row's; each row keeps its own commit and date
    row.update(commit=machine.get("commit"), date=machine["date"])
    doc = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "interleaved", "rows": []}
    doc["machine"] = machine
    doc["rows"] = [r for r in doc["rows"] if r["label"] != args.label] + [row]
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(row))
    if args.plot:
        plot(doc, args.plot)


def ort_int8_session(onnx_path: Path, manifest: dict, feeds: dict, options):
    """ONNX Runtime on its own int8 QDQ model of `onnx_path`, quantising the nodes mlc's --quantize quantises."""
    import logging
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnxruntime import quantization as q

    from mlc.frontends import onnx as onnx_frontend
    from mlc.passes import quantize

    logging.getLogger().setLevel(logging.ERROR)  # its "consider pre-processing" advice, twice per run
    mode = (manifest.get("quantization") or {}).get("mode", "int8")
    model = onnx.load(str(onnx_path))
    folder = Path(tempfile.mkdtemp(prefix="ort-int8-"))
    if not all(n.name for n in model.graph.node):  # nodes_to_quantize needs names
        for k, node in enumerate(model.graph.node):
            node.name = node.name or f"mlc_node_{k}"
        onnx_path = folder / "named.onnx"
        onnx.save(model, str(onnx_path))
    found, _ = quantize.candidates(model, mode)
    nodes = [c.node.name for c in found]
    out = folder / "model.int8.onnx"
    if mode == "int8-dynamic":
        q.quantize_dynamic(str(onnx_path), str(out), per_channel=True, weight_type=q.QuantType.QInt8,
                           nodes_to_quantize=nodes, op_types_to_quantize=["MatMul", "Gemm"])
    else:
        specs = onnx_frontend.input_specs(model)
        shapes = {s.name: list(np.shape(feeds[s.name])) for s in specs}
        batches = iter([onnx_frontend.make_inputs(specs, shapes, seed=onnx_frontend.REFERENCE_SEED + 1 + k)
                        for k in range(quantize.SEEDED_CALIBRATION)])

        class Reader(q.CalibrationDataReader):
            def get_next(self):
                return next(batches, None)

        q.quantize_static(str(onnx_path), str(out), Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                          activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                          nodes_to_quantize=nodes, op_types_to_quantize=["MatMul", "Gemm", "Conv"])
    how = f"onnxruntime {mode} {'QDQ' if mode == 'int8' else 'MatMulInteger'} ({len(nodes)} nodes)"
    return ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]), how


def plot(doc: dict, path: Path) -> None:
    """Horizontal bars: each row's median mlc/ORT ratio with its p10-p90 range; left of 1 is faster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    ratios = [r["mlc_over_ort_median"] for r in rows]
    spread = np.array([[m - r["mlc_over_ort_p10_p90"][0], r["mlc_over_ort_p10_p90"][1] - m]
                       for m, r in zip(ratios, rows)]).T
    longest = max(len(r["label"]) for r in rows)  # room for the labels left of the bars
    fig, ax = plt.subplots(figsize=(6 + 0.075 * longest, 0.45 * len(rows) + 1.2))
    ax.barh(range(len(rows)), ratios, xerr=spread, color=["tab:green" if x <= 1 else "tab:orange" for x in ratios],
            capsize=3)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows])
    ax.invert_yaxis()
    machine = doc["machine"]
    ax.set_xlabel("mlc / ORT latency: median per-round ratio, p10-p90 (< 1: mlc faster)")
    isa = f" ({machine['llvm_cpu']})" if machine.get("llvm_cpu") else ""
    ax.set_title(f"{machine['cpu']}{isa}, {rows[0]['threads']} thread, interleaved call by call", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
