"""`mlc bench --lengths cola-like`: the seed 002 experiment. One model over a realistic set of
sentence lengths (batch 1, one sentence at a time), served by several strategies:

- dynamic: one mlc compile with `--dynamic seq=1..MAX` (symbolic seq, one library);
- buckets: one mlc compile with `--buckets` (inputs padded to the next bucket);
- static: one mlc compile per distinct length in the set;
- ort, openvino (fp32): ONNX Runtime and OpenVINO on the dynamic export; torch: PyTorch eager.

Per strategy: total compile time, total run time over the set, padding waste, artifact size and
accuracy against eager. The model is exported once (bench worker "prepare", which also writes the
eager reference per distinct length); the mlc compiles read that ONNX export, so export time is
recorded once, apart from every strategy's compile time."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from mlc import models
from mlc.bench.cells import SCHEMA, dir_size, error_text, run_child, source_framework, write_json
from mlc.bench.contract import CompileJobRequest, PrepareRequest, PrepareResult, SequenceRequest, SequenceResult
from mlc.bench.machine import load_average, machine_info
from mlc.errors import InputError

DISTRIBUTIONS = ("cola-like",)
STRATEGIES = ("dynamic", "buckets", "static", "ort", "openvino", "torch")
SEED = 2


def cola_like(n: int, seed: int = SEED) -> list[int]:
    """BERT token lengths (with [CLS] and [SEP]) of n CoLA-like sentences: CoLA's sentences are short
    (about 9 words, a long right tail); WordPiece adds ~10%. Modelled as 2 + round(lognormal(median 7.5
    words, sigma 0.45) * 1.1), clipped to 5..45: mean ~11, median ~10, 99th percentile ~28."""
    rng = np.random.default_rng(seed)
    words = rng.lognormal(mean=np.log(7.5), sigma=0.45, size=n)
    return [int(v) for v in np.clip(2 + np.round(words * 1.1), 5, 45)]


def lengths_for(name: str, n: int) -> list[int]:
    if name not in DISTRIBUTIONS:
        raise InputError(f"unknown --lengths {name!r}; choose from: {', '.join(DISTRIBUTIONS)}")
    if n < 1:
        raise InputError("--sentences must be >= 1")
    return cola_like(n)


def distribution_stats(lengths: list[int]) -> dict:
    a = np.asarray(lengths)
    counts = {int(k): int(v) for k, v in zip(*np.unique(a, return_counts=True))}
    return {"n": len(lengths), "mean": round(float(a.mean()), 2), "median": float(np.median(a)), "min": int(a.min()),
            "max": int(a.max()), "p90": float(np.percentile(a, 90)), "distinct": len(counts), "histogram": counts}


def padding_waste(lengths: list[int], sizes: list[int]) -> float:
    """Percent of the tokens run that are padding when each length is padded to the next size."""
    padded = [next(s for s in sorted(sizes) if s >= n) for n in lengths]
    return round(100.0 * (sum(padded) - sum(lengths)) / sum(padded), 2)


@dataclass
class _LengthsRun:
    """One --lengths run's model, machine settings and scratch folders, once the model is exported."""
    zoo: object
    source: str
    target: str
    threads: int
    lengths: list
    sizes: list  # the buckets, ascending
    workdir: Path
    prep_dir: Path
    prepared: PrepareResult  # the prepare job's answer
    cell_timeout: object
    tell: Callable
    n_strategies: int

    @property
    def distinct(self) -> list:
        return sorted(set(self.lengths))

    def input_shapes(self, n: int) -> list[str]:
        shape_of = {e.seq: e.shapes for e in self.prepared.shapes}
        return [f"{k}:{'x'.join(map(str, v))}" for k, v in shape_of[n].items()]

    def compile(self, what: str, name: str, **options) -> str:
        """One compile in a fresh process (the time includes its start and imports, as a user's
        `mlc compile` would): 20 bert-base compiles in one process grew it to 15 GB."""
        job = CompileJobRequest(source=str(self.prep_dir / "model.onnx"), target=self.target,
                                output=str(self.workdir / name), options=options)
        return run_child(job, self.workdir, f"compile-{name}", f"compiling {what}").path

    def compile_strategy(self, index: int, strategy: str, row: dict, artifacts: dict) -> None:
        """Fill `artifacts` ({seq or '*': artifact path}) with the builds `strategy` needs (none for a baseline)."""
        name, sizes, distinct = self.zoo.name, self.sizes, self.distinct
        if strategy == "dynamic":
            artifacts["*"] = self.compile(f"{name}: dynamic", "dynamic", input_shapes=self.input_shapes(distinct[-1]),
                                          dynamic=[f"seq=1..{sizes[-1]}"])
        elif strategy == "buckets":
            artifacts["*"] = self.compile(f"{name}: buckets", "buckets", input_shapes=self.input_shapes(distinct[0]),
                                          buckets=[",".join(map(str, sizes))])
            row["padding_waste_pct"] = padding_waste(self.lengths, sizes)
        elif strategy == "static":
            for n in distinct:
                self.tell(index, self.n_strategies, f"{name}: static, compiling seq {n}")
                artifacts[str(n)] = self.compile(f"{name}: static seq {n}", f"static-{n}",
                                                 input_shapes=self.input_shapes(n))

    def measure(self, strategy: str, artifacts: dict) -> SequenceResult:
        return run_child(SequenceRequest(backend="mlc" if artifacts else strategy, artifacts=artifacts,
                                         dir=str(self.prep_dir), lengths=self.lengths, inputs=self.prepared.inputs,
                                         outputs=self.prepared.outputs, source=self.source, threads=self.threads),
                         self.workdir, f"sequence-{strategy}", f"the {strategy} benchmark process",
                         self.cell_timeout)

    def strategy_row(self, index: int, strategy: str) -> dict:
        """Build and run one strategy over every sentence; a failure is recorded in the row."""
        row = {"strategy": strategy, "status": "ok", "compiles": 0}
        artifacts: dict[str, str] = {}
        try:
            start = time.perf_counter()
            self.compile_strategy(index, strategy, row, artifacts)
            row["compile_s"] = round(time.perf_counter() - start, 3) if artifacts else None
            row["compiles"] = len(self.distinct) if strategy == "static" else int(bool(artifacts))
            if artifacts:
                row["artifact_bytes"] = sum(dir_size(Path(p)) for p in artifacts.values())
            row.setdefault("padding_waste_pct", 0.0)
            measured = self.measure(strategy, artifacts)
            if strategy in ("ort", "openvino"):  # session creation / compile_model: their graph optimisation
                row["compile_s"] = round(measured.setup_s, 3)
            row.update({"setup_s": round(measured.setup_s, 3), "run_total_s": round(measured.run_total_s, 4),
                        "run_ms": [round(t, 4) for t in measured.run_ms], "accuracy": measured.accuracy,
                        "run_cpu_total_s": round(measured.run_cpu_total_s, 4),
                        "run_cpu_ms": [round(t, 4) for t in measured.run_cpu_ms],
                        "peak_rss_mb": measured.peak_rss_mb, "load_average": measured.load_average})
        except Exception as e:  # recorded; the other strategies go on
            row.update({"status": "failed", "error": error_text(e)})
        finally:
            for path in artifacts.values():
                shutil.rmtree(path, ignore_errors=True)
        return row


