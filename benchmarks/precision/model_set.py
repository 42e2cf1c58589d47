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

import broad_models

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


SETS = {"precision": lambda: {label: (spec, flags, None) for label, (spec, flags) in MODELS.items()},
        "broad": lambda: broad_models.MODELS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), default="precision",
                        help="precision: the first model set; broad: issue #39's list (broad_models.py)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/precision-set"), help="exports and artifacts")
    parser.add_argument("--models", help="comma-separated labels (default: the whole set)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--samples", type=int, default=16, help="inputs the accuracy figures average over")
    parser.add_argument("--compile-timeout", type=int, default=1800, help="seconds per export or compile")
    parser.add_argument("--build-only", action="store_true", help="exports and artifacts only, nothing timed")
    parser.add_argument("-o", "--output", type=Path, default=RESULTS)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    models = SETS[args.set]()
    if not args.summary_only:
        for label in args.models.split(",") if args.models else models:
            folder = args.work / label.split(" (")[0].replace(" ", "-")
            missing = _build(models[label], folder, args.compile_timeout)
            if args.build_only:
                continue
            for threads in args.threads.split(","):
                if "fp32" in missing or "model.onnx" in missing:
                    _annotate(args.output, label, int(threads), "missing", missing)
                    continue
                error = _run([sys.executable, str(HERE / "precision.py"), "--fp32", str(folder / "fp32"),
                              *([] if "bf16" in missing else ["--bf16", str(folder / "bf16")]),
                              "--onnx", str(folder / "model.onnx"), "--label", label, "--ort",
                              "--threads", threads, "--rounds", str(args.rounds), "--samples", str(args.samples),
                              "--peak", "-o", str(args.output)])
                if error:
                    missing = {**missing, "timing": error}
                if missing:
                    _annotate(args.output, label, int(threads), "missing", missing)
                if (folder / "bf16.gate").exists():
                    _annotate(args.output, label, int(threads), "bf16_gate", (folder / "bf16.gate").read_text())
    if args.build_only:
        return
    summary = args.output.with_suffix(".md")
    summary.write_text(render(json.loads(args.output.read_text()), list(models)))
    print(summary.read_text())


def _build(model: tuple, folder: Path, timeout: int) -> dict[str, str]:
    """The model's ONNX export and its mlc fp32 and bf16 artifacts in `folder` (each reused where it exists), and
    what could not be made: {"model.onnx" | "fp32" | "bf16": the failure's last line}. `compile_flags` None
    compiles the export's source; else the ONNX file with those flags."""
    source, flags, compile_flags = model
    onnx_path = folder / "model.onnx"
    mlc = [sys.executable, "-m", "mlc"]
    compiled = [source, *flags] if compile_flags is None else [str(onnx_path), *compile_flags]
    if source.startswith("caffe2:"):
        export = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import broad_models; "
                  "broad_models.write_caffe2(sys.argv[2], sys.argv[3])", str(HERE), source[7:], str(onnx_path)]
    else:
        export = mlc + ["export", source, *flags, "-o", str(onnx_path)]
    folder.mkdir(parents=True, exist_ok=True)
    steps = {"model.onnx": export, "fp32": mlc + ["compile", *compiled, "-o", str(folder / "fp32")],
             "bf16": mlc + ["compile", *compiled, "--precision", "bf16", "-o", str(folder / "bf16")]}
    missing = {}
    for made, command in steps.items():
        failed = folder / f"{made}.failed"
        if (folder / made).exists() or made != "model.onnx" and "model.onnx" in missing:
            continue
        if failed.exists():
            missing[made] = failed.read_text()
            continue
        error = _run(command, timeout)
        if made == "bf16" and error.startswith("exit 3"):  # the bf16 gate: built again unchecked, for its speed;
            (folder / "bf16.gate").write_text(error)        # precision.py measures its accuracy beside OpenVINO's
            error = _run(command + ["--no-check"], timeout)
        if error:
            missing[made] = error
            failed.write_text(error)
    return missing


def _annotate(output: Path, label: str, threads: int, key: str, value) -> None:
    """`key`: `value` on the model's row at `threads` in the results (a row of its own where it has none): what a
    model could not build goes in as `missing`, which the summary counts as a miss."""
    doc = json.loads(output.read_text()) if output.exists() else {"benchmark": "precision", "rows": []}
    rows = [r for r in doc["rows"] if (r["label"], r.get("threads", 1)) == (label, threads)]
    if rows:
        rows[-1][key] = value
    else:
        doc["rows"].append({"label": label, "threads": threads, key: value})
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(doc, indent=1) + "\n")


def _run(command: list[str], timeout: int = 3600) -> str:
    """Runs `command`; '' when it succeeds, else its last line of output (or the timeout)."""
    start = time.time()
    print("+", " ".join(command), flush=True)
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {timeout} s", flush=True)
        return f"timed out after {timeout} s"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    print(f"  {time.time() - start:.0f} s, exit {done.returncode}", flush=True)
    return "" if done.returncode == 0 else f"exit {done.returncode}: {lines[-1][:300] if lines else ''}"


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


