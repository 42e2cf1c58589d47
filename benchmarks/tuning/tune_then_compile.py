"""`mlc tune` then `mlc compile --db` on every model of the precision model set (issue #41's goal): each model tuned
into a database of its own with one --budget, then built from it, and the artifact checked. Records, per model, the
tune's wall time against its budget, its trials, the compile's exit status, warnings and kernels tuned/default/
unscheduled, and the check.

    .venv-suites/bin/python benchmarks/tuning/tune_then_compile.py --budget 4m --work /tmp/tune-set

torchvision's CNNs need `make suite-env`'s venv. One run, at one commit: results/tune-then-compile.json."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "precision"))
from model_set import MODELS  # noqa: E402 - the precision benchmark's list: one list of models

from mlc.bench.machine import machine_info  # noqa: E402


_TUNE_FIELDS = ("tasks", "trials", "failed_trials", "records", "seconds", "stopped_by", "left_to_default")


def _mlc(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mlc", *args], capture_output=True, text=True, timeout=timeout)
    return proc, time.perf_counter() - start


def _seconds(budget: str) -> float:
    return float(budget[:-1]) * {"s": 1, "m": 60, "h": 3600}[budget[-1]]


def run_one(label: str, work: Path, budget: str) -> dict:
    source, flags = MODELS[label]
    folder = work / label.replace(" ", "-").replace("(", "").replace(")", "")
    db, artifact = folder / "db", folder / "artifact"
    tune, tune_s = _mlc("tune", source, *flags, "--target", "x86", "--db", str(db), "--budget", budget, "--json",
                        timeout=_seconds(budget) * 3 + 600)
    row = {"model": label, "budget_s": _seconds(budget), "tune_rc": tune.returncode, "tune_wall_s": round(tune_s, 1),
           "tune_ratio": round(tune_s / _seconds(budget), 3), "tune_error": tune.stderr.strip().splitlines()[-1:]}
    try:
        row["tune"] = {k: v for k, v in json.loads(tune.stdout).items() if k in _TUNE_FIELDS}
    except ValueError:
        pass
    compile_, compile_s = _mlc("compile", source, *flags, "--target", "x86", "--db", str(db), "-o", str(artifact),
                               "--json", timeout=3600)
    row.update(compile_rc=compile_.returncode, compile_wall_s=round(compile_s, 1),
               compile_stderr=[line for line in compile_.stderr.splitlines() if "warning" in line or "error" in line])
    manifest = artifact / "manifest.json"
    if compile_.returncode == 0 and manifest.is_file():
        schedules = json.loads(manifest.read_text())["compile"]["schedules"] or {}
        row["kernels"] = {k: len(schedules.get(k, [])) for k in ("tuned", "default", "unscheduled")}
        check, _ = _mlc("check", str(artifact), timeout=1800)
        row["check_rc"] = check.returncode
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="4m")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tune-set"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("-o", "--output", type=Path, default=HERE / "results" / "tune-then-compile.json")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    record = {"machine": machine_info(), "commit": commit, "budget": args.budget, "rows": []}
    for label in args.models.split(","):
        record["rows"].append(run_one(label, args.work, args.budget))
        args.output.write_text(json.dumps(record, indent=1) + "\n")  # after every model: a kill keeps the rest
        row = record["rows"][-1]
        print(f"{label}: tune rc {row['tune_rc']} {row['tune_wall_s']} s ({row['tune_ratio']}x), compile rc "
              f"{row['compile_rc']}, check rc {row.get('check_rc')}, kernels {row.get('kernels')}", flush=True)


if __name__ == "__main__":
    main()
