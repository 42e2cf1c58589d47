"""int8 top-1 agreement on a trained transformer (#39): mlc's --quantize int8 beside OpenVINO's NNCF int8 and ONNX
Runtime's QDQ int8, all three on the same ONNX file and calibration inputs.

A small ViT-like classifier is trained on scikit-learn's bundled handwritten digits (no download): each 8x8 digit is
8 tokens (its rows) of 8 pixels, embedded to 64 with a learned position, then 2 pre-norm encoder blocks (4 heads,
attention written as MatMul / Softmax / MatMul, as exporters emit it, and a GELU MLP), a mean over tokens and a
10-class head. Trained until its logits mean something, it is exported to ONNX (TorchScript exporter), and each
engine quantises that file calibrated on the same 8 training digits. Top-1 agreement with ONNX Runtime fp32 on the
held-out digits (and on seeded random inputs) is what the goal compares: mlc's at least OpenVINO int8's.

    .venv/bin/python benchmarks/int8/trained_transformer.py -o benchmarks/int8/results/trained-transformer.json
    # ~20 s
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[0] = str(ROOT)  # the repo root first: this folder's profile.py would shadow the stdlib's
sys.path.append(str(Path(__file__).resolve().parent))
from trained import MLC, SEED, agreement, fit, write_record  # noqa: E402

TOKENS, WIDTH, DIM, HEADS, LAYERS = 8, 8, 64, 4, 2


def classifier():
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
            self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
            self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
            scores = torch.softmax(q @ k.transpose(-1, -2) / (DIM // HEADS) ** 0.5, dim=-1)
            x = x + self.proj((scores @ v).transpose(1, 2).reshape(b, t, DIM))
            return x + self.mlp(self.norm2(x))

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(WIDTH, DIM)
            self.position = nn.Parameter(torch.zeros(1, TOKENS, DIM))
            self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
            self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, 10)

        def forward(self, tokens):
            return self.head(self.norm(self.blocks(self.embed(tokens) + self.position)).mean(1))

    return Classifier()


def trained(x: np.ndarray, y: np.ndarray, epochs: int):
    import torch

    torch.manual_seed(SEED)
    model = classifier()
    return fit(model, torch.optim.AdamW(model.parameters(), lr=2e-3), x, y, epochs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--train", type=int, default=1000, help="digits it is trained on (the rest: test)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--calibration", type=int, default=8, help="training digits that calibrate every int8 build")
    parser.add_argument("--seeded", type=int, default=200, help="seeded random inputs also compared")
    args = parser.parse_args(argv)

    import onnxruntime as ort
    import torch
    from sklearn.datasets import load_digits

    from mlc import api
    from mlc.bench.baselines import nncf_int8_model, openvino_model, ort_int8_model
    from mlc.bench.machine import machine_info

    digits = load_digits()
    order = np.random.default_rng(SEED).permutation(len(digits.target))
    tokens = ((digits.images[order] / 16.0 - 0.5) / 0.25).astype(np.float32)  # (n, 8 rows, 8 pixels)
    labels = digits.target[order]
    train, test = slice(0, args.train), slice(args.train, None)
    model = trained(tokens[train], labels[train], args.epochs)
    seeded = np.random.default_rng(SEED + 1).standard_normal((args.seeded, TOKENS, WIDTH)).astype(np.float32)
    calibration = [{"tokens": tokens[k:k + 1]} for k in range(args.calibration)]
    with tempfile.TemporaryDirectory(prefix="int8-transformer-") as scratch:
        folder = Path(scratch)
        onnx_path = folder / "model.onnx"
        torch.onnx.export(model, (torch.from_numpy(tokens[:1]),), str(onnx_path), input_names=["tokens"],
                          output_names=["logits"], opset_version=17, dynamo=False)
        flags = []
        for k, feed in enumerate(calibration):
            np.savez(folder / f"calibration-{k}.npz", **feed)
            flags += ["--calibration", str(folder / f"calibration-{k}.npz")]
        artifact = folder / "int8"
        command = [*MLC, "compile", str(onnx_path), "--quantize", "int8", *flags, "-o", str(artifact)]
        compiled = subprocess.run(command, text=True, capture_output=True, cwd=ROOT)
        print(compiled.stdout[-2000:], compiled.stderr[-2000:], sep="\n")
        if compiled.returncode not in (0, 3):  # 3: the gate failed, and the artifact is there to measure
            return compiled.returncode
        runner = api.open_runner(artifact)
        fp32 = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        ort_int8 = ort.InferenceSession(str(ort_int8_model(onnx_path, calibration, folder / "ort")),
                                        providers=["CPUExecutionProvider"])
        openvino, _ = openvino_model(nncf_int8_model(onnx_path, calibration), 1, "f32")
        engines = {"mlc int8": lambda x: runner.run({"tokens": x})["logits"],
                   "openvino int8 (NNCF)": lambda x: openvino({"tokens": x})[openvino.outputs[0]],
                   "onnxruntime int8 (QDQ)": lambda x: ort_int8.run(None, {"tokens": x})[0]}
        rows = {}
        for name, x, y in (("held-out digits", tokens[test], labels[test]), ("seeded random inputs", seeded, None)):
            reference = np.concatenate([fp32.run(None, {"tokens": row[None]})[0] for row in x])
            rows[name] = {label: agreement(reference, np.concatenate([np.asarray(run(row[None])) for row in x]), y)
                          for label, run in engines.items()}
    doc = {"machine": machine_info(), "model": f"ViT-like classifier, {LAYERS} blocks, {HEADS} heads, dim {DIM}, "
                                               f"digits as {TOKENS} tokens of {WIDTH}",
           "train_digits": args.train, "epochs": args.epochs, "calibration_digits": args.calibration,
           "command": " ".join(["mlc", *command[len(MLC):]]), "compile_exit": compiled.returncode, "results": rows}
    write_record(args.output, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
