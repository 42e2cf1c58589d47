"""Attention over a key count that is no multiple of the vector width (a ViT's 197 tokens), #39: mlc with and
without the `pad_attention` Relax pass, at fp32 and bf16, beside OpenVINO fp32 and its default (bf16 on CPUs with
AVX512-BF16), interleaved call by call in one process (the order rotated each round).

    .venv-suites/bin/python benchmarks/precision/model_set.py --set broad --work /tmp/broad \\
        --models deit_tiny_patch16_224,vit_small_patch16_224 --build-only      # the two ViTs' ONNX files
    .venv-suites/bin/python benchmarks/attention/bench.py --broad /tmp/broad --work /tmp/attention \\
        --threads 1,2 -o benchmarks/attention/results/pad-attention.json
    git worktree add /tmp/before 81b7e1c      # bf16 attention matmuls: before that commit's tree, after this one
    .venv-suites/bin/python benchmarks/attention/bench.py --broad /tmp/broad --work /tmp/attention-bf16 \\
        --before-tree /tmp/before --threads 1,2 -o benchmarks/attention/results/bf16-attention.json

"before" is the same tree built with `--disable-pass pad_attention`, or with `--before-tree DIR` the mlc of another
commit (a git worktree: `git worktree add DIR COMMIT`), built with the same flags. Rows: the list's ViTs, compiled
with the list's flags, and "attention-197": deit_tiny's attention alone (3 heads, 197 tokens, depth 64, 12 in a
chain). `--models` takes other labels of the broad list (`benchmarks/grouped-conv`: resnext50_32x4d). Each row: p50
ms per build and the median (p10-p90) of per-round ratios, after / before and mlc / OpenVINO at the same precision
(below 1: mlc faster)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repo root
sys.path.insert(0, str(HERE.parent / "precision"))

VITS = ("deit_tiny_patch16_224", "vit_small_patch16_224")
BUILDS = ("before fp32", "after fp32", "before bf16", "after bf16")


def attention_model(heads: int = 3, tokens: int = 197, depth: int = 64, layers: int = 12):
    """softmax((q s) @ (k^T s)) @ v as timm's ViTs export it, `layers` times, each one's output the next one's q."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, x = [], "q"
    for i in range(layers):
        nodes += [helper.make_node("Mul", [x, "s"], [f"qs{i}"]),
                  helper.make_node("Transpose", ["k"], [f"kt{i}"], perm=[0, 1, 3, 2]),
                  helper.make_node("Mul", [f"kt{i}", "s"], [f"kts{i}"]),
                  helper.make_node("MatMul", [f"qs{i}", f"kts{i}"], [f"a{i}"]),
                  helper.make_node("Softmax", [f"a{i}"], [f"p{i}"], axis=-1),
                  helper.make_node("MatMul", [f"p{i}", "v"], [f"o{i}"])]
        x = f"o{i}"
    shape = [1, heads, tokens, depth]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                                                   for n in "qkv"],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(np.array(depth ** -0.25, np.float32), "s")])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def build(source: Path, flags: list[str], folder: Path, before_tree: Optional[Path]) -> dict:
    """The four builds of `source` (the CLI, as a user runs it); each one's exit code and check."""
    result = {}
    for name in BUILDS:
        side, precision = name.split()
        out = folder / name.replace(" ", "-")
        before_flags = ["--disable-pass", "pad_attention"] if before_tree is None else []
        command = [sys.executable, "-m", "mlc", "compile", str(source), "--target", "x86", "-o", str(out), *flags,
                   "--json", *(["--precision", "bf16"] if precision == "bf16" else []),
                   *(before_flags if side == "before" else [])]
        # `python -m` puts the working folder first on the path, before PYTHONPATH: run in the other tree
        other = {"cwd": before_tree, "env": {**os.environ, "PYTHONPATH": str(before_tree)}} \
            if side == "before" and before_tree else {}
        proc = subprocess.run(command, capture_output=True, text=True, **other)
        if proc.returncode == 3:  # the bf16 gate (random weights): built unchecked, its speed still counts
            proc = subprocess.run([*command, "--no-check"], capture_output=True, text=True, **other)
            result[name] = {"exit": proc.returncode, "check": "bf16 gate missed: built with --no-check"}
        else:
            result[name] = {"exit": proc.returncode, "check": "pass" if proc.returncode == 0 else
                            proc.stderr.strip().splitlines()[-1][:200]}
    return result


def measure(source: Path, folder: Path, threads: int, rounds: int) -> dict:
    from beside_openvino import before_after, timed_beside_openvino

    from mlc.runtime.runner import Runner

    runners = {name: Runner(folder / name.replace(" ", "-"), threads=threads) for name in BUILDS}
    return before_after(timed_beside_openvino(source, runners, "after fp32", threads, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--broad", type=Path, required=True, help="model_set.py's --work folder of the broad list")
    parser.add_argument("--models", default=",".join(("attention-197", *VITS)),
                        help="comma-separated: attention-197 and labels of the broad list")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--before-tree", type=lambda p: Path(p).resolve(),
                        help="build 'before' with the mlc of this git worktree (another commit), not the flag")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    import onnx

    from broad_models import MODELS as BROAD

    from mlc.bench.machine import load_average, machine_info

    doc = {"benchmark": "pad-attention" if args.before_tree is None else "before-tree", "rows": []}
    if args.before_tree is not None:
        doc["before_commit"] = subprocess.run(["git", "-C", str(args.before_tree), "rev-parse", "--short", "HEAD"],
                                              capture_output=True, text=True).stdout.strip()
    for name in args.models.split(","):
        folder = args.work.resolve() / name.replace(" ", "-")
        folder.mkdir(parents=True, exist_ok=True)
        if name == "attention-197":
            source, flags = folder / "model.onnx", []
            onnx.save(attention_model(), source)
        else:
            source, flags = args.broad.resolve() / name.replace(" ", "-") / "model.onnx", BROAD[name][2]
        builds = build(source, flags, folder, args.before_tree)
        for threads in map(int, args.threads.split(",")):
            load_start = load_average()
            row = {"label": name, "threads": threads, "builds": builds, "rounds": args.rounds,
                   **measure(source, folder, threads, args.rounds), "load_average": [load_start, load_average()]}
            doc["rows"].append(row)
            doc["machine"] = machine_info()
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(doc, indent=1) + "\n")
            print(json.dumps({k: row[k] for k in row if k != "builds"}), flush=True)


if __name__ == "__main__":
    main()
