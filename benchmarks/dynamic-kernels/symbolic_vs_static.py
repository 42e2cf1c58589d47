"""One model compiled once with a symbolic dim against one static compile per size, timed interleaved in one
process, call by call (1 thread; process CPU time, the minimum of --rounds batches of --min-time seconds:
on the shared 2-core machine wall time also counted other processes' turns). Each static artifact is
compiled with `mlc compile --input-shape`, timed beside the symbolic one, compared with it, and deleted.

    mlc export zoo:bert-base -o /tmp/bert/model.onnx --dynamic seq=1..64
    PYTHONPATH=$PWD python benchmarks/dynamic-kernels/symbolic_vs_static.py /tmp/bert/model.onnx --dim seq \\
        --sizes 5,8,11,13,16,21,27 --symbolic='--dynamic seq=1..64' -o benchmarks/dynamic-kernels/results/x.json
    mlc export zoo:resnet50 -o /tmp/r50/model.onnx      # batch symbolic as exported
    PYTHONPATH=$PWD python benchmarks/dynamic-kernels/symbolic_vs_static.py /tmp/r50/model.onnx --dim batch \\
        --sizes 1 -o benchmarks/dynamic-kernels/results/y.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np


def _inputs(onnx_path: str) -> list[tuple[str, list, int]]:
    import onnx

    model = onnx.load(onnx_path, load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    return [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim], i.type.tensor_type.elem_type)
            for i in model.graph.input if i.name not in initializers]


def _shape(dims: list, dim: str, size: int) -> list[int]:
    return [size if d == dim else (1 if isinstance(d, str) else d) for d in dims]


def _feeds(inputs, dim: str, size: int) -> dict[str, np.ndarray]:
    import onnx

    rng = np.random.default_rng(size)
    feeds = {}
    for name, dims, elem in inputs:
        shape = _shape(dims, dim, size)
        if elem in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            dtype = np.int64 if elem == onnx.TensorProto.INT64 else np.int32
            value = (np.ones(shape) if "mask" in name else np.zeros(shape) if "type" in name
                     else rng.integers(0, 1000, shape))
            feeds[name] = value.astype(dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _compile(onnx_path: str, out: Path, args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mlc", "compile", onnx_path, "-o", str(out), *args], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _kernel_key(name: str) -> str:
    """A kernel's name without the numbers TVM appends per build (fused_matmul1_multiply_add5 in one build is
    fused_matmul1_multiply_add2 in another): kernels of one key are summed."""
    return re.sub(r"\d+(?=_|$)", "", name.removesuffix("_prepacked"))


def _cpu_time(runner, feeds, number: int) -> float:
    start = time.process_time()
    for _ in range(number):
        runner.run(feeds)
    return (time.process_time() - start) / number


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("onnx")
    parser.add_argument("--dim", required=True, help="the symbolic dim to compare (seq, batch)")
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--symbolic", default="", help='extra mlc compile arguments for the symbolic build '
                        '(e.g. --symbolic="--dynamic seq=1..64")')
    parser.add_argument("--workdir", default="/tmp/mlc-symbolic-vs-static")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--kernels", type=int, default=0, help="also profile each kernel (the VM's instrument, "
                        "wall time): the minimum of this many profiles of 3 runs, matched by kernel name")
    parser.add_argument("--keep", action="store_true", help="keep the static artifacts")
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    from mlc.bench import machine
    from mlc.runtime.runner import Runner

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    inputs = _inputs(args.onnx)
    sizes = [int(s) for s in args.sizes.split(",")]
    symbolic_args = shlex.split(args.symbolic)
    doc = {"machine": machine.machine_info(), "command": " ".join(sys.argv), "onnx": args.onnx, "dim": args.dim,
           "symbolic_args": symbolic_args, "results": []}
    doc["symbolic_compile_s"] = _compile(args.onnx, work / "symbolic", symbolic_args)
    symbolic = Runner(work / "symbolic")
    print(f"symbolic build: {doc['symbolic_compile_s']:.1f} s", flush=True)
    for size in sizes:
        shapes = [f"{name}:{'x'.join(map(str, _shape(dims, args.dim, size)))}" for name, dims, _ in inputs]
        static_dir = work / f"static-{size}"
        compile_s = _compile(args.onnx, static_dir, [a for s in shapes for a in ("--input-shape", s)])
        static = Runner(static_dir)
        feeds = _feeds(inputs, args.dim, size)
        a, b = symbolic.run(feeds), static.run(feeds)
        error = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
        for runner in (symbolic, static):
            runner.run(feeds)
        one = _cpu_time(static, feeds, 2)
        number = max(1, int(args.min_time / max(one, 1e-6)))
        times = {"symbolic": [], "static": []}
        for _ in range(args.rounds):
            for label, runner in (("symbolic", symbolic), ("static", static)):
                times[label].append(_cpu_time(runner, feeds, number))
        kernels: dict[str, dict[str, float]] = {"symbolic": {}, "static": {}}
        for _ in range(args.kernels):
            for label, runner in (("symbolic", symbolic), ("static", static)):
                summed: dict[str, float] = {}
                for entry in runner.profile(feeds, runs=3):
                    summed[_kernel_key(entry["name"])] = summed.get(_kernel_key(entry["name"]), 0.0) + entry["ms"]
                for name, ms in summed.items():
                    kernels[label][name] = min(kernels[label].get(name, float("inf")), ms)
        s, t = min(times["symbolic"]), min(times["static"])
        row = {"size": size, "symbolic_ms": s * 1e3, "static_ms": t * 1e3, "ratio": s / t,
               "symbolic_median_ms": float(np.median(times["symbolic"])) * 1e3,
               "static_median_ms": float(np.median(times["static"])) * 1e3, "static_compile_s": compile_s,
               "max_abs_diff": error, "number": number, "rounds": args.rounds,
               "load_average": machine.load_average()}
        if args.kernels:
            names = sorted(set(kernels["symbolic"]) | set(kernels["static"]),
                           key=lambda n: -kernels["symbolic"].get(n, 0.0))
            row["kernels_ms"] = {n: {"symbolic": kernels["symbolic"].get(n), "static": kernels["static"].get(n)}
                                 for n in names}
        doc["results"].append(row)
        print(f"{args.dim} {size:4d}: symbolic {s * 1e3:8.3f} ms static {t * 1e3:8.3f} ms ratio {s / t:5.3f} "
              f"(max diff {error:.1e}, static compile {compile_s:.0f} s)", flush=True)
        for name, k in list(row.get("kernels_ms", {}).items())[:12]:
            ratio = f"{k['symbolic'] / k['static']:6.2f}" if k["symbolic"] and k["static"] else "     -"
            print(f"    {name:50s} {k['symbolic'] or 0:8.4f} {k['static'] or 0:8.4f} {ratio}", flush=True)
        del static
        if not args.keep:
            shutil.rmtree(static_dir, ignore_errors=True)
        if args.output:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
