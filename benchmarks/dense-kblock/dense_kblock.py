"""Dense fp32 kernels (bert-base, swin) as mlc's default CPU schedule builds them, against the same rule with the
reduction axis K blocked (an experiment, defined here: issue #22/#21 suspected the unblocked K for the K or N = 3072
layers' speed), numpy (OpenBLAS) and the core's measured fp32 peak (benchmarks/int8-kernels/peak.c). One thread,
the variants timed interleaved in one process: hot (the same call repeated; process CPU time) and cold (a 64 MB
read evicts L1/L2/L3 before every call, as the other layers' weights do in a model; wall time of the call alone).
Outputs are compared before timing.

    PYTHONPATH=$PWD python benchmarks/dense-kblock/dense_kblock.py -o benchmarks/dense-kblock/results/kernels.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

HERE = Path(__file__).resolve().parent
# name: (rows, K, N, epilogue)
SHAPES = {
    "bert s1 ffn-down 3072x768 +res": (1, 3072, 768, "residual"),
    "bert s4 ffn-down 3072x768 +res": (4, 3072, 768, "residual"),
    "bert s8 ffn-up 768x3072 +gelu": (8, 768, 3072, "gelu"),
    "bert s8 ffn-down 3072x768 +res": (8, 3072, 768, "residual"),
    "bert s12 ffn-down 3072x768 +res": (12, 3072, 768, "residual"),
    "bert s128 qkv 768x2304": (128, 768, 2304, "none"), "bert s128 out 768x768": (128, 768, 768, "bias"),
    "bert s128 ffn-up 768x3072 +gelu": (128, 768, 3072, "gelu"),
    "bert s128 ffn-down 3072x768 +res": (128, 3072, 768, "residual"),
    "bert s32 ffn-up 768x3072 +gelu": (32, 768, 3072, "gelu"),
    "bert s32 ffn-down 3072x768 +res": (32, 3072, 768, "residual"),
    "bert s512 ffn-down 3072x768 +res": (512, 3072, 768, "residual"),
    "swin stage3 512x2048": (196, 512, 2048, "bias"), "swin stage3 2048x512": (196, 2048, 512, "bias"),
    "swin stage4 4096x1024": (49, 4096, 1024, "bias"),
}


def module(rows: int, k: int, n: int, epilogue: str, seed: int = 0):
    """[1, rows, K] x constant [K, N] (+ bias, + GELU as the ONNX importer writes it with erf, + residual)."""
    from tvm import relax

    from mlc.compiler import relax_passes

    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, rows, k), "float32"))
    params = [x] + ([relax.Var("r", relax.TensorType((1, rows, n), "float32"))] if epilogue == "residual" else [])
    w = relax.const((rng.standard_normal((k, n)) * 0.05).astype(np.float32))
    b = relax.const((rng.standard_normal((n,)) * 0.05).astype(np.float32))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = relax.op.matmul(x, w)
            if epilogue != "none":
                y = relax.op.add(y, b)
            if epilogue == "gelu":
                erf = relax.op.erf(relax.op.divide(y, relax.const(2 ** 0.5, "float32")))
                y = relax.op.multiply(relax.op.multiply(y, relax.op.add(erf, relax.const(1.0, "float32"))),
                                      relax.const(0.5, "float32"))
            if epilogue == "residual":
                y = relax.op.add(y, params[1])
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return relax_passes.fast_math(bb.get(), {}, None)  # erf -> fast_erf, as mlc's pipeline does


def reference(x, w, b, epilogue, residual=None):
    from math import erf

    y = x @ w.astype(np.float64)
    if epilogue != "none":
        y = y + b
    if epilogue == "gelu":
        y = 0.5 * y * (1 + np.vectorize(erf)(y / 2 ** 0.5))
    if epilogue == "residual":
        y = y + residual
    return y


def kblocked(kb: int):
    """A `_schedule_register_tile` with K blocked: each task is one block of J panels (parallel) over all rows;
    for each K block of `kb`, every row tile accumulates `kb` steps in registers into a block-sized local
    accumulator (the packed weights' K block, kb x panels x 32 floats, stays in L1/L2 across the row tiles); the
    epilogue runs in the write-back after the last K block. Static fp32 tiles only (else the rule's own tile)."""
    from mlc.compiler import schedule_rules as sr

    original = sr._schedule_register_tile

    def tile(sch, block, spatial, reduction, last, lanes, bf16=False, int8=False, registers=None, columns=None,
             row_count=None, padded_rows=False):
        depths = [sr._extent(sch, r) for r in reduction]
        row_extent = sr._extent(sch, spatial[-2]) if len(spatial) > 1 else None
        if (bf16 or int8 or columns is not None or len(reduction) != 1 or None in depths or row_extent is None
                or depths[0] < 2 * kb or depths[0] % kb):
            return original(sch, block, spatial, reduction, last, lanes, bf16, int8, registers, columns,
                            row_count, padded_rows)
        j_extent = sr._extent(sch, spatial[-1])
        vectors, _ = sr._tile_shape(j_extent, row_extent, lanes, registers, depths)
        row_tile = sr._row_tile(j_extent, row_extent, lanes, depths, registers)
        jo, jv, ji = sch.split(spatial[-1], factors=[None, vectors, lanes])
        panels = sr._panels_per_block(sr._extent(sch, jo), kb, vectors * lanes)
        panels = max(d for d in range(1, panels + 1) if sr._extent(sch, jo) % d == 0)
        jo, panel = sch.split(jo, factors=[None, panels])
        ko, ki = sch.split(reduction[0], factors=[None, kb])
        mo, rows = sch.split(spatial[-2], factors=[None, row_tile])
        head = [jo, *spatial[:-2]]
        sch.reorder(*head, ko, mo, panel, ki, rows, jv, ji)
        sr._pack_weights(sch, block, last, vectors * lanes)
        fused = sch.fuse(*head) if len(head) > 1 else head[0]
        sch.parallel(fused)
        write_back = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(write_back, fused, preserve_unit_loops=True)
        sr._inline_epilogue(sch, write_back)
        inner = sch.get_loops(write_back)[1:]
        _, vec = sch.split(sch.fuse(*inner) if len(inner) > 1 else inner[0], factors=[None, lanes])
        sch.vectorize(vec)
        sch.unroll(rows)
        sch.unroll(jv)
        sch.vectorize(ji)
        init = sch.decompose_reduction(block, ko)
        sch.vectorize(sch.get_loops(init)[-1])
        return None

    return tile


def build(rows, k, n, epilogue, variant: str, target_json):
    import tvm
    from tvm import relax

    from mlc.compiler import schedule_rules as sr
    from mlc.compiler import schedules

    original, prefetch = sr._schedule_register_tile, sr.PREFETCH_WEIGHTS
    if variant.startswith("kblock"):
        sr._schedule_register_tile = kblocked(int(variant[len("kblock"):]))
    sr.PREFETCH_WEIGHTS = variant != "noprefetch"  # kblock: only the tiles it leaves to the rule
    try:
        executable, report = schedules.build(module(rows, k, n, epilogue), target_json, None, True)
    finally:
        sr._schedule_register_tile, sr.PREFETCH_WEIGHTS = original, prefetch
    assert not report["unscheduled"], report
    return relax.VirtualMachine(executable, tvm.cpu())["main"]


def peak() -> float | None:
    """vfmadd231ps ops/s from peak.c (None where gcc cannot build it)."""
    with tempfile.TemporaryDirectory() as folder:
        binary = Path(folder) / "peak"
        try:
            subprocess.run(["gcc", "-O2", "-mavx512f", str(HERE.parent / "int8-kernels" / "peak.c"), "-o",
                            str(binary)], check=True)
            out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}.get("vfmadd231ps")


FLUSH = None


def timed(function, feeds, number: int, cold: bool, wall: bool = False) -> float:
    """Seconds per call: hot, process CPU time over `number` calls (`wall`: the median of each call's wall time,
    how benchmarks/int8-kernels timed them); cold, each call's wall time after reading 64 MB (not timed)."""
    global FLUSH
    if wall and not cold:
        samples = []
        for _ in range(number):
            start = time.perf_counter()
            function(*feeds)
            samples.append(time.perf_counter() - start)
        return float(np.median(samples))
    if not cold:
        start = time.process_time()
        for _ in range(number):
            function(*feeds)
        return (time.process_time() - start) / number
    if FLUSH is None:
        FLUSH = np.ones(16 << 20, np.float32)
    total = 0.0
    for _ in range(number):
        FLUSH.sum()  # read, as a model's other weights are (a write would leave dirty lines to write back)
        start = time.perf_counter()
        function(*feeds)
        total += time.perf_counter() - start
    return total / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names from SHAPES")
    parser.add_argument("--variants", default="current,kblock256",
                        help="current, noprefetch (the rule without its weight prefetch), kblockKB (K blocks of KB)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per timing (hot)")
    parser.add_argument("--wall", action="store_true",
                        help="hot: the median of per-call wall times, not process CPU time; no cold timing")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    import tvm

    from mlc import targets
    from mlc.bench.machine import load_average, machine_info

    target_json = dict(targets.resolve("x86").tvm, **{"num-cores": 1})
    doc = {"machine": machine_info(), "command": " ".join(sys.argv), "peaks_vfmadd231ps": [peak()], "results": []}
    print(f"peak {doc['peaks_vfmadd231ps'][0] / 1e9:.1f} GFLOP/s", flush=True)
    for name in args.shapes.split(","):
        rows, k, n, epilogue = SHAPES[name]
        rng = np.random.default_rng(1)
        x = rng.standard_normal((1, rows, k)).astype(np.float32)
        residual = rng.standard_normal((1, rows, n)).astype(np.float32)
        feeds = [tvm.runtime.tensor(x)] + ([tvm.runtime.tensor(residual)] if epilogue == "residual" else [])
        init = np.random.default_rng(0)  # module()'s weights, drawn again for the reference
        w = (init.standard_normal((k, n)) * 0.05).astype(np.float32)
        b = (init.standard_normal((n,)) * 0.05).astype(np.float32)
        want = reference(x[0], w, b, epilogue, residual[0])
        functions = {}
        for variant in args.variants.split(","):
            functions[variant] = (build(rows, k, n, epilogue, variant, target_json), feeds)
            got = functions[variant][0](*feeds).numpy()[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} {variant}")
        functions["numpy (OpenBLAS, matmul only)"] = (lambda a, c: a @ c, (x[0], w))
        first = next(iter(functions.values()))
        number = max(1, int(args.min_time / max(timed(*first, 3, False), 1e-6)))
        row = {"shape": name, "clock": "wall, median of each call" if args.wall else "process CPU time",
               "rows": rows, "k": k, "n": n, "epilogue": epilogue, "flop": 2 * rows * k * n,
               "number": number, "rounds": args.rounds, "load_before": load_average()}
        for cold in (False,) if args.wall else (False, True):
            times: dict[str, list[float]] = {label: [] for label in functions}
            calls = min(20, max(1, number // 4)) if cold else number  # a flush costs ~5 ms
            labels = list(functions)
            for round_ in range(args.rounds):  # the first in a round read up to 20 % slow cold: it rotates
                for label in labels[round_ % len(labels):] + labels[:round_ % len(labels)]:
                    function, args_ = functions[label]
                    times[label].append(timed(function, args_, calls, cold, args.wall))
            best = {label: min(t) for label, t in times.items()}  # interference only ever adds time
            row["cold" if cold else "hot"] = {
                label: {"ms": best[label] * 1e3, "median_ms": float(np.median(t)) * 1e3,
                        "gflops": row["flop"] / best[label] / 1e9} for label, t in times.items()}
            shown = {label: float(np.median(t)) for label, t in times.items()} if args.wall else best
            print(f"{name:34s} {'cold' if cold else 'hot '}: " + "  ".join(
                f"{label.split()[0]} {shown[label] * 1e3:.3f} ms {row['flop'] / shown[label] / 1e9:.0f} GF"
                for label in functions), flush=True)
        row["load_after"] = load_average()
        doc["results"].append(row)
    doc["peaks_vfmadd231ps"].append(peak())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
