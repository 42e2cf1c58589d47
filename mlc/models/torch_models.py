"""PyTorch zoo models, built in code with seeded random weights (never downloaded).

Each builder returns a FrameworkModel; they run only inside the frontend worker process."""

from __future__ import annotations

from mlc.frontends.base import FrameworkModel
from mlc.frontends.torch import from_module

SEED = 0


def _torch():
    import torch

    torch.manual_seed(SEED)
    return torch


def mlp() -> FrameworkModel:
    torch = _torch()
    nn = torch.nn
    module = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return from_module(module, (torch.randn(1, 64),), ["x"], ["logits"])


def cnn() -> FrameworkModel:
    torch = _torch()
    nn = torch.nn
    module = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10),
    )
    _randomize_batchnorm(module)
    return from_module(module, (torch.randn(1, 3, 32, 32),), ["images"], ["logits"])


def _randomize_batchnorm(module) -> None:
    """Fresh BatchNorm layers are identities; give them statistics so folding them is tested."""
    import torch

    for layer in module.modules():
        if isinstance(layer, torch.nn.BatchNorm2d):
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 1.5)
            layer.weight.data.uniform_(0.5, 1.5)
            layer.bias.data.uniform_(-0.5, 0.5)


class _LanguageModel:
    """Embedding -> stacked LSTM -> vocabulary logits at every step (seed 001's model)."""

    @staticmethod
    def build(vocab: int, embedding: int, layers: int, hidden: int):
        torch = _torch()
        nn = torch.nn

        class LstmLanguageModel(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(vocab, embedding)
                self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)
                self.head = nn.Linear(hidden, vocab)

            def forward(self, input_ids):
                states, _ = self.lstm(self.embed(input_ids))
                return self.head(states)

        return torch, LstmLanguageModel()


def lstm() -> FrameworkModel:
    torch, module = _LanguageModel.build(vocab=1000, embedding=32, layers=1, hidden=64)
    ids = torch.randint(0, 1000, (1, 16))
    # The sequence is static: the LSTM lowering unrolls it.
    return from_module(module, (ids,), ["input_ids"], ["logits"], dims={"input_ids": ["batch", 16]})


def lstm_lm() -> FrameworkModel:
    """Seed 001: vocab 10001, embedding 128, 3 LSTM layers of 256, sequence 50 (batch 128 in the seed)."""
    torch, module = _LanguageModel.build(vocab=10001, embedding=128, layers=3, hidden=256)
    ids = torch.randint(0, 10001, (1, 50))
    return from_module(module, (ids,), ["input_ids"], ["logits"], dims={"input_ids": ["batch", 50]})


def _bert(layers: int, hidden: int, heads: int, intermediate: int, vocab: int) -> FrameworkModel:
    torch = _torch()
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=intermediate, attn_implementation="eager")

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(config)

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)

    ids = torch.randint(0, vocab, (1, 8))
    return from_module(Bert(), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"],
                       ["last_hidden_state", "pooler_output"])


def bert_tiny() -> FrameworkModel:
    return _bert(layers=2, hidden=128, heads=2, intermediate=512, vocab=30522)


def bert_base() -> FrameworkModel:
    return _bert(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522)


def _resnet(blocks: list[int], bottleneck: bool):
    """torchvision's ResNet layout (v1.5: stride on the 3x3), written here: torchvision's wheel
    does not load beside the CPU torch build these machines use."""
    torch = _torch()
    nn = torch.nn
    expansion = 4 if bottleneck else 1

    class Block(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int):
            super().__init__()
            if bottleneck:
                widths = [(inplanes, planes, 1, 1), (planes, planes, 3, stride), (planes, planes * 4, 1, 1)]
            else:
                widths = [(inplanes, planes, 3, stride), (planes, planes, 3, 1)]
            layers = []
            for i, (cin, cout, k, s) in enumerate(widths):
                layers += [nn.Conv2d(cin, cout, k, s, padding=k // 2, bias=False), nn.BatchNorm2d(cout)]
                if i < len(widths) - 1:
                    layers.append(nn.ReLU(inplace=True))
            self.body = nn.Sequential(*layers)
            out = planes * expansion
            self.shortcut = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                             if stride != 1 or inplanes != out else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.shortcut(x))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    inplanes = 64
    for stage, count in enumerate(blocks):
        planes = 64 * 2 ** stage
        for i in range(count):
            layers.append(Block(inplanes, planes, 2 if i == 0 and stage > 0 else 1))
            inplanes = planes * expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, 1000)]
    module = nn.Sequential(*layers)
    _randomize_batchnorm(module)
    return from_module(module, (torch.randn(1, 3, 224, 224),), ["images"], ["logits"])


def resnet18() -> FrameworkModel:
    return _resnet([2, 2, 2, 2], bottleneck=False)


def resnet50() -> FrameworkModel:
    return _resnet([3, 4, 6, 3], bottleneck=True)


def shufflenet_v1() -> FrameworkModel:
    """ShuffleNet v1, 3 groups, width 1x (Zhang et al. 2017; the Caffe2 zoo's): 1x1 group conv -> channel shuffle
    -> 3x3 depthwise -> 1x1 group conv, stages of 4/8/4 units at 240/480/960 channels; a stride-2 unit concatenates
    an average-pooled shortcut."""
    torch = _torch()
    nn = torch.nn
    groups = 3

    class Unit(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, first_groups: int):
            super().__init__()
            self.stride = stride
            out = cout - cin if stride == 2 else cout
            mid = cout // 4
            self.g = first_groups
            self.reduce = nn.Sequential(nn.Conv2d(cin, mid, 1, groups=first_groups, bias=False), nn.BatchNorm2d(mid),
                                        nn.ReLU(inplace=True))
            self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
                                           nn.BatchNorm2d(mid))
            self.expand = nn.Sequential(nn.Conv2d(mid, out, 1, groups=groups, bias=False), nn.BatchNorm2d(out))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            y = self.reduce(x)
            n, c, h, w = y.shape
            y = y.reshape(n, self.g, c // self.g, h, w).transpose(1, 2).reshape(n, c, h, w)  # channel shuffle
            y = self.expand(self.depthwise(y))
            if self.stride == 2:
                return self.relu(torch.cat([nn.functional.avg_pool2d(x, 3, 2, 1), y], 1))
            return self.relu(x + y)

    layers = [nn.Conv2d(3, 24, 3, 2, 1, bias=False), nn.BatchNorm2d(24), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 24
    for stage, (cout, units) in enumerate([(240, 4), (480, 8), (960, 4)]):
        for i in range(units):
            # the first unit's 1x1 conv reads the 24-channel stem: not grouped (as in the paper)
            layers.append(Unit(cin, cout, 2 if i == 0 else 1, 1 if stage == 0 and i == 0 else groups))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    module = nn.Sequential(*layers)
    _randomize_batchnorm(module)
    return from_module(module, (torch.randn(1, 3, 224, 224),), ["images"], ["logits"])
