"""Build the CUDA artifacts of one GPU run here (no GPU needed) into a bundle that travels to the GPU machine, within
its 64 MiB: the artifacts with each large file (runtime libraries, weights) gzipped and stored once, put back there;
the apache-tvm-ffi wheel for the GPU machine's Python; for the dynamic BERT, inputs and ONNX Runtime outputs at three
shapes.

    python benchmarks/gpu/prepare.py a      # -> benchmarks/work-gpu/bundle-a (then run_on_gpu.py there)

Bundle a: zoo:mlp for cuda-h100, for the generic `cuda` target (sm_80: on a Hopper GPU its PTX is what loads) and
for sm_100a (which a Hopper GPU must refuse in one line),
and bert2 (bert-base width, 2 layers, dynamic batch and seq) at --precision fp16. Bundle b: zoo:bert-tiny and
squeezenet1_0 at fp32; bundle c: zoo:resnet18 at --precision fp16 with a dynamic batch (timed there at 1 and 32);
bundles d and e: bert2 at fp16 and a fixed shape, (1, 128) and (32, 128), with --cuda-graphs; bundle f: zoo:lstm-lm
(seed 001) at fp32 with a dynamic batch; bundle g: bert2 at (1, 128) with and without CUDA graphs; all cuda-h100."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = HERE.parent / "work-gpu"
SHARED_BYTES = 64 * 1024
LIMIT_MIB = 63  # of the 64 MiB a run may take there, the checkout's tracked files included
TVM_FFI = "apache-tvm-ffi==0.1.14.post1"
GPU_PYTHON = "3.12"  # the GPU machine's
BERT_SHAPES = [(1, 16), (4, 64), (8, 128)]  # (batch, seq) the dynamic artifact is checked at there

# A Blackwell build (sm_100a cubin, compute_100 PTX), which a Hopper GPU cannot load.
SM100 = json.dumps({"kind": "cuda", "arch": "sm_100a", "max_num_threads": 1024, "thread_warp_size": 32,
                    "max_shared_memory_per_block": 49152, "max_threads_per_block": 1024, "registers_per_block": 65536})
BERT2_1x128 = ["{work}/bert2.onnx", "--target", "cuda-h100", "--precision", "fp16", "--input-shape", "input_ids:1x128",
               "--input-shape", "attention_mask:1x128"]
BUNDLES = {
    "a": [("mlp-h100", ["zoo:mlp", "--target", "cuda-h100"]),
          ("mlp-cuda-generic", ["zoo:mlp", "--target", "cuda"]),
          ("mlp-sm100", ["zoo:mlp", "--target", SM100]),  # must be refused there in one line: no code for sm_90
          ("bert2-fp16", ["{work}/bert2.onnx", "--target", "cuda-h100", "--precision", "fp16"])],
    "b": [("bert-tiny", ["zoo:bert-tiny", "--target", "cuda-h100"]),
          ("squeezenet", [f"{HERE}/models.py:squeezenet1_0", "--target", "cuda-h100"])],
    "c": [("resnet18-fp16", ["zoo:resnet18", "--target", "cuda-h100", "--precision", "fp16", "--dynamic", "batch"])],
    # bert2 at fixed shapes with CUDA graphs, one shape a bundle (the weights are 32 MiB, the reference outputs at
    # (32, 128) 12 MiB)
    "d": [("bert2-fp16-1x128-graphs", BERT2_1x128 + ["--cuda-graphs"])],
    # seed 001's LSTM language model at fp32, beside cuDNN's LSTM there
    "f": [("lstm-lm", ["zoo:lstm-lm", "--target", "cuda-h100", "--dynamic", "batch"])],
    # bert2 at (1, 128) with and without CUDA graphs, timed in one process (the two share their weights)
    "g": [("bert2-fp16-1x128-graphs", BERT2_1x128 + ["--cuda-graphs"]), ("bert2-fp16-1x128", BERT2_1x128)],
    # bf16 (sm_80+, bf16 wmma): its gate in run.py --check; with --timing, beside torch's bf16 model, and the
    # profile's device times from CUDA events
    "h": [("bert2-bf16-1x128", BERT2_1x128[:4] + ["bf16"] + BERT2_1x128[5:])],
    "e": [("bert2-fp16-32x128-graphs", ["{work}/bert2.onnx", "--target", "cuda-h100", "--precision", "fp16",
                                        "--input-shape", "input_ids:32x128", "--input-shape", "attention_mask:32x128",
                                        "--cuda-graphs"])],
}


def mlc(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "mlc", *args], check=True)


def strip_shared(artifact: Path, shared: Path) -> dict[str, str]:
    """Move each file of at least SHARED_BYTES to `shared`, gzipped and stored once by its content (the runtime
    libraries of every artifact, the weights of builds of one model): {path in the artifact: name in `shared`}."""
    shared.mkdir(exist_ok=True)
    moved = {}
    for path in sorted(p for p in artifact.rglob("*") if p.is_file() and p.stat().st_size >= SHARED_BYTES):
        data = path.read_bytes()
        name = f"{hashlib.sha256(data).hexdigest()[:16]}-{path.name}.gz"
        if not (shared / name).exists():
            (shared / name).write_bytes(gzip.compress(data, mtime=0))
        path.unlink()
        moved[str(path.relative_to(artifact))] = name
    return moved


def bert_shapes(onnx_path: Path, folder: Path) -> None:
    """Seeded inputs at each of BERT_SHAPES and ONNX Runtime's fp32 outputs for them: what the fp16 artifact is judged
    against there (the accuracy gate)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for batch, seq in BERT_SHAPES:
        feeds = {"input_ids": rng.integers(0, 1000, (batch, seq), dtype=np.int64),
                 "attention_mask": np.ones((batch, seq), dtype=np.int64)}
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        np.savez(folder / f"{batch}x{seq}.npz", **{f"in:{k}": v for k, v in feeds.items()},
                 **{f"out:{k}": v for k, v in outputs.items()})


def main(name: str) -> None:
    bundle = WORK / f"bundle-{name}"
    if bundle.exists():
        shutil.rmtree(bundle)
    (bundle / "artifacts").mkdir(parents=True)
    if name == "a":
        subprocess.run([sys.executable, HERE / "models.py", WORK], check=True)
    stripped = {}
    for artifact, args in BUNDLES[name]:
        out = bundle / "artifacts" / artifact
        mlc("compile", *[a.replace("{work}", str(WORK)) for a in args], "-o", str(out))
        stripped[artifact] = strip_shared(out, bundle / "shared")
    if name == "a":
        bert_shapes(WORK / "bert2.onnx", bundle / "shapes" / "bert2-fp16")
    (bundle / "stripped.json").write_text(json.dumps(stripped, indent=1) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", GPU_PYTHON, "--platform", "manylinux_2_28_x86_64", "--platform",
                    "manylinux2014_x86_64", "-d", bundle / "wheels", TVM_FFI], check=True)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) / 2**20
    tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True, cwd=HERE.parents[1]).stdout
    checkout = sum((HERE.parents[1] / f.decode()).stat().st_size for f in tracked.split(b"\0") if f) / 2**20
    print(f"{bundle}: {size:.1f} MiB, with the checkout {size + checkout:.1f} MiB")
    if size + checkout > LIMIT_MIB:
        sys.exit(f"bundle {name} and the checkout are {size + checkout:.1f} MiB, over the {LIMIT_MIB} MiB a GPU run "
                 "can take")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in BUNDLES:
        sys.exit(f"usage: prepare.py {{{','.join(BUNDLES)}}}")
    main(sys.argv[1])
