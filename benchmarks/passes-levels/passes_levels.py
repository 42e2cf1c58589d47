"""What each -O level does to compile time and latency, for one model on one target.

For every level: `mlc compile` (isolated TVM worker, as users run it) with its wall time and the
per-pass report, the accuracy check, then latency of the artifact (thin runner, warm-up + repeats).

    .venv/bin/python benchmarks/passes-levels/passes_levels.py zoo:transformer
    .venv/bin/python benchmarks/passes-levels/passes_levels.py zoo:resnet50 --framework torch --levels 0 2
    .venv/bin/python benchmarks/passes-levels/passes_levels.py bert.onnx --input-shape input_ids:1x128 \
        --levels 0 2 --out x.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
from mlc.bench.machine import machine_info

import mlc.api as api
from mlc import passes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", help="a model as mlc compile takes it: .onnx, framework file, zoo:NAME")
    parser.add_argument("--target", default="x86")
    parser.add_argument("--framework", help="as mlc compile --framework (e.g. torch for zoo:resnet50, zoo:bert-base)")
    parser.add_argument("--input-shape", action="append", default=[])
    parser.add_argument("--levels", type=int, nargs="+", default=list(passes.OPT_LEVELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    name = api.model_name(args.model)
    out = args.out or Path(__file__).with_name("results") / f"passes_levels_{name}.json"

    rows = []
    with tempfile.TemporaryDirectory(prefix="mlc-bench-") as scratch:
        for level in args.levels:
            start = time.perf_counter()
            result = api.compile(args.model, target=args.target, output=Path(scratch) / f"O{level}",
                                 input_shapes=args.input_shape, framework=args.framework,
                                 pass_options=passes.Options(opt_level=level))
            compile_s = time.perf_counter() - start
            latency = api.run(result.path, warmup=3, repeat=args.repeat).latency
            timings = result.manifest.compile.timings_s
            rows.append({
                "opt_level": level,
                "compile_s": round(compile_s, 2),
                "tvm_build_s": timings.get("tvm_build"),
                "check_passed": result.check.passed if result.check else None,
                "max_abs_error": (max((o.max_abs_error for o in result.check.outputs), default=None)
                                  if result.check else None),
                "latency_ms": {k: round(v, 3) for k, v in latency.items() if k.endswith("_ms")} if latency else None,
                "passes": [p.model_dump() for p in result.manifest.compile.passes],
            })
            print(f"-O{level}: compile {compile_s:.1f} s, mean latency {latency['mean_ms']:.2f} ms, "
                  f"check {'pass' if rows[-1]['check_passed'] else 'FAIL'}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "passes_levels", "model": args.model, "target": args.target,
                               "input_shapes": args.input_shape, "machine": machine_info(), "levels": rows},
                               indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
