"""`mlc bench`: zoo models x targets x shapes x threads, mlc side by side with registered baselines.

For each model: one child process per framework builds it, exports it to ONNX and writes seeded
inputs and eager reference outputs per shape (worker.py "prepare"). For each shape, mlc compiles
the model once per target (mlc.api.compile). Then every cell (backend x threads) is measured in
a child process of its own with its thread count, so frameworks never share a process and peak
RSS is the cell's own. A cell that fails records its error; the matrix goes on.

The result is one JSON document (SCHEMA): the machine, the configuration, and a row per cell."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from mlc import models, targets
from mlc.bench import baselines, lengths, suites
from mlc.bench.cells import SCHEMA, CellError, dir_size, error_text, run_child, source_framework, write_json
from mlc.bench.contract import MeasureRequest, PrepareRequest
from mlc.bench.machine import load_average, machine_info
from mlc.check import PRECISIONS, QUANTIZED
from mlc.errors import InputError, MlcError
from mlc.pipeline.options import BenchOptions, parse_list

MLC = "mlc"

# Progress: (cells done, cells in total, what runs now).
Progress = Callable[[int, int, str], None]


@dataclass
class BenchConfig:
    models: list[str]
    targets: list[str] = field(default_factory=lambda: ["x86"])
    precisions: list[str] = field(default_factory=lambda: ["fp32"])  # mlc builds per target (--precision)
    batch: list[int] = field(default_factory=lambda: [1])
    seq: list[int] = field(default_factory=lambda: [128])
    threads: list[int] = field(default_factory=lambda: [1])
    baselines: list[str] = field(default_factory=lambda: ["torch", "ort"])
    warmup: int = 3
    repeat: int = 20
    framework: Optional[str] = None  # mlc's (and ort's) source framework [default: torch where the model has it]
    db: Optional[str] = None  # tuning database, passed to mlc.api.compile once tuning exists
    cell_timeout: Optional[float] = None  # seconds a cell's process may run before it is stopped (cell failed)
    command: str = ""
    # --lengths: a sentence-length distribution run instead of the matrix (mlc/bench/lengths.py)
    lengths: Optional[str] = None
    sentences: int = 200
    buckets: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    strategies: list[str] = field(default_factory=list)  # [default: all]
    # --suite: PyTorch's benchmark suite models (mlc/bench/suites.py) instead of zoo models; `models` then picks
    # some of the suite's (empty: all of them)
    suite: Optional[str] = None


def pick_models(models: Optional[str], suite: Optional[str], suite_models: Optional[str]) -> list[str]:
    """--models, or --suite with --suite-models (none: the whole suite)."""
    if suite and models:
        raise InputError("give --models (zoo models) or --suite, not both; pick suite models with --suite-models")
    if suite_models and not suite:
        raise InputError("--suite-models picks models of a --suite; give --suite huggingface or --suite timm")
    text = suite_models if suite else models
    return parse_list("--suite-models" if suite else "--models", text) if text else []


def config_from(options: BenchOptions, command: str = "") -> BenchConfig:
    """The matrix `options` ask for (the models picked, each list as given); `validate` checks it."""
    return BenchConfig(models=pick_models(options.models, options.suite, options.suite_models), suite=options.suite,
                       targets=list(options.targets), precisions=list(options.precision), batch=list(options.batch),
                       seq=list(options.seq), threads=list(options.threads), baselines=list(options.baselines),
                       warmup=options.warmup, repeat=options.repeat, framework=options.framework, db=options.db,
                       cell_timeout=options.cell_timeout, command=command, lengths=options.lengths,
                       sentences=options.sentences, buckets=list(options.buckets),
                       strategies=list(options.strategies or ()))


def validate(config: BenchConfig) -> None:
    """Every option checked before anything runs: one clean InputError for the first bad one."""
    if config.suite:
        config.models = suites.select(config.suite, config.models)
        if config.framework and config.framework != "torch":
            raise InputError(f"the {config.suite} suite is built in torch; leave out --framework")
        if config.batch != [1] or config.seq != [suites.SEQ]:
            raise InputError(f"the suites run at batch 1 and {suites.SEQ} tokens (static shapes); leave out --batch "
                             "and --seq")
        suites.require(config.suite)
    elif not config.models:
        raise InputError("give --models (zoo models) or --suite huggingface|timm")
    for name in [] if config.suite else config.models:
        models.get(name)
        if config.framework:
            source_framework(models.get(name), config.framework)
    for name in config.baselines:
        if name == MLC:
            raise InputError("mlc is measured for every --targets entry; list only other backends in --baselines")
        baselines.get(name)
    for name in config.targets:
        targets.resolve(name)
    from mlc.pipeline.compile import precision_supported, quantize_supported

    for precision in config.precisions:
        if precision not in PRECISIONS + QUANTIZED:
            raise InputError(f"--precision {precision}: choose one of {', '.join(PRECISIONS + QUANTIZED)}")
        for name in config.targets:
            if precision in QUANTIZED:
                quantize_supported(targets.resolve(name), precision, emulated=False)
            else:
                precision_supported(targets.resolve(name), precision, emulated=False)
    if config.warmup < 0 or config.repeat < 1:
        raise InputError("--warmup must be >= 0 and --repeat >= 1")
    if config.cell_timeout is not None and not config.cell_timeout > 0:
        raise InputError("--cell-timeout must be a number of seconds > 0")
    if not config.targets and not config.baselines:
        raise InputError("nothing to measure: give --targets and/or --baselines")
    if config.db is not None:  # before any cell runs, not once per compile
        from mlc.pipeline.schedules import check_db_dir

        check_db_dir(Path(config.db), create=False)


def mlc_builds(config: BenchConfig) -> list[str]:
    """mlc's builds per shape: TARGET at fp32, TARGET/PRECISION otherwise (the part after `mlc@` in a backend)."""
    return [t if p == "fp32" else f"{t}/{p}" for t in config.targets for p in config.precisions]


