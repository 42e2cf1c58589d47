"""int8 top-1 agreement on a trained classifier: zoo:resnet50's network trained on real images, then quantised by
mlc, and by ONNX Runtime and OpenVINO (NNCF) from mlc's ONNX export, on the same calibration digits.

A seeded random-weight resnet50 cannot measure top-1 agreement: its logits lie within ~1e-3 of each other (README:
36 % exact for mlc int8, 0 % for ONNX Runtime's), and its pooled features hardly depend on the input (their spread
over images is ~5e-4 of their size, below one uint8 step and one bf16 rounding). So here the network (zoo:resnet50's
layers, a 10-class head) is trained for a few epochs on scikit-learn's bundled handwritten digits (8x8, upsampled
to 64x64 RGB; 1797 images, no download), until its features and logits mean something. Then it does what a user
does: `mlc compile model.pt --quantize int8 --calibration ...` (TorchScript, calibrated on training digits), and
runs the artifact on the held-out digits and on seeded random inputs, comparing its top-1 with torch eager fp32's.

    .venv/bin/python benchmarks/int8/trained.py -o benchmarks/int8/results/trained.json   # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[0] = str(ROOT)  # the repo root first: this folder's profile.py would shadow the stdlib's
sys.path.append(str(Path(__file__).resolve().parent))  # accuracy.py's ONNX Runtime int8

SEED = 0
SIZE = 64
MLC = [sys.executable, "-m", "mlc"]  # the mlc of the venv running this script


def digit_images(images: np.ndarray, size: int = SIZE) -> np.ndarray:
    """8x8 digits (0..16) as normalised 3 x SIZE x SIZE float32 images."""
    import torch

    x = torch.from_numpy((images / 16.0 - 0.5) / 0.25).float()[:, None]
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.repeat(1, 3, 1, 1).numpy()


def in_batches(fn, x: np.ndarray, batch: int = 32) -> np.ndarray:
    return np.concatenate([fn(x[i:i + batch]) for i in range(0, len(x), batch)])


def trained_resnet50(train_x: np.ndarray, train_y: np.ndarray, epochs: int):
    """zoo:resnet50's layers with a 10-class head, trained (Adam, batch 32) on the digits."""
    import torch

    from mlc.models import torch_models

    layers = list(torch_models.resnet50().native)
    model = torch.nn.Sequential(*layers[:-1], torch.nn.Linear(layers[-1].in_features, 10))
    return fit(model, torch.optim.Adam(model.parameters(), lr=1e-3), train_x, train_y, epochs)


def fit(model, optimizer, train_x: np.ndarray, train_y: np.ndarray, epochs: int):
    """`model` trained for `epochs` on shuffled batches of 32 (cross-entropy, seeded order); returned in eval mode."""
    import torch

    x, y = torch.from_numpy(train_x), torch.from_numpy(train_y).long()
    generator = torch.Generator().manual_seed(SEED)
    model.train()
    for epoch in range(epochs):
        order, total = torch.randperm(len(x), generator=generator), 0.0
        for i in range(0, len(x), 32):
            batch = order[i:i + 32]
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        print(f"epoch {epoch + 1}/{epochs}: training loss {total / len(x):.4f}", flush=True)
    return model.eval()


def other_int8(torchscript: Path, calibration: list[dict], folder: Path) -> dict:
    """{label: run(batch of one) -> logits}: ONNX Runtime's own int8 (the `ort-int8` baseline's quantize_static) and
    OpenVINO's (NNCF's quantize, the `openvino-int8` baseline's) of mlc's export, calibrated on the same inputs."""
    from accuracy import session
    from mlc.bench.baselines import nncf_int8_model, openvino_model, ort_int8_model

    exported = folder / "model.onnx"
    subprocess.run([*MLC, "export", str(torchscript), "--input-shape",
                    f"input:1x3x{SIZE}x{SIZE}", "-o", str(exported)], check=True, capture_output=True)
    ort_int8 = session(ort_int8_model(exported, calibration, folder))
    openvino, _ = openvino_model(nncf_int8_model(exported, calibration), 1, "f32")
    return {"onnxruntime int8 (QDQ)": lambda x: ort_int8.run(None, {"input": x})[0],
            "openvino int8 (NNCF)": lambda x: openvino({"input": x})[openvino.outputs[0]]}


