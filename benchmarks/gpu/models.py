"""The models of the GPU runs, built in code with seeded random weights (no downloads), sized so that their
artifacts travel to the GPU machine within its 64 MiB:

- bert2: BERT at bert-base width (hidden 768, 12 heads, FFN 3072), 2 layers, vocabulary 1000, exported to ONNX by
  torch's TorchScript exporter with dynamic batch and seq (as users export BERT);
- squeezenet1_0: torchvision's SqueezeNet 1.0, written out here (the suite venv has torchvision, the main one not),
  as an `mlc compile models.py:squeezenet1_0` factory;
- lstm_lm: seed 001's LSTM language model, the torch side of zoo:lstm-lm's timing (cuDNN's LSTM).

    python benchmarks/gpu/models.py OUT_DIR     # writes OUT_DIR/bert2.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

BERT2 = {"hidden_size": 768, "num_hidden_layers": 2, "num_attention_heads": 12, "intermediate_size": 3072,
         "vocab_size": 1000}


class LastHiddenState(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def bert2() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    return LastHiddenState(transformers.BertModel(transformers.BertConfig(**BERT2)).eval())


def export_bert2(path: Path) -> None:
    ids = torch.randint(0, BERT2["vocab_size"], (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    torch.onnx.export(bert2(), (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)


class Fire(nn.Module):
    def __init__(self, inplanes: int, squeeze: int, expand1x1: int, expand3x3: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(inplanes, squeeze, 1), nn.ReLU(inplace=True))
        self.expand1x1 = nn.Sequential(nn.Conv2d(squeeze, expand1x1, 1), nn.ReLU(inplace=True))
        self.expand3x3 = nn.Sequential(nn.Conv2d(squeeze, expand3x3, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x):
        x = self.squeeze(x)
        return torch.cat([self.expand1x1(x), self.expand3x3(x)], 1)


class SqueezeNet(nn.Module):
    """torchvision.models.squeezenet1_0's layers."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 7, stride=2), nn.ReLU(inplace=True), pool(),
            Fire(96, 16, 64, 64), Fire(128, 16, 64, 64), Fire(128, 32, 128, 128), pool(),
            Fire(256, 32, 128, 128), Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256),
            pool(), Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d(1))

    def forward(self, images):
        return torch.flatten(self.classifier(self.features(images)), 1)


class LstmLanguageModel(nn.Module):
    """Seed 001's stacked LSTM language model (mlc's zoo:lstm-lm): embedding 128, 3 LSTM layers of 256, vocabulary
    10001; on CUDA torch runs the LSTM through cuDNN. A copy of mlc.models.torch_models' layers: this folder runs on
    the GPU machine, where mlc is not installed."""

    def __init__(self, vocab: int = 10001, embedding: int = 128, layers: int = 3, hidden: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids):
        states, _ = self.lstm(self.embed(input_ids))
        return self.head(states)


def lstm_lm() -> nn.Module:
    torch.manual_seed(0)
    return LstmLanguageModel().eval()


def squeezenet1_0():
    torch.manual_seed(0)
    return SqueezeNet().eval(), {"images": torch.randn(1, 3, 224, 224)}


if __name__ == "__main__":
    export_bert2(Path(sys.argv[1]) / "bert2.onnx")
