"""Every classifier in `paddle.vision.models` through `mlc compile` with no flags (issue #37).

Each model is built with pretrained=False after paddle.seed(0), saved with
`paddle.jit.save(m, prefix, input_spec=[InputSpec([1, 3, H, W], "float32", "x")])` (H = W = 224, 299 for
inception_v3), compiled by `mlc compile PREFIX --target x86 -o DIR --json` in a child process with a timeout, and,
when it compiles and passes its check against Paddle's eager outputs, timed against Paddle's own CPU inference
(the Paddle Inference predictor on the same saved program, IR optimisation on, 1 math thread) on the artifact's
reference inputs, call by call, interleaved, in one child process.

    .venv/bin/python benchmarks/framework-models/paddle_vision.py --list  # writes the list
    .venv/bin/python benchmarks/framework-models/paddle_vision.py             # runs the list, smallest first
    .venv/bin/python benchmarks/framework-models/paddle_vision.py --resume    # skips models already recorded
    .venv/bin/python benchmarks/framework-models/paddle_vision.py --only resnet18,vgg11

Each step (save, compile, time) runs in a child process of its own, under `nice -n 5` and a timeout; the results
file is rewritten after each model.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LIST = HERE / "results" / "paddle-vision-list.json"
RESULTS = HERE / "results" / "paddle-vision.json"
SIZES = {"inception_v3": 299}  # the model's own input size; 224 otherwise
PY = sys.executable
MLC = str(Path(sys.executable).with_name("mlc"))


def _quiet_paddle():
    os.environ.setdefault("GLOG_minloglevel", "2")
    import warnings

    warnings.simplefilter("ignore")
    import paddle

    return paddle


def classifiers() -> list[str]:
    """The public functions of paddle.vision.models that return a Layer (checked by building each one)."""
    import inspect

    _quiet_paddle()
    import paddle.vision.models as models

    names = []
    for name in sorted(dir(models)):
        fn = getattr(models, name)
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        names.append(name)
    return names


def list_models() -> None:
    paddle = _quiet_paddle()
    import paddle.vision.models as models

    rows = []
    for name in classifiers():
        paddle.seed(0)
        layer = getattr(models, name)(pretrained=False)
        if not isinstance(layer, paddle.nn.Layer):
            continue
        params = int(sum(int(p.size) for p in layer.parameters()))
        rows.append({"name": name, "params": params, "size": SIZES.get(name, 224)})
        print(name, params, flush=True)
        del layer
    rows.sort(key=lambda r: (r["params"], r["name"]))
    LIST.write_text(json.dumps({"paddle": paddle.__version__, "module": "paddle.vision.models",
                                "order": "parameters, smallest first", "models": rows}, indent=1) + "\n")


def save_model(name: str, prefix: str) -> None:
    """Child process: build `name` with seeded random weights and jit.save it at a fixed [1, 3, H, W]."""
    paddle = _quiet_paddle()
    import paddle.vision.models as models
    from paddle.static import InputSpec

    paddle.seed(0)
    layer = getattr(models, name)(pretrained=False)
    layer.eval()
    size = SIZES.get(name, 224)
    paddle.jit.save(layer, prefix, input_spec=[InputSpec([1, 3, size, size], "float32", "x")])


def time_model(prefix: str, artifact: str, rounds: int, out: str) -> None:
    """Child process: the artifact (mlc.runtime Runner, 1 thread) and the Paddle Inference predictor (1 math thread)
    on the artifact's reference inputs, one call of each in turn, `rounds` rounds after warm-up."""
    import numpy as np

    _quiet_paddle()
    import paddle.inference as inference

    from mlc.runtime.runner import Runner, load_npz

    runner = Runner(artifact, threads=1)
    feeds = load_npz(Path(artifact) / runner.manifest["reference"]["inputs"])
    program = next(p for p in (Path(prefix + ".json"), Path(prefix + ".pdmodel")) if p.exists())
    config = inference.Config(str(program), prefix + ".pdiparams")
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(1)
    config.switch_ir_optim(True)
    predictor = inference.create_predictor(config)
    for name, array in zip(predictor.get_input_names(), feeds.values()):
        predictor.get_input_handle(name).copy_from_cpu(np.ascontiguousarray(array))
    handles = [predictor.get_output_handle(n) for n in predictor.get_output_names()]

    def paddle_run():
        predictor.run()
        return [h.copy_to_cpu() for h in handles]

    def mlc_run():
        return list(runner.run(feeds).values())

    ours, theirs = mlc_run(), paddle_run()
    agreement = max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
                    for a, b in zip(ours, theirs))
    for _ in range(2):
        mlc_run(), paddle_run()
    times = {"mlc": [], "paddle": []}
    for _ in range(rounds):
        for key, fn in (("mlc", mlc_run), ("paddle", paddle_run)):
            start = time.perf_counter()
            fn()
            times[key].append((time.perf_counter() - start) * 1e3)

    def stats(values):
        return {"p50_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values),
                "runs_ms": [round(v, 3) for v in values]}

    mkldnn = bool(getattr(config, "mkldnn_enabled", lambda: None)())
    Path(out).write_text(json.dumps({
        "threads": 1, "rounds": rounds, "warmup": 3,
        "paddle_runtime": f"paddle.inference predictor (switch_ir_optim(True), 1 math thread, mkldnn {mkldnn})",
        "mlc_vs_paddle_inference_max_abs": agreement,
        "mlc": stats(times["mlc"]), "paddle": stats(times["paddle"]),
        "ratio_mlc_over_paddle": statistics.median(times["mlc"]) / statistics.median(times["paddle"])}))


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:300]


