"""PyTorch's compiler benchmark suites (benchmarks/dynamo in the pytorch repository), built in code for `mlc bench
--suite`: HuggingFace models from their transformers config classes (defaults = the published size) and TIMM models
from `timm.create_model(name, pretrained=False)`, seeded, never downloaded.

A suite model is the source "suite:SUITE/NAME"; the bench worker builds it (framework_model) at fp32, batch 1, with
static shapes: text models take 128 tokens (encoder-decoder models: the encoder and one decoder pass of 128 tokens,
as one graph). A model over MAX_PARAMS parameters is rebuilt with its config cut to CUT_LAYERS layers, and says so.
With MLC_SUITE_TINY=1 in the environment every model is built with a tiny config (tests: minutes, not hours).

This module imports no framework at import time (the bench parent process reads the lists)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

from mlc.errors import InputError, MissingDependencyError

PREFIX = "suite:"
SEQ = 128  # tokens for text models (and decoder tokens for encoder-decoder models)
MAX_PARAMS = 1.5e9
CUT_LAYERS = 2
TINY_ENV = "MLC_SUITE_TINY"
SEED = 0
TIMM_PIN = "timm==1.0.31"

# Config attributes that count layers, across transformers' model families.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers")
# MLC_SUITE_TINY: the widths too (keys a config does not have are left alone).
TINY = {**{k: 1 for k in LAYER_KEYS}, "hidden_size": 64, "d_model": 64, "n_embd": 64, "dim": 64, "embedding_size": 64,
        "intermediate_size": 128, "hidden_dim": 128, "d_ff": 128, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
        "n_inner": 128, "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "num_heads": 2,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "d_kv": 32, "d_head": 32,
        "true_hidden_size": 64, "intra_bottleneck_size": 64, "rotary_dim": 16}  # GPT-J rotates part of a 32-wide head


@dataclass(frozen=True)
class HFModel:
    name: str  # as PyTorch's huggingface_models_list.txt spells it
    config: str  # transformers config class
    model: str  # transformers model class
    kind: str = "text"  # text: input_ids; seq2seq: + decoder_input_ids; speech: input_features + decoder_input_ids
    overrides: dict = field(default_factory=dict)  # published numbers (for the LLMs) or fixes


def _hf(name: str, config: str, model: str, kind: str = "text", **overrides) -> HFModel:
    return HFModel(name, config, model, kind, overrides)


HUGGINGFACE: dict[str, HFModel] = {m.name: m for m in [
    _hf("AlbertForMaskedLM", "AlbertConfig", "AlbertForMaskedLM"),
    _hf("AlbertForQuestionAnswering", "AlbertConfig", "AlbertForQuestionAnswering"),
    # onnx_export: transformers' switch for its ONNX-exportable sliding-window chunks (_longformer_chunks).
    _hf("AllenaiLongformerBase", "LongformerConfig", "LongformerForMaskedLM", onnx_export=True),
    _hf("BartForCausalLM", "BartConfig", "BartForCausalLM"),
    _hf("BartForConditionalGeneration", "BartConfig", "BartForConditionalGeneration", "seq2seq"),
    _hf("BertForMaskedLM", "BertConfig", "BertForMaskedLM"),
    _hf("BertForQuestionAnswering", "BertConfig", "BertForQuestionAnswering"),
    _hf("BlenderbotForCausalLM", "BlenderbotConfig", "BlenderbotForCausalLM"),
    _hf("BlenderbotForConditionalGeneration", "BlenderbotConfig", "BlenderbotForConditionalGeneration", "seq2seq"),
    _hf("BlenderbotSmallForCausalLM", "BlenderbotSmallConfig", "BlenderbotSmallForCausalLM"),
    _hf("BlenderbotSmallForConditionalGeneration", "BlenderbotSmallConfig", "BlenderbotSmallForConditionalGeneration",
        "seq2seq"),
    _hf("CamemBert", "CamembertConfig", "CamembertForMaskedLM"),
    _hf("DebertaV2ForMaskedLM", "DebertaV2Config", "DebertaV2ForMaskedLM"),
    _hf("DebertaV2ForQuestionAnswering", "DebertaV2Config", "DebertaV2ForQuestionAnswering"),
    _hf("DistilBertForMaskedLM", "DistilBertConfig", "DistilBertForMaskedLM"),
    _hf("DistilBertForQuestionAnswering", "DistilBertConfig", "DistilBertForQuestionAnswering"),
    _hf("DistillGPT2", "GPT2Config", "GPT2LMHeadModel", n_layer=6),  # distilgpt2: GPT-2 with 6 layers
    _hf("ElectraForCausalLM", "ElectraConfig", "ElectraForCausalLM", is_decoder=True),
    _hf("ElectraForQuestionAnswering", "ElectraConfig", "ElectraForQuestionAnswering"),
    _hf("GPT2ForSequenceClassification", "GPT2Config", "GPT2ForSequenceClassification"),
    _hf("GPTJForCausalLM", "GPTJConfig", "GPTJForCausalLM"),
    _hf("GPTJForQuestionAnswering", "GPTJConfig", "GPTJForQuestionAnswering"),
    _hf("GPTNeoForCausalLM", "GPTNeoConfig", "GPTNeoForCausalLM"),
    _hf("GPTNeoForSequenceClassification", "GPTNeoConfig", "GPTNeoForSequenceClassification"),
    _hf("GoogleFnet", "FNetConfig", "FNetForMaskedLM"),
    _hf("LayoutLMForMaskedLM", "LayoutLMConfig", "LayoutLMForMaskedLM"),
    _hf("LayoutLMForSequenceClassification", "LayoutLMConfig", "LayoutLMForSequenceClassification"),
    _hf("M2M100ForConditionalGeneration", "M2M100Config", "M2M100ForConditionalGeneration", "seq2seq"),
    _hf("MBartForCausalLM", "MBartConfig", "MBartForCausalLM"),
    _hf("MBartForConditionalGeneration", "MBartConfig", "MBartForConditionalGeneration", "seq2seq"),
    _hf("MT5ForConditionalGeneration", "MT5Config", "MT5ForConditionalGeneration", "seq2seq"),
    _hf("MegatronBertForCausalLM", "MegatronBertConfig", "MegatronBertForCausalLM", is_decoder=True),
    _hf("MegatronBertForQuestionAnswering", "MegatronBertConfig", "MegatronBertForQuestionAnswering"),
    _hf("MobileBertForMaskedLM", "MobileBertConfig", "MobileBertForMaskedLM"),
    _hf("MobileBertForQuestionAnswering", "MobileBertConfig", "MobileBertForQuestionAnswering"),
    _hf("OPTForCausalLM", "OPTConfig", "OPTForCausalLM"),
    _hf("PLBartForCausalLM", "PLBartConfig", "PLBartForCausalLM"),
    _hf("PLBartForConditionalGeneration", "PLBartConfig", "PLBartForConditionalGeneration", "seq2seq"),
    _hf("PegasusForCausalLM", "PegasusConfig", "PegasusForCausalLM"),
    _hf("PegasusForConditionalGeneration", "PegasusConfig", "PegasusForConditionalGeneration", "seq2seq"),
    _hf("RobertaForCausalLM", "RobertaConfig", "RobertaForCausalLM", is_decoder=True),
    _hf("RobertaForQuestionAnswering", "RobertaConfig", "RobertaForQuestionAnswering"),
    _hf("T5ForConditionalGeneration", "T5Config", "T5ForConditionalGeneration", "seq2seq"),
    _hf("T5Small", "T5Config", "T5ForConditionalGeneration", "seq2seq"),  # t5-small is T5Config()'s default
    _hf("TrOCRForCausalLM", "TrOCRConfig", "TrOCRForCausalLM"),
    _hf("XGLMForCausalLM", "XGLMConfig", "XGLMForCausalLM"),
    _hf("XLNetLMHeadModel", "XLNetConfig", "XLNetLMHeadModel", use_mems_eval=False),
    _hf("YituTechConvBert", "ConvBertConfig", "ConvBertForMaskedLM"),
    # Decoder LLMs (and whisper) from their published config.json numbers.
    _hf("Llama-3.2-1B", "LlamaConfig", "LlamaForCausalLM", vocab_size=128256, hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    _hf("gemma-2-2b", "Gemma2Config", "Gemma2ForCausalLM", vocab_size=256000, hidden_size=2304,
        intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        sliding_window=4096, query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    # gemma-3-4b-it is an image-text model; its language model (text_config) is what runs here.
    _hf("gemma-3-4b-it", "Gemma3TextConfig", "Gemma3ForCausalLM", vocab_size=262208, hidden_size=2560,
        intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        sliding_window=1024, query_pre_attn_scalar=256),
    _hf("whisper-tiny", "WhisperConfig", "WhisperForConditionalGeneration", "speech", vocab_size=51865, d_model=384,
        encoder_layers=4, decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
        encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80, max_source_positions=1500,
        max_target_positions=448),
    _hf("Qwen3-0.6B", "Qwen3Config", "Qwen3ForCausalLM", vocab_size=151936, hidden_size=1024,
        intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    _hf("Mistral-7B-Instruct-v0.3", "MistralConfig", "MistralForCausalLM", vocab_size=32768, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    _hf("gpt-oss-20b", "GptOssConfig", "GptOssForCausalLM", vocab_size=201088, hidden_size=2880,
        intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        num_local_experts=32, num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072),
]}

TIMM = ["adv_inception_v3", "beit_base_patch16_224", "convnextv2_nano.fcmae_ft_in22k_in1k",
        "deit_base_distilled_patch16_224", "deit_tiny_patch16_224.fb_in1k", "dm_nfnet_f0", "ghostnet_100",
        "inception_v3", "mobilenetv2_100", "mobilenetv3_large_100", "mobilevit_s", "nfnet_l0", "repvgg_a2",
        "swin_base_patch4_window7_224", "tf_efficientnet_b0", "visformer_small", "vit_base_patch14_dinov2.lvd142m",
        "vit_base_patch16_siglip_256"]

SUITES: dict[str, list[str]] = {"huggingface": list(HUGGINGFACE), "timm": TIMM}


def names(suite: str) -> list[str]:
    if suite not in SUITES:
        raise InputError(f"unknown suite {suite!r}; choose one of: {', '.join(SUITES)}")
    return SUITES[suite]


def select(suite: str, picked: Optional[list[str]]) -> list[str]:
    """The suite's models in its order, or the picked ones (checked against the list)."""
    listed = names(suite)
    if not picked:
        return list(listed)
    folded = {n.lower(): n for n in listed}
    unknown = [p for p in picked if p.lower() not in folded]
    if unknown:
        raise InputError(f"--suite-models: {', '.join(unknown)} not in the {suite} suite; it has: {', '.join(listed)}")
    return [folded[p.lower()] for p in picked]


