"""bert-base's dense layers, one symbolic-seq build against one static build per length, timed
interleaved in one process (1 thread; process CPU time, the minimum of --rounds batches of --min-time
seconds each: on the shared 2-core machine wall time also counted other processes' turns). Each build is
a Relax module of one dense layer as the ONNX importer makes it ([1, seq, K] x constant [K, N] + bias
[+ residual]), compiled by mlc's CPU path (mlc.compiler.schedules.build: default schedules + the TIR
pipeline); outputs are compared before timing.

    PYTHONPATH=$PWD python benchmarks/dynamic-kernels/dense.py -o benchmarks/dynamic-kernels/results/dense.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np

# name: (K, N, epilogue): bias, bias + residual, or none (the Q/K/V projections combined into one matmul)
SHAPES = {"qkv 768x2304 no bias": (768, 2304, "none"), "attn-out 768x768": (768, 768, "bias"),
          "ffn-up 768x3072": (768, 3072, "bias"), "ffn-down 3072x768 +res": (3072, 768, "residual")}
LENGTHS = [5, 8, 11, 13, 16, 27, 32, 64, 100, 128]


def module(tvm, relax, rows, k, n, epilogue, seed=0):
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, rows, k), "float32"))
    params = [x]
    if epilogue == "residual":
        params.append(relax.Var("r", relax.TensorType((1, rows, n), "float32")))
    w = relax.const((rng.standard_normal((k, n)) * 0.05).astype(np.float32))
    b = relax.const((rng.standard_normal((n,)) * 0.05).astype(np.float32))
    with bb.function("main", params):
        with bb.dataflow():
            y = relax.op.matmul(x, w)
            if epilogue != "none":
                y = relax.op.add(y, b)
            if epilogue == "residual":
                y = relax.op.add(y, params[1])
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    if not isinstance(rows, int):
        mod["main"] = mod["main"].with_attr("tir_var_upper_bound", {"seq": 512})
    return mod


def _cpu_time(function, feeds, number: int) -> float:
    """Seconds of this process's CPU time per call: on a shared machine a wall clock also counts the time
    other processes held the core (one thread: TVM runs the kernels in the calling thread)."""
    start = time.process_time()
    for _ in range(number):
        function(*feeds)
    return (time.process_time() - start) / number


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-o", "--output")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per timing")
    args = parser.parse_args()
    import tvm
    from tvm import relax

    from mlc import targets
    from mlc.bench import machine
    from mlc.compiler import schedules

    target_json = targets.resolve("x86").tvm
    target_json = {**target_json, "num-cores": 1}
    lengths = [int(v) for v in args.lengths.split(",")]
    results = []
    for name in args.shapes.split(","):
        k, n, epilogue = SHAPES[name]
        seq = tvm.tirx.Var("seq", "int64")
        t0 = time.time()
        dyn, _ = schedules.build(module(tvm, relax, seq, k, n, epilogue), target_json, None, True)
        dyn_vm = relax.VirtualMachine(dyn, tvm.cpu())
        print(f"{name}: dynamic build {time.time() - t0:.1f} s", file=sys.stderr)
        for length in lengths:
            st, _ = schedules.build(module(tvm, relax, length, k, n, epilogue), target_json, None, True)
            st_vm = relax.VirtualMachine(st, tvm.cpu())
            rng = np.random.default_rng(length)
            feeds = [tvm.runtime.tensor(rng.standard_normal((1, length, k)).astype(np.float32))]
            if epilogue == "residual":
                feeds.append(tvm.runtime.tensor(rng.standard_normal((1, length, n)).astype(np.float32)))
            a = dyn_vm["main"](*feeds).numpy()
            b = st_vm["main"](*feeds).numpy()
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
            times = {"dynamic": [], "static": []}
            for vm in (dyn_vm, st_vm):  # calibrate repeats
                vm.time_evaluator("main", tvm.cpu(), number=1, repeat=3)(*feeds)
            one = vm.time_evaluator("main", tvm.cpu(), number=3, repeat=1)(*feeds).mean
            number = max(1, int(args.min_time / max(one, 1e-6)))
            for _ in range(args.rounds):
                for label, vm in (("dynamic", dyn_vm), ("static", st_vm)):
                    times[label].append(_cpu_time(vm["main"], feeds, number))
            # the minimum over rounds: the machine is shared, and interference only ever adds time
            d, s = float(np.min(times["dynamic"])), float(np.min(times["static"]))
            gflops = 2 * length * k * n / s / 1e9
            results.append({"shape": name, "seq": length, "dynamic_ms": d * 1e3, "static_ms": s * 1e3,
                            "ratio": d / s, "static_gflops": gflops, "number": number, "rounds": args.rounds,
                            "dynamic_median_ms": float(np.median(times["dynamic"])) * 1e3,
                            "static_median_ms": float(np.median(times["static"])) * 1e3})
            print(f"{name:24s} seq {length:4d}: dynamic {d * 1e3:8.3f} ms static {s * 1e3:8.3f} ms "
                  f"ratio {d / s:5.2f} ({gflops:5.1f} GFLOP/s static)", flush=True)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump({"machine": machine.machine_info(),
                       "command": " ".join(sys.argv), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
