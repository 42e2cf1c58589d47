"""Zoo models written directly as ONNX graphs (no framework needed), with seeded weights."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # what opset 17 needs; newer onnx packages default to IRs that ONNX Runtime may not read yet


class _GraphBuilder:
    """Collects nodes and seeded initializers; names are generated so graphs read like code."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, value: np.ndarray, prefix: str = "const") -> str:
        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, *shape: int, scale: float | None = None, prefix: str = "w") -> str:
        fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
        scale = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), prefix)

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out + "_node", **attrs))
        return out

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        return self.op("Add", self.op("MatMul", x, self.weight(n_in, n_out)), self.weight(n_out, scale=0.1, prefix="b"))

    def model(self, name: str, inputs: list, outputs: list, final: str) -> onnx.ModelProto:
        # The node computing `final` writes the declared output name instead.
        producer = next(n for n in self.nodes if n.output[0] == final)
        producer.output[0] = outputs[0].name
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mlc-zoo",
                                  ir_version=IR_VERSION)
        onnx.checker.check_model(model)
        return model


def mlp() -> onnx.ModelProto:
    g = _GraphBuilder(seed=1)
    h = g.op("Relu", g.linear("x", 64, 128))
    h = g.op("Relu", g.linear(h, 128, 64))
    y = g.linear(h, 64, 10)
    return g.model(
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        y,
    )


def cnn() -> onnx.ModelProto:
    g = _GraphBuilder(seed=2)
    h = g.op("Relu", g.op("Conv", "image", g.weight(16, 3, 3, 3), g.weight(16, scale=0.1), pads=[1, 1, 1, 1]))
    h = g.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Relu", g.op("Conv", h, g.weight(32, 16, 3, 3), g.weight(32, scale=0.1), pads=[1, 1, 1, 1]))
    h = g.op("Flatten", g.op("GlobalAveragePool", h))
    y = g.op("Gemm", h, g.weight(32, 10), g.weight(10, scale=0.1))
    return g.model(
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        y,
    )


def transformer(layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 1000, seq: int = 32) -> onnx.ModelProto:
    """A BERT-style encoder: token + position embeddings, post-LN attention blocks, GELU MLP."""
    g = _GraphBuilder(seed=3)
    head_dim = hidden // heads
    ones, zeros = np.ones(hidden, np.float32), np.zeros(hidden, np.float32)

    def layer_norm(x: str) -> str:
        return g.op("LayerNormalization", x, g.const(ones, "ln_scale"), g.const(zeros, "ln_bias"), axis=-1,
                    epsilon=1e-12)

    def split_heads(x: str) -> str:  # [b, s, h] -> [b, heads, s, head_dim]
        shaped = g.op("Reshape", x, g.const(np.array([0, seq, heads, head_dim], np.int64), "shape"))
        return g.op("Transpose", shaped, perm=[0, 2, 1, 3])

    tokens = g.op("Gather", g.weight(vocab, hidden, scale=0.02, prefix="word_embeddings"), "input_ids")
    x = layer_norm(g.op("Add", tokens, g.weight(seq, hidden, scale=0.02, prefix="position_embeddings")))
    # attention_mask [b, s] of 1/0 -> additive bias [b, 1, 1, s] of 0/-10000
    mask = g.op("Cast", g.op("Unsqueeze", "attention_mask", g.const(np.array([1, 2], np.int64), "axes")),
                to=TensorProto.FLOAT)
    bias = g.op("Mul", g.op("Sub", g.const(np.float32(1.0)), mask), g.const(np.float32(-10000.0)))
    for _ in range(layers):
        q, k, v = (split_heads(g.linear(x, hidden, hidden)) for _ in range(3))
        scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                      g.const(np.float32(np.sqrt(head_dim))))
        probs = g.op("Softmax", g.op("Add", scores, bias), axis=-1)
        context = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        context = g.op("Reshape", context, g.const(np.array([0, seq, hidden], np.int64), "shape"))
        x = layer_norm(g.op("Add", x, g.linear(context, hidden, hidden)))
        up = g.linear(x, hidden, 4 * hidden)
        gelu = g.op("Mul", g.op("Mul", up, g.const(np.float32(0.5))),
                    g.op("Add", g.const(np.float32(1.0)),
                         g.op("Erf", g.op("Div", up, g.const(np.float32(np.sqrt(2.0)))))))
        x = layer_norm(g.op("Add", x, g.linear(gelu, 4 * hidden, hidden)))
    return g.model(
        "transformer",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", seq]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", seq]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", seq, hidden])],
        x,
    )