def source(suite: str, name: str) -> str:
    return f"{PREFIX}{suite}/{name}"


def is_suite(spec: str) -> bool:
    return spec.startswith(PREFIX)


def tiny() -> bool:
    return os.environ.get(TINY_ENV, "") not in ("", "0")


def require(suite: str) -> None:
    """MissingDependencyError (exit 4) when the suite's framework cannot be imported, before anything runs."""
    package = {"huggingface": "transformers", "timm": "timm"}[suite]
    if importlib.util.find_spec(package) is None:
        hint = f"`make suite-env` (a venv with {TIMM_PIN} and a torchvision that loads beside its torch)" \
            if suite == "timm" else "pip install 'mlc[torch]'"
        raise MissingDependencyError(f"the {suite} suite needs {package}, which is not installed; {hint}")
    if suite == "timm":  # timm imports torchvision, which may be installed yet fail to load beside this torch
        probe = subprocess.run([sys.executable, "-c", "import timm"], capture_output=True, text=True, timeout=300)
        if probe.returncode:
            lines = [ln for ln in probe.stderr.strip().splitlines() if ln.strip()]
            raise MissingDependencyError(
                "timm unavailable: needs torchvision, and `import timm` fails here "
                f"({lines[-1] if lines else 'no output'})"
                "; run it from `make suite-env`'s venv: torch 2.14.1 with its own torchvision 0.29.1 (README)")


