"""Issue #39's broad CPU model list: the exact variants and how each becomes the ONNX file every engine runs.

- The Caffe2 zoo's nine CNNs (alexnet, densenet121, inception v1 and v2, resnet50, shufflenet v1, squeezenet, vgg19,
  zfnet512): the graphs the `onnx` package ships as "light" models, with seeded weights
  (`benchmarks/inception/build_models.py`), opset 9 as shipped; input data_0 1x3x224x224.
- torchvision (weights=None) and timm (pretrained=False) models as `mlc export file.py:factory` factories below:
  batch 1 at 224x224, seed 0, batch-norm statistics from one seeded batch (`cnn_models._build`) so that every layer's
  output is normalised as in a trained model; mobilenet_v2 keeps its init (`cnn_models.mobilenet_v2`).
- bert-base (zoo:bert-base, transformers' BertModel) at batch 1, seq 32 and 128, and gpt2 (transformers' GPT2Model
  from GPT2Config(): 12 layers, hidden 768, vocab 50257; last hidden state, no cache) at batch 1, seq 128.

Factories need `make suite-env`'s venv (torchvision, timm)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "inception"))

CAFFE2 = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
          "vgg19", "zfnet512")
TORCH = ("resnext50_32x4d", "regnety_016", "shufflenet_v2_x1_0", "mobilenet_v2", "mobilenet_v3_large",
         "efficientnet_b0", "convnext_tiny", "vit_small_patch16_224", "deit_tiny_patch16_224")


def _exported(source: str, *shapes: str, export: tuple = ()) -> tuple[str, list[str], list[str]]:
    """Exported and compiled at these input shapes (a factory's batch is otherwise left open, and mlc's reference
    runs at batch 2)."""
    flags = [f"--input-shape={shape}" for shape in shapes]
    return source, [*export, *flags], flags


# label -> (what `mlc export` exports, or caffe2:NAME; export flags; flags for `mlc compile model.onnx`)
MODELS: dict[str, tuple[str, list[str], list[str]]] = {
    **{f"caffe2 {name}": (f"caffe2:{name}", [], []) for name in CAFFE2},
    **{f"bert-base b1 s{seq}": _exported("zoo:bert-base", f"input_ids:1x{seq}", f"attention_mask:1x{seq}",
                                         export=("-f", "torch")) for seq in (32, 128)},
    **{name: _exported(f"{HERE / 'broad_models.py'}:{name}", "images:1x3x224x224") for name in TORCH},
    "gpt2 b1 s128": _exported(f"{HERE / 'broad_models.py'}:gpt2", "input_ids:1x128"),
}


def write_caffe2(name: str, path: Path) -> None:
    """The light Caffe2 model `name` with seeded weights, saved at `path`."""
    import onnx
    from build_models import seeded

    onnx.save(seeded(name), str(path))


def _build(name: str):
    from cnn_models import _build

    return _build(name)


def mobilenet_v2():
    from cnn_models import mobilenet_v2

    return mobilenet_v2()


def _timm(name: str):
    import timm
    import torch
    from cnn_models import normalised

    torch.manual_seed(0)
    return normalised(timm.create_model(name, pretrained=False)), {"images": torch.randn(1, 3, 224, 224)}


def resnext50_32x4d():
    return _build("resnext50_32x4d")


def shufflenet_v2_x1_0():
    return _build("shufflenet_v2_x1_0")


def mobilenet_v3_large():
    return _build("mobilenet_v3_large")


def efficientnet_b0():
    return _build("efficientnet_b0")


def convnext_tiny():
    return _build("convnext_tiny")


def regnety_016():
    return _timm("regnety_016")


def vit_small_patch16_224():
    return _timm("vit_small_patch16_224")


def deit_tiny_patch16_224():
    return _timm("deit_tiny_patch16_224")


def gpt2():
    import torch
    from transformers import GPT2Config, GPT2Model

    class LastHidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(use_cache=False)).eval()
    return LastHidden(model).eval(), {"input_ids": torch.randint(0, 50257, (1, 128))}
