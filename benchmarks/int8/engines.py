"""mlc's int8 beside OpenVINO's (NNCF) and ONNX Runtime's, and batched throughput (issue #39), timed call by call.

Two phases, one process each (TVM's thread pool takes its size when it starts):

- `--phase latency` (batch 1; --threads, default 1, for every engine): per model, `mlc compile --quantize int8
  --calibration ...`, the openvino-int8 baseline (nncf.quantize on the OpenVINO model read from the same ONNX), the
  ort-int8 baseline (quantize_static, QDQ) and OpenVINO fp32, all calibrated on the same .npz inputs; each round
  calls every engine once (the order rotating); p50s and the medians of the per-round ratios. Top-1 agreement with
  ONNX Runtime fp32 where the model is trained: zoo:cnn's layers trained here on scikit-learn's digits (8x8, no
  download).
- `--phase throughput` (batch 8, --threads, default every usable core): mlc fp32 at batch 8 (one batched call at a
  time), OpenVINO fp32 with the THROUGHPUT hint (the openvino-throughput baseline: its optimal number of requests in
  flight on an AsyncInferQueue) and ONNX Runtime fp32 with all threads; samples/s per round.

    .venv/bin/python benchmarks/int8/engines.py --phase latency -o benchmarks/int8/results/engines.json
    .venv/bin/python benchmarks/int8/engines.py --phase throughput -o benchmarks/int8/results/engines.json

`--broad DIR` runs the latency phase on issue #39's list instead (`benchmarks/precision/broad_models.py`): each
model's ONNX from DIR/<label>/model.onnx (`model_set.py --set broad --build-only --work DIR` makes them), compiled
with its list flags, calibrated on 8 seeded inputs (mlc's own, seeds 0-7) and judged on 16 others (random weights:
cosine and error only; `--models` takes the list's labels). A model whose build fails is a miss, recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[0] = str(ROOT)  # the repo root first: this folder's profile.py would shadow the stdlib's
sys.path.insert(1, str(ROOT / "benchmarks" / "precision"))  # beside_openvino, broad_models
from beside_openvino import interleave, timer  # noqa: E402
MODELS = ("cnn-digits", "resnet18")
SEED = 0


def digits_cnn(folder: Path, batch: int = 1, epochs: int = 20):
    """zoo:cnn's layers trained on the digits at their own 8x8 (as 3 channels; upsampled to the zoo's 32x32, the
    global pool over two 3x3 convs' receptive field loses the strokes' positions: 63 % held out, here ~96 %). Its ONNX
    (static `batch`), 8 training digits (the calibration), the 797 held-out digits and their labels."""
    import torch
    from sklearn.datasets import load_digits

    from mlc.models import torch_models

    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # a few seconds either way; the shared machine's other core stays free
    digits = load_digits()
    order = np.random.default_rng(SEED).permutation(len(digits.target))
    x = torch.from_numpy((digits.images[order] / 16.0 - 0.5) / 0.25).float()[:, None].repeat(1, 3, 1, 1)
    y = torch.from_numpy(digits.target[order]).long()
    model = torch_models.cnn().native.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(epochs):
        for i in range(0, 1000, 32):
            loss = torch.nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    path = folder / f"cnn-digits-b{batch}.onnx"
    torch.onnx.export(model, (x[:batch],), str(path), dynamo=False, input_names=["input"], output_names=["logits"])
    images = x.numpy()
    return path, [{"input": images[k:k + 1]} for k in range(8)], images[1000:], digits.target[order][1000:]


def zoo_onnx(name: str, folder: Path, batch: int) -> Path:
    path = folder / f"{name}-b{batch}.onnx"
    mlc(["export", f"zoo:{name}", "--input-shape", f"images:{batch}x3x224x224", "-o", str(path)])
    return path


class Miss(Exception):
    """A model the broad list counts as a miss: its build failed (the message is recorded)."""


def mlc(args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the mlc of this tree, not another checkout's editable install
    done = subprocess.run([sys.executable, "-m", "mlc", *args], text=True, capture_output=True, env=env)
    if done.returncode not in (0, 3):  # 3: the gate failed; the artifact is there and its figures are recorded
        raise Miss(f"mlc {args[0]} exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}")


def broad_model(label: str, work: Path):
    """Issue #39's list: the ONNX file model_set.py built for `label`, its compile flags, 8 seeded calibration
    feeds and 16 seeded held-out ones (as `mlc compile` seeds its inputs: masks of ones, indices in range)."""
    import onnx

    from broad_models import MODELS as BROAD  # main put benchmarks/precision on the path for --broad

    from mlc.frontends import onnx as onnx_frontend

    path = work / label.split(" (")[0].replace(" ", "-") / "model.onnx"
    if not path.exists():
        raise Miss(f"{path} is missing: run benchmarks/precision/model_set.py --set broad --build-only first")
    flags = BROAD[label][2]
    specs = onnx_frontend.input_specs(onnx.load(str(path), load_external_data=False))
    shapes = onnx_frontend.concrete_shapes(
        specs, onnx_frontend.resolve_input_shapes(specs, [f.split("=", 1)[1] for f in flags]))
    feeds = [onnx_frontend.make_inputs(specs, shapes, seed=k) for k in range(8 + 16)]
    return path, flags, feeds[:8], feeds[8:]


def save_calibration(feeds: list[dict], folder: Path) -> list[str]:
    args = []
    for k, feed in enumerate(feeds):
        path = folder / f"calibration-{k}.npz"
        np.savez(path, **feed)
        args += ["--calibration", str(path)]
    return args


def summary(times: dict[str, list[float]], samples: dict[str, int], mlc_name: str) -> dict:
    out = {}
    for name, seconds in times.items():
        s = np.asarray(seconds)
        row = {"p50_ms": round(float(np.median(s)) * 1e3, 4), "min_ms": round(float(s.min()) * 1e3, 4),
               "samples_per_call": samples[name],
               "samples_per_s_p50": round(float(np.median(samples[name] / s)), 1)}
        if name != mlc_name:  # mlc's time per sample over theirs, per round (below 1: mlc faster)
            ratio = (np.asarray(times[mlc_name]) / samples[mlc_name]) / (s / samples[name])
            row["mlc_over_this_median"] = round(float(np.median(ratio)), 3)
            row["mlc_over_this_p10_p90"] = [round(float(np.percentile(ratio, q)), 3) for q in (10, 90)]
        out[name] = row
    return out


def agreement(reference: np.ndarray, actual: np.ndarray, labels=None) -> dict:
    row = {"rows": len(reference), "top1_agreement": round(float((reference.argmax(1) == actual.argmax(1)).mean()), 4),
           "cosine": round(float(np.sum(reference * actual) / np.linalg.norm(reference) / np.linalg.norm(actual)), 6),
           "max_abs_error_of_peak": round(float(np.abs(reference - actual).max() / np.abs(reference).max()), 4)}
    if labels is not None:
        row["accuracy"] = round(float((actual.argmax(1) == labels).mean()), 4)
    return row


def latency_phase(args, folder: Path) -> list[dict]:
    from mlc.bench import baselines
    from mlc.runtime.runner import Runner

    rows = []
    for name in args.models:
        try:
            rows.append(_latency_row(args, folder, name, baselines, Runner))
        except Miss as miss:
            rows.append({"phase": "latency", "model": name, "batch": 1, "threads": args.threads, "miss": str(miss)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _latency_row(args, folder: Path, name: str, baselines, Runner) -> dict:
    labels = None
    if args.broad:
        onnx_path, flags, calibration, held_out = broad_model(name, args.broad)
    elif name == "cnn-digits":
        onnx_path, calibration, digits, labels = digits_cnn(folder)
        held_out, flags = [{"input": x[None]} for x in digits], ["--input-shape=input:1x3x8x8"]
    else:
        onnx_path = zoo_onnx(name, folder, 1)
        rng = np.random.default_rng(SEED + 1)
        calibration = [{"images": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(8)]
        held_out = [{"images": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(16)]
        flags = ["--input-shape=images:1x3x224x224"]  # seeded inputs: cosine only
    slug = name.replace(" ", "-")
    artifact = folder / f"{slug}-int8"
    start = time.perf_counter()
    mlc(["compile", str(onnx_path), *flags, "--quantize", "int8", *save_calibration(calibration, folder),
         "-o", str(artifact)])
    compile_s = time.perf_counter() - start
    runner = Runner(artifact)
    feed = {k: v.copy() for k, v in held_out[0].items()}  # refilled with each held-out input below
    ctx = baselines.Context(None, onnx_path, list(feed), list(feed.values()), args.threads, folder / f"scratch-{slug}",
                            calibration=calibration, spinning=False)  # ORT spinning took the next engine's cores
    calls = {"mlc int8": lambda runner=runner, feed=feed: list(runner.run(feed).values())}
    failed = {}  # an engine that cannot take this model (NNCF's quantize raised on some of the Caffe2 graphs)
    for label, baseline in (("openvino-int8", "openvino-int8"), ("ort-int8", "ort-int8"),
                            ("openvino fp32", "openvino"), ("ort fp32", "ort")):
        try:
            calls[label] = baselines.get(baseline).setup(ctx)
        except Exception as e:  # recorded with the row; the other engines are still timed
            failed[label] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
    if "ort fp32" in failed:
        raise Miss(f"ONNX Runtime fp32, the accuracy reference, failed: {failed['ort fp32']}")
    precisions = baselines.runtime_precisions(calls["openvino-int8"].compiled) if "openvino-int8" in calls else None
    # Accuracy: every held-out input through each engine (batch 1), against ONNX Runtime fp32; the first output,
    # as rows of its last axis (a classifier's logits; a hidden state's tokens, where top-1 says little).
    outputs = {k: [] for k in calls}
    for x in held_out:
        for key, value in x.items():
            feed[key][...] = value  # every engine's feeds hold these arrays
        for k, call in calls.items():
            first = np.asarray(call()[0])
            outputs[k].append(first.reshape(-1, first.shape[-1]))
    fp32 = np.concatenate(outputs["ort fp32"])
    accuracy = {k: agreement(fp32, np.concatenate(v), labels) for k, v in outputs.items() if k != "ort fp32"}
    load_start = os.getloadavg()
    times = interleave({k: timer(c) for k, c in calls.items()}, args.rounds, args.warmup)
    return {"phase": "latency", "model": name, "batch": 1, "threads": args.threads,
            "rounds": args.rounds, "mlc_compile_s": round(compile_s, 1),
            "openvino_int8_runtime_precisions": precisions, **({"engine_errors": failed} if failed else {}),
            "engines": summary(times, {k: 1 for k in calls}, "mlc int8"),
            "accuracy_vs_ort_fp32": accuracy,
            "accuracy_inputs": "held-out digits" if labels is not None else "seeded random inputs",
            "load_average": [load_start, os.getloadavg()]}


def throughput_phase(args, folder: Path) -> list[dict]:
    from mlc.bench import baselines
    from mlc.runtime.runner import Runner

    rows = []
    for name in args.models:
        batch = args.batch
        if name == "cnn-digits":
            onnx_path, _, held_out, _ = digits_cnn(folder, batch)
            x, shape, input_name = held_out[:batch], f"input:{batch}x3x8x8", "input"
        else:
            onnx_path = zoo_onnx(name, folder, batch)
            x = np.random.default_rng(SEED).standard_normal((batch, 3, 224, 224)).astype(np.float32)
            shape, input_name = f"images:{batch}x3x224x224", "images"
        artifact = folder / f"{name}-fp32-b{batch}"
        mlc(["compile", str(onnx_path), "--input-shape", shape, "-o", str(artifact)])
        runner = Runner(artifact)
        ctx = baselines.Context(None, onnx_path, [input_name], [x], args.threads, folder / f"scratch-{name}")
        ov = baselines.get("openvino-throughput").setup(ctx)
        calls = {"mlc fp32": lambda runner=runner, feed={input_name: x}: runner.run(feed), "openvino-throughput": ov,
                 "ort fp32": baselines.get("ort").setup(ctx)}
        samples = {"mlc fp32": batch, "openvino-throughput": batch * ov.batches_per_call, "ort fp32": batch}
        load_start = os.getloadavg()
        times = interleave({k: timer(c) for k, c in calls.items()}, args.rounds, args.warmup)
        rows.append({"phase": "throughput", "model": name, "batch": batch, "threads": args.threads,
                     "rounds": args.rounds, "openvino_requests": ov.batches_per_call, "openvino_streams": ov.streams,
                     "engines": summary(times, samples, "mlc fp32"), "load_average": [load_start, os.getloadavg()]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=("latency", "throughput"), required=True)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--threads", type=int, help="[default: 1 for latency, every usable core for throughput]")
    parser.add_argument("--batch", type=int, default=8, help="throughput phase: the batch")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--broad", type=Path, metavar="DIR",
                        help="latency phase on issue #39's list, its ONNX files from model_set.py's --work DIR")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    known = MODELS
    if args.broad:
        from broad_models import MODELS as BROAD

        known = tuple(BROAD)
        if args.models == ",".join(MODELS):
            args.models = ",".join(known)
        if args.phase != "latency":
            parser.error("--broad runs the latency phase")
    args.models = [m for m in args.models.split(",") if m]
    if unknown := set(args.models) - set(known):
        parser.error(f"unknown models {sorted(unknown)}; choose from {', '.join(known)}")
    if args.threads is None:
        args.threads = 1 if args.phase == "latency" else len(os.sched_getaffinity(0))
    for variable in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):  # before TVM's and ORT's pools start
        os.environ[variable] = str(args.threads)

    from mlc.bench.machine import machine_info

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True, capture_output=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="int8-engines-") as scratch:
        run = latency_phase if args.phase == "latency" else throughput_phase
        rows = run(args, Path(scratch))
    doc = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "int8-engines", "rows": []}
    doc["machine"] = machine_info()
    from importlib.metadata import version

    doc["machine"]["versions"]["nncf"] = version("nncf")  # machine_info lists the frameworks, not nncf
    for row in rows:
        row["commit"] = commit or os.environ.get("MLC_COMMIT", "?")
        key = lambda r: (r["phase"], r["model"], r["batch"], r["threads"])  # noqa: E731 - a rerun replaces its row
        doc["rows"] = [r for r in doc["rows"] if key(r) != key(row)] + [row]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
