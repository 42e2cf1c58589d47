"""Zoo models in Keras, seeded random weights built in code. Each `NAME()` returns a FrameworkModel;
`NAME_model()` returns the bare keras.Model (for saving it as a file). Import only in the
frontend worker: this imports tensorflow."""

from __future__ import annotations

from mlc.frontends import tensorflow as tf_frontend
from mlc.frontends.base import FrameworkModel, InputDecl

SEED = 0


def _keras():
    tf_frontend.import_tensorflow()  # quiet logging before keras imports tensorflow
    import keras

    keras.utils.set_random_seed(SEED)
    return keras


def cnn_model():
    """NCHW input like the other frameworks' CNNs; permuted to NHWC, which TF's CPU kernels need."""
    keras = _keras()
    layers = keras.layers
    image = keras.Input((3, 32, 32), name="image")
    x = layers.Permute((2, 3, 1))(image)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(32, 3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling2D()(x)
    logits = layers.Dense(10, name="logits")(x)
    return keras.Model(image, logits, name="cnn")


def cnn() -> FrameworkModel:
    return tf_frontend.from_keras(cnn_model(), [InputDecl("image", "float32", ["batch", 3, 32, 32])], {"batch": 1})


def _lstm_lm_model(vocab: int, embedding: int, layers_: int, hidden: int, seq: int, name: str):
    keras = _keras()
    layers = keras.layers
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = layers.Embedding(vocab, embedding)(tokens)
    for _ in range(layers_):
        # Keras' defaults (tanh/sigmoid, no recurrent dropout, unroll=False) are what tf2onnx
        # rewrites into one ONNX LSTM op per layer.
        x = layers.LSTM(hidden, return_sequences=True)(x)
    logits = layers.Dense(vocab, name="logits")(x)
    return keras.Model(tokens, logits, name=name)


def lstm_model():
    return _lstm_lm_model(1000, 32, 1, 64, 16, "lstm")


def lstm() -> FrameworkModel:
    """Small LSTM language model: vocab 1000, embedding 32, 1 layer, hidden 64, seq 16."""
    return tf_frontend.from_keras(lstm_model(), [InputDecl("tokens", "int32", ["batch", 16])], {"batch": 1})


def lstm_lm_model():
    return _lstm_lm_model(10001, 128, 3, 256, 50, "lstm_lm")


def lstm_lm() -> FrameworkModel:
    """Seed 001's stacked LSTM LM: vocab 10001, embedding 128, 3 layers, hidden 256, seq 50 (batch 128)."""
    return tf_frontend.from_keras(lstm_lm_model(), [InputDecl("tokens", "int32", ["batch", 50])], {"batch": 128})


VOCAB, HIDDEN, LAYERS, HEADS, INTERMEDIATE, MAX_POSITIONS = 1000, 128, 2, 2, 512, 512


def bert_tiny_model():
    """BERT-like encoder (post-LayerNorm, GELU); outputs last_hidden_state and the tanh pooler."""
    keras = _keras()
    layers, ops = keras.layers, keras.ops

    class Positions(layers.Layer):
        """Adds learned position embeddings for the input's own length (the seq dim is dynamic)."""

        def build(self, shape):
            self.table = self.add_weight((MAX_POSITIONS, HIDDEN), initializer="random_normal", name="table")

        def call(self, x):
            return x + ops.take(self.table, ops.arange(ops.shape(x)[1]), axis=0)[None]

    def gelu(x):  # exact GELU through erf: TF's own gelu uses Erfc, which tf2onnx cannot convert
        return 0.5 * x * (1.0 + ops.erf(x * 0.7071067811865476))

    input_ids = keras.Input((None,), dtype="int32", name="input_ids")
    attention_mask = keras.Input((None,), dtype="int32", name="attention_mask")
    x = layers.Embedding(VOCAB, HIDDEN)(input_ids)
    x = layers.LayerNormalization(epsilon=1e-12)(Positions()(x))
    mask = ops.cast(attention_mask[:, None, :], "bool")  # (batch, 1, keys): every query sees the same keys
    for _ in range(LAYERS):
        attended = layers.MultiHeadAttention(HEADS, HIDDEN // HEADS)(x, x, attention_mask=mask)
        x = layers.LayerNormalization(epsilon=1e-12)(x + attended)
        ffn = layers.Dense(HIDDEN)(layers.Activation(gelu)(layers.Dense(INTERMEDIATE)(x)))
        x = layers.LayerNormalization(epsilon=1e-12)(x + ffn)
    pooled = layers.Dense(HIDDEN, activation="tanh", name="pooler_output")(x[:, 0])
    hidden = layers.Identity(name="last_hidden_state")(x)
    return keras.Model([input_ids, attention_mask], [hidden, pooled], name="bert_tiny")


def bert_tiny() -> FrameworkModel:
    """vocab 1000, hidden 128, 2 layers, 2 heads, intermediate 512; batch and seq dynamic."""
    inputs = [InputDecl("input_ids", "int32", ["batch", "seq"]), InputDecl("attention_mask", "int32", ["batch", "seq"])]
    return tf_frontend.from_keras(bert_tiny_model(), inputs, {"batch": 1, "seq": 8})


def save(name: str, path: str) -> None:
    """Save zoo model `name` as a user would: a .keras or .h5 file, else a SavedModel directory."""
    model = globals()[f"{name}_model"]()
    if path.endswith((".keras", ".h5")):
        model.save(path)
    else:
        model.export(path, verbose=False)
