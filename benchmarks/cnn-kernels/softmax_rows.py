"""Softmax kernels (mlc's two: exp, then normalise) over rows no multiple of 16, scheduled by this tree's default
rules vs another copy of mlc/compiler/schedule_rules.py (e.g. `git show 585a14a:mlc/compiler/schedule_rules.py`),
timed interleaved call by call at 1 thread; checks both against numpy.

    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/cnn-kernels/softmax_rows.py /tmp/rules_before.py \\
        12x1370x1370:6 12x197x197:30 256x49x49:30 -o benchmarks/cnn-kernels/results/softmax-rows.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="a schedule_rules.py to compare with")
    parser.add_argument("shapes", nargs="+", help="AxBxC:ROUNDS")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = "1"
    import tvm
    from tvm import relax

    from mlc import targets
    from mlc.bench.machine import load_average, machine_info
    from mlc.compiler import relax_passes, schedule_rules, schedules

    spec = importlib.util.spec_from_file_location("rules_before", args.before)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    target = tvm.target.Target(targets.resolve("x86").tvm)

    def build(rules, shape):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                e = bb.emit(bb.call_te(relax_passes._softmax_exp, x, -1, primfunc_name_hint="fast_softmax_exp"))
                out = bb.emit_output(bb.call_te(relax_passes._softmax_normalize, e, -1,
                                                primfunc_name_hint="fast_softmax_norm"))
            bb.emit_func_output(out)
        mod = rules.apply_default_schedules(schedules._legalize_and_fuse(bb.get(), target), target)
        return relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())["main"]

    rows = []
    rng = np.random.default_rng(0)
    for item in args.shapes:
        dims, _, rounds = item.partition(":")
        shape = tuple(int(d) for d in dims.split("x"))
        values = (rng.standard_normal(shape) * 3).astype(np.float32)
        e = np.exp(values - values.max(-1, keepdims=True))
        expected = e / e.sum(-1, keepdims=True)
        fns = {"before": build(before, shape), "after": build(schedule_rules, shape)}
        tensor = tvm.runtime.tensor(values)
        errors = {k: float(np.abs(f(tensor).numpy() - expected).max()) for k, f in fns.items()}
        times = {k: [] for k in fns}
        names = list(fns)
        load = load_average()
        for i in range(int(rounds or 10)):
            for name in names[i % 2:] + names[:i % 2]:
                start = time.perf_counter()
                fns[name](tensor)
                times[name].append(time.perf_counter() - start)
        row = {"shape": list(shape), "rounds": len(times["after"]), "load_average": load,
               "p50_ms": {k: round(float(np.median(v)) * 1e3, 3) for k, v in times.items()},
               "after_vs_before": round(float(np.median(np.array(times["before"]) / np.array(times["after"]))), 3),
               "max_abs_error_vs_numpy": errors}
        print(json.dumps(row), flush=True)
        rows.append(row)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"benchmark": "softmax-rows", "machine": machine_info(), "rows": rows},
                                      indent=1) + "\n")


if __name__ == "__main__":
    main()