# Building (inside the bench worker process) ---------------------------------------------------------------------

def framework_model(spec: str):
    """The FrameworkModel of "suite:SUITE/NAME" (mlc.frontends.base), its notes saying how it was built."""
    suite, _, name = spec[len(PREFIX):].partition("/")
    if name not in names(suite):
        raise InputError(f"{spec}: no model {name!r} in the {suite} suite")
    return _huggingface(name) if suite == "huggingface" else _timm(name)


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


EXPORTABLE_EXPERTS = "batched_mm"


def _hf_config(entry: HFModel, transformers, extra: dict):
    cls = getattr(transformers, entry.config)
    kwargs = {k: v for k, v in entry.overrides.items() if k != "use_mems_eval"}
    if entry.name.startswith("GPTNeo") and any(k in extra for k in LAYER_KEYS):  # its layer list must match
        layers = extra.get("num_layers", 1)
        extra = {**extra, "num_layers": layers, "attention_types": [[["global", "local"], max(layers // 2, 1)]]}
        if layers == 1:
            extra["attention_types"] = [[["global"], 1]]
    present = {k: v for k, v in extra.items() if hasattr(cls(), k) or k == "attention_types"}
    return cls(**{**kwargs, **present})


def _huggingface(name: str):
    from mlc.frontends.torch import from_module

    wrapped, inputs, notes = hf_module(name)
    fm = from_module(wrapped, tuple(inputs.values()), list(inputs),
                     dims={k: list(v.shape) for k, v in inputs.items()})
    fm.notes = notes + fm.notes
    return fm


def hf_module(name: str):
    """The HuggingFace suite's model `name` as the suite runs it: (a module taking the inputs positionally and
    returning its logits, the example inputs by name, notes on how it was built). Also an `mlc export
    file.py:factory` source (benchmarks/compile-time/hf_models.py)."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    entry = HUGGINGFACE[name]
    model_cls = getattr(transformers, entry.model)
    notes = []
    extra = dict(TINY) if tiny() else {}
    config = _hf_config(entry, transformers, extra)
    if tiny():
        notes.append("tiny config (MLC_SUITE_TINY)")
    else:
        with torch.device("meta"):  # count without allocating
            full = _count(model_cls(config))
        if full > MAX_PARAMS:
            layers = {k: CUT_LAYERS for k in LAYER_KEYS}
            config = _hf_config(entry, transformers, layers)
            notes.append(f"config cut to {CUT_LAYERS} layers ({full / 1e9:.2f} B parameters in full)")
    if entry.overrides.get("onnx_export"):
        _longformer_chunks(transformers)
        notes.append("config onnx_export=True, its chunks as slices (transformers' ONNX-export path before 5.x)")
    if entry.overrides.get("use_mems_eval") is False:
        config.use_mems_eval = False
    torch.manual_seed(SEED)
    model = model_cls(config).eval()
    if getattr(config, "_experts_implementation", None) not in (None, "eager", EXPORTABLE_EXPERTS):
        # MoE experts: transformers' default grouped_mm calls a custom op no ONNX exporter converts (and its
        # offsets use histc); batched_mm computes the same with gathers and a bmm.
        model.set_experts_implementation(EXPORTABLE_EXPERTS)
        notes.append(f"MoE experts as {EXPORTABLE_EXPERTS} (the default grouped_mm does not export)")
    vocab = getattr(config, "vocab_size", 1000)
    ids = torch.randint(0, vocab, (1, SEQ))
    if entry.kind == "speech":
        frames = 2 * config.max_source_positions  # the encoder's fixed input length (30 s of audio)
        inputs = {"input_features": torch.randn(1, config.num_mel_bins, frames), "decoder_input_ids": ids}
    elif entry.kind == "seq2seq":
        inputs = {"input_ids": ids, "decoder_input_ids": torch.randint(0, vocab, (1, SEQ))}
    else:
        inputs = {"input_ids": ids}
    keys = list(inputs)

    class Suite(torch.nn.Module):
        """Positional inputs, the logits out (no caches, no hidden states)."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(keys, args)), return_dict=True,
                             **({"use_cache": False} if "use_cache" in _forward_args(self.model) else {}))
            return tuple(v for k, v in out.items() if k.endswith("logits"))

    return Suite().eval(), inputs, notes


def _longformer_chunks(transformers) -> None:
    """Longformer's overlapping attention chunks as slices of the sequence: the loop transformers' ONNX-export path
    ran before it became `unfold`, the same values as the default's `as_strided` view. torch's ONNX exporters export
    that view wrongly, without a warning (pytorch/pytorch#90607: ONNX Runtime, OpenVINO and mlc all missed eager by
    0.15), and `unfold` not at all (dynamo: a data-dependent guard; TorchScript: "Unfold, input size not
    accessible")."""
    import torch

    def chunk(hidden_states, window_overlap, onnx_export: bool = False):
        count = hidden_states.size(1) // window_overlap - 1  # chunks of 2w overlapping by w
        return torch.stack([hidden_states[:, k * window_overlap:(k + 2) * window_overlap] for k in range(count)], 1)

    transformers.models.longformer.modeling_longformer.LongformerSelfAttention._chunk = staticmethod(chunk)


def _forward_args(module) -> set:
    import inspect

    return set(inspect.signature(module.forward).parameters)


def _timm(name: str):
    try:
        import timm
    except Exception as e:  # torchvision fails in several ways beside a torch it was not built for
        raise MissingDependencyError(f"timm unavailable: needs torchvision, and `import timm` fails here "
                                     f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    import torch

    from mlc.frontends.torch import from_module

    torch.manual_seed(SEED)
    kwargs = {"depth": 1} if tiny() and "vit" in name else {}
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
    image = torch.randn(1, *size)
    fm = from_module(model, (image,), ["images"], ["logits"], dims={"images": list(image.shape)})
    if tiny():
        fm.notes.insert(0, "tiny config (MLC_SUITE_TINY)")
    return fm


# Accuracy (torch's benchmark suites' rule) ------------------------------------------------------------------------

REFERENCE64 = "reference64-{key}.npz"
FP64_MAX_PARAMS = 4e8  # an fp64 copy beside the fp32 model: 3.2 GB at most
FP64_MULTIPLIER = 2.0  # torch._dynamo.utils.same: res_error <= 2 x ref_error + tol / 10
FP64_SLACK = 1e-5  # tol / 10 with mlc's fp32 atol (1e-4)
SUITE_TOL = 1e-3  # torch's huggingface and timm runners' inference tolerance: same()'s allclose, atol = rtol


def eager_fp64(fm, inputs: list) -> Optional[list]:
    """Eager outputs of a suite model run in float64 (a copy), or None when the model is too large for a copy.
    With random weights some models' activations grow to hundreds (visformer_small's logits reach ~300), where
    fp32 itself is off by 1e-3 and an element-wise tolerance would fail any reordering of the sums."""
    import copy

    import numpy as np
    import torch

    from mlc.frontends.torch import flatten_outputs

    module = fm.native
    if module is None or sum(p.numel() for p in module.parameters()) > FP64_MAX_PARAMS:
        return None
    double = copy.deepcopy(module).double().eval()
    args = [torch.from_numpy(np.asarray(a, np.float64) if np.issubdtype(np.asarray(a).dtype, np.floating)
                             else np.asarray(a)) for a in inputs]
    with torch.no_grad():
        return flatten_outputs(double(*args))


def rmse(a, b) -> float:
    import numpy as np

    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)))


def suite_check(reference: dict, reference64: Optional[dict], actual: dict) -> dict:
    """torch's benchmark suites' rule (torch._dynamo.utils.same), for a suite model whose element-wise check at
    mlc's tolerances failed: allclose at SUITE_TOL, else, where an fp64 eager run was affordable, the fp64 rule."""
    import numpy as np

    close = all(np.shape(actual[name]) == np.shape(ref) and np.allclose(actual[name], ref, atol=SUITE_TOL,
                                                                         rtol=SUITE_TOL)
                for name, ref in reference.items())
    if close or reference64 is None:
        return {"rule": f"allclose atol=rtol={SUITE_TOL:g} (torch benchmarks' same()"
                        + ("" if close else f"; no fp64 run over {FP64_MAX_PARAMS / 1e9:g} B parameters") + ")",
                "passed": close}
    return fp64_check(reference, reference64, actual)


def fp64_check(reference: dict, reference64: dict, actual: dict) -> dict:
    """torch's benchmark suites' fallback rule (torch._dynamo.utils.same with an fp64 reference): each output's RMSE
    against the fp64 eager run is at most FP64_MULTIPLIER x the fp32 eager run's own RMSE against it (+ slack)."""
    worst_ratio, passed, mine, eager = 0.0, True, 0.0, 0.0
    for name, ref64 in reference64.items():
        own, res = rmse(reference[name], ref64), rmse(actual[name], ref64)
        bound = FP64_MULTIPLIER * own + FP64_SLACK
        passed = passed and res <= bound
        if res / bound >= worst_ratio:
            worst_ratio, mine, eager = res / bound, res, own
    return {"rule": f"fp64 RMSE <= {FP64_MULTIPLIER:g} x eager fp32's (torch benchmarks' same())",
            "rmse_vs_fp64": mine, "eager_rmse_vs_fp64": eager, "passed": passed}
