"""The bert.onnx most users have (issue #19): transformers' BertModel at the bert-base config with seeded random
weights, exported by torch's TorchScript exporter with dynamic batch and seq. Writes bert.onnx (420 MB) here."""

import torch
import transformers


class LastHiddenState(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def main() -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig()  # bert-base
    model = LastHiddenState(transformers.BertModel(config).eval())
    ids = torch.randint(0, config.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    torch.onnx.export(model, (ids, mask), "bert.onnx", input_names=["input_ids", "attention_mask"], dynamic_axes=axes,
                      opset_version=17, dynamo=False)


if __name__ == "__main__":
    main()
