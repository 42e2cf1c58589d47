"""PaddlePaddle frontend: a `paddle.jit.save` prefix (PREFIX.json or PREFIX.pdmodel, plus
PREFIX.pdiparams), converted with paddle2onnx. Runs only in the frontend worker process."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from mlc.frontends.base import FrameworkModel, InputDecl
from mlc.frontends.onnx_export import OPSET, example_sizes_for, finalize, trace_shape, unnamed_outputs
from mlc.errors import InputError, MissingDependencyError, UnsupportedModelError

MODEL_SUFFIXES = (".json", ".pdmodel")  # PIR programs (Paddle 3) and the legacy format
PARAMS_SUFFIX = ".pdiparams"
INSTALL = "pip install 'mlc[paddle]'"


def _files(path: str) -> tuple[Path, Optional[Path], Path]:
    """(prefix, model file or None, params file) for a prefix or any of its files."""
    p = Path(path)
    prefix = p.with_suffix("") if p.suffix.lower() in (*MODEL_SUFFIXES, PARAMS_SUFFIX) else p
    model = next((f for f in (prefix.with_name(prefix.name + s) for s in MODEL_SUFFIXES) if f.is_file()), None)
    return prefix, model, prefix.with_name(prefix.name + PARAMS_SUFFIX)


def detect(path: str) -> bool:
    """A jit.save prefix or one of its files (imports nothing). A .json alone is not enough: it
    takes the .pdiparams beside it to tell a Paddle program from any JSON file."""
    if Path(path).is_dir():
        return False
    _, model, params = _files(path)
    return model is not None and (model.suffix == ".pdmodel" or params.is_file())


def import_paddle():
    os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ INFO lines
    # paddle2onnx's polygraphy pass pip-installs packages at run time when this is set: never.
    os.environ["POLYGRAPHY_AUTOINSTALL_DEPS"] = "0"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "No ccache found" at import
            import paddle
    except ImportError:
        raise MissingDependencyError(f"PaddlePaddle is not installed; install it with: {INSTALL}") from None
    return paddle


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]


def open_model(path: str) -> FrameworkModel:
    prefix, model_file, params = _files(path)
    if model_file is None:
        raise InputError(f"no Paddle model at {prefix}: expected {prefix}.json (or .pdmodel) and "
                         f"{prefix}.pdiparams, as paddle.jit.save(layer, '{prefix}') writes them")
    paddle = import_paddle()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if model_file.suffix == ".pdmodel":
                specs, run = _load_legacy(paddle, prefix)
            else:
                specs, run = _load_jit(paddle, prefix)
    except Exception as e:  # corrupt programs and parameters raise many exception types
        raise InputError(f"cannot load the Paddle model {prefix} ({_first_line(e)}); save it again with "
                         "paddle.jit.save") from None
    # Only the dims the InputSpec leaves open (None, -1) are symbolic: a declared size may be baked into the
    # program (shufflenet's channel-shuffle reshape holds the saved batch of 1).
    inputs = [InputDecl(name, _dtype_name(dtype), [("batch" if axis == 0 else f"{name}_dim{axis}")
                                                   if d is None or d < 0 else int(d) for axis, d in enumerate(shape)])
              for name, shape, dtype in specs]

    def convert(onnx_path: Path, dynamic: set[str]) -> None:
        _convert(model_file, params, onnx_path)

    return _framework_model(run, inputs, None, convert, None)


def _load_jit(paddle, prefix: Path):
    """A PIR program (PREFIX.json): paddle.jit.load runs it in dygraph mode."""
    layer = paddle.jit.load(str(prefix))
    return [(s.name, list(s.shape), s.dtype) for s in layer._input_spec()], _layer_runner(paddle, layer)


def _load_legacy(paddle, prefix: Path):
    """A legacy program (PREFIX.pdmodel): Paddle 3 runs it only in static mode under the old IR."""
    executor = paddle.static.Executor(paddle.CPUPlace())
    with _static_old_ir(paddle):
        program, feeds, fetches = paddle.static.load_inference_model(str(prefix), executor)
        block = program.global_block()
        specs = [(name, list(block.var(name).shape), block.var(name).dtype) for name in feeds]

    def run(values: list[np.ndarray]) -> list:
        with _static_old_ir(paddle):
            return executor.run(program, feed=dict(zip(feeds, values)), fetch_list=fetches)

    return specs, run


@contextlib.contextmanager
def _static_old_ir(paddle):
    paddle.enable_static()
    try:
        with paddle.pir_utils.OldIrGuard():
            yield
    finally:
        paddle.disable_static()


def from_layer(layer, inputs: list[InputDecl], example_sizes: Optional[dict[str, int]] = None,
               output_names: Optional[list[str]] = None) -> FrameworkModel:
    """A dygraph Layer (eager = the Layer itself), exported through paddle.jit.save. Its forward
    must name its first argument `self` (jit.save's dy2static requires it)."""
    paddle = import_paddle()
    layer.eval()
    sizes = example_sizes_for(inputs, example_sizes)

    def convert(onnx_path: Path, dynamic: set[str]) -> None:
        spec = [paddle.static.InputSpec(trace_shape(decl, dynamic, sizes), decl.dtype, decl.name) for decl in inputs]
        with tempfile.TemporaryDirectory(prefix="mlc-paddle-") as tmp:
            prefix = Path(tmp) / "model"
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    paddle.jit.save(layer, str(prefix), input_spec=spec)
            except Exception as e:
                raise UnsupportedModelError(f"paddle.jit.save cannot trace the model: {_first_line(e)}") from None
            _, model_file, params = _files(str(prefix))
            _convert(model_file, params, onnx_path)

    model = _framework_model(_layer_runner(paddle, layer), inputs, sizes, convert, output_names)
    model.native = layer  # benchmarks compile it (paddle.jit.to_static)
    return model


def _layer_runner(paddle, layer) -> Callable[[list[np.ndarray]], list]:
    def run(values: list[np.ndarray]) -> list:
        with paddle.no_grad():
            return [t.numpy() for t in _flatten(layer(*[paddle.to_tensor(v) for v in values]))]

    return run


def _convert(model_file: Path, params: Path, onnx_path: Path) -> None:
    try:
        import paddle2onnx
    except ImportError:
        raise MissingDependencyError(f"paddle2onnx is not installed; install it with: {INSTALL}") from None
    Path(onnx_path).unlink(missing_ok=True)
    log = io.StringIO()
    try:
        # paddle2onnx prints its log and calls sys.exit() on a failed conversion. optimize_tool
        # "None": its default, polygraphy, may pip-install packages at run time.
        with contextlib.redirect_stdout(log), _native_stdout_to_stderr():
            paddle2onnx.export(str(model_file), str(params) if params.is_file() else "", str(onnx_path),
                               opset_version=OPSET, optimize_tool="None", verbose=False)
    except (Exception, SystemExit) as e:
        errors = [m.group(1) for m in re.finditer(r"\[ERROR\]\s*(.+)", log.getvalue())]
        reason = errors[0] if errors else _first_line(e)
        raise UnsupportedModelError(f"paddle2onnx cannot convert {model_file.name}: {reason[:300]}") from None
    if not Path(onnx_path).is_file():
        raise UnsupportedModelError(f"paddle2onnx wrote no ONNX file for {model_file.name}")


@contextlib.contextmanager
def _native_stdout_to_stderr():
    """paddle2onnx's C++ part prints progress to fd 1, which may carry the worker's results."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _count_outputs(onnx_path: Path) -> int:
    import onnx

    return len(onnx.load(str(onnx_path), load_external_data=False).graph.output)


def _dtype_name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]  # paddle.int64 -> int64


def _flatten(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for key in value for leaf in _flatten(value[key])]
    return [value]


def _framework_model(run: Callable[[list[np.ndarray]], list], inputs: list[InputDecl],
                     example_sizes: Optional[dict[str, int]], convert: Callable[[Path, set[str]], None],
                     output_names: Optional[list[str]]) -> FrameworkModel:
    """`run`: the framework on numpy inputs of the declared dtypes, outputs flattened."""
    sizes = example_sizes_for(inputs, example_sizes)

    def export(onnx_path: Path, dynamic: set[str]) -> str:
        import paddle2onnx

        convert(Path(onnx_path), dynamic)
        # A saved program names its outputs fetch_name_0, ...: named as torch's bare tensors are instead.
        finalize(Path(onnx_path), inputs, dynamic, sizes, output_names or unnamed_outputs(_count_outputs(onnx_path)))
        return f"paddle2onnx {paddle2onnx.__version__} (opset {OPSET})"

    def eager(values: list[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(out) for out in run([np.asarray(v, dtype=d.dtype) for v, d in zip(values, inputs)])]

    return FrameworkModel("paddle", inputs, sizes, export, eager)
