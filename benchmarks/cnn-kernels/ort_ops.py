"""ONNX Runtime's time per operator type (its node profiler, 1 thread), to set beside mlc's per-kernel profile.

    .venv/bin/python benchmarks/cnn-kernels/ort_ops.py model.onnx [runs]   # prints JSON: op type -> ms per run

Random normal inputs (float32 image models); `runs` timed runs after 3 warm-ups (default 10)."""

import collections
import json
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort


def main() -> None:
    path, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
    graph = onnx.load(path, load_external_data=False).graph
    feeds = {i.name: np.random.default_rng(0).standard_normal(
        [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in graph.input}
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = tempfile.mkdtemp() + "/ort"
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    for _ in range(3 + runs):
        session.run(None, feeds)
    profile = json.load(open(session.end_profiling()))
    total, calls, seen = collections.defaultdict(float), collections.Counter(), collections.Counter()
    for event in profile:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            seen[event["name"]] += 1
            if seen[event["name"]] > 3:  # each node's first 3 runs are the warm-up
                total[event["args"]["op_name"]] += event["dur"]
                calls[event["args"]["op_name"]] += 1
    rows = {op: {"nodes": calls[op] // runs, "ms": round(us / runs / 1e3, 3)} for op, us in
            sorted(total.items(), key=lambda kv: -kv[1])}
    print(json.dumps({"model": path, "ms": round(sum(total.values()) / runs / 1e3, 3), "ops": rows}))


if __name__ == "__main__":
    main()
