#!/usr/bin/env python3
"""Run this mlc artifact on a machine with only numpy and apache-tvm-ffi installed:

    python run.py                      # reference inputs, prints outputs and latency
    python run.py -i in.npz -o out.npz --repeat 100
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "runtime"))

from mlc_runtime import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(artifact_dir=HERE))
