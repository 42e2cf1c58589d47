"""int8 accuracy of `mlc compile --quantize` on zoo models, measured on the quantised ONNX graph with ONNX Runtime.

The graph mlc's quantisation writes (mlc/passes/quantize.py) is what TVM imports; its compiled int8 kernels matched
ONNX Runtime's run of that graph bit for bit on the test nets (integer arithmetic), so ONNX Runtime gives the figures
without building slow untuned int8 kernels. Against the fp32 model on seeded inputs none of which calibrated it: the
int8 gate's figures (mlc.check.gate) and, for comparison, ONNX Runtime's own quantize_static (QDQ, per-channel int8
weights, uint8 activations, the same calibration inputs and the same nodes).

    .venv/bin/python benchmarks/int8/accuracy.py -o benchmarks/int8/results/accuracy.json [--inputs 32] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

MODELS = {  # label -> (zoo spec, framework, input shapes)
    "cnn": ("zoo:cnn", "onnx", ()),
    "transformer": ("zoo:transformer", "onnx", ()),
    "resnet18": ("zoo:resnet18", "torch", ()),
    "resnet50": ("zoo:resnet50", "torch", ()),
    "bert-tiny": ("zoo:bert-tiny", "torch", ()),
}


def session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    data = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def measure(label: str, inputs: int, modes: list[str]) -> dict:
    from mlc.bench.baselines import ort_int8_model
    from mlc.check import gate
    from mlc.frontends import onnx as onnx_frontend
    from mlc.pipeline.options import ModelSpec
    from mlc.pipeline.prepare import GATE_SEED, prepare
    from mlc.runtime.runner import stacked
    from mlc.pipeline.steps import Timer

    source, framework, shapes = MODELS[label]
    row = {"model": label, "source": source, "framework": framework, "inputs": inputs}
    with tempfile.TemporaryDirectory(prefix="int8-acc-") as scratch:
        folder = Path(scratch)
        (folder / "fp32").mkdir()
        fp32 = prepare(ModelSpec(source, framework, shapes), folder / "fp32", Timer())
        fp32_session = session(fp32.cleaned_path)  # the cleaned fp32 graph: what the quantisation starts from
        feed_shapes = {s.name: list(np.shape(fp32.feeds[s.name])) for s in fp32.specs}
        tests = [onnx_frontend.make_inputs(fp32.specs, feed_shapes, seed=GATE_SEED + k) for k in range(inputs)]
        reference = [dict(zip([o.name for o in fp32_session.get_outputs()], fp32_session.run(None, t)))
                     for t in tests]
        for mode in modes:
            (folder / mode).mkdir()
            prepared = prepare(ModelSpec(source, framework, shapes), folder / mode, Timer(), quantize=mode)
            int8_session = session(prepared.cleaned_path)
            got = [dict(zip([o.name for o in int8_session.get_outputs()], int8_session.run(None, t))) for t in tests]
            result = gate(*stacked(reference, got), mode)
            row[mode] = {"quantization": prepared.quantization, "passed": result.passed,
                         "outputs": [_figures(o) for o in result.outputs]}
            if mode == "int8":
                ort_session = session(ort_int8_model(fp32.cleaned_path, prepared.calibration, folder))
                theirs = [dict(zip([o.name for o in ort_session.get_outputs()], ort_session.run(None, t)))
                          for t in tests]
                result = gate(*stacked(reference, theirs), mode)
                row["onnxruntime_int8_qdq"] = {"passed": result.passed,
                                               "outputs": [_figures(o) for o in result.outputs]}
    return row


def _figures(o) -> dict:
    keep = ("name", "shape", "cosine_similarity", "rel_error", "rows", "top1_agreement", "top1_near_ties",
            "top5_agreement", "passed", "problems")
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in vars(o).items() if k in keep}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--inputs", type=int, default=32, help="seeded test inputs (none of them calibrated)")
    parser.add_argument("--modes", default="int8,int8-dynamic")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()

    from mlc.bench.machine import machine_info

    doc = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "int8-accuracy", "rows": []}
    for label in args.models:
        row = measure(label, args.inputs, args.modes.split(","))
        doc["rows"] = [r for r in doc["rows"] if r["model"] != label] + [row]
        doc["machine"] = machine_info()
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(doc, indent=1) + "\n")
        summary = {m: [(o["name"], o["cosine_similarity"], o.get("top1_agreement")) for o in row[m]["outputs"]]
                   for m in row if isinstance(row[m], dict) and "outputs" in row[m]}
        print(label, json.dumps(summary))


if __name__ == "__main__":
    main()
