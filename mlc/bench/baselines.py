"""The baselines mlc is measured against, registered by name.

A baseline runs inside a benchmark child process (mlc/bench/worker.py), one cell per process and
one framework per process (tensorflow and paddle crash when imported together). Its setup gets a
Context (the zoo model as a FrameworkModel, the ONNX export, the inputs, the thread count) and
returns a function that runs the model once on those inputs and returns its outputs as numpy, in
ONNX output order. Whatever setup does before returning (and the first call, which is where
lazy compilers compile) counts as the baseline's compile time.

A run may carry attributes the worker records: `precision` (what it ran at, where the engine picks) and
`batches_per_call` (a throughput baseline: each call runs that many batches at once; the cell then records
samples/s, not a latency).

Adding one: decorate `setup(ctx) -> run` with @baseline(name, framework, description).
This module imports no framework; the setups import theirs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from mlc.errors import InputError

ONNX_EXPORT = "export"  # a baseline that runs the ONNX export of the model (no framework model needed)


class Unavailable(Exception):
    """The baseline cannot run this model here (not built for its framework, not installed):
    the cell is recorded as skipped with this reason."""


@dataclass
class Context:
    model: Any  # FrameworkModel, or None for baselines on the ONNX export
    onnx_path: Optional[Path]
    input_names: list[str]  # ONNX input order
    inputs: list[np.ndarray]
    threads: int
    scratch: Path  # a folder of this cell's own (compiler caches)
    # int8 baselines' calibration feeds (input name -> array); None: the seeded inputs mlc's --quantize int8 uses
    calibration: Optional[list[dict[str, np.ndarray]]] = None
    # False: ONNX Runtime's idle workers sleep (engines timed in turn in one process; see ort_session)
    spinning: bool = True


Setup = Callable[[Context], Callable[[], list[np.ndarray]]]


@dataclass(frozen=True)
class Baseline:
    name: str
    framework: str  # whose zoo model it runs: torch, tensorflow, paddle, or ONNX_EXPORT
    description: str
    setup: Setup
    compiles: bool  # setup compiles (its time is reported as compile time)


BASELINES: dict[str, Baseline] = {}


def baseline(name: str, framework: str, description: str, compiles: bool = False) -> Callable[[Setup], Setup]:
    def register(setup: Setup) -> Setup:
        BASELINES[name] = Baseline(name, framework, description, setup, compiles)
        return setup

    return register


def get(name: str) -> Baseline:
    if name not in BASELINES:
        raise InputError(f"unknown baseline {name!r}; choose from: {', '.join(BASELINES)}")
    return BASELINES[name]


# Thread limits, set in the child before the framework starts its thread pools.
def limit_threads(framework: str, threads: int) -> None:
    if framework == "torch":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
    elif framework == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    elif framework == "paddle":
        import paddle

        if hasattr(paddle, "set_num_threads"):
            paddle.set_num_threads(threads)  # OMP/MKL env vars (set by the worker) cover older versions


def _native(ctx: Context, what: str):
    if ctx.model is None or ctx.model.native is None:
        raise Unavailable(f"{what} needs the framework's model object (FrameworkModel.native), which this "
                          "zoo builder does not provide yet")
    return ctx.model.native


# PyTorch -----------------------------------------------------------------------------------------

def _torch_call(module, ctx: Context) -> Callable[[], list[np.ndarray]]:
    import torch

    from mlc.frontends.torch import flatten_outputs

    args = [torch.from_numpy(np.ascontiguousarray(a)) for a in ctx.inputs]

    def run() -> list[np.ndarray]:
        with torch.no_grad():
            return flatten_outputs(module(*args))

    return run


@baseline("torch", "torch", "PyTorch eager (no_grad)")
def torch_eager(ctx: Context):
    return _torch_call(_native(ctx, "torch eager"), ctx)


@baseline("torch-compile", "torch", "torch.compile, inductor backend (C++/OpenMP kernels on CPU); "
          "compile time is the first call, with an empty inductor cache", compiles=True)
def torch_compile(ctx: Context):
    import torch

    # A cache of this cell's own: a warm cache from an earlier run would hide the compile time.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(ctx.scratch / "inductor")
    compiled = torch.compile(_native(ctx, "torch.compile"), backend="inductor", dynamic=False)
    run = _torch_call(compiled, ctx)
    run()  # inductor compiles on the first call
    return run


@baseline("torchscript", "torch", "TorchScript: torch.jit.trace + torch.jit.freeze", compiles=True)
def torchscript(ctx: Context):
    import torch

    module = _native(ctx, "TorchScript")
    args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in ctx.inputs)
    with torch.no_grad():
        traced = torch.jit.trace(module, args, check_trace=False, strict=False)
        try:
            traced = torch.jit.freeze(traced)
        except Exception:  # freezing is an optimisation; the traced module still runs
            pass
    run = _torch_call(traced, ctx)
    run()  # the profiling executor specialises on the first calls
    return run


# ONNX Runtime ------------------------------------------------------------------------------------

def ort_session(path: Path, threads: int, spinning: bool = True):
    """An ONNX Runtime CPU session with all graph optimisations and `threads` intra-op threads. `spinning` False:
    its idle workers sleep after each run instead of spinning, for timing it beside other engines in one process
    (spinning, they took the cores of the engine timed next)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@baseline("ort", ONNX_EXPORT, "ONNX Runtime (CPU provider, all graph optimisations) on mlc's ONNX export",
          compiles=True)
