"""How long `mlc debug` takes to localise a fault on a BERT-base-sized encoder.

A fault is injected into TVM's Erf converter (every Erf adds 0.05), in this process only; the
benchmark records wall time and TVM builds for the exposed-values method and for bisection.

    .venv/bin/python benchmarks/debug-localisation/debug_localisation.py [--layers 12 --hidden 768 --seq 128]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from unittest import mock

import onnx

import mlc.api as api
from mlc.bench.machine import machine_info
from mlc.models import onnx_graphs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "debug_localisation.json")
    args = parser.parse_args()

    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    model = onnx_graphs.transformer(args.layers, args.hidden, args.heads, args.vocab, args.seq)
    path = Path("/tmp/mlc-bench-encoder.onnx")
    onnx.save(model, str(path))
    expected = next(n.name for n in model.graph.node if n.op_type == "Erf")

    def faulty_erf(cls, bb, inputs, attr, params):
        return relax.op.add(relax.op.erf(inputs[0]), relax.const(0.05, "float32"))

    runs = []
    with mock.patch.object(onnx_frontend.Erf, "_impl_v13", classmethod(faulty_erf)):
        for method in ("auto", "bisect"):
            start = time.perf_counter()
            report = api.debug(str(path), input_shapes=[f"input_ids:1x{args.seq}", f"attention_mask:1x{args.seq}"],
                               method=method, isolate=False)
            runs.append({
                "method": method,
                "used": report.method,
                "wall_s": round(time.perf_counter() - start, 2),
                "tvm_builds": report.builds,
                "values": len(model.graph.node),
                "found": report.divergence.first.node_name if report.divergence.first else None,
                "correct": bool(report.divergence.first and report.divergence.first.node_name == expected),
            })
            print(json.dumps(runs[-1]), flush=True)
    result = {"benchmark": "debug_localisation", "model": vars(args) | {"out": None, "nodes": len(model.graph.node)},
              "machine": machine_info(), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
