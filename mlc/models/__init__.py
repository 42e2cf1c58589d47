"""The built-in model zoo: models built in code with seeded random weights, never downloaded.
Listed by `mlc models`; compiled as `mlc compile zoo:NAME`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

import onnx

from mlc.errors import InputError
from mlc.models import onnx_graphs

ZOO_PREFIX = "zoo:"


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    build: Callable[[], onnx.ModelProto]
    framework: str = "onnx"


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("mlp", "3-layer perceptron, 64 -> 128 -> 64 -> 10, dynamic batch", onnx_graphs.mlp),
        ZooModel("cnn", "small CNN on 3x32x32 images (2 conv + pool + linear), dynamic batch", onnx_graphs.cnn),
        ZooModel(
            "transformer",
            "BERT-like encoder: 2 layers, hidden 64, 4 heads, vocab 1000, seq 32, dynamic batch",
            onnx_graphs.transformer,
        ),
    ]
}


def is_zoo(spec: str) -> bool:
    return spec.startswith(ZOO_PREFIX)


def get(spec: str) -> ZooModel:
    name = spec[len(ZOO_PREFIX):] if is_zoo(spec) else spec
    if name in ZOO:
        return ZOO[name]
    near = difflib.get_close_matches(name, ZOO, n=1)
    hint = f"did you mean 'zoo:{near[0]}'? " if near else ""
    raise InputError(f"unknown zoo model '{name}'; {hint}available: {', '.join(ZOO)} (see `mlc models`)")
