"""Run a bundle of prebuilt CUDA artifacts (prepare.py) on a GPU machine that has the NVIDIA driver, numpy and torch
and no tvm, no mlc and no network: one script, run once, every figure written to OUT/gpu-results.json.

    python benchmarks/gpu/run_on_gpu.py benchmarks/work-gpu/bundle-a "$OUT" [--timing]

For each artifact: `python run.py --check` in a Python that sees only numpy and apache-tvm-ffi (installed from the
bundle's wheel into a folder of its own); the dynamic BERT at three shapes against ONNX Runtime's outputs, by the fp16
accuracy gate; the one-line refusals (the native runner's of a GPU artifact, an sm_100a build's, a GPU index that is
not there). --timing adds, for bert2 and resnet18 at fp16, p50 latency of mlc beside torch eager and torch.compile
(mode "max-autotune-no-cudagraphs") on the same GPU, interleaved call by call, device-resident and end to end, and
mlc's per-call profile."""

from __future__ import annotations

import functools
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

SITE = Path("/tmp/mlc-gpu-site")  # apache-tvm-ffi alone, for the artifacts' Python
COMPILE_MODE = "max-autotune-no-cudagraphs"
DEVICE = "cuda"  # the torch side's


def sh(*args, env=None, timeout=300) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=timeout)
    return {"command": " ".join(map(str, args)), "rc": proc.returncode, "seconds": time.perf_counter() - start,
            "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}


def thin_env() -> dict:
    """numpy (the machine's) and apache-tvm-ffi (the bundle's), nothing of mlc or tvm."""
    return {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
            "PYTHONPATH": str(SITE)}


def install(bundle: Path) -> None:
    if SITE.exists():
        shutil.rmtree(SITE)
    wheel = next((bundle / "wheels").glob("apache_tvm_ffi-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", SITE,
                    wheel], check=True)
    stripped = json.loads((bundle / "stripped.json").read_text())
    for artifact, files in stripped.items():
        for rel, name in files.items():
            target = bundle / "artifacts" / artifact / rel
            target.write_bytes(gzip.decompress((bundle / "shared" / name).read_bytes()))
            target.chmod(0o755)  # the libraries and the native runner


GATE_SCRIPT = """
import json, sys, numpy as np
artifact, case = sys.argv[1], sys.argv[2]
sys.path.insert(0, artifact + "/runtime")
from mlc_runtime import Runner
from mlc_gate import gate
data = np.load(case)
feeds = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
expected = {k[4:]: data[k] for k in data.files if k.startswith("out:")}
result = gate(expected, Runner(artifact).run(feeds), "bf16" if "bf16" in artifact else "fp16")
print(json.dumps({"passed": result.passed, "outputs": [
    {"name": o.name, "cosine": o.cosine_similarity, "rel_error": o.rel_error, "problems": o.problems}
    for o in result.outputs]}))
sys.exit(0 if result.passed else 3)
"""


# Artifacts that must be refused there in one line (rc 4 or 5, no traceback), and extra refusals to try.
REFUSED = {"mlp-sm100"}
EXTRA_REFUSALS = {"mlp-h100": {"device cuda:1": ["--check", "--device", "cuda:1"]}}


def checks(bundle: Path) -> dict:
    results = {}
    for artifact in sorted((bundle / "artifacts").iterdir()):
        entry = {"check": sh(sys.executable, artifact / "run.py", "--check", "--repeat", "20", env=thin_env())}
        entry["check"]["expected"] = "refused" if artifact.name in REFUSED else "passed"
        for step, args in EXTRA_REFUSALS.get(artifact.name, {}).items():
            entry[step] = {**sh(sys.executable, artifact / "run.py", *args, env=thin_env()), "expected": "refused"}
        manifest = json.loads((artifact / "manifest.json").read_text())
        if manifest["runtime"].get("native_runner"):  # refuses a GPU artifact in one line
            entry["native_runner"] = {**sh(artifact / manifest["runtime"]["native_runner"], artifact, "/tmp", "/tmp"),
                                      "expected": "refused"}
        shapes = bundle / "shapes" / artifact.name
        for case in sorted(shapes.glob("*.npz")) if shapes.is_dir() else []:
            entry[f"shape {case.stem}"] = sh(sys.executable, "-c", GATE_SCRIPT, artifact, case, env=thin_env())
        for result in entry.values():
            result["ok"] = verdict(result)
        results[artifact.name] = entry
    return results


def verdict(result: dict) -> bool:
    """Passed as expected, or refused as expected: a nonzero exit with one line on stderr and no traceback."""
    if result.get("expected", "passed") == "passed":
        return result["rc"] == 0
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    return result["rc"] != 0 and len(lines) == 1 and "Traceback" not in result["stderr"]


def torch_models():
    """The torch side of each timed artifact: {artifact: (its model, built on first use, on the GPU; its inputs
    (device tensors) per shape; the shapes)}, fp16 where the artifact is."""
    import torch
    import torchvision

    import models  # this folder's: the same architectures, seeded

    def bert_inputs(shape):
        batch, seq = shape
        return {"input_ids": torch.randint(0, 1000, (batch, seq), device=DEVICE),
                "attention_mask": torch.ones(batch, seq, dtype=torch.int64, device=DEVICE)}

    def image_inputs(shape):
        return {"images": torch.randn(shape[0], 3, 224, 224, device=DEVICE)}

    def id_inputs(shape):
        return {"input_ids": torch.randint(0, 10001, shape, device=DEVICE)}

    bert = functools.cache(lambda: models.bert2().half().to(DEVICE).eval())
    bert_bf16 = functools.cache(lambda: models.bert2().bfloat16().to(DEVICE).eval())
    return {"bert2-bf16-1x128": (bert_bf16, bert_inputs, [(1, 128)]),
            "lstm-lm": (lambda: models.lstm_lm().to(DEVICE), id_inputs, [(1, 50), (128, 50)]),
            "bert2-fp16": (bert, bert_inputs, [(1, 128), (32, 128)]),
            "bert2-fp16-1x128-graphs": (bert, bert_inputs, [(1, 128)]),
            "bert2-fp16-1x128": (bert, bert_inputs, [(1, 128)]),
            "bert2-fp16-32x128-graphs": (bert, bert_inputs, [(32, 128)]),
            "resnet18-fp16": (lambda: torchvision.models.resnet18().half().to(DEVICE).eval().to(
                memory_format=torch.channels_last), image_inputs, [(1,), (32,)])}


def timing(bundle: Path, out: Path, record: dict) -> None:
    """p50 of mlc, torch eager and torch.compile (mode COMPILE_MODE, one static compile per shape), interleaved call
    by call (GPU.md's method), two ways: device-resident (inputs and outputs on the GPU, a sync after each call) and
    end to end (numpy in, numpy out). Then where mlc's time goes at the larger shape (Runner.profile)."""
    import torch

    sys.path.insert(0, str(SITE))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    record["torch"] = torch.__version__
    record["torch_compile_mode"] = COMPILE_MODE
    figures = record.setdefault("timing", {})
    for name, (build_module, make_inputs, shapes) in torch_models().items():
        artifact = bundle / "artifacts" / name
        if not artifact.is_dir():
            continue
        module = build_module()
        sys.path.insert(0, str(artifact / "runtime"))
        from mlc_runtime import Runner

        runner = Runner(artifact)
        for shape in shapes:
            feeds = make_inputs(shape)  # torch's dtypes; the artifact's inputs keep the model's (fp32 images)
            mlc_feeds = {spec["name"]: feeds[spec["name"]].to(getattr(torch, spec["dtype"]))
                         for spec in runner.inputs}
            half = reduced(name)  # None: fp32 on both sides
            torch_feeds = {k: v.to(half).contiguous(memory_format=torch.channels_last) if v.dim() == 4 and half
                           else v.to(half) if v.is_floating_point() and half else v for k, v in feeds.items()}
            host_feeds = {k: v.cpu().numpy() for k, v in mlc_feeds.items()}
            torch_calls = {"torch eager": module,
                           "torch.compile": torch.compile(module, mode=COMPILE_MODE, dynamic=False)}
            if name.endswith("-graphs"):  # beside mlc's CUDA graphs, torch.compile's too
                torch_calls["torch.compile max-autotune"] = torch.compile(module, mode="max-autotune", dynamic=False)
            if not half:  # fp32: cuDNN may use TF32 tensor cores by default (mlc does not); timed both ways
                torch_calls["torch eager, no TF32"] = functools.partial(without_tf32, module)
            resident = {"mlc": functools.partial(runner.run, mlc_feeds, device_outputs=True),
                        **{k: functools.partial(m, *torch_feeds.values()) for k, m in torch_calls.items()}}
            end_to_end = {"mlc": functools.partial(runner.run, host_feeds),
                          **{k: functools.partial(host_round_trip, m, host_feeds, half)
                             for k, m in torch_calls.items()}}
            label = f"{name} {'x'.join(map(str, shape))}"
            figures[label] = {"device-resident": interleaved(resident), "end to end": interleaved(end_to_end),
                              "outputs kept": outputs_kept(runner, mlc_feeds, make_inputs(shape))}
            write(out, record)
        largest = make_inputs(shapes[-1])
        record.setdefault("profile", {})[f"{name} {'x'.join(map(str, shapes[-1]))}"] = runner.profile(
            {spec["name"]: largest[spec["name"]].cpu().numpy().astype(spec["dtype"]) for spec in runner.inputs})[:15]
        write(out, record)




def outputs_kept(runner, feeds: dict, other: dict) -> bool:
    """A device output held across the next call with other inputs keeps its values (CUDA graphs replay into fixed
    buffers), and the next call's output differs."""
    import torch

    first = runner.run(feeds, device_outputs=True)
    held = {k: torch.from_dlpack(v).clone() for k, v in first.items()}
    other = {spec["name"]: other[spec["name"]].to(getattr(torch, spec["dtype"])) for spec in runner.inputs}
    second = runner.run(other, device_outputs=True)
    torch.cuda.synchronize()
    return all(torch.equal(torch.from_dlpack(first[k]), held[k]) and not torch.equal(torch.from_dlpack(second[k]),
                                                                                     held[k]) for k in held)


def without_tf32(module, *args):
    import torch

    torch.backends.cudnn.allow_tf32 = False
    try:
        return module(*args)
    finally:
        torch.backends.cudnn.allow_tf32 = True


def reduced(artifact: str):
    """The torch dtype an artifact's name says it computes in (fp16, bf16), None for fp32."""
    import torch

    return torch.float16 if "fp16" in artifact else torch.bfloat16 if "bf16" in artifact else None


def host_round_trip(module, host_feeds: dict, half):
    """torch end to end: numpy in, to the GPU (floats in `half` for a reduced-precision model), the model, numpy
    out."""
    import torch

    tensors = [torch.from_numpy(v).to(DEVICE) for v in host_feeds.values()]
    result = module(*[t.to(half) if t.is_floating_point() and half else t for t in tensors])
    return result.float().cpu().numpy()


def interleaved(calls: dict, warmup: int = 5, repeat: int = 100) -> dict:
    import numpy as np
    import torch

    times = {k: [] for k in calls}
    with torch.no_grad():
        for call in calls.values():  # torch.compile compiles here
            for _ in range(warmup):
                call()
        torch.cuda.synchronize()
        for _ in range(repeat):
            for key, call in calls.items():
                start = time.perf_counter()
                call()
                torch.cuda.synchronize()
                times[key].append(time.perf_counter() - start)
    return {key: {"p50_ms": float(np.median(t) * 1e3), "p10_ms": float(np.percentile(t, 10) * 1e3),
                  "p90_ms": float(np.percentile(t, 90) * 1e3)} for key, t in times.items()}


def write(out: Path, record: dict) -> None:
    """After every step, so that a run cut short still brings back what it measured."""
    (out / "gpu-results.json").write_text(json.dumps(record, indent=1, default=str) + "\n")


def main() -> None:
    bundle, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    record = {"machine": {"host": platform.node(), "python": platform.python_version(),
                          "gpu": sh("nvidia-smi", "--query-gpu=name,driver_version,compute_cap",
                                    "--format=csv,noheader")["stdout"].strip()},
              "bundle": bundle.name}
    install(bundle)
    record["checks"] = checks(bundle)
    write(out, record)
    for name, entry in record["checks"].items():
        print(name, {step: ("ok" if result["ok"] else f"FAILED rc {result['rc']}") for step, result in entry.items()},
              flush=True)
    if "--timing" in sys.argv:
        try:
            timing(bundle, out, record)
        except Exception as e:  # the checks above are recorded whatever happens here
            import traceback

            record["timing_error"] = traceback.format_exc()[-3000:]
            print("timing failed:", type(e).__name__, e, flush=True)
        write(out, record)
        print(json.dumps(record.get("timing"), indent=1), flush=True)


if __name__ == "__main__":
    main()
