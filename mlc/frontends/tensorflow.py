"""TensorFlow/Keras frontend: a SavedModel directory, a .keras or a .h5 file, converted with tf2onnx.

tf2onnx's `from_keras` breaks on Keras 3, so every model goes through a tf.function whose
input_signature carries None exactly for the dynamic dims. Runs only in the frontend worker process."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from mlc.frontends.base import FrameworkModel, InputDecl
from mlc.frontends.onnx_export import OPSET, example_sizes_for, finalize, trace_shape
from mlc.errors import InputError, MissingDependencyError, UnsupportedModelError

KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
INSTALL = "pip install 'mlc[tf]'"


def detect(path: str) -> bool:
    """A SavedModel directory or a Keras file, judged by name and layout (imports nothing)."""
    p = Path(path)
    if p.is_dir():
        return any((p / name).is_file() for name in SAVED_MODEL_FILES)
    return p.suffix.lower() in KERAS_SUFFIXES


def import_tensorflow():
    # Quiet before the import: TF logs from C++ at import time.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # also makes eager results reproducible
    try:
        import tensorflow as tf
    except ImportError:
        raise MissingDependencyError(f"TensorFlow is not installed; install it with: {INSTALL}") from None
    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    return tf


def _first_line(e: BaseException, limit: int = 300) -> str:
    """The first line of an error, a long one cut after its last whole sentence (else word) that fits."""
    line = (str(e).strip() or type(e).__name__).splitlines()[0]
    if len(line) <= limit:
        return line
    cut = line[:limit]
    end = cut.rfind(". ")
    return cut[:end + 1] if end > 0 else cut[:cut.rfind(" ")] + " ..."


def open_model(path: str) -> FrameworkModel:
    p = Path(path)
    if not p.exists():
        raise InputError(f"model not found: {p}")
    if p.is_dir():
        if not detect(str(p)):
            raise InputError(f"{p} is a directory without saved_model.pb; pass a TensorFlow SavedModel "
                             "directory (model.export(dir) or tf.saved_model.save)")
        return _open_saved_model(p)
    if p.suffix.lower() not in KERAS_SUFFIXES:
        raise InputError(f"{p} is not a TensorFlow model; pass a SavedModel directory, a .keras or a .h5 file")
    return _open_keras_file(p)


def _open_keras_file(path: Path) -> FrameworkModel:
    if path.suffix.lower() == ".keras" and not zipfile.is_zipfile(path):  # Keras would say "file not found"
        raise InputError(f"{path} is not a Keras archive (a .keras file is a zip); save it again with "
                         "model.save('model.keras')")
    import_tensorflow()
    import keras

    try:
        model = keras.models.load_model(str(path), compile=False)
    except Exception as e:  # keras raises ValueError, OSError, zipfile and h5py errors alike
        reason = _first_line(e)
        if re.search(r"custom|Could not locate|Lambda|deserializ", reason):
            # Custom layers need their Python code, and Lambda layers unsafe deserialization: a
            # SavedModel carries the traced graph instead.
            raise UnsupportedModelError(f"{path} needs Python code mlc does not have ({reason}); export a "
                                        "SavedModel with model.export('saved_dir') and pass that directory") from None
        raise InputError(f"cannot load {path} as a Keras model ({reason}); save it again with "
                         "model.save('model.keras')") from None
    return from_keras(model)


def from_keras(model, inputs: Optional[list[InputDecl]] = None,
               example_sizes: Optional[dict[str, int]] = None) -> FrameworkModel:
    """A Keras model, eager = the model called with training=False. Without `inputs`, they come from
    the model's own Input layers (None dims symbolic)."""
    if inputs is None:
        if not getattr(model, "inputs", None):
            raise UnsupportedModelError("the Keras model has no defined inputs (a subclassed model never called?); "
                                        "save a functional or Sequential model, or a SavedModel")
        inputs = [_decl(t.name, t.dtype, t.shape) for t in model.inputs]
    names = list(getattr(model, "output_names", None) or [])
    single = len(inputs) == 1

    def call(*args):
        return model(args[0] if single else list(args), training=False)

    return _framework_model(call, inputs, example_sizes, names, _weights_as_inputs(model, single))


# tf2onnx holds ~25 copies of the weights it freezes into the graph (TF's frozen functions, grappler's graph, its
# own graph and the copies each optimizer rolls back to): a Keras model of 285 MB of weights peaked at 8 GB, VGG16
# (550 MB) past 10 GiB. Above this size the weights go in as graph inputs instead, and become initializers after.
WEIGHTS_AS_INPUTS_BYTES = 192 << 20