def onnxruntime(ctx: Context):
    session = ort_session(ctx.onnx_path, ctx.threads, ctx.spinning)
    feeds = dict(zip(ctx.input_names, ctx.inputs))
    wanted = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in wanted}
    return lambda: session.run(None, feeds)


# int8 baselines -----------------------------------------------------------------------------------

def calibration_feeds(ctx: Context) -> list[dict[str, np.ndarray]]:
    """The inputs int8 baselines calibrate on: ctx.calibration, else the seeded inputs `mlc compile --quantize int8`
    calibrates on without --calibration (the same function, seeds and shapes), so every engine sees the same data."""
    if ctx.calibration is not None:
        return ctx.calibration
    from mlc.frontends import onnx as onnx_frontend
    from mlc.pipeline.prepare import calibration_inputs

    specs = onnx_frontend.input_specs(onnx_frontend.load_graph(ctx.onnx_path))
    feeds, _ = calibration_inputs(specs, dict(zip(ctx.input_names, ctx.inputs)), (), "int8")
    return feeds


def ort_int8_model(path: Path, calibration: list[dict[str, np.ndarray]], folder: Path) -> Path:
    """ONNX Runtime's own static int8 of `path` (QDQ, per-channel int8 weights, uint8 activations, MinMax), on the
    nodes mlc's --quantize int8 quantises, calibrated on `calibration`; the quantised model's path."""
    import logging

    import onnx
    from onnxruntime import quantization as q

    from mlc.passes import quantize

    logging.getLogger().setLevel(logging.ERROR)  # its "consider pre-processing" advice, twice per model
    model = onnx.load(str(path))
    folder.mkdir(parents=True, exist_ok=True)
    old_opset = quantize.opset(model) < 13
    if old_opset:  # per-channel QDQ (DequantizeLinear's axis) is opset 13's: ORT wrote invalid opset-9 models
        from onnx import version_converter

        model = version_converter.convert_version(model, 13)
    if old_opset or not all(n.name for n in model.graph.node):  # nodes_to_quantize needs names
        for k, node in enumerate(model.graph.node):
            node.name = node.name or f"mlc_node_{k}"
        path = folder / "named.onnx"
        onnx.save(model, str(path))
    nodes = [c.node.name for c in quantize.candidates(model, "int8")[0]]
    if not nodes:  # an empty nodes_to_quantize would make ORT quantise every node
        raise Unavailable("mlc's --quantize int8 quantises no node of this model (no MatMul, Gemm or Conv to compare)")
    batches = iter(calibration)

    class Reader(q.CalibrationDataReader):
        def get_next(self):
            return next(batches, None)

    out = folder / "model.ort-int8.onnx"
    q.quantize_static(str(path), str(out), Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8, nodes_to_quantize=nodes,
                      op_types_to_quantize=["MatMul", "Gemm", "Conv"])
    return out


@baseline("ort-int8", ONNX_EXPORT, "ONNX Runtime's static int8 (quantize_static: QDQ, per-channel int8 weights, uint8 "
          "activations) of mlc's ONNX export, on the nodes and calibration inputs mlc's --quantize int8 uses",
          compiles=True)
