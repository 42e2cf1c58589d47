"""Lowering of ONNX LSTM, GRU and RNN nodes (TVM 0.27's ONNX importer has no converter for them)
into MatMul/Add/Mul/Sigmoid/Tanh/Gather/Slice/Unsqueeze/Concat, following the ONNX operator spec.

The recurrence is unrolled over the sequence, so its length must be static; the batch stays
dynamic (no shape arithmetic is emitted). The input projection X.W^T is one MatMul over the whole
sequence; each step adds h.R^T. An absent initial state, or one built by ConstantOfShape(0) as
torch exports it, makes the first step skip the recurrent terms instead of multiplying by zeros."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mlc.passes.onnx import constant_values, eliminate_dead_nodes
from mlc.passes.registry import RNN_OPS, PassFailed

_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# Activations with their (alpha, beta) defaults from the ONNX spec; None: takes no parameter.
_ACTIVATIONS = {"Sigmoid": None, "Tanh": None, "Relu": None, "Softsign": None, "Softplus": None,
                "HardSigmoid": (0.2, 0.5), "LeakyRelu": (0.01, None), "Elu": (1.0, None),
                "ThresholdedRelu": (1.0, None), "Affine": (1.0, 0.0), "ScaledTanh": (1.0, 1.0)}


class _Graph:
    """Emits the nodes and constants of one lowered RNN node. None stands for an all-zero tensor."""

    def __init__(self, prefix: str, opset: int, dtype: np.dtype):
        self.prefix, self.opset, self.dtype = prefix, opset, dtype
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def _name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}/{hint}_{self.count}"

    def const(self, value, hint: str = "const", dtype=None) -> str:
        name = self._name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype or self.dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, out: Optional[str] = None, **attrs) -> str:
        out = out or self._name(op_type)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=self._name(op_type + "_node"), **attrs))
        return out

    def add(self, a: Optional[str], b: Optional[str]) -> Optional[str]:
        return b if a is None else a if b is None else self.op("Add", a, b)

    def mul(self, a: Optional[str], b: Optional[str]) -> Optional[str]:
        return None if a is None or b is None else self.op("Mul", a, b)

    def matmul(self, a: Optional[str], b: str) -> Optional[str]:
        return None if a is None else self.op("MatMul", a, b)

    def columns(self, x: str, start: int, end: int) -> str:
        """x[..., start:end]"""
        if self.opset < 10:
            return self.op("Slice", x, starts=[start], ends=[end], axes=[-1])
        i64 = np.int64
        return self.op("Slice", x, self.const([start], "start", i64), self.const([end], "end", i64),
                       self.const([-1], "axis", i64))

    def step(self, x: str, t: int, axis: int) -> str:
        """x.take(t, axis) as Slice + Squeeze: TVM imports a Gather with wrap-around index arithmetic
        that its FoldConstant then compiles once per step (minutes on a long sequence)."""
        if self.opset < 10:
            part = self.op("Slice", x, starts=[t], ends=[t + 1], axes=[axis])
        else:
            i64 = np.int64
            part = self.op("Slice", x, self.const([t], "start", i64), self.const([t + 1], "end", i64),
                           self.const([axis], "axis", i64))
        if self.opset < 13:
            return self.op("Squeeze", part, axes=[axis])
        return self.op("Squeeze", part, self.const([axis], "axes", np.int64))

    def unsqueeze(self, x: str, axes: list[int], out: Optional[str] = None) -> str:
        if self.opset < 13:
            return self.op("Unsqueeze", x, out=out, axes=axes)
        return self.op("Unsqueeze", x, self.const(axes, "axes", np.int64), out=out)

    def take(self, x: str, index: int, axis: int) -> str:
        """x.take(index, axis): drops the axis."""
        return self.op("Gather", x, self.const(np.int64(index), "index", np.int64), axis=axis)

    def clip(self, x: str, threshold: Optional[float]) -> str:
        if threshold is None:
            return x
        if self.opset < 11:
            return self.op("Clip", x, min=-threshold, max=threshold)
        return self.op("Clip", x, self.const(-threshold, "min"), self.const(threshold, "max"))

    def activation(self, kind: str, x: str, alpha: Optional[float], beta: Optional[float]) -> str:
        if kind in ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"):
            return self.op(kind, x)
        a, b = _ACTIVATIONS[kind]
        alpha = a if alpha is None else alpha
        beta = b if beta is None else beta
        if kind == "HardSigmoid":
            return self.op(kind, x, alpha=alpha, beta=beta)
        if kind in ("LeakyRelu", "Elu", "ThresholdedRelu"):
            return self.op(kind, x, alpha=alpha)
        if kind == "Affine":
            return self.op("Add", self.op("Mul", x, self.const(alpha)), self.const(beta))
        # ScaledTanh: alpha * tanh(beta * x)
        return self.op("Mul", self.op("Tanh", self.op("Mul", x, self.const(beta))), self.const(alpha))

    def join(self, parts: list[str], axis: int, out: str) -> str:
        if len(parts) == 1:
            return self.op("Identity", parts[0], out=out)
        return self.op("Concat", *parts, out=out, axis=axis)


def _evaluate_constants(model: onnx.ModelProto, names: set[str], constants: dict[str, np.ndarray],
                        producers: dict[str, onnx.NodeProto]) -> None:
    """Compute values built from constants only (paddle2onnx makes W/R/B with Concat/Slice/Reshape
    of initializers) with ONNX's reference evaluator, into `constants`. Others are left out."""
    order, seen = [], set()

    def visit(name: str) -> bool:  # whether `name` depends on constants only
        if name in constants or not name:
            return True
        node = producers.get(name)
        if node is None or node.op_type in RNN_OPS:
            return False
        if id(node) not in seen:
            if not all(visit(i) for i in node.input):
                return False
            seen.add(id(node))
            order.append(node)
        return True

    needed = [n for n in names if n and n not in constants and visit(n)]
    if not needed:
        return
    from onnx.reference import ReferenceEvaluator

    inputs = sorted({i for n in order for i in n.input if i in constants})
    graph = helper.make_graph(order, "weights", [], [helper.make_tensor_value_info(n, 0, None) for n in needed],
                              [numpy_helper.from_array(constants[i], i) for i in inputs])
    small = helper.make_model(graph, opset_imports=model.opset_import)
    for name, value in zip(needed, ReferenceEvaluator(small).run(None, {})):
        constants[name] = np.asarray(value)


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, or where it has weights left in their files (mlc.frontends.onnx_weights.load_light) a copy with
    those as graph inputs of their shape: ONNX Runtime's shape inference reads every initializer and cannot read
    them (it then gave up, and zoo:lstm-lm's second LSTM lost its sequence length). Shapes are computed from small,
    inline constants."""
    from mlc.frontends.onnx_weights import is_external

    if not any(is_external(t) for t in model.graph.initializer):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    moved = [t for t in out.graph.initializer if is_external(t)]
    kept = [t for t in out.graph.initializer if not is_external(t)]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    inputs = {i.name for i in out.graph.input}  # old IRs list weights as inputs too
    out.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                           for t in moved if t.name not in inputs)
    return out


def _dims(model: onnx.ModelProto) -> dict[str, list[Optional[int]]]:
    # ONNX Runtime's symbolic inference follows the Shape->Slice->Concat->Reshape chains that
    # torch.export puts between stacked LSTMs when batch is dynamic; ONNX's own loses the
    # sequence length there (even with data propagation). It refuses some graphs: then ONNX's.
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        inferred = SymbolicShapeInference.infer_shapes(_weights_as_inputs(model), auto_merge=True)
    except Exception:  # an op or pattern it does not know
        inferred = onnx.shape_inference.infer_shapes(model)
    dims = {}
    for info in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = info.type.tensor_type
        if t.HasField("shape"):
            dims[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    return dims


def _is_zeros(name: str, producers: dict[str, onnx.NodeProto], constants: dict[str, np.ndarray]) -> bool:
    """Whether a value is all zeros by construction: a zero constant, or ConstantOfShape(0) seen
    through the Slice/Reshape/Expand/Identity/Unsqueeze/Squeeze/Cast that exporters put after it."""
    for _ in range(16):
        if name in constants:
            return not np.any(constants[name])
        node = producers.get(name)
        if node is None:
            return False
        if node.op_type == "ConstantOfShape":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            return value is None or not np.any(numpy_helper.to_array(value))
        if node.op_type not in ("Slice", "Reshape", "Expand", "Identity", "Unsqueeze", "Squeeze", "Cast", "Tile"):
            return False
        name = node.input[0]
    return False


def _attrs(node: onnx.NodeProto) -> dict:
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else [x.decode() if isinstance(x, bytes) else x for x in v]
            if isinstance(v, list) else v for k, v in values.items()}


@dataclass
class _Rnn:
    """An LSTM/GRU/RNN node's settings, read from its attributes and constant weights and checked."""
    kind: str
    x: str
    W: np.ndarray
    R: np.ndarray
    B: np.ndarray
    P: Optional[np.ndarray]  # LSTM peepholes
    hidden: int
    steps: int
    direction: str
    layout: int
    activations: list
    params: list  # (alpha, beta) per activation
    clip: object
    input_forget: bool
    linear_before_reset: bool

    @property
    def time_axis(self) -> int:  # of X and Y
        return 1 if self.layout else 0

    @property
    def dir_axis(self) -> int:  # of initial_h and Y_h
        return 1 if self.layout else 0

    @property
    def directions(self) -> int:
        return self.W.shape[0]

    @property
    def gates(self) -> int:
        return _GATES[self.kind]

    @property
    def per_dir(self) -> int:  # activations per direction
        return len(_DEFAULT_ACTIVATIONS[self.kind])

    def activate(self, g: _Graph, index: int, value: str, clipped: bool = True) -> str:
        # clip bounds gate pre-activations; like ONNX Runtime, not the cell state LSTM's h() reads
        return g.activation(self.activations[index], g.clip(value, self.clip) if clipped else value,
                            *self.params[index])


@dataclass
class _DirectionWeights:
    """One direction's recurrent weights as graph constants (transposed for h @ R^T)."""
    RT: Optional[str] = None  # LSTM and RNN
    RT_zr: Optional[str] = None  # GRU's update and reset gates
    RT_h: Optional[str] = None  # GRU's candidate
    rb_h: Optional[str] = None  # GRU's candidate recurrent bias
    peepholes: Optional[tuple] = None  # LSTM's i, o, f


def _activations(node: onnx.NodeProto, kind: str, attrs: dict, directions: int) -> tuple[list, list]:
    """The node's activation per gate function and direction, with their (alpha, beta)."""
    per_dir = len(_DEFAULT_ACTIVATIONS[kind])
    activations = attrs.get("activations") or _DEFAULT_ACTIVATIONS[kind] * directions
    if len(activations) == per_dir and directions == 2:
        activations = activations * 2
    unknown = sorted(set(activations) - set(_ACTIVATIONS))
    if unknown:
        raise PassFailed(f"{node.name or kind}: activation(s) {', '.join(unknown)} are not supported")
    # activation_alpha/beta are consumed in order by the activations that take them (as ONNX Runtime reads them).
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    params = []
    for kind_ in activations:
        defaults = _ACTIVATIONS[kind_] or (None, None)
        alpha = alphas.pop(0) if defaults[0] is not None and alphas else None
        beta = betas.pop(0) if defaults[1] is not None and betas else None
        params.append((alpha, beta))
    return activations, params


def _read_rnn(node: onnx.NodeProto, g: _Graph, attrs: dict, inputs: list, constants, dims) -> _Rnn:
    kind = node.op_type
    x, w_name, r_name, b_name = inputs[:4]
    p_name = inputs[7] if kind == "LSTM" else ""
    for label, name in (("W", w_name), ("R", r_name), ("B", b_name), ("P", p_name)):
        if name and name not in constants:
            raise PassFailed(f"{node.name or kind}: its {label} weights are computed, not constant")
    layout = int(attrs.get("layout", 0))
    time_axis = 1 if layout else 0
    x_dims = dims.get(x)
    if not x_dims or len(x_dims) != 3 or x_dims[time_axis] is None:
        raise PassFailed(f"{node.name or kind}: the sequence length of its input must be static to unroll it "
                         "(fix it with --input-shape)")
    W, R = constants[w_name].astype(g.dtype), constants[r_name].astype(g.dtype)
    directions = W.shape[0]
    hidden = int(attrs.get("hidden_size", R.shape[-1]))
    B = (constants[b_name].astype(g.dtype) if b_name
         else np.zeros((directions, 2 * _GATES[kind] * hidden), g.dtype))
    P = constants[p_name].astype(g.dtype) if p_name else None
    direction = attrs.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional") or (direction == "bidirectional") != (directions == 2):
        raise PassFailed(f"{node.name or kind}: direction '{direction}' does not fit weights for "
                         f"{directions} direction(s)")
    activations, params = _activations(node, kind, attrs, directions)
    return _Rnn(kind, x, W, R, B, P, hidden, x_dims[time_axis], direction, layout, activations, params,
                attrs.get("clip"), bool(attrs.get("input_forget", 0)), bool(attrs.get("linear_before_reset", 0)))


def _direction_weights(g: _Graph, rnn: _Rnn, d: int, Rb: np.ndarray) -> _DirectionWeights:
    H, R, P = rnn.hidden, rnn.R, rnn.P
    weights = _DirectionWeights()
    if rnn.kind == "GRU":
        weights.RT_zr, weights.RT_h = g.const(R[d, :2 * H].T.copy(), "Rzr"), g.const(R[d, 2 * H:].T.copy(), "Rh")
        weights.rb_h = g.const(Rb[2 * H:], "Rbh")
    else:
        weights.RT = g.const(R[d].T.copy(), "R")
    if P is not None:  # peepholes, stored i, o, f
        weights.peepholes = tuple(g.const(P[d, k * H:(k + 1) * H], "P") for k in range(3))
    return weights


def _cell_step(g: _Graph, rnn: _Rnn, d: int, weights: _DirectionWeights, xt: str, h, c, one: str):
    """One time step of direction `d`'s cell on input xt: (h, c) after it (c: LSTM's, else unchanged)."""
    H = rnn.hidden

    def f(i, v, clipped=True):
        return rnn.activate(g, d * rnn.per_dir + i, v, clipped)

    if rnn.kind == "LSTM":
        pre = g.add(xt, g.matmul(h, weights.RT))
        gi, go, gf, gc = (g.columns(pre, k * H, (k + 1) * H) for k in range(4))
        if rnn.P is not None and c is not None:
            p_i, _, p_f = weights.peepholes
            gi = g.add(gi, g.mul(p_i, c))
            gf = g.add(gf, g.mul(p_f, c))
        i = f(0, gi)
        forget = g.op("Sub", one, i) if rnn.input_forget else f(0, gf)
        c = g.add(g.mul(forget, c), g.op("Mul", i, f(1, gc)))
        if rnn.P is not None:
            go = g.add(go, g.mul(weights.peepholes[1], c))
        h = g.op("Mul", f(0, go), f(2, c, clipped=False))
    elif rnn.kind == "GRU":
        zr = g.add(g.columns(xt, 0, 2 * H), g.matmul(h, weights.RT_zr))
        z, r = f(0, g.columns(zr, 0, H)), f(0, g.columns(zr, H, 2 * H))
        xh = g.columns(xt, 2 * H, 3 * H)
        if rnn.linear_before_reset:
            candidate = f(1, g.add(xh, g.op("Mul", r, g.add(g.matmul(h, weights.RT_h), weights.rb_h))))
        else:
            candidate = f(1, g.add(xh, g.matmul(g.mul(r, h), weights.RT_h)))
        h = g.add(g.op("Mul", g.op("Sub", one, z), candidate), g.mul(z, h))
    else:
        h = f(0, g.add(xt, g.matmul(h, weights.RT)))
    return h, c


def _lower_direction(g: _Graph, rnn: _Rnn, d: int, initial_h, initial_c, one: str, lengths, zero):
    """Direction `d` unrolled: (its Y, the steps' outputs concatenated on the time axis; last h; last c)."""
    H, gates = rnn.hidden, rnn.gates
    Wb, Rb = rnn.B[d, :gates * H], rnn.B[d, gates * H:]
    if rnn.kind == "GRU" and rnn.linear_before_reset:  # Rb_h stays inside r * (h.Rh^T + Rb_h)
        input_bias = np.concatenate([Wb[:2 * H] + Rb[:2 * H], Wb[2 * H:]])
    else:
        input_bias = Wb + Rb
    xw = g.op("Add", g.op("MatMul", rnn.x, g.const(rnn.W[d].T.copy(), "W")), g.const(input_bias, "bias"))
    h = g.take(initial_h, d, rnn.dir_axis) if initial_h else None
    c = g.take(initial_c, d, rnn.dir_axis) if initial_c else None
    weights = _direction_weights(g, rnn, d, Rb)
    steps = rnn.steps
    order = (range(steps) if rnn.direction == "forward" or (rnn.direction == "bidirectional" and d == 0)
             else range(steps - 1, -1, -1))
    outputs: dict[int, str] = {}
    for t in order:
        xt = g.step(xw, t, rnn.time_axis)
        h_before, c_before = h, c
        h, c = _cell_step(g, rnn, d, weights, xt, h, c, one)
        if lengths is not None:
            valid = g.op("Less", g.const(t, "t", np.int64), lengths)  # [batch, 1]
            outputs[t] = g.op("Where", valid, h, zero)
            h = g.op("Where", valid, h, h_before or zero)
            c = g.op("Where", valid, c, c_before or zero) if c is not None else None
        else:
            outputs[t] = h
    y = g.op("Concat", *(g.unsqueeze(outputs[t], [1, 2] if rnn.layout else [0, 1]) for t in range(steps)),
             axis=rnn.time_axis)
    return y, h, c


def _lower(node: onnx.NodeProto, g: _Graph, constants, dims, producers, zeros_allowed: bool) -> None:
    attrs = _attrs(node)
    inputs = list(node.input) + [""] * (8 - len(node.input))
    rnn = _read_rnn(node, g, attrs, inputs, constants, dims)
    seq_lens, h0 = inputs[4], inputs[5]
    c0 = inputs[6] if rnn.kind == "LSTM" else ""
    initial_h = None if not h0 or (zeros_allowed and _is_zeros(h0, producers, constants)) else h0
    initial_c = None if not c0 or (zeros_allowed and _is_zeros(c0, producers, constants)) else c0
    one = g.const(1.0, "one")
    # sequence_lens: past a batch row's length its state stays and its Y is 0 (a reverse pass starts at its end)
    lengths = g.unsqueeze(g.op("Cast", seq_lens, to=onnx.TensorProto.INT64), [1]) if seq_lens else None
    zero = g.const(0.0, "zero") if seq_lens else None
    ys, last_h, last_c = [], [], []
    for d in range(rnn.directions):
        y, h, c = _lower_direction(g, rnn, d, initial_h, initial_c, one, lengths, zero)
        ys.append(y)
        last_h.append(h)
        last_c.append(c)
    dir_axis = rnn.dir_axis
    outs = list(node.output) + [""] * 3
    if outs[0]:
        g.join(ys, 2 if rnn.layout else 1, outs[0])
    if outs[1]:
        g.join([g.unsqueeze(v, [dir_axis]) for v in last_h], dir_axis, outs[1])
    if rnn.kind == "LSTM" and outs[2]:
        g.join([g.unsqueeze(v, [dir_axis]) for v in last_c], dir_axis, outs[2])


def lower_rnn(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """Replace every LSTM/GRU/RNN node of the main graph by its unrolled equivalent."""
    if not any(n.op_type in RNN_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    constants = constant_values(model)
    dims = _dims(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    weights = {i for n in model.graph.node if n.op_type in RNN_OPS for k, i in enumerate(n.input) if k in (1, 2, 3, 7)}
    _evaluate_constants(model, weights, constants, producers)
    nodes, initializers = [], []
    for index, node in enumerate(model.graph.node):
        if node.op_type not in RNN_OPS or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        dtype = constants[node.input[1]].dtype if node.input[1] in constants else np.float32
        g = _Graph(f"{node.name or node.op_type}#{index}", opset, dtype)
        _lower(node, g, constants, dims, producers, zeros_allowed=True)
        nodes.extend(g.nodes)
        initializers.extend(g.initializers)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(initializers)
    return eliminate_dead_nodes(out, {})  # the original W/R/B and what computed them
