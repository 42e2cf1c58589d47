"""PaddlePaddle frontend: a `paddle.jit.save` prefix (PREFIX.json or PREFIX.pdmodel, plus
PREFIX.pdiparams), converted with paddle2onnx. Runs only in the frontend worker process."""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from mlc.compiler.frontends.base import FrameworkModel, InputDecl
from mlc.compiler.frontends.onnx_export import OPSET, example_sizes_for, finalize, trace_shape
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


def _paddle():
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
    paddle = _paddle()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            layer = paddle.jit.load(str(prefix))
            specs = layer._input_spec()
    except Exception as e:  # corrupt programs and parameters raise many exception types
        raise InputError(f"cannot load the Paddle model {prefix} ({_first_line(e)}); save it again with "
                         "paddle.jit.save") from None
    inputs = []
    for spec in specs:
        dims: list[int | str] = ["batch" if axis == 0 else f"{spec.name}_dim{axis}" if d is None or d < 0 else int(d)
                                 for axis, d in enumerate(spec.shape)]
        inputs.append(InputDecl(spec.name, _dtype_name(spec.dtype), dims))

    def convert(onnx_path: Path, dynamic: set[str]) -> None:
        _convert(model_file, params, onnx_path)

    return _framework_model(layer, inputs, None, convert, None)


def from_layer(layer, inputs: list[InputDecl], example_sizes: Optional[dict[str, int]] = None,
               output_names: Optional[list[str]] = None) -> FrameworkModel:
    """A dygraph Layer (eager = the Layer itself), exported through paddle.jit.save. Its forward
    must name its first argument `self` (jit.save's dy2static requires it)."""
    paddle = _paddle()
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

    return _framework_model(layer, inputs, sizes, convert, output_names)


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
        with contextlib.redirect_stdout(log):
            paddle2onnx.export(str(model_file), str(params) if params.is_file() else "", str(onnx_path),
                               opset_version=OPSET, optimize_tool="None", verbose=False)
    except (Exception, SystemExit) as e:
        errors = [m.group(1) for m in re.finditer(r"\[ERROR\]\s*(.+)", log.getvalue())]
        reason = errors[0] if errors else _first_line(e)
        raise UnsupportedModelError(f"paddle2onnx cannot convert {model_file.name}: {reason[:300]}") from None
    if not Path(onnx_path).is_file():
        raise UnsupportedModelError(f"paddle2onnx wrote no ONNX file for {model_file.name}")


def _dtype_name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]  # paddle.int64 -> int64


def _flatten(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for key in value for leaf in _flatten(value[key])]
    return [value]


def _framework_model(layer, inputs: list[InputDecl], example_sizes: Optional[dict[str, int]],
                     convert: Callable[[Path, set[str]], None], output_names: Optional[list[str]]) -> FrameworkModel:
    paddle = _paddle()
    sizes = example_sizes_for(inputs, example_sizes)

    def export(onnx_path: Path, dynamic: set[str]) -> str:
        import paddle2onnx

        convert(Path(onnx_path), dynamic)
        finalize(Path(onnx_path), inputs, dynamic, sizes, output_names)
        return f"paddle2onnx {paddle2onnx.__version__} (opset {OPSET})"

    def eager(values: list[np.ndarray]) -> list[np.ndarray]:
        tensors = [paddle.to_tensor(np.asarray(v, dtype=decl.dtype)) for v, decl in zip(values, inputs)]
        with paddle.no_grad():
            outputs = layer(*tensors)
        return [np.asarray(t.numpy()) for t in _flatten(outputs)]

    return FrameworkModel("paddle", inputs, sizes, export, eager)