def split_build(build: str) -> tuple[str, str]:
    target, _, precision = build.partition("/")
    return target, precision or "fp32"


def _compile_mlc(source: str, framework: str, target: str, precision: str, shapes: dict[str, list[int]], dest: Path,
                 db: Optional[str]) -> dict:
    """Compile once for a (model, target, precision, shape): the artifact and what the cells report of it."""
    from mlc import api

    options = {"db": db} if db is not None else {}
    if precision in QUANTIZED:
        options["quantize"] = precision  # calibrated on seeded inputs (mlc compile warns that real data is better)
    elif precision != "fp32":
        options["precision"] = precision
    start = time.perf_counter()
    result = api.compile(source, target=target, output=dest, framework=framework,
                         input_shapes=[f"{n}:{'x'.join(map(str, s))}" for n, s in shapes.items()], **options)
    wall = time.perf_counter() - start
    timings = dict(result.manifest.compile.timings_s)
    tuning = sum(v for k, v in timings.items() if k.startswith("tun"))
    return {"artifact": str(result.path), "compile_s": round(wall, 3), "compile_breakdown_s": timings,
            "tuning_s": round(tuning, 3) if tuning else None, "artifact_bytes": dir_size(result.path),
            # as built: fp32 where TVM failed on the asked precision (mlc compile's fallback)
            "precision": precision if precision in QUANTIZED else result.manifest.precision,
            # How many kernels came from --db, from mlc's default rules, or from neither.
            "kernels": {k: len(v) for k, v in (result.manifest.compile.schedules or {}).items()}}


