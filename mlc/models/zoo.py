"""The built-in model zoo: models built in code with seeded random weights, never downloaded.
Listed by `mlc models`; compiled as `mlc compile zoo:NAME [--framework F]`.

A model may exist in several frameworks; each builder is named "module:function" and resolved
only when used (framework builders run inside the frontend worker process)."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Callable

import onnx

from mlc.errors import InputError

ZOO_PREFIX = "zoo:"
_ONNX = "mlc.models.onnx_graphs"
_TORCH = "mlc.models.torch_models"
_KERAS = "mlc.models.keras_models"
_PADDLE = "mlc.models.paddle_models"


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    builders: dict[str, str]  # framework -> "module:function"; the first is the default framework

    @property
    def frameworks(self) -> list[str]:
        return list(self.builders)

    @property
    def default_framework(self) -> str:
        return self.frameworks[0]

    def builder(self, framework: str) -> Callable:
        if framework not in self.builders:
            raise InputError(f"zoo:{self.name} is not built for {framework}; it exists for: {', '.join(self.builders)}")
        module, _, function = self.builders[framework].partition(":")
        return getattr(importlib.import_module(module), function)

    def build(self) -> onnx.ModelProto:
        """The ONNX graph of a model that exists as one."""
        return self.builder("onnx")()


def _zoo(name: str, description: str, **builders: str) -> ZooModel:
    modules = {"onnx": _ONNX, "torch": _TORCH, "tensorflow": _KERAS, "paddle": _PADDLE}
    return ZooModel(name, description, {fw: f"{modules[fw]}:{fn}" for fw, fn in builders.items()})


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        _zoo("mlp", "3-layer perceptron, 64 -> 128 -> 64 -> 10, dynamic batch", onnx="mlp", torch="mlp"),
        _zoo("cnn", "small CNN on 3x32x32 images (2 conv blocks, pooling, linear), dynamic batch",
             onnx="cnn", torch="cnn", tensorflow="cnn", paddle="cnn"),
        _zoo("transformer", "BERT-like encoder as an ONNX graph: 2 layers, hidden 64, 4 heads, vocab 1000, seq 32, "
             "dynamic batch", onnx="transformer"),
        _zoo("bert-tiny", "BERT encoder: 2 layers, hidden 128, 2 heads (BertModel from a config in torch; "
             "the same shape built natively in Keras and Paddle), dynamic batch and seq",
             torch="bert_tiny", tensorflow="bert_tiny", paddle="bert_tiny"),
        _zoo("bert-base", "BERT-base: 12 layers, hidden 768, 12 heads, vocab 30522 (transformers BertModel), "
             "dynamic batch and seq; the Paddle one is paddle.nn's encoder of the same shape", torch="bert_base",
             paddle="bert_base"),
        _zoo("resnet18", "ResNet-18 on 3x224x224 images, dynamic batch", torch="resnet18"),
        _zoo("resnet50", "ResNet-50 (v1.5) on 3x224x224 images, dynamic batch", torch="resnet50"),
        _zoo("shufflenet-v1", "ShuffleNet v1 (3 groups, 1x: 1x1 group convs at 240/480/960 channels) on 3x224x224 "
             "images, dynamic batch", torch="shufflenet_v1"),
        _zoo("lstm", "small LSTM language model: vocab 1000, embedding 32, 1 layer of 64, seq 16, dynamic batch",
             torch="lstm", tensorflow="lstm", paddle="lstm"),
        _zoo("lstm-lm", "seed 001's stacked LSTM LM: vocab 10001, embedding 128, 3 layers of 256, seq 50 "
             "(batch 128 in the seed), dynamic batch", torch="lstm_lm", tensorflow="lstm_lm", paddle="lstm_lm"),
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
