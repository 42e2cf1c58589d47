#!/usr/bin/env python3
"""Run this mlc artifact on a machine with only numpy and apache-tvm-ffi installed:

    python run.py                      # reference inputs, prints outputs and latency
    python run.py -i in.npz -o out.npz --repeat 100
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "runtime"))

REQUIRES = "numpy apache-tvm-ffi==0.1.14.post1"

if __name__ == "__main__":
    try:
        from mlc_runtime import main

        sys.exit(main(artifact_dir=HERE))
    except ModuleNotFoundError as e:  # the two packages the thin runtime needs; nothing else is imported
        if e.name not in ("numpy", "tvm_ffi"):
            raise
        print(f"error: this artifact's runtime needs {e.name}: pip install {REQUIRES}", file=sys.stderr)
        sys.exit(4)
