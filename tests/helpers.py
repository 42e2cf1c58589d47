"""Helpers the tests import (`from helpers import ...`; pytest puts tests/ on sys.path): the CLI in a subprocess,
error checks, and small models built in code. Fixtures live in conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# An x86 target with every ISA extension mlc's kernels choose by but AMX (AVX-512, VNNI, BF16): kernels whose shape is
# asserted are built for it whatever the host is; they run only where `host_runs` says so.
ZNVER4 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 1}


def host_runs(target_json: dict) -> bool:
    """Whether code built for an x86 LLVM target runs on this machine: each feature mlc's CPU table knows (AVX-512,
    VNNI, BF16, AMX) that the target has, the host has too. (Code with an instruction the host lacks dies of SIGILL,
    and takes the whole pytest run with it.)"""
    from mlc import targets
    from mlc.targets import cpu_features

    if targets.HOST_ARCH != "x86_64" or "x86_64" not in target_json.get("mtriple", "x86_64"):
        return False
    host = targets.resolve("x86").tvm
    return all(cpu_features.has(host["mcpu"], list(host.get("mattr", [])), feature, False)
               for feature in cpu_features.FEATURES["x86_64"]
               if cpu_features.has(target_json["mcpu"], list(target_json.get("mattr", [])), feature, False))




def run_mlc(*args: str, cwd: Path | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    proc = subprocess.run([sys.executable, "-m", "mlc", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "COLUMNS": "200"})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def assert_clean_error(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    """A failure the user can read: the right exit code, the message, and no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)


def reseal(artifact: Path) -> None:
    """Rewrite file hashes after a deliberate change, as a wrong compiler would have written them."""
    from mlc import artifacts

    artifacts.seal(artifact, artifacts.load(artifact, verify=False))


def break_tvm_builds_of(monkeypatch, marker: str) -> None:
    """Make TVM's build (in-process: compile with isolate=False) fail on every module whose script holds `marker`
    (a dtype: the optional step that introduced it), as a TVM bug would."""
    from mlc.compiler import worker

    build = worker._build

    def broken(mod, *args):
        if marker in mod.script(show_meta=False):
            raise RuntimeError(f"Check failed: {marker} kernel blew up (injected)")
        return build(mod, *args)
    monkeypatch.setattr(worker, "_build", broken)


