"""Helpers shared by the framework-model studies (issue #37): `paddle_vision.py`, `keras_apps.py`.

The machine record, the child-process runner, mlc's JSON result, timing stats, one `mlc compile` step and the
README table, so every study records and prints the same way.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PY = sys.executable
MLC = str(Path(sys.executable).with_name("mlc"))


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def stats(values: list[float]) -> dict:
    """p50 with min-max of per-call times in ms (and every call, rounded)."""
    return {"p50_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values),
            "runs_ms": [round(v, 3) for v in values]}


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 3) -> dict[str, list[float]]:
    """Per-call ms of each function, one call of each in turn, `rounds` rounds after `warmup` untimed rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[key].append((time.perf_counter() - start) * 1e3)
    return times


def one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:300]


MAX_RSS_GIB = 10.0  # a step whose processes together hold more is stopped: the machine's memory is shared


def _tree_rss(proc) -> int:
    """Resident bytes of `proc` and every process under it (0 for one that ended meanwhile)."""
    import psutil

    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def child(args: list[str], timeout: int, max_rss_gib: float = MAX_RSS_GIB) -> tuple[int, str, str, float]:
    """Run `args` under `nice -n 5` in the repository root; exit 124 on timeout, 137 when its process tree holds
    more than `max_rss_gib` GiB (the output so far kept, the reason as stderr's last line)."""
    import signal

    import psutil

    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(["nice", "-n", "5", *args], stdout=out, stderr=err, text=True, cwd=ROOT,
                                start_new_session=True)
        watched = psutil.Process(proc.pid)
        reason, peak = None, 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(watched))
            if peak > max_rss_gib * 2**30:
                reason = (f"stopped: its processes held {peak / 2**30:.1f} GiB, over the {max_rss_gib:g} GiB "
                          "this study allows on a shared machine")
            elif time.perf_counter() - start > timeout:
                reason = f"timed out after {timeout} s"
            if reason:
                try:
                    below = watched.children(recursive=True)  # workers may run in sessions of their own
                except psutil.Error:
                    below = []
                os.killpg(proc.pid, signal.SIGKILL)
                for p in below:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                proc.wait()
                break
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    rc = proc.returncode if reason is None else 124 if reason.startswith("timed out") else 137
    if reason:
        stderr += f"\n{reason}"
    return rc, stdout, stderr, time.perf_counter() - start


def machine() -> dict:
    """What and where: mlc.bench.machine.machine_info(), the commit (with -dirty when the tree has edits), uptime."""
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
    info.setdefault("date", now())
    return info


def parse_result(out: str) -> Optional[dict]:
    """`mlc compile --json`'s result from its stdout (anything printed before the JSON object is skipped)."""
    try:
        return json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        start = out.find("{")
        try:
            return json.loads(out[start:]) if start >= 0 else None
        except json.JSONDecodeError:
            return None


def save_step(record: dict, argv: list[str], timeout: int) -> bool:
    """The child that builds and saves the model as a user would; fills `record`; True when it exited 0."""
    rc, _, err, secs = child(argv, timeout)
    record["save_s"] = round(secs, 1)
    if rc != 0:
        record.update(stage="save", exit_code=rc, passed=False, error=one_line(err))
    return rc == 0


def timing_step(record: dict, argv: list[str], out: Path, timeout: int) -> None:
    """The timing child (`argv` + `--out OUT`): its JSON as `record["timing"]`, or why there is none."""
    rc, _, err, _ = child([*argv, "--out", str(out)], timeout)
    if rc == 0 and out.exists():
        record["timing"] = json.loads(out.read_text())
    else:
        record["timing_error"] = one_line(err) or f"exit {rc}"
    record["load_after"] = os.getloadavg()[0]


def compile_step(record: dict, model_path: str, artifact: Path, timeout: int) -> bool:
    """`mlc compile MODEL --target x86 -o ARTIFACT --json` (no other flags) in a child; fills `record`; True when it
    exited 0 (compiled and passed its check against the framework's eager outputs)."""
    rc, out, err, secs = child([MLC, "compile", model_path, "--target", "x86", "-o", str(artifact), "--json"],
                               timeout)
    record.update(exit_code=rc, compile_s=round(secs, 1))
    result = parse_result(out)
    record["mlc_json"] = result
    check = (result or {}).get("check") if isinstance(result, dict) else None
    if isinstance(check, dict):
        record["check"] = {k: check[k] for k in ("passed", "max_abs_error", "max_abs_err", "reference") if k in check}
    if rc != 0:
        error = ((result or {}).get("error") if isinstance(result, dict) else None) or one_line(err) or one_line(out)
        record.update(stage="compile", passed=False, error=error if isinstance(error, str) else json.dumps(error)[:300])
        record["stderr_tail"] = err[-2000:]
        return False
    record["passed"] = True
    return True


def max_abs(m: dict):
    outputs = (((m.get("mlc_json") or {}).get("check") or {}).get("outputs")) or []
    values = [o["max_abs_error"] for o in outputs if o.get("max_abs_error") is not None]
    return max(values) if values else None