def run(config: BenchConfig, output: Optional[Path] = None, progress: Optional[Progress] = None) -> dict:
    """Run the matrix. With `output`, the JSON is rewritten after every cell, so an interrupted
    run keeps what it measured."""
    validate(config)
    if config.lengths:

        return lengths.run(config, output, progress)
    doc = {"schema": SCHEMA, "machine": machine_info(), "config": asdict(config), "cells": []}
    if config.suite:
        doc["suite"] = {"name": config.suite, "tiny": suites.tiny(), "models": {}}
    cells: list[dict] = doc["cells"]
    tell = progress or (lambda done, total, what: None)
    backends = config.baselines + [f"{MLC}@{b}" for b in mlc_builds(config)]
    per_model = len(config.batch) * len(config.seq) * len(config.threads) * len(backends)
    total = per_model * len(config.models)

    def save() -> None:
        if output is not None:
            write_json(doc, output)

    def add(cell: dict) -> None:
        cells.append(cell)
        save()
        tell(len(cells), total, "")

    def status(what: str) -> None:
        tell(len(cells), total, what)

    with tempfile.TemporaryDirectory(prefix="mlc-bench-") as scratch:
        workdir = Path(scratch)
        for index, name in enumerate(config.models):
            entry = _entry(config, name)
            name = entry["name"]
            source, source_fw = entry["source"], entry["framework"]
            where = f"[{index + 1}/{len(config.models)}] {name}" if config.suite else name
            prepared = _prepare_frameworks(config, entry, _frameworks_to_prepare(config, source_fw), workdir, where,
                                           status)
            main = prepared.get(source_fw) or {}
            shapes = _cell_shapes(config, main)
            total -= per_model - len(shapes) * len(config.threads) * len(backends)
            for shape in shapes:
                base = {"model": name, "batch": shape["batch"], "seq": shape["seq"]}
                artifacts = _compile_builds(config, entry, main, shape, workdir, where, status)
                model_cells = []
                for threads in config.threads:
                    for backend in backends:
                        tell(len(cells), total, f"{where} {_label(shape)} t{threads}: {backend}")
                        model_cells.append(_cell(config, name, source, source_fw, backend, shape, threads, prepared,
                                                 artifacts, workdir, base))
                        add(model_cells[-1])
                for info in artifacts.values():
                    if "artifact" in info:
                        shutil.rmtree(info["artifact"], ignore_errors=True)
                if config.suite:
                    doc["suite"]["models"][name] = _suite_outcome(main, artifacts, model_cells)
                    save()
    doc["machine"]["load_average_end"] = load_average()
    save()
    return doc


def _frameworks_to_prepare(config: BenchConfig, source_fw: str) -> dict:
    """The frameworks the cells run in, in order (a dict used as an ordered set): the source's for mlc's builds,
    each baseline's."""
    wanted = dict.fromkeys([source_fw] if config.targets else [])  # framework -> None, in order
    for b in config.baselines:
        fw = baselines.get(b).framework
        wanted[source_fw if fw == baselines.ONNX_EXPORT else fw] = None
    return wanted


def _prepare_frameworks(config: BenchConfig, entry: dict, wanted, workdir: Path, where: str,
                        status: Callable[[str], None]) -> dict[str, dict]:
    """{framework: the model built in it, exported and run eagerly; or why not ("skip" or "error")}."""
    name, source, frameworks = entry["name"], entry["source"], entry["frameworks"]
    prepared: dict[str, dict] = {}
    for fw in wanted:
        status(f"{where}: building in {fw}, exporting, eager reference")
        if fw not in frameworks:
            prepared[fw] = {"skip": f"{entry['label']} is not built for {fw} (it exists for: "
                                    f"{', '.join(frameworks)})"}
            continue
        out_dir = workdir / f"{_safe(name)}-{fw}"
        try:
            done = run_child(PrepareRequest(source=source, framework=fw, out_dir=str(out_dir), batch=config.batch,
                                            seq=config.seq),
                             workdir, f"{_safe(name)}-{fw}-prepare", f"the {fw} benchmark process",
                             config.cell_timeout if config.suite else None)
            prepared[fw] = {**done.record(), "dir": out_dir}
        except (MlcError, CellError) as e:
            prepared[fw] = {"error": f"preparing the {fw} model failed: {error_text(e)}"}
    return prepared


def _cell_shapes(config: BenchConfig, main: dict) -> list[dict]:
    # The source framework decides the shapes (models without a seq dim ignore --seq).
    shapes = main.get("shapes") or [{"batch": b, "seq": s, "key": f"b{b}-s{s}"}
                                    for b in config.batch for s in config.seq]
    if config.suite == "huggingface":  # static shapes: the suite's text length
        for shape in shapes:
            shape["seq"] = suites.SEQ
    return shapes


