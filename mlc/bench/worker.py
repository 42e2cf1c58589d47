"""The benchmark child process. Run as

    python -m mlc.bench.worker REQUEST.json

Jobs, one per process:
- "prepare": build a zoo model in one framework, export it to ONNX (batch and seq dynamic), and
  for every benchmark shape write seeded inputs and the framework's eager outputs (the reference
  every cell is checked against);
- "measure": one cell, one backend (a registered baseline, or an mlc artifact) at one thread
  count: compile/setup, warm-up, timed repeats, outputs compared with the reference, peak RSS;
- "sequence": one --lengths strategy over a list of sentence lengths;
- "compile": one `mlc compile` (--lengths compiles each in a fresh process: a process that compiled
  bert-base 20 times held 15 GB, memory that ONNX/TVM's native code keeps, and was OOM-killed).

Thread limits go into the environment before numpy or any framework is imported (OpenMP, MKL,
OpenBLAS and TVM's pool read them when they start). Writes the result beside the request as
every mlc worker does (mlc.child_process)."""

from __future__ import annotations

import math

import os
import sys
from pathlib import Path

from mlc.bench.contract import (BenchRequest, CompileJobRequest, CompileJobResult, MeasureRequest, MeasureResult,
                                PreparedShape, PrepareRequest, PrepareResult, SequenceRequest, SequenceResult)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")
FEEDS = "feeds-{key}.npz"
REFERENCE = "reference-{key}.npz"
MODEL = "model.onnx"


def shape_key(batch: int, seq: int | None) -> str:
    return f"b{batch}" + (f"-s{seq}" if seq is not None else "")


def _framework_model(source: str, framework: str):
    from mlc.bench import suites
    from mlc.pipeline import convert_worker

    if suites.is_suite(source):
        return suites.framework_model(source)
    return convert_worker.framework_model(source, framework)


def prepare(request: PrepareRequest) -> PrepareResult:
    import numpy as np
    import onnx

    from mlc import models
    from mlc.child_process import one_line
    from mlc.bench import suites
    from mlc.compiler.contract import Note, NoteKind
    from mlc.frontends import onnx as onnx_frontend
    from mlc.runtime.runner import save_npz

    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source, framework = request.source, request.framework
    if framework == "onnx":  # a zoo graph: ONNX Runtime is its reference
        fm = None
        onnx.save(models.get(source).build(), str(out / MODEL))
        exporter, version = "zoo ONNX graph", "onnx"
    else:
        fm = _framework_model(source, framework)
        exporter = fm.export(out / MODEL, set(fm.symbolic_dims()))
        from mlc.pipeline.convert_worker import framework_version

        version = f"{framework} {framework_version(framework)} eager"
    model = onnx_frontend.load_graph(out / MODEL)
    specs = onnx_frontend.input_specs(model)
    names = [o.name for o in model.graph.output]
    dims = {d.name: d.dims for d in fm.inputs} if fm else {s.name: s.shape for s in specs}
    sizes = dict(fm.example_sizes) if fm else {}
    symbolic = list(dict.fromkeys(d for ds in dims.values() for d in ds if isinstance(d, str)))
    seqs = request.seq if "seq" in symbolic else [None]
    shapes = []
    for batch in request.batch:
        for seq in seqs:
            key = shape_key(batch, seq)
            try:
                known = {**sizes, "batch": batch, **({"seq": seq} if seq is not None else {})}
                concrete = {s.name: [known.get(d, onnx_frontend.DEFAULT_OTHER_DIM) if isinstance(d, str) else d
                                     for d in dims[s.name]] for s in specs}
                feeds = onnx_frontend.make_inputs(specs, concrete)
                if fm is None:
                    outputs = list(onnx_frontend.onnxruntime_reference(out / MODEL, feeds).outputs.values())
                else:
                    outputs = fm.eager([feeds[s.name] for s in specs])
                save_npz(out / FEEDS.format(key=key), feeds)
                save_npz(out / REFERENCE.format(key=key), {n: np.asarray(v) for n, v in zip(names, outputs)})
                if fm is not None and suites.is_suite(source):  # for the fp64 rule when the plain check fails
                    wide = suites.eager_fp64(fm, [feeds[s.name] for s in specs])
                    if wide is not None:
                        save_npz(out / suites.REFERENCE64.format(key=key), dict(zip(names, wide)))
                shapes.append(PreparedShape(batch, seq, key, shapes=concrete))
            except Exception as e:  # one shape failing (memory, limits) must not stop the rest
                shapes.append(PreparedShape(batch, seq, key, error=one_line(e)))
    return PrepareResult(exporter=exporter, reference=version if fm else "onnxruntime",
                         params=_parameter_count(fm.native if fm else None, model),
                         notes=[Note(NoteKind.FRONTEND, text) for text in (fm.notes if fm else [])],
                         inputs=[s.name for s in specs], outputs=names, symbolic=symbolic, shapes=shapes)


