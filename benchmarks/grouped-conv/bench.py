"""Grouped convs (#39): mlc with the per-group channel padding ("after") and without it ("before":
`grouped_conv.PAD_GROUPS = False`; `build --baseline split` also leaves out the per-group register tile,
`schedule_rules.SPLIT_GROUPS = False`) vs ONNX Runtime and OpenVINO fp32, interleaved call by call in one process.

    .venv/bin/python benchmarks/grouped-conv/models.py /tmp/gc            # the ONNX models
    .venv/bin/python benchmarks/grouped-conv/bench.py build /tmp/gc g3-240-28 shufflenet-v1 ...
    .venv/bin/python benchmarks/grouped-conv/bench.py time /tmp/gc --threads 1 -o results/x.json g3-240-28 ...

`build` compiles DIR/NAME.onnx to DIR/art-{before,after}-NAME in this process (default schedules, target x86).
`time` runs, per model, every round one call of each backend back to back (the order rotating); a row holds each
side's p50, the median of the per-round ratios (other / mlc after: above 1, mlc faster) with p10-p90, and the load."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "precision"))


MODELS = {"shufflenet-v1"}  # whole models (a symbolic batch, compiled at 1); the rest are single layers


def build(folder: Path, names: list[str], baseline: str = "pad") -> None:
    """`baseline` "pad": "before" builds without the per-group channel padding (grouped_conv.PAD_GROUPS off, as
    f4feee1 built), "after" with it; "split": "before" without the per-group tile nor the padding (2e05e73)."""
    import mlc.api as api
    from mlc.compiler import grouped_conv, schedule_rules

    for name in names:
        for label, on in (("before", False), ("after", True)):
            schedule_rules.SPLIT_GROUPS = on or baseline == "pad"
            grouped_conv.PAD_GROUPS = on
            result = api.compile(str(folder / f"{name}.onnx"), target="x86", output=folder / f"art-{label}-{name}",
                                 isolate=False, input_shapes=["images:1x3x224x224"] if name in MODELS else ())
            print(name, label, "check", bool(result.check.passed), result.manifest.compile.schedules["unscheduled"])


def measure(folder: Path, names: list[str], threads: int, rounds: int, output: Path) -> None:
    for var in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[var] = str(threads)
    import onnxruntime as ort

    from beside_openvino import interleave, mlc_timers, timer

    from mlc.bench.baselines import openvino_model
    from mlc.bench.machine import load_average, machine_info
    from mlc.runtime.runner import Runner

    doc = json.loads(output.read_text()) if output.exists() else {"benchmark": "grouped-conv", "rows": []}
    for name in names:
        runners = {label: Runner(folder / f"art-{label}-{name}") for label in ("before", "after")}
        first = runners["after"]
        with np.load(first.root / first.manifest["reference"]["inputs"]) as npz:
            feeds = {k: npz[k] for k in npz.files}
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(folder / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
        compiled, precision = openvino_model(folder / f"{name}.onnx", threads, "f32")
        request = compiled.create_infer_request()
        wanted = {n for port in compiled.inputs for n in port.get_names()}

        ov_feeds = {k: v for k, v in feeds.items() if k in wanted}
        timers = {"ort": timer(lambda s=session, f=feeds: s.run(None, f)),
                  "openvino_fp32": timer(lambda r=request, f=ov_feeds: r.infer(f))}
        timers.update({f"mlc_{label}": t for label, t in mlc_timers(runners, feeds).items()})
        load_start = load_average()
        samples = interleave(timers, rounds, warmup=5)
        arrays = {k: np.array(v) for k, v in samples.items()}
        row = {"label": name, "threads": threads, "rounds": rounds, "openvino_precision": precision,
               "p50_ms": {k: round(float(np.median(a)) * 1e3, 4) for k, a in arrays.items()},
               "min_max_ms": {k: [round(float(a.min()) * 1e3, 4), round(float(a.max()) * 1e3, 4)]
                              for k, a in arrays.items()},
               "load_average": [load_start, load_average()]}
        for mine in ("before", "after"):
            for other in ("ort", "openvino_fp32"):
                ratio = arrays[other] / arrays[f"mlc_{mine}"]
                row[f"speedup_{mine}_vs_{other}"] = [round(float(np.percentile(ratio, q)), 3) for q in (50, 10, 90)]
        ratio = arrays["mlc_before"] / arrays["mlc_after"]
        row["speedup_after_vs_before"] = [round(float(np.percentile(ratio, q)), 3) for q in (50, 10, 90)]
        doc["rows"] = [r for r in doc["rows"] if (r["label"], r["threads"]) != (name, threads)] + [row]
        doc["machine"] = machine_info()
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(row))


def kernels(folder: Path, names: list[str], rounds: int, output: Path) -> None:
    """The conv kernel alone, 1 thread: mlc's (before/after; the VM's per-kernel profile, which leaves out the
    single-layer models' layout transposes) and ONNX Runtime's Conv node (its node profiler), rounds alternating;
    and mlc's kernels all together (`*_all`: the padded convs' slices run in the kernel after the conv)."""
    for var in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[var] = "1"
    import tempfile

    import onnxruntime as ort

    from mlc.bench.machine import load_average, machine_info
    from mlc.runtime.runner import Runner

    doc = json.loads(output.read_text()) if output.exists() else {"benchmark": "grouped-conv kernels", "rows": []}
    for name in names:
        runners = {label: Runner(folder / f"art-{label}-{name}") for label in ("before", "after")}
        with np.load(runners["after"].root / runners["after"].manifest["reference"]["inputs"]) as npz:
            feeds = {k: npz[k] for k in npz.files}
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = tempfile.mkdtemp() + "/ort"
        session = ort.InferenceSession(str(folder / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
        samples = {"before": [], "after": [], "before_all": [], "after_all": []}
        profiles = {"before": [], "after": []}
        load_start = load_average()
        for i in range(3 + rounds):
            session.run(None, feeds)
            for label in (("before", "after") if i % 2 else ("after", "before")):
                rows = [r for r in runners[label].profile(feeds, runs=1) if not r["name"].startswith("vm.")]
                if i >= 3:  # the conv kernels; every kernel (the padding's slices run in the kernels after a conv)
                    samples[label].append(sum(r["ms"] for r in rows if "conv2d" in r["name"]))
                    samples[f"{label}_all"].append(sum(r["ms"] for r in rows))
                    profiles[label].append({r["name"]: r["ms"] for r in rows})
        events = json.load(open(session.end_profiling()))
        runs = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "model_run"][3:]
        nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                 and any(start <= e["ts"] <= end for start, end in runs)]
        convs = [e for e in nodes if e.get("args", {}).get("op_name") in ("Conv", "FusedConv")]
        ort_ms = [sum(e["dur"] for e in convs if start <= e["ts"] <= end) / 1e3 for start, end in runs]  # per run
        arrays = {"ort": np.array(ort_ms), **{f"mlc_{k}": np.array(v) for k, v in samples.items()}}
        row = {"label": name, "threads": 1, "rounds": rounds, "load_average": [load_start, load_average()],
               "p50_ms": {k: round(float(np.median(a)), 4) for k, a in arrays.items()},
               "p10_p90_ms": {k: [round(float(np.percentile(a, q)), 4) for q in (10, 90)] for k, a in arrays.items()},
               "min_max_ms": {k: [round(float(a.min()), 4), round(float(a.max()), 4)] for k, a in arrays.items()}}
        row["ort_over_after"] = round(row["p50_ms"]["ort"] / row["p50_ms"]["mlc_after"], 3)
        row["before_over_after"] = round(float(np.median(arrays["mlc_before"] / arrays["mlc_after"])), 3)
        row["before_over_after_all_kernels"] = [round(float(np.percentile(
            arrays["mlc_before_all"] / arrays["mlc_after_all"], q)), 3) for q in (50, 10, 90)]
        row["sum_of_kernel_minima_ms"] = _minima(profiles, nodes)
        doc["rows"] = [r for r in doc["rows"] if r["label"] != name] + [row]
        doc["machine"] = machine_info()
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(row))


def _minima(profiles: dict[str, list[dict[str, float]]], ort_nodes: list[dict]) -> dict[str, float]:
    """Each kernel's (ORT node's) fastest call over the rounds, summed: the conv kernels, and all kernels
    (`*_all`). On a loaded machine (another session's work preempting a call) this is steadier than the
    per-round sums' median, for a model of many short kernels (ShuffleNet: ~70 of 10-100 us)."""
    out = {}
    for label, rounds in profiles.items():
        fastest = {name: min(r.get(name, np.inf) for r in rounds) for name in rounds[0]}
        out[f"mlc_{label}"] = round(sum(ms for name, ms in fastest.items() if "conv2d" in name), 4)
        out[f"mlc_{label}_all"] = round(sum(fastest.values()), 4)
    fastest_nodes: dict[tuple, float] = {}
    for e in ort_nodes:
        key = (e["name"], e.get("args", {}).get("op_name"))
        fastest_nodes[key] = min(fastest_nodes.get(key, np.inf), e["dur"] / 1e3)
    out["ort"] = round(sum(ms for (_, op), ms in fastest_nodes.items() if op in ("Conv", "FusedConv")), 4)
    out["ort_all"] = round(sum(fastest_nodes.values()), 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "time", "kernels"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--baseline", choices=["pad", "split"], default="pad",
                        help="build: what 'before' leaves out (the per-group padding, or the per-group tile too)")
    args = parser.parse_args()
    if args.command == "build":
        build(args.folder, args.names, args.baseline)
    elif args.command == "kernels":
        kernels(args.folder, args.names, args.rounds, args.output)
    else:
        measure(args.folder, args.names, args.threads, args.rounds, args.output)


if __name__ == "__main__":
    main()
