import torch, transformers
torch.manual_seed(0)
cfg = transformers.BertConfig()  # bert-base
model = transformers.BertModel(cfg).eval()
ids = torch.randint(0, cfg.vocab_size, (2, 16)); mask = torch.ones(2, 16, dtype=torch.int64)
class M(torch.nn.Module):
    def __init__(s): super().__init__(); s.m = model
    def forward(s, input_ids, attention_mask): return s.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
torch.onnx.export(M(), (ids, mask), "bert.onnx", input_names=["input_ids", "attention_mask"],
                  dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
                  opset_version=17, dynamo=False)