def _parameter_count(native, model) -> int:
    if hasattr(native, "parameters"):  # torch and paddle (whose numel() is a Tensor)
        return sum(int(p.numel()) for p in native.parameters())
    return sum(math.prod(init.dims) for init in model.graph.initializer)  # Keras, ONNX: the exported weights


REDUCED_PRECISIONS = ("bf16", "fp16", "int8", "int8-dynamic")  # judged by the accuracy gate


def _measure_mlc(request: MeasureRequest, feeds: dict, result: dict):
    """Run the mlc artifact: (outputs, latency stats); its setup time, precision and whether it ran emulated go
    into `result`."""
    import time

    from mlc.runtime import runner as thin_runtime

    artifact = Path(request.artifact)
    manifest = thin_runtime.read_manifest(artifact)
    runner_class = (thin_runtime.Runner if manifest["target"]["runtime_arch"] == thin_runtime.HOST_ARCH
                    else thin_runtime.NativeRunner)
    start = time.perf_counter()
    runner = runner_class(artifact)
    result["setup_s"] = time.perf_counter() - start
    outputs, stats, _ = runner.measure(feeds, request.warmup, request.repeat)
    result["emulated"] = bool(getattr(runner, "emulated", False))
    quantization = manifest.get("quantization") or {}
    result["precision"] = quantization.get("mode") or manifest.get("precision", "fp32")
    return outputs, stats


def _timed_calls(run, warmup: int, repeat: int) -> tuple[list, list[float]]:
    """(the first call's outputs, the times of `repeat` calls after `warmup` untimed ones)."""
    import time

    produced = run()
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return produced, times


