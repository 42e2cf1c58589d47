"""The precision benchmark over a model set: builds each model's ONNX export and its mlc fp32 and bf16 artifacts,
runs `precision.py` on them at each thread count (each row interleaved call by call in one process), and writes a
markdown summary: the geometric means, each backend's share of the peak, and a bf16 accuracy table.

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

import numpy as np

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
    parser.add_argument("--samples", type=int, default=16, help="inputs the accuracy figures average over")
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
                      "--threads", threads, "--rounds", str(args.rounds), "--samples", str(args.samples), "--peak",
                      "-o", str(args.output)])
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


# Below these a difference is fp32 rounding (bf16's step is 2^-9 of a value): googlenet's logits sit on their bias
ERROR_FLOOR, COSINE_FLOOR = 1e-5, 1e-8


def no_worse(mine: dict, theirs: dict) -> bool:
    """One output's per-input figures (precision.py's, the same inputs) against theirs: worse only where the mean
    paired difference in error, or in 1 - cosine, exceeds two standard errors and the fp32 floor."""
    def worse(a: list, b: list, floor: float) -> bool:
        d = np.asarray(a) - np.asarray(b)
        return d.mean() > max(floor, 2 * d.std(ddof=1) / np.sqrt(len(d)))

    return not worse(mine["error_over_peak"], theirs["error_over_peak"], ERROR_FLOOR) \
        and not worse(-np.asarray(mine["cosine"]), -np.asarray(theirs["cosine"]), COSINE_FLOOR)


def render(doc: dict) -> str:
    """One table per thread count: the per-round median ratios against OpenVINO at the same precision and each
    backend's share of the peak, with the geometric means; then the bf16 accuracy of each output (1-thread rows)
    against OpenVINO's default."""
    machine = doc["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    lines = ["# mlc vs OpenVINO at fp32 and bf16, model set", "",
             f"Machine: {machine['cpu']} ({machine['llvm_cpu']}), {machine['cores_usable']} usable cores, "
             f"{machine['date'][:10]}; versions: {versions}. Each row: `precision.py --peak`, the four backends "
             "timed call by call in turn in one process; ratios are the median of the per-round ratios (below 1: "
             "mlc is faster). OpenVINO's default precision is bf16 on this CPU. Share of peak: the model's "
             "matmul/conv FLOPs at its fastest round over the thread count times one core's peak at the precision "
             "it ran (`peak.py`: fp32 vfmadd231ps, bf16 vdpbf16ps).", ""]
    ordered = sorted(doc["rows"], key=lambda r: list(MODELS).index(r["label"]) if r["label"] in MODELS
                     else len(MODELS))
    for threads in sorted({r["threads"] for r in ordered}):
        rows = [r for r in ordered if r["threads"] == threads]
        lines += [f"## {threads} thread{'s' if threads > 1 else ''}", "",
                  "| model | mlc fp32 ms | OV fp32 ms | mlc fp32 / OV fp32 | peak share fp32, mlc / OV | mlc bf16 ms | "
                  "OV default ms | mlc bf16 / OV default | peak share bf16, mlc / OV | load |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        fp32, bf16 = [], []
        for r in rows:
            p50 = r["p50_ms"]
            f = r["over_openvino_fp32_median"]["mlc fp32"]
            b = r["over_openvino_default_median"]["mlc bf16"]
            fp32.append(f)
            bf16.append(b)
            load = "-".join(f"{x[0]:.1f}" for x in r["load_average"])  # 1-minute averages, start and end
            lines.append(f"| {r['label']} | {p50['mlc fp32']:.1f} | {p50['openvino fp32']:.1f} | {_bold(f)} | "
                         f"{_shares(r, 'mlc fp32', 'openvino fp32')} | {p50['mlc bf16']:.1f} | "
                         f"{p50['openvino default']:.1f} | {_bold(b)} | {_shares(r, 'mlc bf16', 'openvino default')} "
                         f"| {load} |")
        lines += [f"| **geomean ({len(rows)} rows)** | | | {_bold(_geomean(fp32))} | | | | {_bold(_geomean(bf16))} "
                  "| | |", ""]
    return "\n".join(lines + _accuracy_table([r for r in ordered if r["threads"] == 1]))


def _shares(row: dict, mine: str, theirs: str) -> str:
    if "share_of_peak" not in row:
        return ""
    return " / ".join(f"{row['share_of_peak'][name]['share_of_peak_at_min']:.0%}" for name in (mine, theirs))


def _accuracy_table(rows: list) -> list[str]:
    """Each output's bf16 error against the fp32 reference, mlc vs OpenVINO's default, over the row's inputs."""
    if not rows or "accuracy_vs_fp32" not in rows[0]:
        return []
    inputs = rows[0]["accuracy_vs_fp32"]["mlc bf16"]["inputs"]
    lines = ["## bf16 accuracy", "",
             f"Each output against its fp32 reference over {inputs} inputs: the artifact's reference input (torch "
             f"eager's outputs) and {inputs - 1} seeded ones (ONNX Runtime fp32's). Error: the max abs error over "
             "the peak |reference|, mean (worst) over the inputs. No worse: neither the mean paired difference in "
             "error nor in cosine against OpenVINO's on the same inputs is worse by more than two standard errors "
             f"(and than fp32's rounding: {ERROR_FLOOR:g} of the peak, {COSINE_FLOOR:g} of cosine).", "",
             "| model | output | error, mlc bf16 | error, OV default | cosine, mlc bf16 | cosine, OV default | "
             "inputs passing mlc's bf16 gate, mlc / OV | no worse |", "|---|---|---:|---:|---:|---:|---:|---|"]
    verdicts = []
    for r in rows:
        accuracy = r["accuracy_vs_fp32"]
        for output, mine in accuracy["mlc bf16"]["outputs"].items():
            theirs = accuracy["openvino default"]["outputs"][output]
            verdicts.append(no_worse(mine, theirs))
            lines.append(f"| {r['label']} | {output} | {_error(mine)} | {_error(theirs)} | {mine['cosine_mean']:.7f} "
                         f"| {theirs['cosine_mean']:.7f} | {mine['inputs_passing_bf16_gate']} / "
                         f"{theirs['inputs_passing_bf16_gate']} | {'yes' if verdicts[-1] else '**no**'} |")
    return lines + ["", f"mlc's bf16 is no worse than OpenVINO's default on {sum(verdicts)} of {len(verdicts)} "
                    "outputs.", ""]


def _error(figures: dict) -> str:
    return f"{figures['error_over_peak_mean']:.3g} ({figures['error_over_peak_worst']:.3g})"


def _bold(ratio: float) -> str:
    return f"**{ratio:.3f}**" if ratio <= 1.0 else f"{ratio:.3f}"


if __name__ == "__main__":
    main()
