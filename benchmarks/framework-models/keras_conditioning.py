"""Is a Keras model's failed check mlc's export, or the seeded model's fp32 conditioning? (issue #37)

With weights=None, EfficientNetV2M/L's activations grow through the network (logits ~3e5 and ~2e9), and any change
in fp32 rounding order moves the output. This exports the model (classifier_activation=None: the logits) through
mlc's TensorFlow frontend, the weights frozen into the graph and traced as inputs (`WEIGHTS_AS_INPUTS_BYTES`), and
runs each ONNX file in ONNX Runtime with graph optimisations off and on, against Keras eager on one seeded image.
Where ONNX Runtime disagrees with itself as much as with Keras, no fp32 engine can match Keras's numbers.

    .venv/bin/python benchmarks/framework-models/keras_conditioning.py EfficientNetV2M 480 \\
        -o benchmarks/framework-models/results/keras-conditioning.json [--skip-frozen]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np


def _compare(a: np.ndarray, b: np.ndarray) -> dict:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return {"max_abs": float(np.abs(a - b).max()), "cosine": round(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)),
                                                                    6), "argmax": [int(a.argmax()), int(b.argmax())]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("size", type=int)
    parser.add_argument("--skip-frozen", action="store_true", help="only the weights-as-inputs export (memory)")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import onnxruntime as ort

    import mlc.frontends.tensorflow as frontend
    from mlc.bench.machine import machine_info

    tf = frontend.import_tensorflow()
    keras.utils.set_random_seed(0)
    model = getattr(tf.keras.applications, args.model)(weights=None, classifier_activation=None)
    image = np.random.default_rng(0).uniform(0, 255, (1, args.size, args.size, 3)).astype("float32")
    eager = np.asarray(model(image, training=False))
    row = {"model": args.model, "size": args.size, "logit_peak": float(np.abs(eager).max()), "exports": {}}
    exports = {"weights as inputs": 0} if args.skip_frozen else {"frozen": 1 << 50, "weights as inputs": 0}
    with tempfile.TemporaryDirectory() as folder:
        for how, threshold in exports.items():
            frontend.WEIGHTS_AS_INPUTS_BYTES = threshold
            path = str(Path(folder) / "model.onnx")
            frontend.from_keras(model).export(Path(path), set())
            runs = {}
            for level, value in (("off", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                                 ("on", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
                options = ort.SessionOptions()
                options.graph_optimization_level = value
                session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
                runs[level] = session.run(None, {session.get_inputs()[0].name: image})[0]
            row["exports"][how] = {"ort_off_vs_keras": _compare(runs["off"], eager),
                                   "ort_on_vs_keras": _compare(runs["on"], eager),
                                   "ort_off_vs_on": _compare(runs["off"], runs["on"])}
            print(args.model, how, json.dumps(row["exports"][how]), flush=True)
    doc = json.loads(args.output.read_text()) if args.output.exists() else {"study": __doc__.split("\n\n")[0],
                                                                              "rows": []}
    doc["machine"] = machine_info()
    row["commit"] = doc["machine"].get("commit")
    doc["rows"] = [r for r in doc["rows"] if r["model"] != args.model] + [row]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
