"""Frontends: a framework model (torch, TensorFlow, Paddle) to ONNX plus its eager calls, run inside the conversion
worker (mlc.pipeline.convert_worker); ONNX loading, input specs and ONNX Runtime references (onnx.py)."""

from mlc.frontends.base import FRAMEWORKS, ONNX, detect, framework_names, resolve_framework
from mlc.frontends.options import check_exporter, parse_dynamic

__all__ = ["FRAMEWORKS", "ONNX", "check_exporter", "detect", "framework_names", "parse_dynamic", "resolve_framework"]
