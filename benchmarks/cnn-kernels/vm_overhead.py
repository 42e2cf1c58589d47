"""Per-call cost of the Relax VM at 1 thread: a chain of 300 tiny matmuls (1x16 @ 16x16, nothing to fuse) against
a chain of 1; (t300 - t1) / 299 is one kernel call, its allocation and its (tiny) compute.

    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/cnn-kernels/vm_overhead.py"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import tvm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
from tvm import relax

from mlc.compiler import schedules

TARGET = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 2}


def chain(n: int) -> float:
    """p50 microseconds of one call of a model that runs `n` tiny matmuls one after the other."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    weight = (np.eye(16) * 0.5 + 0.01).astype(np.float32)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(n):
                y = bb.emit(relax.op.matmul(y, relax.const(weight)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    executable, _ = schedules.build(bb.get(), TARGET, None, True)
    main = relax.VirtualMachine(executable, tvm.cpu())["main"]
    data = tvm.runtime.tensor(np.ones((1, 16), np.float32))
    for _ in range(50):
        main(data)
    times = []
    for _ in range(500):
        start = time.perf_counter()
        main(data)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


if __name__ == "__main__":
    p50 = {n: chain(n) for n in (1, 300)}
    print(json.dumps({"p50_us": p50, "per_call_us": round((p50[300] - p50[1]) / 299, 3)}))