def onnxruntime_int8(ctx: Context):
    quantized = ort_int8_model(ctx.onnx_path, calibration_feeds(ctx), ctx.scratch / "ort-int8")
    session = ort_session(quantized, ctx.threads, ctx.spinning)
    wanted = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in zip(ctx.input_names, ctx.inputs) if k in wanted}
    run = lambda: session.run(None, feeds)  # noqa: E731
    run.precision = "int8"  # judged by the int8 gate, as mlc's int8 builds are
    return run


# OpenVINO ----------------------------------------------------------------------------------------

def _ov():
    try:
        import openvino as ov
    except ImportError:
        raise Unavailable("openvino is not installed: pip install 'mlc[bench]'") from None
    return ov


def openvino_model(model, threads: int, precision: Optional[str] = "f32", hint: str = "LATENCY"):
    """An OpenVINO CPU model (`model`: an ONNX path or an openvino.Model) compiled with `threads` threads and the
    LATENCY or THROUGHPUT performance hint, and the inference precision it runs at. precision None keeps OpenVINO's
    default, which is bf16 on CPUs with avx512_bf16 or AMX."""
    ov = _ov()
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": hint}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = ov.Core().compile_model(model if isinstance(model, ov.Model) else str(model), "CPU", config)
    return compiled, compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # "f32", "bf16"


def nncf_int8_model(path: Path, calibration: list[dict[str, np.ndarray]]):
    """NNCF's post-training int8 (nncf.quantize, its default preset) of the OpenVINO model read from `path`,
    calibrated on `calibration`: the openvino.Model with FakeQuantize nodes the CPU plugin runs as int8."""
    ov = _ov()
    try:
        import nncf
    except ImportError:
        raise Unavailable("nncf is not installed: pip install 'mlc[bench]' (or pip install nncf==3.4.0)") from None
    import logging

    nncf.set_log_level(logging.ERROR)
    model = ov.Core().read_model(str(path))
    names = [port.get_any_name() for port in model.inputs]
    data = nncf.Dataset([{n: feeds[n] for n in names} for feeds in calibration])
    return nncf.quantize(model, data, subset_size=len(calibration))


def runtime_precisions(compiled) -> dict[str, int]:
    """How many of the compiled model's executed layers run at each precision (its runtime graph), e.g. {"u8": 5}."""
    counts: dict[str, int] = {}
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) not in ("Const", "Input", "Output"):
            precision = info["runtimePrecision"].astype(str)
            counts[precision] = counts.get(precision, 0) + 1
    return counts


def _openvino(ctx: Context, precision: Optional[str], model=None):
    compiled, ran_at = openvino_model(ctx.onnx_path if model is None else model, ctx.threads, precision)
    request = compiled.create_infer_request()
    wanted = {name for port in compiled.inputs for name in port.get_names()}
    feeds = {k: v for k, v in zip(ctx.input_names, ctx.inputs) if k in wanted}

    def run() -> list[np.ndarray]:
        results = request.infer(feeds)
        return [np.asarray(results[port]) for port in compiled.outputs]

    run.precision = ran_at  # what the cell records: OpenVINO picks bf16 by itself where the CPU has it
    run.compiled = compiled
    return run


@baseline("openvino", ONNX_EXPORT, "OpenVINO CPU plugin at fp32 (INFERENCE_PRECISION_HINT f32, latency hint) on "
          "mlc's ONNX export", compiles=True)
def openvino_fp32(ctx: Context):
    return _openvino(ctx, "f32")


@baseline("openvino-default", ONNX_EXPORT, "OpenVINO CPU plugin at its default precision (bf16 on CPUs with "
          "avx512_bf16 or AMX; the cell records which) on mlc's ONNX export", compiles=True)
def openvino_default(ctx: Context):
    return _openvino(ctx, None)


@baseline("openvino-int8", ONNX_EXPORT, "OpenVINO CPU plugin on NNCF's post-training int8 (nncf.quantize) of mlc's "
          "ONNX export, calibrated on the inputs mlc's --quantize int8 uses; f32 where not quantised, latency hint",
          compiles=True)
def openvino_int8(ctx: Context):
    run = _openvino(ctx, "f32", nncf_int8_model(ctx.onnx_path, calibration_feeds(ctx)))
    run.precision = "int8"  # judged by the int8 gate, as mlc's int8 builds are
    return run


