"""The precision benchmark over a model set: builds each model's ONNX export and its mlc fp32 and bf16 artifacts,
runs `precision.py` on them at each thread count (each row interleaved call by call in one process), and writes a
markdown summary with the geometric means.

    .venv-suites/bin/python benchmarks/precision/model_set.py --work /tmp/precision-set --threads 1,2
    .venv-suites/bin/python benchmarks/precision/model_set.py --summary-only      # re-render the table

torchvision's CNNs need `make suite-env`'s venv; builds already in --work are reused."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FACTORIES = HERE / "cnn_models.py"
RESULTS = HERE / "results" / "model-set.json"


def _bert(seq: int) -> tuple[str, list[str]]:
    return "zoo:bert-base", ["-f", "torch", "--input-shape", f"input_ids:1x{seq}",
                             "--input-shape", f"attention_mask:1x{seq}"]


RESNET = ("zoo:resnet50", ["-f", "torch", "--input-shape", "images:1x3x224x224"])
MODELS: dict[str, tuple[str, list[str]]] = {
    "bert-base b1 s32": _bert(32),
    "bert-base b1 s128": _bert(128),
    "resnet50 b1": RESNET,
    "resnet50 symbolic batch (b1)": (RESNET[0], RESNET[1] + ["--dynamic", "batch"]),
    **{name: (f"{FACTORIES}:{name}", []) for name in
       ("squeezenet1_0", "densenet121", "googlenet", "inception_v3", "vgg19", "alexnet", "mobilenet_v2")},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/precision-set"), help="exports and artifacts")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated labels (default: all)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("-o", "--output", type=Path, default=RESULTS)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    if not args.summary_only:
        for label in args.models.split(","):
            folder = args.work / label.split(" (")[0].replace(" ", "-")
            _build(label, folder)
            for threads in args.threads.split(","):
                _run([sys.executable, str(HERE / "precision.py"), "--fp32", str(folder / "fp32"),
                      "--bf16", str(folder / "bf16"), "--onnx", str(folder / "model.onnx"), "--label", label,
                      "--threads", threads, "--rounds", str(args.rounds), "-o", str(args.output)])
    summary = args.output.with_suffix(".md")
    summary.write_text(render(json.loads(args.output.read_text())))
    print(summary.read_text())


def _build(label: str, folder: Path) -> None:
    spec, flags = MODELS[label]
    mlc = [sys.executable, "-m", "mlc"]
    steps = [(folder / "model.onnx", mlc + ["export", spec, *flags, "-o", str(folder / "model.onnx")]),
             (folder / "fp32", mlc + ["compile", spec, *flags, "-o", str(folder / "fp32")]),
             (folder / "bf16", mlc + ["compile", spec, *flags, "--precision", "bf16", "-o", str(folder / "bf16")])]
    for made, command in steps:
        if not made.exists():
            _run(command)


def _run(command: list[str]) -> None:
    start = time.time()
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"  {time.time() - start:.0f} s", flush=True)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _worst_error(row: dict, backend: str) -> float:
    """The largest max abs error over the outputs, relative to that output's peak magnitude."""
    return max(o["error_over_peak"] for o in row["accuracy_vs_fp32_eager"][backend]["outputs"].values())


def render(doc: dict) -> str:
    """One table per thread count: the per-round median ratios against OpenVINO at the same precision, each
    bf16 build's worst error against the fp32 eager outputs, and the geometric means."""
    machine = doc["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    lines = ["# mlc vs OpenVINO at fp32 and bf16, model set", "",
             f"Machine: {machine['cpu']} ({machine['llvm_cpu']}), {machine['cores_usable']} usable cores, "
             f"{machine['date'][:10]}; versions: {versions}. Each row: `precision.py`, the four backends timed "
             "call by call in turn in one process; ratios are the median of the per-round ratios (below 1: mlc is "
             "faster). OpenVINO's default precision is bf16 on this CPU.", ""]
    for threads in sorted({r["threads"] for r in doc["rows"]}):
        rows = sorted((r for r in doc["rows"] if r["threads"] == threads),
                      key=lambda r: list(MODELS).index(r["label"]) if r["label"] in MODELS else len(MODELS))
        lines += [f"## {threads} thread{'s' if threads > 1 else ''}", "",
                  "| model | mlc fp32 ms | OV fp32 ms | mlc fp32 / OV fp32 | mlc bf16 ms | OV default ms | "
                  "mlc bf16 / OV default | error / peak, mlc bf16 / OV default | load |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        fp32, bf16 = [], []
        for r in rows:
            p50 = r["p50_ms"]
            f = r["over_openvino_fp32_median"]["mlc fp32"]
            b = r["over_openvino_default_median"]["mlc bf16"]
            fp32.append(f)
            bf16.append(b)
            load = "-".join(f"{x[0]:.1f}" for x in r["load_average"])  # 1-minute averages, start and end
            lines.append(f"| {r['label']} | {p50['mlc fp32']:.1f} | {p50['openvino fp32']:.1f} | {_bold(f)} | "
                         f"{p50['mlc bf16']:.1f} | {p50['openvino default']:.1f} | {_bold(b)} | "
                         f"{_worst_error(r, 'mlc bf16'):.2g} / {_worst_error(r, 'openvino default'):.2g} | {load} |")
        lines += [f"| **geomean ({len(rows)} rows)** | | | {_bold(_geomean(fp32))} | | | {_bold(_geomean(bf16))} "
                  "| | |", ""]
    return "\n".join(lines)


def _bold(ratio: float) -> str:
    return f"**{ratio:.3f}**" if ratio <= 1.0 else f"{ratio:.3f}"


if __name__ == "__main__":
    main()
