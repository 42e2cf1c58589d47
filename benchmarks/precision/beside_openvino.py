"""mlc builds timed beside OpenVINO fp32 and OpenVINO's default precision (bf16 on CPUs with AVX512-BF16), call by
call in one process: the loop and summary the before/after studies share (benchmarks/attention,
benchmarks/grouped-conv)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def timed_beside_openvino(source: Path, runners: dict, reference: str, threads: int, rounds: int, warmup: int = 5
                          ) -> dict[str, np.ndarray]:
    """Seconds per call of each runner (name -> mlc Runner) and of OpenVINO ("openvino f32", and "openvino bf16" or
    the same key again where its default is fp32) on the reference inputs of runners[reference]: every engine once
    a round, the order rotated each round, after `warmup` untimed rounds."""
    from mlc.bench.baselines import openvino_model

    feeds = reference_feeds(runners[reference])
    timers = {}
    for precision in ("f32", None):
        compiled, actual = openvino_model(source, threads, precision)
        request = compiled.create_infer_request()
        timers[f"openvino {actual}"] = timer(lambda request=request: request.infer(feeds))
    timers |= mlc_timers(runners, feeds)
    return {k: np.array(v) for k, v in interleave(timers, rounds, warmup).items()}


def reference_feeds(runner) -> dict[str, np.ndarray]:
    """The artifact's reference inputs."""
    with np.load(runner.root / runner.manifest["reference"]["inputs"]) as npz:
        return {k: npz[k] for k in npz.files}


def mlc_timers(runners: dict, feeds: dict) -> dict:
    """Seconds per call of each mlc Runner, its inputs already in the runtime's tensors."""
    return {name: lambda r=runner: r.measure(feeds, warmup=0, repeat=1)[1]["mean_ms"] / 1e3
            for name, runner in runners.items()}


def timer(call):
    """`call` as a function that returns its seconds."""
    def timed() -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start
    return timed


def interleave(engines: dict, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Each round calls every engine once, starting one later each round, after `warmup` untimed rounds; seconds
    per call."""
    names = list(engines)
    for _ in range(warmup):
        for name in names:
            engines[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            times[name].append(engines[name]())
    return times


def ratio(arrays: dict[str, np.ndarray], a: str, b: str) -> list[float]:
    """The median, p10 and p90 of the per-round ratios of `a`'s time to `b`'s."""
    r = arrays[a] / arrays[b]
    return [round(float(np.percentile(r, q)), 3) for q in (50, 10, 90)]


def before_after(arrays: dict[str, np.ndarray]) -> dict:
    """p50 ms per engine, and the per-round ratios of the "before"/"after" builds at fp32 and bf16 to each other
    and to OpenVINO at the same precision (its default where that is bf16)."""
    ov_default = "openvino bf16" if "openvino bf16" in arrays else "openvino f32"
    sides = ("before", "after")
    return {"p50_ms": {k: round(float(np.median(a)) * 1e3, 4) for k, a in arrays.items()},
            **{f"after / before {p}": ratio(arrays, f"after {p}", f"before {p}") for p in ("fp32", "bf16")},
            **{f"{side} fp32 / openvino f32": ratio(arrays, f"{side} fp32", "openvino f32") for side in sides},
            **{f"{side} bf16 / {ov_default}": ratio(arrays, f"{side} bf16", ov_default) for side in sides}}