@dataclass(frozen=True)
class _WeightsAsInputs:
    """A Keras 3 model called with its variables' values as arguments after the data (`stateless_call`)."""

    call: Callable
    values: list[np.ndarray]


def _weights_as_inputs(model, single: bool) -> Optional[_WeightsAsInputs]:
    trainable, rest = list(model.trainable_variables), list(model.non_trainable_variables)
    tf = import_tensorflow()
    size = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in trainable + rest)
    if not hasattr(model, "stateless_call") or size < WEIGHTS_AS_INPUTS_BYTES:
        return None  # (before copying the values: every Keras model comes through here)
    values = [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in trainable + rest]

    def call(*args):
        data, weights = args[:len(args) - len(values)], list(args[len(args) - len(values):])
        outputs, _ = model.stateless_call(weights[:len(trainable)], weights[len(trainable):],
                                          data[0] if single else list(data), training=False)
        return outputs

    return _WeightsAsInputs(call, values)


def _open_saved_model(path: Path) -> FrameworkModel:
    tf = import_tensorflow()
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as e:  # corrupt protobufs and missing variables surface as many exception types
        raise InputError(f"cannot load the SavedModel in {path} ({_first_line(e)}); export it again") from None
    signatures = dict(loaded.signatures)
    if not signatures:
        raise UnsupportedModelError(f"the SavedModel in {path} has no serving signature; save it with "
                                    "model.export(dir) or tf.saved_model.save(obj, dir, signatures=...)")
    key = "serving_default" if "serving_default" in signatures else next(iter(signatures))
    signature = signatures[key]
    args, kwargs = signature.structured_input_signature
    if args:
        raise UnsupportedModelError("the SavedModel's signature takes positional inputs; mlc needs named ones")
    names = list(kwargs)
    inputs = [_decl(name, kwargs[name].dtype, kwargs[name].shape) for name in names]
    output_names = sorted(signature.structured_outputs)  # the order tf.nest flattens a dict in

    def call(*values):
        outputs = loaded.signatures[key](**dict(zip(names, values)))  # keeps `loaded` alive
        return [outputs[name] for name in output_names]

    model = _framework_model(call, inputs, None, output_names)
    if key != "serving_default":  # the default needs no word; another one is worth knowing
        model.notes.append(f"the SavedModel has no 'serving_default' signature: compiled its signature '{key}'")
    return model


def _decl(name: str, dtype, shape) -> InputDecl:
    tf = import_tensorflow()
    dims: list[int | str] = []
    for axis, size in enumerate(list(shape)):
        if size is None or size < 0:
            dims.append("batch" if axis == 0 else f"{name}_dim{axis}")
        else:
            dims.append(int(size))
    return InputDecl(name, np.dtype(tf.as_dtype(dtype).as_numpy_dtype).name, dims)


def _captured_constants(tf, concrete) -> dict[str, np.ndarray]:
    """{placeholder name: value} of the tensors a traced function captures by value (Keras Normalization's mean
    and variance): tf2onnx makes them graph inputs. Variables (resource handles) it freezes itself."""
    captured = list(concrete.captured_inputs)
    placeholders = concrete.inputs[len(concrete.inputs) - len(captured):] if captured else []
    return {p.name: c.numpy() for p, c in zip(placeholders, captured)
            if c.dtype != tf.resource and hasattr(c, "numpy")}


def _register_erfc(tf2onnx) -> None:
    """tf2onnx has no handler for TF's Erfc, which exact GELU lowers to (tf.nn.gelu: 0.5 x erfc(-x/sqrt 2); Keras
    ConvNeXt's Activation("gelu")): erfc(x) = 1 - erf(x)."""
    from tf2onnx import constants, utils
    from tf2onnx.handler import tf_op

    if any("Erfc" in handlers for handlers in tf_op.get_opsets().get(constants.ONNX_DOMAIN, [])):
        return

    @tf_op("Erfc")
    class Erfc:  # noqa: F841 (the decorator registers it)
        @classmethod
        def version_9(cls, ctx, node, **kwargs):
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
            erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name)
            node.type = "Sub"
            ctx.replace_inputs(node, [one.output[0], erf.output[0]])