def _compile_builds(config: BenchConfig, entry: dict, main: dict, shape: dict, workdir: Path, where: str,
                    status: Callable[[str], None]) -> dict[str, dict]:
    """{build: mlc's artifact at this shape, or why there is none}, for each target x precision build."""
    name, source, source_fw = entry["name"], entry["source"], entry["framework"]
    artifacts: dict[str, dict] = {}
    for build in mlc_builds(config):
        target, precision = split_build(build)
        status(f"{where} {_label(shape)}: mlc compiling for {target} at {precision}")
        failure = main.get("skip") or main.get("error") or shape.get("error")
        if failure:
            artifacts[build] = {"error": failure}
            continue
        # Suite models compile from the ONNX graph prepare exported (one export per model, and the
        # cells check it against the eager outputs); zoo models from their framework, as users do.
        model_source, model_fw = ((str(main["dir"] / "model.onnx"), "onnx") if config.suite
                                  else (source, source_fw))
        try:
            artifacts[build] = _compile_mlc(model_source, model_fw, target, precision, shape["shapes"],
                                            workdir / _safe(f"{name}-{shape['key']}-{build}"), config.db)
        except Exception as e:  # recorded in the cells; the matrix goes on
            artifacts[build] = {"error": f"mlc compile failed: {error_text(e)}",
                                 "stage": _compile_stage(e)}
    return artifacts


def _entry(config: BenchConfig, name: str) -> dict:
    """Where a model comes from: a suite's (built in torch) or the zoo's."""
    if config.suite:
        return {"name": name, "source": suites.source(config.suite, name), "framework": "torch",
                "frameworks": ["torch"], "label": f"{config.suite}/{name}"}
    zoo = models.get(name)
    return {"name": zoo.name, "source": f"{models.ZOO_PREFIX}{zoo.name}",
            "framework": source_framework(zoo, config.framework),
            "frameworks": zoo.frameworks, "label": f"zoo:{zoo.name}"}


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


def _compile_stage(e: BaseException) -> str:
    """The suite table's stage of a failed mlc compile: importing the ONNX graph into Relax, or compiling it."""
    stage = getattr(e, "stage", None)
    text = str(e)
    if stage == "import" or (stage is None and re.search(r"\bimport|not supported|unsupported|no converter", text,
                                                         re.IGNORECASE)):
        return "import"
    return "compile"


def _suite_outcome(prepared: dict, artifacts: dict, cells: list[dict]) -> dict:
    """One suite model: pass, or the first stage that failed (export, import, compile, run, check) and why."""
    outcome = {k: prepared[k] for k in ("params", "notes", "exporter", "shapes") if k in prepared}
    failure = prepared.get("error") or (prepared.get("shapes") or [{}])[0].get("error")
    if failure:
        return {**outcome, "status": "failed", "stage": "export",
                "reason": failure.removeprefix("preparing the torch model failed: ")}
    compiled = next(iter(artifacts.values()), {})
    if "error" in compiled:
        return {**outcome, "status": "failed", "stage": compiled.get("stage", "compile"),
                "reason": compiled["error"].removeprefix("mlc compile failed: ")}
    if compiled:
        outcome["compile_s"] = compiled["compile_s"]
        if (compiled.get("kernels") or {}).get("unscheduled"):  # a pass on a slow path: the table says so
            outcome["unscheduled"] = compiled["kernels"]["unscheduled"]
    mine = [c for c in cells if c["backend"] == MLC]
    broken = next((c for c in mine if c["status"] != "ok"), None)
    if broken:
        return {**outcome, "status": "failed", "stage": "run", "reason": broken.get("error", broken["status"])}
    wrong = next((c for c in mine if not (c.get("accuracy") or {}).get("passed")), None)
    if wrong:
        acc = wrong.get("accuracy") or {}
        return {**outcome, "status": "failed", "stage": "check",
                "reason": f"outputs differ from torch eager (max abs error {acc.get('max_abs_error')}, "
                          f"max rel error {acc.get('max_rel_error')}, {wrong['threads']} thread(s))"}
    ruled = next((c["accuracy"] for c in mine if "rule" in c["accuracy"]), None)
    if ruled:  # failed the element-wise tolerance, passed torch's benchmark rule: say so in the table
        rmse = (f": {ruled['rmse_vs_fp64']:.2g} vs eager {ruled['eager_rmse_vs_fp64']:.2g}"
                if "rmse_vs_fp64" in ruled else "")  # the fp64 rule's figures; allclose has none
        outcome["notes"] = outcome.get("notes", []) + [
            f"max abs error {ruled['max_abs_error']:.2g}; passed by {ruled['rule']}{rmse}"]
    return {**outcome, "status": "passed" if mine else "not compiled"}