def table(path: Path, theirs: str, theirs_label: str, ratio_key: str, short: str,
          size: Callable[[dict], object], also: Sequence[Path] = ()) -> str:
    """The README's table from a results file: `theirs` is the framework's timing key, `theirs_label` its column
    name, `ratio_key` the timing's ratio, `short` the framework in the ratio column, `size(row)` the input cell;
    `also`: results files of other processes of the same run, whose rows fill the models `path` lacks."""
    record = json.loads(path.read_text())
    for other in also:
        have = {m["model"] for m in record["models"]}
        record["models"] += [m for m in json.loads(Path(other).read_text())["models"] if m["model"] not in have]
    lines = ["| model | params (M) | input | exit | compile s | check (max abs err) | mlc ms (min-max) | "
             f"{theirs_label} ms (min-max) | mlc / {short} |", "|---|---|---|---|---|---|---|---|---|"]
    recorded = {m["model"]: m for m in record["models"]}
    passed = 0
    for name in record["list"]:
        m = recorded.get(name)
        if m is None:
            lines.append(f"| {name} | | | | | not run (time) | | | |")
            continue
        err = max_abs(m)
        ok = m.get("passed") and m.get("exit_code") == 0
        passed += bool(ok)
        check = (f"pass ({err:.1e})" if ok else f"**fail** ({m.get('stage', '')}: {m.get('error', '')})"
                 if err is None else f"**fail** ({err:.1e})")
        t = m.get("timing") or {}

        def cell(k, t=t):
            s = t.get(k)
            return f"{s['p50_ms']:.2f} ({s['min_ms']:.2f}-{s['max_ms']:.2f})" if s else ""

        ratio = f"{t[ratio_key]:.2f}x" if t else m.get("timing_error", "")
        lines.append(f"| {name} | {m['params'] / 1e6:.1f} | {size(m)} | {m.get('exit_code')} | "
                     f"{m.get('compile_s', '')} | {check} | {cell('mlc')} | {cell(theirs)} | {ratio} |")
    ratios = [m["timing"][ratio_key] for m in record["models"] if m.get("timing")]
    geo = statistics.geometric_mean(ratios) if ratios else float("nan")
    lines.append("")
    lines.append(f"{passed} of {len(record['list'])} pass ({100 * passed / len(record['list']):.1f} %); "
                 f"{len(recorded)} run; geomean mlc / {short} time over the {len(ratios)} timed: {geo:.2f}x")
    return "\n".join(lines)


def only(rows: list[dict], names: Optional[str], parser) -> list[dict]:
    """The rows `--only A,B` names (all when not given); a name not in the list is a usage error."""
    if not names:
        return rows
    wanted = names.split(",")
    unknown = set(wanted) - {r["name"] for r in rows}
    if unknown:
        parser.error(f"not in the list: {', '.join(sorted(unknown))}")
    return [r for r in rows if r["name"] in wanted]


def run_list(rows: list[dict], listing_rows: list[dict], output: Path, new_record: Callable[[], dict],
             run_one: Callable[[dict, Path], dict], work: Path, keep: bool, resume: bool, reuse: bool,
             note: Optional[str], theirs: str, elsewhere: Sequence[Path] = ()) -> None:
    """Run `rows` in order, rewriting `output` after each model (rows replace earlier rows of the same model);
    `reuse` adds to an existing `output`, `resume` also skips the models it has; a model recorded in one of the
    `elsewhere` results files (read again before each model: another process running the list from its other end)
    is skipped."""
    record = json.loads(output.read_text()) if output.exists() and (resume or reuse) else None
    if record is None:
        record = new_record()
    run = machine()
    if note:
        run["note"] = note
    record.setdefault("runs", []).append(run)
    done = {m["model"] for m in record["models"]}
    order = {r["name"]: i for i, r in enumerate(listing_rows)}
    import shutil

    for row in rows:
        if resume and row["name"] in done:
            continue
        if any(row["name"] in {m["model"] for m in json.loads(p.read_text())["models"]}
               for p in elsewhere if p.exists()):
            print(f"== {row['name']}: recorded in another results file, skipped", flush=True)
            continue
        print(f"== {row['name']} ({row['params'] / 1e6:.1f} M params)", flush=True)
        result = run_one(row, work)
        result["run"] = len(record["runs"]) - 1
        record["models"] = [m for m in record["models"] if m["model"] != row["name"]] + [result]
        record["models"].sort(key=lambda m: order.get(m["model"], 1e9))
        record["runs"][-1]["load_last"] = list(os.getloadavg())
        record["runs"][-1]["finished"] = now()
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(record, indent=1) + "\n")
        t = result.get("timing") or {}
        print(f"   exit {result.get('exit_code')} passed {result.get('passed')} compile {result.get('compile_s')} s "
              f"check {result.get('check')} mlc {t.get('mlc', {}).get('p50_ms')} ms {theirs} "
              f"{t.get(theirs, {}).get('p50_ms')} ms {result.get('error', '')}", flush=True)
        if not keep:
            shutil.rmtree(work / row["name"], ignore_errors=True)