def _checked_strategies(config) -> list[str]:
    strategies = config.strategies or list(STRATEGIES)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise InputError(f"unknown --strategies {', '.join(unknown)}; choose from: {', '.join(STRATEGIES)}")
    return strategies


def _torch_model(config):
    """(the zoo model, its source, its framework), which must be torch: the comparison is with PyTorch eager."""
    zoo = models.get(config.models[0])
    source = f"{models.ZOO_PREFIX}{zoo.name}"
    framework = source_framework(zoo, config.framework)
    if framework != "torch":
        raise InputError(f"--lengths compares with PyTorch eager: give a model with a torch build ({zoo.name} "
                         f"has {', '.join(zoo.frameworks)})")
    return zoo, source, framework


def _prepare(zoo, source: str, framework: str, distinct: list, workdir: Path, prep_dir: Path,
             doc: dict) -> PrepareResult:
    """Export the model with a dynamic seq and run it eagerly at each length (the time goes into `doc`)."""
    start = time.perf_counter()
    prepared = run_child(PrepareRequest(source=source, framework=framework, out_dir=str(prep_dir), batch=[1],
                                        seq=distinct), workdir, "prepare", "the torch benchmark process")
    doc["lengths"]["export_s"] = round(time.perf_counter() - start, 3)
    failed = [e for e in prepared.shapes if e.error is not None]
    if failed:
        raise InputError(f"preparing {zoo.name} failed at seq {failed[0].seq}: {failed[0].error}")
    return prepared


def run(config, output: Optional[Path] = None, progress=None) -> dict:
    """config: a BenchConfig with lengths set (one model, its first target, its first thread count)."""

    if len(config.models) != 1:
        raise InputError("--lengths runs one model; give one --models entry")
    lengths = lengths_for(config.lengths, config.sentences)
    strategies = _checked_strategies(config)
    sizes = sorted(config.buckets)
    if max(lengths) > sizes[-1]:
        raise InputError(f"the longest sentence has {max(lengths)} tokens, more than the largest bucket {sizes[-1]}")
    zoo, source, framework = _torch_model(config)
    target = config.targets[0] if config.targets else "x86"
    threads = config.threads[0]
    tell = progress or (lambda done, total, what: None)
    distinct = sorted(set(lengths))
    doc = {"schema": SCHEMA, "machine": machine_info(), "config": asdict(config), "cells": [],
           "lengths": {"model": zoo.name, "distribution": config.lengths, "seed": SEED, "target": target,
                       "threads": threads, "buckets": sizes, "stats": distribution_stats(lengths),
                       "lengths": lengths, "strategies": []}}
    rows = doc["lengths"]["strategies"]

    def save() -> None:
        if output is not None:
            write_json(doc, output)

    with tempfile.TemporaryDirectory(prefix="mlc-bench-lengths-") as scratch:
        workdir = Path(scratch)
        prep_dir = workdir / "prepared"
        tell(0, len(strategies), f"{zoo.name}: exporting (dynamic seq) and running eagerly at {len(distinct)} lengths")
        prepared = _prepare(zoo, source, framework, distinct, workdir, prep_dir, doc)
        lengths_run = _LengthsRun(zoo, source, target, threads, lengths, sizes, workdir, prep_dir, prepared,
                                  config.cell_timeout, tell, len(strategies))
        for index, strategy in enumerate(strategies):
            tell(index, len(strategies), f"{zoo.name}: {strategy}")
            rows.append(lengths_run.strategy_row(index, strategy))
            save()
    doc["machine"]["load_average_end"] = load_average()
    save()
    return doc
