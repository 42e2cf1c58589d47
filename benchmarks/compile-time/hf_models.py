"""#39's large models as `mlc export file.py:factory` factories, built as the HF suite builds them
(`mlc.bench.suites`: the published config, seed 0, random weights, models over 1.5 B parameters cut to 2 layers,
Longformer's chunks as slices), batch 1 at seq 128, the logits out. Needs `make suite-env`'s venv (transformers).

    .venv-suites/bin/mlc export benchmarks/compile-time/hf_models.py:llama_3_2_1b \
        --input-shape input_ids:1x128 -o /tmp/llama/model.onnx"""

from __future__ import annotations


def _suite_model(name: str):
    import torch
    import transformers

    from mlc.bench import suites

    entry = suites.HUGGINGFACE[name]
    config = suites._hf_config(entry, transformers, {})
    model_cls = getattr(transformers, entry.model)
    with torch.device("meta"):
        full = suites._count(model_cls(config))
    if full > suites.MAX_PARAMS:
        config = suites._hf_config(entry, transformers, {k: suites.CUT_LAYERS for k in suites.LAYER_KEYS})
    if entry.overrides.get("onnx_export"):
        suites._longformer_chunks(transformers)
    torch.manual_seed(suites.SEED)
    model = model_cls(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, return_dict=True,
                              **({"use_cache": False} if "use_cache" in suites._forward_args(model) else {})).logits

    return Logits().eval(), {"input_ids": torch.randint(0, config.vocab_size, (1, suites.SEQ))}


def llama_3_2_1b():
    return _suite_model("Llama-3.2-1B")


def longformer():
    return _suite_model("AllenaiLongformerBase")


def gemma_3_4b():
    return _suite_model("gemma-3-4b-it")
