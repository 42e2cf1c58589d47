"""Export seed 001's stacked LSTM language model from torch to ONNX (vocab 10001, embedding 128,
3 LSTM layers of 256, seq 50, dynamic batch; seeded random weights) for passes_levels.py:

    .venv/bin/python benchmarks/passes-levels/lstm_lm_export.py /tmp/lstm_lm.onnx
    .venv/bin/python benchmarks/passes-levels/passes_levels.py /tmp/lstm_lm.onnx --input-shape tokens:128x50 \
        --levels 0 2
"""

from __future__ import annotations

import sys

import torch


class StackedLSTMLM(torch.nn.Module):
    def __init__(self, vocab: int = 10001, embedding: int = 128, hidden: int = 256, layers: int = 3):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, embedding)
        self.lstm = torch.nn.LSTM(embedding, hidden, layers, batch_first=True)
        self.projection = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens):
        return self.projection(self.lstm(self.embedding(tokens))[0])


def main(path: str) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 10001, (128, 50))
    torch.onnx.export(StackedLSTMLM().eval(), (tokens,), path, dynamo=False, input_names=["tokens"],
                      output_names=["logits"], dynamic_axes={"tokens": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=17)


if __name__ == "__main__":
    main(sys.argv[1])