def _measure_baseline(request: MeasureRequest, feeds: dict, reference: dict, result: dict):
    """Run a baseline: (outputs, latency stats), or the reason it cannot run here; its setup (and compile) time,
    precision, and a throughput baseline's figures go into `result`."""
    import time

    from mlc.bench import baselines
    from mlc.runtime import runner as thin_runtime

    names = request.inputs
    chosen = baselines.get(request.backend)
    framework = request.framework
    if framework != "onnx" and chosen.framework != baselines.ONNX_EXPORT:
        baselines.limit_threads(framework, request.threads)
    model = None
    if chosen.framework != baselines.ONNX_EXPORT and framework != "onnx":
        model = _framework_model(request.source, framework)
    scratch = Path(request.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = baselines.Context(model, Path(request.onnx), names, [feeds[n] for n in names], request.threads, scratch)
    start = time.perf_counter()
    try:
        run = chosen.setup(ctx)
    except baselines.Unavailable as e:
        return str(e)
    result["setup_s"] = time.perf_counter() - start
    if chosen.compiles:
        result["compile_s"] = result["setup_s"]
    # a backend that picks its own says which (OpenVINO: f32, bf16, f16)
    ran_at = getattr(run, "precision", "fp32")
    result["precision"] = {"f32": "fp32", "f16": "fp16"}.get(ran_at, ran_at)
    produced, times = _timed_calls(run, request.warmup, request.repeat)
    batch = int(ctx.inputs[0].shape[0]) if ctx.inputs and ctx.inputs[0].ndim else 1
    per_call = getattr(run, "batches_per_call", None)  # a throughput baseline: batches in flight per call
    stats = thin_runtime.latency_stats(times, batch * (per_call or 1))
    if per_call:  # its call time is no latency: the cell records samples/s and how they were run
        result["throughput"] = {"batch": batch, "batches_per_call": per_call,
                                "samples_per_s": stats["samples_per_s"], "call_ms": stats["p50_ms"],
                                **({"streams": run.streams} if hasattr(run, "streams") else {})}
    if hasattr(run, "compiled"):  # OpenVINO: the precisions its executed layers ran at (int8: u8/i8)
        result["runtime_precisions"] = baselines.runtime_precisions(run.compiled)
    if len(produced) != len(reference):
        raise ValueError(f"{chosen.name} returned {len(produced)} outputs where the model has {len(reference)}")
    return dict(zip(reference, produced)), stats


def _accuracy(request: MeasureRequest, reference: dict, outputs: dict, precision: str) -> dict:
    """The outputs against the eager reference: within tolerance, or for a reduced precision by the accuracy gate
    (a suite model failing the tolerance: by torch's benchmark rule)."""
    import numpy as np

    from mlc.bench import suites
    from mlc.check import compare
    from mlc.runtime import runner as thin_runtime

    check = compare(reference, {k: np.asarray(v) for k, v in outputs.items()})
    accuracy = {"max_abs_error": max((o.max_abs_error for o in check.outputs), default=None),
                "max_rel_error": max((o.max_rel_error for o in check.outputs), default=None),
                "passed": check.passed}
    wide = Path(request.reference).with_name(Path(request.reference).name.replace("reference-", "reference64-"))
    if precision in REDUCED_PRECISIONS:  # judged as `mlc compile --precision` judges it: by the gate
        from mlc.check import gate

        figures = gate(reference, {k: np.asarray(v) for k, v in outputs.items()}, precision)
        accuracy.update(passed=figures.passed, gate=figures.to_json())
    elif not check.passed and suites.is_suite(request.source):  # torch's benchmark rule
        fallback = suites.suite_check(reference, thin_runtime.load_npz(wide) if wide.is_file() else None, outputs)
        accuracy.update(fallback)
    return accuracy


def measure(request: MeasureRequest) -> MeasureResult:
    from mlc.runtime import runner as thin_runtime

    feeds = thin_runtime.load_npz(request.feeds)
    reference = thin_runtime.load_npz(request.reference)
    result: dict = {}  # MeasureResult's fields, as the steps find them
    if request.backend == "mlc":
        outputs, stats = _measure_mlc(request, feeds, result)
    else:
        measured = _measure_baseline(request, feeds, reference, result)
        if isinstance(measured, str):  # the baseline cannot run on this machine
            return MeasureResult(skipped=measured)
        outputs, stats = measured
    if "throughput" not in result:
        result["latency_ms"] = {k.removesuffix("_ms"): v for k, v in stats.items()}
    result["accuracy"] = _accuracy(request, reference, outputs, result["precision"])
    result["peak_rss_mb"] = peak_rss_mb()
    result["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return MeasureResult(**result)


def _sequence_call(request: SequenceRequest, folder: Path, feeds: dict):
    """The strategy's backend set up: a function from a sentence length to the outputs on that length's feeds."""
    import numpy as np

    from mlc.runtime import runner as thin_runtime

    names = request.inputs
    backend = request.backend
    if backend == "mlc":  # artifacts by length ("*": one serving every length)
        artifacts = request.artifacts
        runners = {key: thin_runtime.Runner(path) for key, path in artifacts.items()}
        call = lambda n: runners.get(str(n), runners.get("*")).run(feeds[n])  # noqa: E731
    elif backend == "ort":
        from mlc.bench.baselines import ort_session

        session = ort_session(folder / MODEL, request.threads)
        call = lambda n: dict(zip(request.outputs, session.run(None, feeds[n])))  # noqa: E731
    elif backend == "openvino":  # fp32 (INFERENCE_PRECISION_HINT f32), the dynamic export as it is
        from mlc.bench.baselines import openvino_model

        compiled, _ = openvino_model(folder / MODEL, request.threads, "f32")
        infer = compiled.create_infer_request()
        wanted = {name for port in compiled.inputs for name in port.get_names()}

        def call(n: int) -> dict:
            results = infer.infer({k: v for k, v in feeds[n].items() if k in wanted})
            return {name: np.asarray(results[port]) for name, port in zip(request.outputs, compiled.outputs)}
    elif backend == "torch":
        import torch

        from mlc.bench import baselines
        from mlc.frontends.torch import flatten_outputs

        baselines.limit_threads("torch", request.threads)
        module = _framework_model(request.source, "torch").native

        def call(n: int) -> dict:
            with torch.no_grad():
                out = flatten_outputs(module(*[torch.from_numpy(feeds[n][k]) for k in names]))
            return dict(zip(request.outputs, out))
    else:
        raise ValueError(f"unknown strategy backend {backend!r}")
    return call


def sequence(request: SequenceRequest) -> SequenceResult:
    """One strategy over a list of sentence lengths (batch 1, one sentence at a time): every distinct
    length once untimed (warm-up, and its outputs checked against the eager reference), then each
    sentence once, timed; returns the total and the per-length accuracy."""
    import time

    import numpy as np

    from mlc.check import compare
    from mlc.runtime import runner as thin_runtime

    folder = Path(request.dir)
    lengths = request.lengths
    distinct = sorted(set(lengths))
    feeds = {n: thin_runtime.load_npz(folder / FEEDS.format(key=shape_key(1, n))) for n in distinct}
    start = time.perf_counter()
    call = _sequence_call(request, folder, feeds)
    setup_s = time.perf_counter() - start
    worst, passed = 0.0, True
    for n in distinct:
        check = compare(thin_runtime.load_npz(folder / REFERENCE.format(key=shape_key(1, n))),
                        {k: np.asarray(v) for k, v in call(n).items()})
        worst = max([worst] + [o.max_abs_error for o in check.outputs])
        passed = passed and check.passed
    times, cpu = [], []  # CPU time beside wall time: on a shared machine wall time counts others' turns too
    for n in lengths:
        start, start_cpu = time.perf_counter(), time.process_time()
        call(n)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return SequenceResult(setup_s=setup_s, run_total_s=sum(times), run_ms=[t * 1e3 for t in times],
                          run_cpu_total_s=sum(cpu), run_cpu_ms=[t * 1e3 for t in cpu],
                          accuracy={"max_abs_error": worst, "passed": passed}, peak_rss_mb=peak_rss_mb(),
                          load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)


def peak_rss_mb() -> float:
    """This process's peak resident memory, framework and model included. VmHWM, not ru_maxrss:
    ru_maxrss survives exec, so a child would report its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    import resource  # not Linux: ru_maxrss (bytes on macOS)

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)


def compile_job(request: CompileJobRequest) -> CompileJobResult:
    from mlc import api

    result = api.compile(request.source, target=request.target, output=request.output, **request.options)
    return CompileJobResult(path=str(result.path))


def run_job(request: BenchRequest):
    """The job's typed result, with the thread limits set first (before numpy or any framework starts its pool)."""
    if request.threads:
        for name in THREAD_VARIABLES:
            os.environ[name] = str(request.threads)
    jobs = {PrepareRequest: prepare, MeasureRequest: measure, SequenceRequest: sequence, CompileJobRequest: compile_job}
    return jobs[type(request)](request)


def serve_request(data: dict):
    """The handler mlc.child_process.serve calls: the JSON request parsed strictly, the result as the worker's
    payload."""
    from mlc import child_process
    from mlc.bench.contract import request_from_json

    return child_process.WorkerResult.success(run_job(request_from_json(data)).to_json())


def main(argv: list[str]) -> int:
    from mlc import child_process

    return child_process.serve(argv, serve_request)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