def agreement(reference: np.ndarray, actual: np.ndarray, labels: np.ndarray | None = None) -> dict:
    ref_top, act_top = reference.argmax(1), actual.argmax(1)
    ordered = np.sort(reference, axis=1)
    row = {"rows": len(reference), "top1_agreement": float((ref_top == act_top).mean()),
           "median_top1_margin": float(np.median(ordered[:, -1] - ordered[:, -2])),
           "cosine": float(np.sum(reference * actual) / np.linalg.norm(reference) / np.linalg.norm(actual)),
           "max_abs_error_of_peak": float(np.abs(reference - actual).max() / np.abs(reference).max())}
    if labels is not None:
        row["accuracy_fp32"] = float((ref_top == labels).mean())
        row["accuracy_int8"] = float((act_top == labels).mean())
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--train", type=int, default=1000, help="digits it is trained on (the rest: test)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--work", type=Path, default=Path("/tmp/int8-trained"), help="the trained model is kept here")
    parser.add_argument("--calibration", type=int, default=8, help="training digits that calibrate the int8 build")
    parser.add_argument("--seeded", type=int, default=200, help="seeded random inputs also compared")
    args = parser.parse_args(argv)

    import torch
    from sklearn.datasets import load_digits

    from mlc import api
    from mlc.bench.machine import machine_info

    torch.manual_seed(SEED)
    digits = load_digits()
    order = np.random.default_rng(SEED).permutation(len(digits.target))
    images, labels = digit_images(digits.images[order]), digits.target[order]
    train, test = slice(0, args.train), slice(args.train, None)
    saved = args.work / f"resnet50-digits-{args.train}-{args.epochs}.pt"  # TorchScript, reused when there
    if saved.exists():
        model = torch.jit.load(str(saved)).eval()
    else:
        model = torch.jit.trace(trained_resnet50(images[train], labels[train], args.epochs),
                                torch.from_numpy(images[:1]))
        args.work.mkdir(parents=True, exist_ok=True)
        model.save(str(saved))

    def eager(batch: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(batch)).numpy()

    seeded = np.random.default_rng(SEED + 1).standard_normal((args.seeded, 3, SIZE, SIZE)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="int8-trained-") as scratch:
        folder = Path(scratch)
        calibration = []
        for k in range(args.calibration):
            path = folder / f"calibration-{k}.npz"
            np.savez(path, input=images[k:k + 1])  # nn.Sequential.forward(input)
            calibration += ["--calibration", str(path)]
        artifact = folder / "int8"
        command = [*MLC, "compile", str(saved),
                   "--input-shape", f"input:1x3x{SIZE}x{SIZE}", "--quantize", "int8", *calibration, "-o", str(artifact)]
        print("+ mlc", " ".join(command[len(MLC):]), flush=True)
        compiled = subprocess.run(command, text=True, capture_output=True)
        print(compiled.stdout[-3000:], compiled.stderr[-3000:], sep="\n")
        if compiled.returncode not in (0, 3):  # 3: the gate failed, and the artifact is there to measure
            return compiled.returncode
        runner = api.open_runner(artifact)
        output = runner.manifest["outputs"][0]["name"]

        def int8(batch: np.ndarray) -> np.ndarray:
            return np.concatenate([runner.run({"input": x[None]})[output] for x in batch])

        others = other_int8(saved, [{"input": images[k:k + 1]} for k in range(args.calibration)], folder)
        rows = {}
        for name, x, y in (("held-out digits", images[test], labels[test]), ("seeded random inputs", seeded, None)):
            fp32 = in_batches(eager, x)
            rows[name] = {"mlc int8": agreement(fp32, int8(x), y),
                          **{label: agreement(fp32, np.concatenate([np.asarray(run(row[None])) for row in x]), y)
                             for label, run in others.items()}}
        gate = json.loads((artifact / "manifest.json").read_text()).get("gate")
    doc = {"machine": machine_info(), "model": f"zoo:resnet50's layers, a 10-class head, digits at {SIZE}x{SIZE}",
           "train_digits": args.train, "epochs": args.epochs, "calibration_digits": args.calibration,
           "command": " ".join(["mlc", *command[len(MLC):]]), "compile_exit": compiled.returncode,
           "results": rows, "gate": gate}
    write_record(args.output, doc)
    return 0


def write_record(path: Path, doc: dict) -> None:
    """The record as JSON, and each of its results (inputs x engine) printed on a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for name, row in doc["results"].items():
        for backend, figures in row.items():
            print(f"{name}, {backend}: {json.dumps(figures)}")


if __name__ == "__main__":
    sys.exit(main())
