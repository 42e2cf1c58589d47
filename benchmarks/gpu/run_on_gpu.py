"""Run a bundle of prebuilt CUDA artifacts (prepare.py) on a GPU machine that has the NVIDIA driver, numpy and torch
and no tvm, no mlc and no network: one script, run once, every figure written to OUT/gpu-results.json.

    python benchmarks/gpu/run_on_gpu.py benchmarks/work-gpu/bundle-a "$OUT" [--timing]

For each artifact: `python run.py --check` in a Python that sees only numpy and apache-tvm-ffi (installed from the
bundle's wheel into a folder of its own); the dynamic BERT at three shapes against ONNX Runtime's outputs, by the fp16
accuracy gate; the native runner's one-line refusal of a GPU artifact. --timing adds device-resident latency (inputs
and outputs on the GPU, a sync after each call, p50 over 100 calls) of mlc beside torch eager and torch.compile
(mode "max-autotune-no-cudagraphs") on the same GPU, interleaved call by call."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

SITE = Path("/tmp/mlc-gpu-site")  # apache-tvm-ffi alone, for the artifacts' Python


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
        for rel in files:
            target = bundle / "artifacts" / artifact / rel
            shutil.copy2(bundle / "runtime-libs" / Path(rel).name, target)


GATE_SCRIPT = """
import json, sys, numpy as np
artifact, case = sys.argv[1], sys.argv[2]
sys.path.insert(0, artifact + "/runtime")
from mlc_runtime import Runner
from mlc_gate import gate
data = np.load(case)
feeds = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
expected = {k[4:]: data[k] for k in data.files if k.startswith("out:")}
result = gate(expected, Runner(artifact).run(feeds), "fp16")
print(json.dumps({"passed": result.passed, "outputs": [
    {"name": o.name, "cosine": o.cosine_similarity, "rel_error": o.rel_error, "problems": o.problems}
    for o in result.outputs]}))
"""


def checks(bundle: Path) -> dict:
    results = {}
    for artifact in sorted((bundle / "artifacts").iterdir()):
        entry = {"check": sh(sys.executable, artifact / "run.py", "--check", "--repeat", "20", env=thin_env())}
        manifest = json.loads((artifact / "manifest.json").read_text())
        if manifest["runtime"].get("native_runner"):  # refuses a GPU artifact in one line
            entry["native_runner"] = sh(artifact / manifest["runtime"]["native_runner"], artifact, "/tmp", "/tmp")
        shapes = bundle / "shapes" / artifact.name
        for case in sorted(shapes.glob("*.npz")) if shapes.is_dir() else []:
            entry[f"shape {case.stem}"] = sh(sys.executable, "-c", GATE_SCRIPT, artifact, case, env=thin_env())
        results[artifact.name] = entry
    return results


def timing(bundle: Path) -> dict:
    """Device-resident p50 of mlc, torch eager and torch.compile, interleaved call by call (GPU.md's method)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(SITE))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models  # this folder's: the same architectures, seeded

    cases = {"bert2-fp16": [(1, 128), (32, 128)]}
    figures = {}
    for name, shapes in cases.items():
        artifact = bundle / "artifacts" / name
        if not artifact.is_dir():
            continue
        sys.path.insert(0, str(artifact / "runtime"))
        from mlc_runtime import Runner

        runner = Runner(artifact)
        eager = models.bert2().half().cuda().eval()
        compiled = torch.compile(eager, mode="max-autotune-no-cudagraphs")
        for batch, seq in shapes:
            ids = torch.randint(0, 1000, (batch, seq), device="cuda")
            mask = torch.ones(batch, seq, dtype=torch.int64, device="cuda")
            feeds = {"input_ids": ids, "attention_mask": mask}
            calls = {"mlc": functools.partial(runner.run, feeds, device_outputs=True),
                     "torch eager": functools.partial(eager, ids, mask),
                     "torch.compile": functools.partial(compiled, ids, mask)}
            times = {k: [] for k in calls}
            with torch.no_grad():
                for call in calls.values():  # warm-up (torch.compile compiles here)
                    for _ in range(5):
                        call()
                torch.cuda.synchronize()
                for _ in range(100):
                    for key, call in calls.items():
                        start = time.perf_counter()
                        call()
                        torch.cuda.synchronize()
                        times[key].append(time.perf_counter() - start)
            figures[f"{name} {batch}x{seq}"] = {
                key: {"p50_ms": float(np.median(t) * 1e3), "p10_ms": float(np.percentile(t, 10) * 1e3),
                      "p90_ms": float(np.percentile(t, 90) * 1e3)} for key, t in times.items()}
    return figures


def main() -> None:
    bundle, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    record = {"machine": {"host": platform.node(), "python": platform.python_version(),
                          "gpu": sh("nvidia-smi", "--query-gpu=name,driver_version,compute_cap",
                                    "--format=csv,noheader")["stdout"].strip()},
              "bundle": bundle.name}
    install(bundle)
    record["checks"] = checks(bundle)
    if "--timing" in sys.argv:
        try:
            record["timing"] = timing(bundle)
        except Exception as e:  # the checks above are recorded whatever happens here
            record["timing_error"] = f"{type(e).__name__}: {e}"
    (out / "gpu-results.json").write_text(json.dumps(record, indent=1) + "\n")
    for name, entry in record["checks"].items():
        print(name, {step: result["rc"] for step, result in entry.items()})


if __name__ == "__main__":
    main()