@baseline("openvino-throughput", ONNX_EXPORT, "OpenVINO CPU plugin at fp32 with the THROUGHPUT hint: its optimal "
          "number of infer requests in flight on an AsyncInferQueue; records samples/s (batch x requests per call), "
          "not latency", compiles=True)
def openvino_throughput(ctx: Context):
    ov = _ov()
    compiled, ran_at = openvino_model(ctx.onnx_path, ctx.threads, "f32", hint="THROUGHPUT")
    requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    queue = ov.AsyncInferQueue(compiled, requests)
    wanted = {name for port in compiled.inputs for name in port.get_names()}
    feeds = {k: v for k, v in zip(ctx.input_names, ctx.inputs) if k in wanted}
    outputs = len(compiled.outputs)

    # No Python callback: one runs on OpenVINO's threads, and a CI worker aborted there once ("terminate called
    # after throwing std::system_error: Resource deadlock avoided"). Every request ran the same feeds, so the
    # first request's outputs are the ones to check.
    def run() -> list[np.ndarray]:
        for _ in range(requests):
            queue.start_async(feeds)
        queue.wait_all()
        return [np.array(queue[0].get_output_tensor(i).data) for i in range(outputs)]

    run.precision = ran_at
    run.batches_per_call = requests
    run.streams = int(compiled.get_property("NUM_STREAMS"))
    return run


# TensorFlow --------------------------------------------------------------------------------------

def _tf_outputs(value) -> list[np.ndarray]:
    import tensorflow as tf

    return [np.asarray(t) for t in tf.nest.flatten(value)]


@baseline("tf", "tensorflow", "TensorFlow eager")
def tf_eager(ctx: Context):
    if ctx.model is not None and ctx.model.native is None:
        return lambda: ctx.model.eager(ctx.inputs)  # the builder's own eager call
    import tensorflow as tf

    module = _native(ctx, "TensorFlow eager")
    args = [tf.constant(a) for a in ctx.inputs]
    return lambda: _tf_outputs(module(*args))


@baseline("tf-graph", "tensorflow", "TensorFlow graph: tf.function (autograph), traced on the first call",
          compiles=True)
def tf_graph(ctx: Context):
    import tensorflow as tf

    module = _native(ctx, "tf.function")
    args = [tf.constant(a) for a in ctx.inputs]
    graph = tf.function(module, input_signature=[tf.TensorSpec(a.shape, a.dtype) for a in args])
    run = lambda: _tf_outputs(graph(*args))  # noqa: E731
    run()
    return run


# PaddlePaddle ------------------------------------------------------------------------------------

@baseline("paddle", "paddle", "PaddlePaddle dynamic graph (eager)")
def paddle_eager(ctx: Context):
    if ctx.model is not None and ctx.model.native is None:
        return lambda: ctx.model.eager(ctx.inputs)
    import paddle

    module = _native(ctx, "Paddle eager")
    args = [paddle.to_tensor(a) for a in ctx.inputs]

    def run() -> list[np.ndarray]:
        with paddle.no_grad():
            return [np.asarray(t) for t in paddle.utils.flatten(module(*args))]

    return run


@baseline("paddle-static", "paddle", "PaddlePaddle static graph: paddle.jit.to_static, saved and run by the "
          "Paddle Inference predictor (its IR fusion passes, CPU math threads set)", compiles=True)
def paddle_static(ctx: Context):
    import paddle
    import paddle.inference as inference

    module = _native(ctx, "paddle.jit.to_static")
    specs = [paddle.static.InputSpec(list(a.shape), str(a.dtype), name=n) for n, a in zip(ctx.input_names, ctx.inputs)]
    prefix = ctx.scratch / "paddle-static" / "model"
    paddle.jit.save(paddle.jit.to_static(module, input_spec=specs), str(prefix))
    program = next(p for p in (prefix.with_suffix(".json"), prefix.with_suffix(".pdmodel")) if p.exists())
    config = inference.Config(str(program), str(prefix.with_suffix(".pdiparams")))
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(ctx.threads)
    config.switch_ir_optim(True)
    predictor = inference.create_predictor(config)
    for name, array in zip(predictor.get_input_names(), ctx.inputs):
        predictor.get_input_handle(name).copy_from_cpu(array)
    outputs = [predictor.get_output_handle(n) for n in predictor.get_output_names()]

    def run() -> list[np.ndarray]:
        predictor.run()
        return [o.copy_to_cpu() for o in outputs]

    run()
    return run
