"""Convs over a channel count no vector fits (#39): mlc before and after, beside ONNX Runtime and OpenVINO fp32,
interleaved call by call in one process, 1 thread, fp32 throughout.

NASNet's convs write 11 and 22 channels (its filters are multiples of 11); a segmentation head writes 21 (VOC's
classes). Such a J ran a scalar loop (no 4- or 8-lane vector divides it) or a 16-lane tile with a predicated tail,
which LLVM emits as scalar code. After: 1x1 convs are padded to whole vectors in the kernel
(`schedule_rules.PAD_NARROW_WIDTHS`), separable ones (depthwise then pointwise) in the graph (the
`pad_depthwise_channels` pass). "before" is this tree with the flag off and the pass disabled, built in the same
process.

    .venv/bin/python benchmarks/framework-models/keras_apps.py --save NASNetMobile /tmp/odd/nasnet.keras --normalised
    .venv/bin/mlc export /tmp/odd/nasnet.keras -o /tmp/odd/nasnet_mobile.onnx --input-shape input_layer:1x224x224x3
    .venv-suites/bin/python benchmarks/cnn-kernels/odd_channels.py --work /tmp/odd \\
        --model /tmp/odd/nasnet_mobile.onnx -o benchmarks/cnn-kernels/results/odd-channels.json

A row: both builds' checks, p50 ms per engine, and the median (p10-p90) of per-round ratios (below 1: the first
faster)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repo root
sys.path.insert(0, str(HERE.parent / "grouped-conv"))
sys.path.insert(0, str(HERE.parent / "precision"))

# name -> (channels in, channels out, height = width, kernel, groups); a "sep" layer is a separable conv: a depthwise
# conv of that kernel over the input channels, then a 1x1 conv to the output channels (NASNet's SeparableConv2D)
LAYERS = {"nasnet-stem-32to11-111": (32, 11, 111, 1, 1), "nasnet-44to22-56": (44, 22, 56, 1, 1),
          "nasnet-32to11-56": (32, 11, 56, 1, 1), "voc-head-512to21-65": (512, 21, 65, 1, 1),
          "nasnet-sep7x7-11-56": (11, 11, 56, 7, "sep"), "nasnet-sep5x5-22-28": (22, 22, 28, 5, "sep"),
          "nasnet-large-sep5x5-42-42": (42, 42, 42, 5, "sep"),
          "control-88to88-14": (88, 88, 14, 1, 1), "control-sep3x3-44-28": (44, 44, 28, 3, "sep")}


def separable_model(cin: int, cout: int, size: int, kernel: int, seed: int = 0):
    """ReLU, a depthwise conv (`kernel`, same padding) and a 1x1 conv with bias, as Keras's SeparableConv2D exports."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    depthwise = (rng.standard_normal((cin, 1, kernel, kernel)) / kernel).astype(np.float32)
    pointwise = (rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Conv", ["r", "dw"], ["d"], group=cin, pads=[kernel // 2] * 4),
             helper.make_node("Conv", ["d", "pw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "separable", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])],
                              [numpy_helper.from_array(depthwise, "dw"), numpy_helper.from_array(pointwise, "pw"),
                               numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def static_batch(model):
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.dim_value = 1
    return model


def build(source: Path, folder: Path) -> dict:
    """mlc's "before" and "after" builds of `source` in `folder`; each one's check."""
    import mlc.api as api
    from mlc.compiler import schedule_rules
    from mlc.passes import Options

    checks = {}
    for side in ("before", "after"):
        schedule_rules.PAD_NARROW_WIDTHS = side == "after"
        passes = Options(disable=("pad_depthwise_channels",) if side == "before" else ())
        result = api.compile(str(source), target="x86", output=folder / side, isolate=False, pass_options=passes)
        checks[side] = bool(result.check.passed)
    schedule_rules.PAD_NARROW_WIDTHS = True
    return checks


def measure(source: Path, folder: Path, rounds: int, warmup: int = 5) -> dict:
    """Every engine once a round, the order rotated each round."""
    import onnxruntime as ort
    from beside_openvino import interleave, mlc_timers, ratio, reference_feeds, timer

    from mlc.bench.baselines import openvino_model
    from mlc.runtime.runner import Runner

    runners = {f"mlc {side}": Runner(folder / side, threads=1) for side in ("before", "after")}
    feeds = reference_feeds(runners["mlc after"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    compiled, _ = openvino_model(source, 1, "f32")
    request = compiled.create_infer_request()
    # mlc's call with its inputs already in the runtime's tensors (Runner.run's numpy copies in and out cost more
    # than these single convs); ORT's and OpenVINO's with theirs
    timers = mlc_timers(runners, feeds) | {"onnxruntime": timer(lambda: session.run(None, feeds)),
                                           "openvino f32": timer(lambda: request.infer(feeds))}
    samples = interleave(timers, rounds, warmup)
    arrays = {k: np.array(v) for k, v in samples.items()}
    return {"p50_ms": {k: round(float(np.median(a)) * 1e3, 4) for k, a in arrays.items()},
            "p10_p90_ms": {k: [round(float(np.percentile(a, q)) * 1e3, 4) for q in (10, 90)]
                           for k, a in arrays.items()},
            "after / before": ratio(arrays, "mlc after", "mlc before"),
            **{f"{side} / {engine}": ratio(arrays, f"mlc {side}", engine)
               for side in ("before", "after") for engine in ("onnxruntime", "openvino f32")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--model", type=Path, action="append", default=[], help="a whole ONNX model (static shapes)")
    parser.add_argument("--names", help="comma-separated layers and model stems (default: all)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    for variable in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[variable] = "1"
    import onnx
    from models import conv_model

    from mlc.bench.machine import load_average, machine_info

    doc = {"benchmark": "odd-channels", "precision": "fp32", "threads": 1, "rounds": args.rounds, "rows": []}
    names = [*LAYERS, *(m.stem for m in args.model)]
    for name in args.names.split(",") if args.names else names:
        folder = args.work / name
        folder.mkdir(parents=True, exist_ok=True)
        if name in LAYERS:
            source = folder / "model.onnx"
            cin, cout, size, kernel, groups = LAYERS[name]
            onnx.save(separable_model(cin, cout, size, kernel) if groups == "sep" else conv_model(*LAYERS[name]),
                      source)
        else:  # its open dims (the export's batch) at 1, for OpenVINO and ONNX Runtime as for mlc
            source = folder / "model.onnx"
            onnx.save(static_batch(onnx.load(next(m for m in args.model if m.stem == name))), source)
        checks = build(source, folder)
        load_start = load_average()
        row = {"label": name, "checks": checks, **measure(source, folder, args.rounds),
               "load_average": [load_start, load_average()]}
        doc["rows"].append(row)
        doc["machine"] = machine_info()
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
