"""`mlc compile` of a large ONNX file, whole process tree measured: wall time, CPU time (user + sys of every
process), the peak of the SUM of the RSS of the processes alive together (sampled every 50 ms: what the machine
sees), each process's own peak and lifetime, and the steps' timings from the manifest.

    python benchmarks/compile-time/measure.py bert-base.onnx --tree before=/tmp/base --tree after=. --runs 3 \
        -o benchmarks/compile-time/results/bert-base-23.json -- --input-shape input_ids:1x128 \
        --input-shape attention_mask:1x128

Trees (PYTHONPATH roots holding an `mlc` package) run interleaved, run by run, so that load from other jobs on a
shared machine falls on each alike; compare the minimum per tree."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mlc.bench.machine import machine_info


def measure(tree: Path, model: str, extra: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "mlc", "compile", str(Path(model).resolve()), "-o", str(out), *extra]
    start = time.perf_counter()
    # cwd: `python -m` puts it first on sys.path, before PYTHONPATH
    proc = subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(proc.pid)
    procs: dict[int, dict] = {}
    peak_sum, cpu = 0, {}
    while proc.poll() is None:
        total = 0
        now = time.perf_counter() - start
        try:
            tree_procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for p in tree_procs:
            try:
                rss = p.memory_info().rss
                times = p.cpu_times()
                if p.pid not in procs:
                    procs[p.pid] = {"command": " ".join(p.cmdline()[:4])[-80:], "start_s": round(now, 2), "peak_mb": 0}
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                continue
            info = procs[p.pid]
            info["end_s"] = round(now, 2)
            info["peak_mb"] = max(info["peak_mb"], round(rss / 2**20))
            cpu[p.pid] = times.user + times.system
            total += rss
        peak_sum = max(peak_sum, total)
        time.sleep(0.05)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: mlc compile failed ({proc.returncode}): {stderr[-2000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {"wall_s": round(wall, 2), "cpu_s": round(sum(cpu.values()), 2), "peak_sum_rss_mb": round(peak_sum / 2**20),
            "steps_s": manifest["compile"]["timings_s"], "artifact_mb": round(sum(
                f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20, 1),
            "processes": [p for p in procs.values() if p["peak_mb"] >= 50]}


def _model_bytes(path: Path) -> int:
    """The ONNX file's size plus its weight files' (external data), each counted once."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo

    model = onnx.load(str(path), load_external_data=False)
    files = {ExternalDataInfo(t).location for t in model.graph.initializer if t.external_data}
    return path.stat().st_size + sum((path.parent / f).stat().st_size for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("-o", "--output", type=Path, required=True)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # more `mlc compile` arguments
    args = parser.parse_args(argv[:len(argv) - len(extra) - (1 if extra else 0)])
    args.extra = extra
    trees = dict(t.split("=", 1) for t in args.tree)
    results: dict[str, list] = {name: [] for name in trees}
    scratch = Path(tempfile.mkdtemp(prefix="compile-time-"))
    try:
        for run in range(args.runs):
            for name, tree in trees.items():
                out = scratch / f"{name}-{run}"
                result = measure(Path(tree).resolve(), args.model, args.extra, out)
                shutil.rmtree(out)
                print(f"{name} run {run}: {result['wall_s']} s wall, {result['cpu_s']} s CPU, "
                      f"peak {result['peak_sum_rss_mb']} MB", flush=True)
                results[name].append(result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {name: {"min_wall_s": min(r["wall_s"] for r in runs), "min_cpu_s": min(r["cpu_s"] for r in runs),
                      "max_peak_sum_rss_mb": max(r["peak_sum_rss_mb"] for r in runs),
                      "min_peak_sum_rss_mb": min(r["peak_sum_rss_mb"] for r in runs)} for name, runs in results.items()}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "benchmark": "compile-time", "model": args.model, "model_mb": round(_model_bytes(Path(args.model)) / 2**20, 1),
        "command": f"mlc compile {Path(args.model).name} {' '.join(args.extra)}", "trees": trees,
        "summary": summary, "runs": results, "machine": machine_info()}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
