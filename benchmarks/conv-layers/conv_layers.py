"""Each distinct convolution of an ONNX model, compiled alone by mlc and by ONNX Runtime, one thread:
the conv kernel's time and GFLOP/s per layer from each one's profiler (layout conversions, which a
whole model does once, left out), to see which layer shapes a schedule rule leaves behind.

    mlc export zoo:resnet50 -o resnet50.onnx
    .venv/bin/python benchmarks/conv-layers/conv_layers.py resnet50.onnx --label "after X" \
        -o benchmarks/conv-layers/results/b.json
    .venv/bin/python benchmarks/conv-layers/conv_layers.py --plot benchmarks/conv-layers/plots/ab.png \
        benchmarks/conv-layers/results/a.json benchmarks/conv-layers/results/b.json

Each layer is Conv(+bias) -> Relu on seeded random data, batch 1, with the model's shapes, strides,
pads and groups. The model's own dims are read by ONNX shape inference (a dynamic batch takes 1)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root


def conv_layers(path: Path) -> list[dict]:
    """The distinct convs of the model: input shape, weight shape, attributes, and how often each occurs."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = {}
    for value in [*model.graph.input, *model.graph.value_info]:
        dims = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
        shapes[value.name] = dims
    weights = {t.name: numpy_helper.to_array(t).shape for t in model.graph.initializer}
    layers: dict[str, dict] = {}
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: list(a.ints) if a.ints else a.i for a in node.attribute}
        layer = {"input": shapes[node.input[0]], "weight": list(weights[node.input[1]]),
                 "strides": attrs.get("strides", [1, 1]), "pads": attrs.get("pads", [0, 0, 0, 0]),
                 "group": attrs.get("group", 1)}
        key = json.dumps(layer)
        layers.setdefault(key, {**layer, "count": 0})["count"] += 1
    return list(layers.values())


def layer_model(layer: dict, path: Path) -> float:
    """Write Conv(+bias)->Relu with `layer`'s shapes to `path`; return its GFLOP."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    n, c, h, w = layer["input"]
    k, c_per_group, kh, kw = layer["weight"]
    sh, sw = layer["strides"]
    top, left, bottom, right = layer["pads"]
    oh, ow = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
    weight = numpy_helper.from_array((rng.standard_normal(layer["weight"]) * 0.05).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["y"], strides=[sh, sw], pads=layer["pads"], group=layer["group"]),
         helper.make_node("Relu", ["y"], ["out"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [n, k, oh, ow])], [weight, bias])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return 2 * n * k * oh * ow * c_per_group * kh * kw / 1e9


def conv_kernel_ms(runner, feeds: dict, runs: int) -> float:
    """mlc: the conv kernel's time per run (its fused bias/relu included; layout transposes not)."""
    rows = runner.profile(feeds, runs=runs)
    return next(r["ms"] for r in rows if "conv2d" in r["name"])


def ort_conv_ms(model: Path, feeds: dict, runs: int, profile_dir: Path) -> float:
    """ONNX Runtime: the median per-run time of its Conv node (ORT fuses the Relu into it; its
    NCHWc reorders are other nodes), from ORT's own profiler."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(profile_dir / model.stem)
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    for _ in range(3 + runs):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    durations = [e["dur"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                 and e.get("args", {}).get("op_name") in ("Conv", "FusedConv")]
    return float(np.median(durations[-runs:])) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, nargs="?", help="An ONNX model (or, with --plot, result files).")
    parser.add_argument("results", type=Path, nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--label", default="mlc", help="What this mlc build is, for plots.")
    parser.add_argument("--plot", type=Path, help="Draw result files (the positional arguments) into this PNG.")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--target", default="x86")
    args = parser.parse_args()
    if args.plot:
        plot([args.model, *args.results], args.plot)
        return
    if args.model is None or args.output is None:
        parser.error("give an ONNX model and -o RESULTS.json (or --plot PNG RESULTS.json ...)")
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[name] = "1"

    from mlc import api
    from mlc.bench.machine import machine_info
    from mlc.runtime.runner import Runner

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, layer in enumerate(conv_layers(args.model)):
            model = Path(tmp) / f"conv{i}.onnx"
            gflop = layer_model(layer, model)
            api.compile(str(model), target=args.target, output=Path(tmp) / f"art{i}", isolate=False)
            runner = Runner(Path(tmp) / f"art{i}")
            feeds = {"x": np.random.default_rng(1).standard_normal(layer["input"]).astype(np.float32)}
            mlc_ms = conv_kernel_ms(runner, feeds, args.runs)
            ort_ms = ort_conv_ms(model, feeds, args.runs, Path(tmp))
            row = {**layer, "gflop": round(gflop, 4), "mlc_ms": round(mlc_ms, 4), "ort_ms": round(ort_ms, 4),
                   "mlc_gflops": round(gflop / mlc_ms * 1e3, 1), "ort_gflops": round(gflop / ort_ms * 1e3, 1),
                   "mlc_over_ort": round(mlc_ms / ort_ms, 3)}
            rows.append(row)
            print(f"{str(layer['input']):>20} w{str(layer['weight']):>20} s{layer['strides'][0]} x{layer['count']}: "
                  f"mlc {row['mlc_gflops']:6.1f} GFLOP/s  ORT {row['ort_gflops']:6.1f}  "
                  f"ratio {row['mlc_over_ort']:.2f}",
                  flush=True)
    total_mlc = sum(r["mlc_ms"] * r["count"] for r in rows)
    total_ort = sum(r["ort_ms"] * r["count"] for r in rows)
    print(f"all convs, weighted by count: mlc {total_mlc:.1f} ms, ORT {total_ort:.1f} ms, "
          f"ratio {total_mlc / total_ort:.3f}")
    doc = {"benchmark": "conv_layers", "label": args.label, "model": args.model.name, "target": args.target,
           "machine": machine_info(), "rows": rows, "total_mlc_ms": round(total_mlc, 3),
           "total_ort_ms": round(total_ort, 3)}
    args.output.write_text(json.dumps(doc, indent=1) + "\n")


def plot(paths: list[Path], output: Path) -> None:
    """GFLOP/s per layer: ONNX Runtime (from the first file) and each file's mlc build side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [json.loads(p.read_text()) for p in paths]
    rows = docs[0]["rows"]
    names = [f"{r['input'][1]}x{r['input'][2]}x{r['input'][3]} -> {r['weight'][0]}, {r['weight'][2]}x{r['weight'][3]}"
             f"{' /2' if r['strides'][0] == 2 else ''} (x{r['count']})" for r in rows]
    series = [("ONNX Runtime", [r["ort_gflops"] for r in rows])]
    series += [(f"{d.get('label', p.stem)}: all convs {d['total_mlc_ms'] / d['total_ort_ms']:.3f}x ORT's time",
                [r["mlc_gflops"] for r in d["rows"]]) for p, d in zip(paths, docs)]
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 2))
    for i, (label, values) in enumerate(series):
        ax.barh([y + i * height for y in range(len(rows))], values, height, label=label)
    ax.set_yticks([y + height * (len(series) - 1) / 2 for y in range(len(rows))], names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GFLOP/s, conv kernel alone (1 thread; fused bias + relu; layout changes excluded)")
    machine = docs[0]["machine"]
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.01))
    fig.suptitle(f"{docs[0]['model']} convolutions, {machine['cpu']} (LLVM cpu {machine.get('llvm_cpu', '?')})",
                 fontsize=10)
    fig.tight_layout()
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
