"""#39's large models as `mlc export file.py:factory` factories, built as the HF suite builds them
(`mlc.bench.suites.hf_module`: the published config, seed 0, random weights, models over 1.5 B parameters cut to 2
layers, Longformer's chunks as slices), batch 1 at seq 128, the logits out. Needs `make suite-env`'s venv
(transformers).

    .venv-suites/bin/mlc export benchmarks/compile-time/hf_models.py:llama_3_2_1b \
        --input-shape input_ids:1x128 -o /tmp/llama/model.onnx"""

from __future__ import annotations

from mlc.bench.suites import hf_module


def _suite_model(name: str):
    import torch

    suite, inputs, _ = hf_module(name)

    class Text(torch.nn.Module):  # the suite's module takes *args; a factory's forward() names its inputs
        def __init__(self):
            super().__init__()
            self.suite = suite

        def forward(self, input_ids):
            return self.suite(input_ids)

    return Text().eval(), inputs


def llama_3_2_1b():
    return _suite_model("Llama-3.2-1B")


def longformer():
    return _suite_model("AllenaiLongformerBase")


def gemma_3_4b():
    return _suite_model("gemma-3-4b-it")