def _child(args: list[str], timeout: int) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(["nice", "-n", "5", *args], capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
        return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired as e:
        def text(v):
            return v.decode(errors="replace") if isinstance(v, bytes) else (v or "")
        return 124, text(e.stdout), text(e.stderr) + f"\ntimed out after {timeout} s", time.perf_counter() - start


def _machine() -> dict:
    info: dict = {}
    try:
        from mlc.bench.machine import machine_info

        info = machine_info()
    except Exception as e:  # the record still says when and where
        info = {"machine_info_error": str(e)[:200]}
    try:
        info["git_head"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                          text=True).stdout.strip()
        info["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    info.setdefault("date", dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    return info


def run_one(row: dict, work: Path, compile_timeout: int, rounds: int) -> dict:
    name = row["name"]
    record = {"model": name, "params": row["params"], "input": [1, 3, row["size"], row["size"]],
              "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "load_before": os.getloadavg()[0]}
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    prefix = str(folder / "model")
    rc, out, err, secs = _child([PY, __file__, "--save", name, prefix], 600)
    record["save_s"] = round(secs, 1)
    if rc != 0:
        record.update(stage="save", exit_code=rc, passed=False, error=_one_line(err))
        return record
    artifact = folder / "artifact"
    rc, out, err, secs = _child([MLC, "compile", prefix, "--target", "x86", "-o", str(artifact), "--json"],
                                compile_timeout)
    record.update(exit_code=rc, compile_s=round(secs, 1))
    result = None
    try:
        result = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        start = out.find("{")
        try:
            result = json.loads(out[start:]) if start >= 0 else None
        except json.JSONDecodeError:
            result = None
    record["mlc_json"] = result
    check = (result or {}).get("check") if isinstance(result, dict) else None
    if isinstance(check, dict):
        record["check"] = {k: check[k] for k in ("passed", "max_abs_error", "max_abs_err", "reference") if k in check}
    if rc != 0:
        error = ((result or {}).get("error") if isinstance(result, dict) else None) or _one_line(err) or _one_line(out)
        record.update(stage="compile", passed=False, error=error if isinstance(error, str) else json.dumps(error)[:300])
        record["stderr_tail"] = err[-2000:]
        return record
    record["passed"] = True
    timing_out = folder / "timing.json"
    rc, out, err, secs = _child([PY, __file__, "--time", prefix, str(artifact), "--rounds", str(rounds),
                                 "--out", str(timing_out)], 900)
    if rc == 0 and timing_out.exists():
        record["timing"] = json.loads(timing_out.read_text())
    else:
        record["timing_error"] = _one_line(err) or f"exit {rc}"
    record["load_after"] = os.getloadavg()[0]
    return record


def _max_abs(m: dict):
    outputs = (((m.get("mlc_json") or {}).get("check") or {}).get("outputs")) or []
    values = [o["max_abs_error"] for o in outputs if o.get("max_abs_error") is not None]
    return max(values) if values else None


def table(path: Path) -> str:
    """The README's table, from a results file."""
    record = json.loads(path.read_text())
    lines = ["| model | params (M) | input | exit | compile s | check (max abs err) | mlc ms (min-max) | "
             "Paddle Inference ms (min-max) | mlc / Paddle |", "|---|---|---|---|---|---|---|---|---|"]
    recorded = {m["model"]: m for m in record["models"]}
    passed = 0
    for name in record["list"]:
        m = recorded.get(name)
        if m is None:
            lines.append(f"| {name} | | | | | not run (time) | | | |")
            continue
        err = _max_abs(m)
        ok = m.get("passed") and m.get("exit_code") == 0
        passed += bool(ok)
        check = (f"pass ({err:.1e})" if ok else f"**fail** ({m.get('stage', '')}: {m.get('error', '')})"
                 if err is None else f"**fail** ({err:.1e})")
        t = m.get("timing") or {}

        def cell(k, t=t):
            s = t.get(k)
            return f"{s['p50_ms']:.2f} ({s['min_ms']:.2f}-{s['max_ms']:.2f})" if s else ""

        ratio = f"{t['ratio_mlc_over_paddle']:.2f}x" if t else m.get("timing_error", "")
        lines.append(f"| {name} | {m['params'] / 1e6:.1f} | {m['input'][2]} | {m.get('exit_code')} | "
                     f"{m.get('compile_s', '')} | {check} | {cell('mlc')} | {cell('paddle')} | {ratio} |")
    ratios = [m["timing"]["ratio_mlc_over_paddle"] for m in record["models"] if m.get("timing")]
    geo = statistics.geometric_mean(ratios) if ratios else float("nan")
    lines.append("")
    lines.append(f"{passed} of {len(record['list'])} pass ({100 * passed / len(record['list']):.1f} %); "
                 f"{len(recorded)} run; geomean mlc / Paddle time over the {len(ratios)} timed: {geo:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="introspect paddle.vision.models, write the list")
    parser.add_argument("--only", help="comma-separated model names (default: the whole list)")
    parser.add_argument("--resume", action="store_true", help="skip models already in the results file")
    parser.add_argument("-o", "--output", default=str(RESULTS))
    parser.add_argument("--compile-timeout", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed per model)")
    parser.add_argument("--keep", action="store_true", help="keep each model's saved program and artifact")
    parser.add_argument("--table", action="store_true", help="print the README table from the results file")
    parser.add_argument("--save", nargs=2, metavar=("NAME", "PREFIX"), help=argparse.SUPPRESS)
    parser.add_argument("--time", nargs=2, metavar=("PREFIX", "ARTIFACT"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.save:
        return save_model(*args.save)
    if args.time:
        return time_model(args.time[0], args.time[1], args.rounds, args.out)
    if args.list:
        return list_models()
    if args.table:
        return print(table(Path(args.output)))

    listing = json.loads(LIST.read_text())
    rows = listing["models"]
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - {r["name"] for r in rows}
        if unknown:
            parser.error(f"not in the list: {', '.join(sorted(unknown))}")
        rows = [r for r in rows if r["name"] in wanted]
    output = Path(args.output)
    record = json.loads(output.read_text()) if output.exists() and (args.resume or args.only) else None
    if record is None:
        record = {"study": "paddle.vision.models through mlc compile --target x86 (no flags), issue #37",
                  "paddle": listing["paddle"], "list": [r["name"] for r in listing["models"]], "runs": [],
                  "models": []}
    record.setdefault("runs", []).append(_machine())
    done = {m["model"] for m in record["models"]}
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mlc-paddle-vision-"))
    for row in rows:
        if args.resume and row["name"] in done:
            continue
        print(f"== {row['name']} ({row['params'] / 1e6:.1f} M params)", flush=True)
        result = run_one(row, work, args.compile_timeout, args.rounds)
        result["run"] = len(record["runs"]) - 1
        record["models"] = [m for m in record["models"] if m["model"] != row["name"]] + [result]
        order = {r["name"]: i for i, r in enumerate(listing["models"])}
        record["models"].sort(key=lambda m: order.get(m["model"], 1e9))
        record["runs"][-1]["load_last"] = list(os.getloadavg())
        record["runs"][-1]["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(record, indent=1) + "\n")
        t = result.get("timing") or {}
        print(f"   exit {result.get('exit_code')} passed {result.get('passed')} compile {result.get('compile_s')} s "
              f"check {result.get('check')} mlc {t.get('mlc', {}).get('p50_ms')} ms paddle "
              f"{t.get('paddle', {}).get('p50_ms')} ms {result.get('error', '')}", flush=True)
        if not args.keep:
            shutil.rmtree(work / row["name"], ignore_errors=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
