"""mlc's int8 kernels (u8 x s8 -> int32 on AVX512-VNNI's vpdpbusd) against mlc's fp32 and bf16 kernels of the same
shape, and ONNX Runtime's MatMulInteger / ConvInteger and fp32 MatMul / Conv, one thread, interleaved call by call.

Each shape is one Relax module per precision holding just the kernel (inputs already in the kernel's dtype and
layout, NHWC for convs, constant weights), built with mlc's default schedules for the host. Every round times one
call of each backend (the starting backend rotating); the table gives the median per backend, GOP/s (a
multiply-add counts 2) and its share of the core's peak for that instruction, measured with peak.c (best of 3 runs,
interleaved with the kernels). The int8 results are checked equal to numpy's before timing.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/int8-kernels/int8_kernels.py \
        -o benchmarks/int8-kernels/results/results.json"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

HERE = Path(__file__).resolve().parent
# name: ("matmul", M, K, N) or ("conv", H, W, C, O, kernel, stride)
SHAPES = {
    "bert qkv/out 128x768x768": ("matmul", 128, 768, 768),
    "bert ffn1 128x768x3072": ("matmul", 128, 768, 3072),
    "bert ffn2 128x3072x768": ("matmul", 128, 3072, 768),
    "resnet50 56x56x64 -> 64 1x1": ("conv", 56, 56, 64, 64, 1, 1),
    "resnet50 56x56x64 -> 64 3x3": ("conv", 56, 56, 64, 64, 3, 1),
    "resnet50 28x28x128 -> 128 3x3": ("conv", 28, 28, 128, 128, 3, 1),
    "resnet50 7x7x512 -> 512 3x3": ("conv", 7, 7, 512, 512, 3, 1),
}
RNG = np.random.default_rng(0)


def _ops(shape) -> int:
    if shape[0] == "matmul":
        _, m, k, n = shape
        return 2 * m * k * n
    _, h, w, c, o, kernel, stride = shape
    return 2 * (h // stride) * (w // stride) * o * c * kernel * kernel


def _peak() -> dict:
    """Ops/s per instruction, from peak.c (empty where gcc cannot build it)."""
    with tempfile.TemporaryDirectory() as folder:
        binary = Path(folder) / "peak"
        subprocess.run(["gcc", "-O2", "-mavx512f", str(HERE / "peak.c"), "-o", str(binary)], check=True)
        out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}


def _mlc_kernel(shape, precision: str, target_json: dict):
    """(callable, input tensor, numpy check or None) for one shape at `precision` (fp32, bf16, int8)."""
    import ml_dtypes
    import tvm
    from tvm import relax

    from mlc.compiler import schedules

    dtype = {"fp32": "float32", "bf16": "bfloat16", "int8": "uint8"}[precision]
    wdtype = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}[precision]
    out_dtype = "int32" if precision == "int8" else "float32"
    if shape[0] == "matmul":
        _, m, k, n = shape
        x_shape, w_shape = (m, k), (k, n)
    else:
        _, h, w, c, o, kernel, stride = shape
        x_shape, w_shape = (1, h, w, c), (kernel, kernel, c, o)
    if precision == "int8":
        x = RNG.integers(0, 256, x_shape).astype(np.uint8)
        weight = RNG.integers(-128, 128, w_shape).astype(np.int8)
    else:
        x = RNG.standard_normal(x_shape).astype(np.float32)
        weight = (RNG.standard_normal(w_shape) * 0.05).astype(np.float32)
        if precision == "bf16":
            x, weight = x.astype(ml_dtypes.bfloat16), weight.astype(ml_dtypes.bfloat16)
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x_shape, dtype))
    with bb.function("main", [var]):
        with bb.dataflow():
            if shape[0] == "matmul":
                y = relax.op.matmul(var, relax.const(weight, wdtype), out_dtype=out_dtype)
            else:
                y = relax.op.nn.conv2d(var, relax.const(weight, wdtype), strides=shape[6], padding=shape[5] // 2,
                                       data_layout="NHWC", kernel_layout="HWIO", out_dtype=out_dtype)
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    executable, report = schedules.build(bb.get(), target_json, None, True)
    assert not report["unscheduled"], report
    asm = executable.mod.imports[0].inspect_source("asm")
    instruction = {"fp32": "vfmadd231ps", "bf16": "vdpbf16ps", "int8": "vpdpbusd"}[precision]
    assert instruction in asm, (precision, shape)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    function, tensor = vm["main"], tvm.runtime.tensor(x)
    if precision == "int8":  # exact, before any timing
        got = function(tensor).numpy()
        if shape[0] == "matmul":
            want = x.astype(np.int64) @ weight.astype(np.int64)
        else:
            pad = shape[5] // 2
            padded = np.pad(x.astype(np.int64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
            windows = np.lib.stride_tricks.sliding_window_view(padded, shape[5:6] * 2, axis=(1, 2))
            want = np.einsum("nhwcij,ijco->nhwo", windows[:, ::shape[6], ::shape[6]], weight.astype(np.int64))
        assert (got == want).all(), shape
    return lambda: function(tensor)


def _ort_kernel(shape, precision: str):
    """ONNX Runtime, one thread: MatMulInteger / ConvInteger (int8: u8 x s8 -> int32), QLinearMatMul / QLinearConv
    (qlinear: u8 x s8 -> u8, requantised: what ORT's quantize_static makes of a model) or MatMul / Conv (fp32); None
    if ORT rejects the model."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    if shape[0] == "matmul":
        _, m, k, n = shape
        x_shape, w_shape = [m, k], [k, n]
    else:
        _, h, w, c, o, kernel, stride = shape
        x_shape, w_shape = [1, c, h, w], [o, c, kernel, kernel]
    inputs, initializers = ["x", "w"], []
    if precision in ("int8", "qlinear"):
        x = RNG.integers(0, 256, x_shape).astype(np.uint8)
        weight = RNG.integers(-128, 128, w_shape).astype(np.int8)
        op = "MatMulInteger" if shape[0] == "matmul" else "ConvInteger"
        in_type, out_type = TensorProto.UINT8, TensorProto.INT32
        if precision == "qlinear":
            op = "QLinearMatMul" if shape[0] == "matmul" else "QLinearConv"
            out_type = TensorProto.UINT8
            initializers = [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in (
                ("xs", 0.02, np.float32), ("xz", 128, np.uint8), ("ws", 0.01, np.float32), ("wz", 0, np.int8),
                ("ys", 2.0, np.float32), ("yz", 128, np.uint8))]
            inputs = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    else:
        x = RNG.standard_normal(x_shape).astype(np.float32)
        weight = (RNG.standard_normal(w_shape) * 0.05).astype(np.float32)
        op = "MatMul" if shape[0] == "matmul" else "Conv"
        in_type = out_type = TensorProto.FLOAT
    attrs = {} if shape[0] == "matmul" else {"pads": [shape[5] // 2] * 4, "strides": [shape[6]] * 2}
    node = helper.make_node(op, inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", in_type, x_shape)],
                              [helper.make_tensor_value_info("y", out_type, None)],
                              initializer=[numpy_helper.from_array(weight, "w"), *initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(onnx.shape_inference.infer_shapes(model).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        session.run(None, {"x": x})
    except Exception as e:  # e.g. an int8 weight ConvInteger does not support
        print(f"ORT {op}: {str(e).splitlines()[0][:160]}", file=sys.stderr)
        return None
    return lambda: session.run(None, {"x": x})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names from SHAPES")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):  # before any thread pool starts
        os.environ[name] = "1"

    from mlc import targets
    from mlc.bench.machine import load_average, machine_info

    target_json = dict(targets.resolve("x86").tvm, **{"num-cores": 1})
    peaks = [_peak()]
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        backends = {f"mlc {p}": _mlc_kernel(shape, p, target_json) for p in ("fp32", "bf16", "int8")}
        for precision in ("fp32", "int8", "qlinear"):
            kernel = _ort_kernel(shape, precision)
            if kernel is not None:
                backends[f"ort {precision}"] = kernel
        times: dict[str, list[float]] = {b: [] for b in backends}
        names = list(backends)
        for round_ in range(args.warmup + args.rounds):
            for i in range(len(names)):
                backend = names[(round_ + i) % len(names)]
                start = time.perf_counter()
                backends[backend]()
                if round_ >= args.warmup:
                    times[backend].append(time.perf_counter() - start)
        peaks.append(_peak())
        medians = {b: float(np.median(t)) for b, t in times.items()}
        per_round = {f"{a} / mlc int8": float(np.median(np.array(times[a]) / np.array(times["mlc int8"])))
                     for a in ("mlc fp32", "mlc bf16", "ort int8", "ort qlinear", "ort fp32") if a in times}
        row = {"shape": name, "ops": _ops(shape), "median_s": medians,
               "gops": {b: _ops(shape) / t / 1e9 for b, t in medians.items()}, "time_ratio_median_per_round": per_round}
        rows.append(row)
        print(json.dumps(row), flush=True)
    peak = {k: max(p[k] for p in peaks) / 1e9 for k in peaks[0]}
    instruction = {"mlc fp32": "vfmadd231ps", "mlc bf16": "vdpbf16ps", "mlc int8": "vpdpbusd"}
    for row in rows:
        row["share_of_peak"] = {b: row["gops"][b] / peak[i] for b, i in instruction.items()}
    result = {"study": "int8-kernels", "threads": 1, "rounds": args.rounds, "peak_gops": peak,
              "peak_runs_gops": [{k: v / 1e9 for k, v in p.items()} for p in peaks], "rows": rows,
              "machine": machine_info(), "load_average_end": load_average(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"peak_gops": peak}))


if __name__ == "__main__":
    main()
