"""Zoo models in PaddlePaddle, seeded random weights built in code. Each `NAME()` returns a
FrameworkModel; `NAME_layer()` returns the bare nn.Layer. Import only in the frontend worker: this
imports paddle. Every forward names its first argument `self`: paddle.jit.save requires it."""

from __future__ import annotations

from mlc.frontends import paddle as paddle_frontend
from mlc.frontends.base import FrameworkModel, InputDecl
from mlc.frontends.onnx_export import trace_shape

SEED = 0


def _paddle():
    paddle = paddle_frontend.import_paddle()
    paddle.seed(SEED)
    return paddle


def cnn_layer():
    nn = _paddle().nn
    return nn.Sequential(
        nn.Conv2D(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
        nn.Conv2D(16, 32, 3, padding=1), nn.BatchNorm2D(32), nn.ReLU(),
        nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(32, 10),
    )


def cnn() -> FrameworkModel:
    return paddle_frontend.from_layer(cnn_layer(), [InputDecl("image", "float32", ["batch", 3, 32, 32])],
                                      {"batch": 1}, ["logits"])


def _lstm_lm_layer(vocab: int, embedding: int, layers: int, hidden: int):
    nn = _paddle().nn

    class LstmLM(nn.Layer):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, embedding)
            self.lstm = nn.LSTM(embedding, hidden, num_layers=layers)  # batch-major, zero initial state
            self.head = nn.Linear(hidden, vocab)

        def forward(self, tokens):
            states, _ = self.lstm(self.embedding(tokens))
            return self.head(states)

    return LstmLM()


def lstm_layer():
    return _lstm_lm_layer(1000, 32, 1, 64)


def lstm() -> FrameworkModel:
    """Small LSTM language model: vocab 1000, embedding 32, 1 layer, hidden 64, seq 16."""
    return paddle_frontend.from_layer(lstm_layer(), [InputDecl("tokens", "int64", ["batch", 16])], {"batch": 1},
                                      ["logits"])


def lstm_lm_layer():
    return _lstm_lm_layer(10001, 128, 3, 256)


def lstm_lm() -> FrameworkModel:
    """Seed 001's stacked LSTM LM: vocab 10001, embedding 128, 3 layers, hidden 256, seq 50 (batch 128)."""
    return paddle_frontend.from_layer(lstm_lm_layer(), [InputDecl("tokens", "int64", ["batch", 50])],
                                      {"batch": 128}, ["logits"])


def _bert_layer(vocab: int, hidden: int, layers: int, heads: int, intermediate: int, max_positions: int = 512):
    """BERT encoder (post-LayerNorm, exact GELU); returns last_hidden_state and the tanh pooler."""
    paddle = _paddle()
    nn = paddle.nn

    class Bert(nn.Layer):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(vocab, hidden)
            self.positions = nn.Embedding(max_positions, hidden)
            self.norm = nn.LayerNorm(hidden, epsilon=1e-12)
            block = nn.TransformerEncoderLayer(hidden, heads, intermediate, dropout=0.0, activation="gelu")
            self.encoder = nn.TransformerEncoder(block, layers)
            self.pooler = nn.Linear(hidden, hidden)

        def forward(self, input_ids, attention_mask):
            positions = paddle.arange(paddle.shape(input_ids)[1])  # the seq dim is dynamic
            x = self.norm(self.words(input_ids) + self.positions(positions))
            # Additive mask over the keys, broadcast over heads and queries, as BERT does.
            mask = (1.0 - attention_mask.astype("float32")).unsqueeze([1, 2]) * -10000.0
            x = self.encoder(x, src_mask=mask)
            return x, paddle.tanh(self.pooler(x[:, 0]))

    return Bert()


def _bert(layer) -> FrameworkModel:
    inputs = [InputDecl("input_ids", "int64", ["batch", "seq"]), InputDecl("attention_mask", "int64", ["batch", "seq"])]
    return paddle_frontend.from_layer(layer, inputs, {"batch": 1, "seq": 8}, ["last_hidden_state", "pooler_output"])


def bert_tiny_layer():
    return _bert_layer(vocab=1000, hidden=128, layers=2, heads=2, intermediate=512)


def bert_tiny() -> FrameworkModel:
    """vocab 1000, hidden 128, 2 layers, 2 heads, intermediate 512; batch and seq dynamic."""
    return _bert(bert_tiny_layer())


def bert_base_layer():
    # bert-base-uncased's shape (PaddleNLP's, in seed 000), built with paddle.nn's encoder.
    return _bert_layer(vocab=30522, hidden=768, layers=12, heads=12, intermediate=3072)


def bert_base() -> FrameworkModel:
    """vocab 30522, hidden 768, 12 layers, 12 heads, intermediate 3072; batch and seq dynamic."""
    return _bert(bert_base_layer())


def save(name: str, prefix: str) -> None:
    """Save zoo model `name` with paddle.jit.save, as a user would (batch dynamic): PREFIX.json and
    PREFIX.pdiparams, or the legacy PREFIX.pdmodel when FLAGS_enable_pir_api=0 is set before paddle starts."""
    paddle = _paddle()
    model = globals()[name]()
    layer = globals()[f"{name}_layer"]()
    layer.eval()
    spec = [paddle.static.InputSpec(trace_shape(decl, {"batch"}, model.example_sizes), decl.dtype, decl.name)
            for decl in model.inputs]
    paddle.jit.save(layer, prefix, input_spec=spec)