def _label(shape: dict) -> str:
    return f"b{shape['batch']}" + (f" s{shape['seq']}" if shape.get("seq") is not None else "")


def _cell(config: BenchConfig, model: str, source: str, source_fw: str, backend: str, shape: dict, threads: int,
          prepared: dict, artifacts: dict, workdir: Path, base: dict) -> dict:
    is_mlc = backend.startswith(f"{MLC}@")
    build = backend.partition("@")[2] if is_mlc else None
    target, precision = split_build(build) if is_mlc else (None, None)
    if is_mlc:
        framework = source_fw
    else:
        fw = baselines.get(backend).framework
        framework = source_fw if fw == baselines.ONNX_EXPORT else fw
    cell = {**base, "threads": threads, "backend": MLC if is_mlc else backend, "target": target,
            "framework": framework, "status": "ok", **({"precision": precision} if is_mlc else {})}
    info = prepared.get(framework, {})
    entry = next((s for s in info.get("shapes", []) if s["key"] == shape["key"]), None)
    reason = info.get("skip")
    if reason:
        return {**cell, "status": "skipped", "error": reason}
    failure = info.get("error") or (entry or {}).get("error")
    if entry is None and not failure:
        failure = f"{framework} has no input of this shape (its symbolic dims: {', '.join(info.get('symbolic', []))})"
    if is_mlc and not failure:
        compiled = artifacts[build]
        failure = compiled.get("error")
        if not failure:
            cell.update({k: compiled[k] for k in ("compile_s", "compile_breakdown_s", "tuning_s", "artifact_bytes",
                                                  "kernels", "precision")})
            cell["target_emulated"] = targets.resolve(target).runtime_arch != targets.HOST_ARCH
    if failure:
        return {**cell, "status": "failed", "error": failure}
    cell["input_shapes"] = entry["shapes"]
    cell["reference"] = info["reference"]
    job = MeasureRequest(backend=MLC if is_mlc else backend, source=source, framework=framework,
                         threads=threads, warmup=config.warmup, repeat=config.repeat,
                         feeds=str(info["dir"] / f"feeds-{shape['key']}.npz"),
                         reference=str(info["dir"] / f"reference-{shape['key']}.npz"),
                         onnx=str(info["dir"] / "model.onnx"), inputs=info["inputs"],
                         artifact=artifacts[build]["artifact"] if is_mlc else None,
                         scratch=str(workdir / f"scratch-{model}-{shape['key']}-{threads}-{backend}"))
    tag = re.sub(r"[^\w.-]", "_", f"{model}-{shape['key']}-t{threads}-{backend}")
    try:
        result = run_child(job, workdir, tag, f"the {backend} benchmark process", config.cell_timeout)
    except Exception as e:
        return {**cell, "status": "failed", "error": error_text(e)}
    finally:
        shutil.rmtree(job.scratch, ignore_errors=True)
    if result.skipped is not None:
        return {**cell, "status": "skipped", "error": result.skipped}
    for key in ("setup_s", "compile_s", "precision", "latency_ms", "throughput", "runtime_precisions", "accuracy",
                "peak_rss_mb", "load_average"):
        value = getattr(result, key)
        if value is not None or key == "load_average":  # None: not measured; load_average: unknown on this OS
            cell[key] = value
    if is_mlc and (result.emulated or cell.get("target_emulated")):
        cell["emulated"] = True
    return cell


def command_line(argv: Sequence[str] | None = None) -> str:
    return shlex.join(["mlc", *(sys.argv[1:] if argv is None else argv)])