@contextlib.contextmanager
def _tf2onnx_conversion(tf, tf2onnx):
    """What tf2onnx needs to convert Keras 3 models, for the length of one conversion:

    - Keras runs a grouped convolution (ConvNeXt's depthwise Conv2D(groups=C)) as a nested tf.function with
      jit_compile=True, since TF's CPU kernels lack it; tf2onnx keeps that call as an opaque
      StatefulPartitionedCall. While tracing for the export it is traced inline (one Conv2D op, which tf2onnx
      converts to a Conv with `group`); the eager reference still runs Keras's own code.
    - tf2onnx deep-copies the whole graph, weights included, before each of its ~12 optimizers and iterations;
      the copies form reference cycles that stay in memory until Python's cyclic collector runs: ResNet50 peaked at
      7.4 GiB, VGG16 past 10 GiB. Collecting before each optimizer keeps one copy at a time (ResNet50: 2.8 GiB)."""
    import gc

    from tf2onnx import optimizer

    _register_erfc(tf2onnx)
    optimizers = optimizer._get_optimizers()

    def collected(factory):
        def make():
            gc.collect()
            return factory()
        return make

    try:
        from keras.src.backend.tensorflow import nn as keras_nn
    except ImportError:  # another Keras: its convolutions are its own
        keras_nn = None
    original_conv = keras_nn.conv if keras_nn is not None else None

    def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
        layout = keras_nn.backend.standardize_data_format(data_format)
        channels = inputs.shape[-1] if layout == "channels_last" else inputs.shape[1]
        if len(inputs.shape) == 5 or channels == kernel.shape[-2]:
            return original_conv(inputs, kernel, strides, padding, data_format, dilation_rate)
        return tf.nn.convolution(inputs, kernel, strides, padding.upper(),
                                 data_format=keras_nn._convert_data_format(layout, len(inputs.shape)),
                                 dilations=dilation_rate)

    optimizer._get_optimizers = lambda: type(optimizers)((k, collected(v)) for k, v in optimizers.items())
    if keras_nn is not None:
        keras_nn.conv = conv
    try:
        yield
    finally:
        optimizer._get_optimizers = lambda: optimizers
        if keras_nn is not None:
            keras_nn.conv = original_conv
        gc.collect()


def _framework_model(call: Callable, inputs: list[InputDecl], example_sizes: Optional[dict[str, int]],
                     output_names: Sequence[str], weights: Optional[_WeightsAsInputs] = None) -> FrameworkModel:
    tf = import_tensorflow()
    sizes = example_sizes_for(inputs, example_sizes)

    def export(onnx_path: Path, dynamic: set[str]) -> str:
        try:
            import tf2onnx
        except ImportError:
            raise MissingDependencyError(f"tf2onnx is not installed; install it with: {INSTALL}") from None
        logging.getLogger("tf2onnx").setLevel(logging.ERROR)
        signature = [
            tf.TensorSpec(trace_shape(decl, dynamic, sizes), tf.as_dtype(decl.dtype), name=decl.name) for decl in inputs
        ]
        values = weights.values if weights is not None else []
        signature += [tf.TensorSpec(v.shape, v.dtype, name=f"mlc_weight_{i}") for i, v in enumerate(values)]
        traced = weights.call if weights is not None else call
        function = tf.function(lambda *args: traced(*args), input_signature=signature)
        try:
            with _tf2onnx_conversion(tf, tf2onnx):
                tf2onnx.convert.from_function(function, input_signature=signature, opset=OPSET,
                                              output_path=str(onnx_path))
        except Exception as e:  # tf2onnx raises bare exceptions for unconvertible ops
            raise UnsupportedModelError(f"tf2onnx cannot convert the model: {_first_line(e)}") from None
        # tf2onnx traced the same (cached) concrete function: its captured values are the extra graph inputs.
        constants = _captured_constants(tf, function.get_concrete_function(*signature))
        constants.update({f"mlc_weight_{i}": v for i, v in enumerate(values)})
        finalize(Path(onnx_path), inputs, dynamic, sizes, output_names, constants)
        how = ", the weights as inputs, then initializers" if values else ""
        return f"tf2onnx {tf2onnx.__version__} (tf.function{how}, opset {OPSET})"

    def eager(values: list[np.ndarray]) -> list[np.ndarray]:
        tensors = [tf.constant(np.asarray(v, dtype=decl.dtype)) for v, decl in zip(values, inputs)]
        return [np.asarray(t) for t in tf.nest.flatten(call(*tensors))]

    return FrameworkModel("tensorflow", inputs, sizes, export, eager, native=call)
