"""Frontends: a framework model (torch, TensorFlow, Paddle) to ONNX plus its eager reference, in a child process per
framework (convert.py, worker.py); ONNX loading, input specs and ONNX Runtime references (onnx.py)."""

from mlc.frontends.base import FRAMEWORKS, ONNX, detect, framework_names, resolve_framework
from mlc.frontends.convert import Converted, check_exporter, convert, parse_dynamic

__all__ = ["FRAMEWORKS", "ONNX", "Converted", "check_exporter", "convert", "detect", "framework_names",
           "parse_dynamic", "resolve_framework"]
