"""Run a compiled artifact of an ONNX export with symbolic batch/seq at new sizes and compare it with ONNX Runtime
on the same file: the issue #19 headline case (a transformers BertModel, bert-base config, random weights,
exported by torch's TorchScript exporter with dynamic_axes; see export_bert.py).

    .venv/bin/python benchmarks/exports/export_bert.py            # writes bert.onnx (420 MB) here
    .venv/bin/mlc compile bert.onnx --target x86 -o bert-x86
    .venv/bin/python benchmarks/exports/check_sizes.py bert.onnx bert-x86 -o results/bert-base-x86.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from mlc.bench import machine
from mlc.runtime.runner import Runner

SIZES = [(1, 7), (3, 33), (4, 128), (1, 512)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("onnx")
    parser.add_argument("artifact")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    session = ort.InferenceSession(args.onnx, providers=["CPUExecutionProvider"])
    runner = Runner(args.artifact)
    rows = []
    rng = np.random.default_rng(0)
    for batch, seq in SIZES:
        feeds = {"input_ids": rng.integers(0, 30522, (batch, seq), dtype=np.int64),
                 "attention_mask": np.ones((batch, seq), np.int64)}
        feeds["attention_mask"][-1, seq // 2:] = 0  # a padded row
        expected = session.run(None, feeds)[0]
        got = list(runner.run(feeds).values())[0]
        error = float(np.abs(got - expected).max())
        rows.append({"batch": batch, "seq": seq, "shape": list(got.shape), "max_abs_error_vs_ort": error,
                     "passed": bool(got.shape == expected.shape and np.allclose(got, expected, atol=1e-4, rtol=1e-3))})
        print(rows[-1])
    record = {"model": Path(args.onnx).name, "artifact": json.loads((Path(args.artifact) / "manifest.json").read_text())
              ["target"], "machine": machine.machine_info(),
              "sizes": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