def render(doc: dict, order: list[str]) -> str:
    """One table per thread count: the per-round median ratios against OpenVINO at the same precision (and ONNX
    Runtime where timed) and each backend's share of the peak, with the geometric means; a model that did not build
    or run is a miss, with its reason. Then the bf16 accuracy of each output (1-thread rows) against OpenVINO's
    default."""
    machine = doc["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    lines = ["# mlc vs OpenVINO at fp32 and bf16, model set", "",
             f"Machine: {machine['cpu']} ({machine['llvm_cpu']}), {machine['cores_usable']} usable cores, "
             f"{machine['date'][:10]}, commit {machine.get('commit')}; versions: {versions}. Each row: "
             "`precision.py --peak`, the backends timed call by call in turn in one process; ratios are the median "
             "of the per-round ratios (below 1: mlc is faster). OpenVINO's default precision is bf16 on this CPU. "
             "Share of peak: the model's matmul/conv FLOPs at its fastest round over the thread count times one "
             "core's peak at the precision it ran (`peak.py`: fp32 vfmadd231ps, bf16 vdpbf16ps).", ""]
    ordered = sorted(doc["rows"], key=lambda r: order.index(r["label"]) if r["label"] in order else len(order))
    for threads in sorted({r["threads"] for r in ordered}):
        rows = [r for r in ordered if r["threads"] == threads]
        lines += [f"## {threads} thread{'s' if threads > 1 else ''}", "",
                  "| model | mlc fp32 ms | OV fp32 ms | mlc fp32 / OV fp32 | mlc fp32 / ORT | peak share fp32, mlc / "
                  "OV | mlc bf16 ms | OV default ms | mlc bf16 / OV default | peak share bf16, mlc / OV | "
                  "unscheduled kernels | load |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        ratios: dict[str, list[float]] = {"fp32": [], "ort": [], "bf16": []}
        misses = []
        for r in rows:
            lines.append(_row(r, ratios))
            misses += [f"{r['label']} ({what}: {why})" for what, why in r.get("missing", {}).items()]
        geomeans = {k: _bold(_geomean(v)) if v else "" for k, v in ratios.items()}
        lines += [f"| **geomean** | | | {geomeans['fp32']} ({len(ratios['fp32'])}) | {geomeans['ort']} | | | | "
                  f"{geomeans['bf16']} ({len(ratios['bf16'])}) | | | |", ""]
        if ratios["fp32"]:
            lines += [f"Slowest fp32 ratio {max(ratios['fp32']):.3f}; rows above 1.05x OpenVINO fp32: "
                      f"{sum(f > 1.05 for f in ratios['fp32'])}. Misses: {'; '.join(misses) or 'none'}.", ""]
    return "\n".join(lines + _accuracy_table([r for r in ordered if r["threads"] == 1 and "accuracy_vs_fp32" in r]))


def _row(r: dict, ratios: dict[str, list[float]]) -> str:
    """One model's table row; its ratios appended to `ratios` (fp32 and bf16 against OpenVINO, fp32 against ORT)."""
    if "p50_ms" not in r:
        return f"| {r['label']} | miss | | | | | miss | | | | | |"
    p50, cells = r["p50_ms"], {}
    f = r["over_openvino_fp32_median"]["mlc fp32"]
    ratios["fp32"].append(f)
    ort = r.get("over_onnxruntime_median", {}).get("mlc fp32")
    if ort:
        ratios["ort"].append(ort)
    cells["ort"] = _bold(ort) if ort else ""
    if "mlc bf16" in p50:
        b = r["over_openvino_default_median"]["mlc bf16"]
        ratios["bf16"].append(b)
        gate = " (gate missed: built with --no-check)" if "bf16_gate" in r else ""
        cells["bf16"] = (f"{p50['mlc bf16']:.1f} | {p50['openvino default']:.1f} | {_bold(b)}{gate} | "
                         f"{_shares(r, 'mlc bf16', 'openvino default')}")
    else:
        cells["bf16"] = f"miss | {p50['openvino default']:.1f} | | "
    load = "-".join(f"{x[0]:.1f}" for x in r["load_average"])  # 1-minute averages, start and end
    unscheduled = "/".join(str(n) for n in r.get("unscheduled_kernels", {}).values())
    return (f"| {r['label']} | {p50['mlc fp32']:.1f} | {p50['openvino fp32']:.1f} | {_bold(f)} | {cells['ort']} | "
            f"{_shares(r, 'mlc fp32', 'openvino fp32')} | {cells['bf16']} | {unscheduled} | {load} |")


def _shares(row: dict, mine: str, theirs: str) -> str:
    if "share_of_peak" not in row:
        return ""
    return " / ".join(f"{row['share_of_peak'][name]['share_of_peak_at_min']:.0%}" for name in (mine, theirs))


def _accuracy_table(rows: list) -> list[str]:
    """Each output's bf16 error against the fp32 reference, mlc vs OpenVINO's default, over the row's inputs."""
    if not rows or "accuracy_vs_fp32" not in rows[0]:
        return []
    rows = [r for r in rows if "mlc bf16" in r["accuracy_vs_fp32"]]
    if not rows:
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