def mlp_onnx(path: Path, seed: int = 0) -> Path:
    """MatMul/Add/Relu MLP with a dynamic batch dimension."""
    rng = np.random.default_rng(seed)
    weights = {
        "w1": rng.standard_normal((16, 32)).astype(np.float32),
        "b1": rng.standard_normal(32).astype(np.float32),
        "w2": rng.standard_normal((32, 4)).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
            helper.make_node("Add", ["h", "b1"], ["h_bias"], name="fc1_bias"),
            helper.make_node("Relu", ["h_bias"], ["h_relu"], name="relu"),
            helper.make_node("MatMul", ["h_relu", "w2"], ["y"], name="fc2"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def torch_cnn_onnx(path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, 10),
    ).eval()
    torch.onnx.export(model, (torch.randn(1, 3, 16, 16),), str(path), dynamo=False, input_names=["image"],
                      output_names=["logits"], dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    return path


class TinyBert:
    """A 2-layer BERT-like encoder in torch: token + position embeddings, TransformerEncoder."""

    @staticmethod
    def build():
        import torch

        class Encoder(torch.nn.Module):
            def __init__(self, vocab=100, hidden=32, seq=16):
                super().__init__()
                self.tokens = torch.nn.Embedding(vocab, hidden)
                self.positions = torch.nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
                layer = torch.nn.TransformerEncoderLayer(hidden, 4, 64, dropout=0.0, batch_first=True)
                self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

            def forward(self, input_ids):
                return self.encoder(self.tokens(input_ids) + self.positions)

        torch.manual_seed(0)
        return Encoder().eval()


def torch_bert_onnx(path: Path) -> Path:
    import torch

    torch.onnx.export(TinyBert.build(), (torch.zeros(1, 16, dtype=torch.long),), str(path), dynamo=False,
                      input_names=["input_ids"], output_names=["hidden"],
                      dynamic_axes={"input_ids": {0: "batch"}, "hidden": {0: "batch"}})
    return path


GPT2_KV_LAYERS, GPT2_KV_HEADS, GPT2_KV_HEAD_DIM = 2, 2, 8


def gpt2_kv_onnx(path: Path) -> Path:
    """A 2-layer GPT-2 decoder step (seeded random weights, nothing downloaded) exported to ONNX with the KV cache as
    inputs: input_ids (batch, seq), attention_mask (batch, total), past_{key,value}_L (batch, heads, past, head_dim);
    outputs logits and present_{key,value}_L (batch, heads, total, head_dim), where total = past + seq."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    config = GPT2Config(n_layer=GPT2_KV_LAYERS, n_head=GPT2_KV_HEADS, n_embd=GPT2_KV_HEADS * GPT2_KV_HEAD_DIM,
                        vocab_size=64, n_positions=1024, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache()
            for layer in range(GPT2_KV_LAYERS):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            # Positions and the causal mask from the mask's values, not from shape arithmetic (arange over a
            # symbolic length), which TVM's importer cannot follow: key j is seen by query i when pos_j <= pos_i.
            positions = torch.cumsum(attention_mask, -1) - 1  # (batch, total)
            seq = input_ids.shape[1]
            query = attention_mask.sum(-1, keepdim=True) - seq + torch.arange(seq)  # (batch, seq): the last ones
            allowed = (positions[:, None, None, :] <= query[:, None, :, None]) & attention_mask.bool()[:, None, None, :]
            mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)  # (batch, 1, seq, total), added
            out = self.model(input_ids=input_ids, attention_mask=mask, past_key_values=cache,
                             position_ids=query, use_cache=True)
            present = out.past_key_values
            return (out.logits, *[t for layer in range(GPT2_KV_LAYERS)
                                  for t in (present.layers[layer].keys, present.layers[layer].values)])

    past_names = [f"past_{kind}_{layer}" for layer in range(GPT2_KV_LAYERS) for kind in ("key", "value")]
    present_names = [n.replace("past_", "present_") for n in past_names]
    batch, seq, past = 1, 3, 5
    example = (torch.zeros(batch, seq, dtype=torch.long), torch.ones(batch, past + seq, dtype=torch.long),
               *[torch.zeros(batch, GPT2_KV_HEADS, past, GPT2_KV_HEAD_DIM) for _ in past_names])
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
            "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total"} for n in present_names})
    with torch.no_grad():
        torch.onnx.export(Step(), example, str(path), dynamo=False, input_names=["input_ids", "attention_mask",
                          *past_names], output_names=["logits", *present_names], dynamic_axes=axes, opset_version=17)
    return path


def gpt2_kv_inputs(past: int, seq: int = 1, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Consistent inputs for gpt2_kv_onnx: total = past + seq."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 64, (batch, seq)).astype(np.int64),
             "attention_mask": np.ones((batch, past + seq), np.int64)}
    for layer in range(GPT2_KV_LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{layer}"] = rng.standard_normal(
                (batch, GPT2_KV_HEADS, past, GPT2_KV_HEAD_DIM)).astype(np.float32)
    return feeds


WORDS = ["cat", "dog", "bird", "fish"]  # string_model_onnx's vocabulary
LABELS = ["low", "high"]


def string_model_onnx(path: Path, sandwich: bool = False) -> Path:
    """A text classifier as sklearn-onnx or a tokenizer export writes them: words -> ids (LabelEncoder, a string op),
    then numbers (an embedding, a dense layer, ArgMax), then the class id -> its label (LabelEncoder again) beside the
    scores. `sandwich`: a string op between two numeric parts (the label re-read as a number)."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((len(WORDS) + 1, 8)).astype(np.float32), "table")
    dense = numpy_helper.from_array(rng.standard_normal((8, len(LABELS))).astype(np.float32), "dense")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [
        helper.make_node("LabelEncoder", ["words"], ["ids"], domain="ai.onnx.ml", keys_strings=WORDS,
                         values_int64s=list(range(len(WORDS))), default_int64=-1),
        helper.make_node("Add", ["ids", "one"], ["rows"]),  # unknown words (-1) read row 0
        helper.make_node("Gather", ["table", "rows"], ["vectors"]),
        helper.make_node("MatMul", ["vectors", "dense"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["class"], axis=1, keepdims=0),
        helper.make_node("LabelEncoder", ["class"], ["label"], domain="ai.onnx.ml", keys_int64s=[0, 1],
                         values_strings=LABELS, default_string="?"),
    ]
    outputs = [helper.make_tensor_value_info("label", TensorProto.STRING, ["n"]),
               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", len(LABELS)])]
    if sandwich:
        nodes.append(helper.make_node("LabelEncoder", ["label"], ["again"], domain="ai.onnx.ml",
                                      keys_strings=LABELS, values_floats=[0.0, 1.0]))
        nodes.append(helper.make_node("Neg", ["again"], ["negated"]))
        outputs.append(helper.make_tensor_value_info("negated", TensorProto.FLOAT, ["n"]))
    graph = helper.make_graph(nodes, "text_classifier",
                              [helper.make_tensor_value_info("words", TensorProto.STRING, ["n"])],
                              outputs, [table, dense, one])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), path)
    return path
