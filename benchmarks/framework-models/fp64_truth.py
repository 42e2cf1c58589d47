"""For a model whose check fails: every fp32 runtime against a float64 run of the same seeded model.

    PV=benchmarks/framework-models
    .venv/bin/python $PV/paddle_vision.py --only resnet101 --work /tmp/pv --keep -o /tmp/r101.json
    .venv/bin/mlc export /tmp/pv/resnet101/model -o /tmp/pv/resnet101/model.onnx
    .venv/bin/python $PV/fp64_truth.py resnet101 /tmp/pv/resnet101 -o $PV/results/resnet101-fp64.json

Reads the artifact's reference inputs and Paddle eager outputs (what `mlc compile` checks against), runs the artifact
(mlc.runtime Runner), the Paddle Inference predictor on the same saved program (with and without oneDNN), ONNX
Runtime on an ONNX file in the folder if there is one (`mlc export PREFIX -o FOLDER/model.onnx`), and the same model
rebuilt (paddle.seed(0), pretrained=False) and cast to float64; prints and records each one's max abs error against
float64 and against Paddle eager fp32, whether each passes mlc's default fp32 check, and the output's peak magnitude.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fm_common import machine  # noqa: E402
from paddle_vision import quiet_paddle  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("folder", help="the model's work folder: model.json/.pdiparams and artifact/")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    folder = Path(args.folder)
    paddle = quiet_paddle()
    import paddle.inference as inference
    import paddle.vision.models as models

    from mlc.runtime.runner import Runner, load_npz

    runner = Runner(folder / "artifact", threads=1)
    ref_info = runner.manifest["reference"]
    feeds = load_npz(folder / "artifact" / ref_info["inputs"])
    eager_fp32 = list(load_npz(folder / "artifact" / ref_info["outputs"]).values())[0]
    x = list(feeds.values())[0]
    outputs = {"paddle eager fp32 (mlc's reference)": eager_fp32, "mlc": list(runner.run(feeds).values())[0]}

    for mkldnn in (True, False):
        config = inference.Config(str(folder / "model.json"), str(folder / "model.pdiparams"))
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(1)
        config.switch_ir_optim(True)
        if not mkldnn:
            config.disable_mkldnn()
        predictor = inference.create_predictor(config)
        predictor.get_input_handle(predictor.get_input_names()[0]).copy_from_cpu(x)
        predictor.run()
        outputs[f"paddle inference fp32 (mkldnn {mkldnn})"] = \
            predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()

    onnx_files = sorted(folder.glob("*.onnx"))
    if onnx_files:
        import onnxruntime as ort

        session = ort.InferenceSession(str(onnx_files[0]), providers=["CPUExecutionProvider"])
        outputs["onnxruntime fp32 (mlc export ONNX)"] = session.run(None, {session.get_inputs()[0].name: x})[0]

    paddle.seed(0)
    layer = getattr(models, args.model)(pretrained=False)
    layer.eval()
    with paddle.no_grad():
        rebuilt = layer(paddle.to_tensor(x)).numpy()
        layer.to(dtype="float64")
        truth = layer(paddle.to_tensor(x.astype(np.float64))).numpy()
    outputs["paddle eager fp32 (rebuilt)"] = rebuilt
    peak = float(np.abs(truth).max())
    rows = {}
    for name, value in outputs.items():
        diff = np.abs(value.astype(np.float64) - truth)
        rows[name] = {"max_abs_error_vs_fp64": float(diff.max()), "max_abs_error_over_peak": float(diff.max() / peak),
                      "max_abs_error_vs_eager_fp32": float(np.abs(value.astype(np.float64) - eager_fp32).max()),
                      "passes_mlc_default_check_vs_fp64": bool(np.all(diff <= 1e-4 + 1e-3 * np.abs(truth))),
                      # mlc's default fp32 check against Paddle eager fp32 (atol 1e-4, rtol 1e-3: these outputs'
                      # peaks are over 1, so the atol is not scaled down)
                      "passes_mlc_default_check_vs_eager_fp32": bool(np.all(
                          np.abs(value - eager_fp32) <= 1e-4 + 1e-3 * np.abs(eager_fp32)))}
        row = rows[name]
        print(f"{name:45s} vs fp64 {row['max_abs_error_vs_fp64']:.3g} (peak {peak:.3g}), vs eager fp32 "
              f"{row['max_abs_error_vs_eager_fp32']:.3g}, passes atol 1e-4 rtol 1e-3 vs fp64: "
              f"{row['passes_mlc_default_check_vs_fp64']}, vs eager: {row['passes_mlc_default_check_vs_eager_fp32']}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"model": args.model, "machine": machine(), "output_peak_abs_fp64": peak,
                                             "output_abs_median_fp64": float(np.median(np.abs(truth))),
                                             "runtimes": rows}, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")
    main()
