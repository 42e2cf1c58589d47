"""Share of peak (#22): a model's matmul/conv FLOPs, and the core's peak per precision from
benchmarks/int8-kernels/peak.c (a register-only loop of the dot-product instruction each precision's kernels use:
vfmadd231ps for fp32, vdpbf16ps for bf16, vpdpbusd for int8; the best of 50 short runs, so a shared machine's load
barely moves it). precision.py --peak records each backend's share at its fastest round (the round least slowed by
other work, like the peak's best run).

FLOPs: 2 x the multiply-adds of every MatMul, Gemm and Conv after ONNX shape inference; the rest of a model
(normalisations, softmax, elementwise) counts zero, so a share is a lower bound on how busy the multiply units were.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np

PEAK_C = Path(__file__).resolve().parents[1] / "int8-kernels" / "peak.c"
INSTRUCTION = {"fp32": "vfmadd231ps", "bf16": "vdpbf16ps", "int8": "vpdpbusd"}


def instruction_peaks(runs: int) -> list[dict[str, float]]:
    """`runs` readings of one core's GFLOP/s (GOP/s for int8) per precision, peak.c compiled once."""
    with tempfile.TemporaryDirectory() as folder:
        binary = Path(folder) / "peak"
        subprocess.run(["gcc", "-O2", "-mavx512f", str(PEAK_C), "-o", str(binary)], check=True)
        outputs = [subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
                   for _ in range(runs)]
    readings = []
    for out in outputs:
        ops = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}
        readings.append({precision: round(ops[name] / 1e9, 1) for precision, name in INSTRUCTION.items()})
    return readings


OPS_PER_INSTRUCTION = {"fp32": 16 * 2, "bf16": 16 * 2 * 2, "int8": 16 * 4 * 2}


def one_clock(readings: list[dict[str, float]]) -> dict[str, float]:
    """The peaks of several instruction_peaks() readings, each precision from the best reading of any of the three
    instructions: they issue at one per cycle each on this core (peak.c measured exactly 1:2:4 when quiet), so each
    measures the same clock, and under load any one reading may be slowed where another is not."""
    clock = max(r[p] / OPS_PER_INSTRUCTION[p] for r in readings for p in OPS_PER_INSTRUCTION)
    return {p: round(clock * ops, 1) for p, ops in OPS_PER_INSTRUCTION.items()}


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else None for d in value_info.type.tensor_type.shape.dim]


def model_flops(path: Path, input_shapes: dict[str, tuple[int, ...]]) -> float:
    """2 x the multiply-adds of the model's MatMul, Gemm and Conv nodes, its inputs at these shapes."""
    import onnx

    model = onnx.load(str(path))
    for value in model.graph.input:
        if value.name in input_shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, input_shapes[value.name]):
                dim.dim_value = int(size)
    model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {v.name: _dims(v) for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    total = 0.0
    for node in model.graph.node:
        out = shapes.get(node.output[0])
        if not out or None in out:
            continue
        if node.op_type in ("MatMul", "Gemm"):
            a = shapes.get(node.input[0])
            if a and None not in a:
                trans_a = any(x.name == "transA" and x.i for x in node.attribute)
                total += 2.0 * float(np.prod(out)) * (a[-2] if trans_a else a[-1])
        elif node.op_type == "Conv":
            w = shapes.get(node.input[1])
            if w:  # [C_out, C_in / groups, *kernel]: each output element takes C_in/groups x kernel multiply-adds
                total += 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
    return total
