"""ONNX-level passes (run in the mlc process, before the TVM worker) and their runner.

Each pass is `fn(model, config) -> model` and raises PassFailed (or anything else) when it cannot
handle a model; `run()` times them, counts nodes and op types before/after, dumps the graph after
each pass when asked, and skips a failing pass with a note unless the user named it."""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mlc import child_process
from mlc.frontends import onnx_weights
from mlc.frontends.onnx_weights import FOLDED, Values, materialized, nbytes, weights_in
from mlc.passes.registry import REGISTRY, PassFailed, Step
from mlc.errors import UnsupportedModelError


def _clone(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _copy_with_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return prune_initializers(out)


def prune_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop initializers no node or graph output reads (e.g. weights a pass rewrote)."""
    used = onnx_weights.names_read(model.graph) | {o.name for o in model.graph.output}  # subgraphs' too
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        dropped = {t.name for t in model.graph.initializer} - {t.name for t in keep}
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
        # Inputs that were dropped weights go; real inputs stay even when unread (the artifact takes them).
        inputs = [i for i in model.graph.input if i.name not in dropped]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
    return model


# Initializers above this many bytes hold weights, never shape values: shape inference needs only their type.
_WEIGHT_BYTES = onnx_weights.WEIGHT_BYTES


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with the data of its weights left out (name, type and dims kept). ONNX shape inference
    serialises the whole model on every call: with bert-base's 440 MB of weights a call took seconds."""
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph, source = light.graph, model.graph
    graph.name = source.name
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(graph, field).extend(getattr(source, field))
    for t in source.initializer:
        if nbytes(t) > _WEIGHT_BYTES:
            graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
        else:
            graph.initializer.append(t)
    return light


def infer_shapes(model: onnx.ModelProto, data_prop: bool = False) -> onnx.ModelProto:
    """ONNX shape inference on the model without its weights' data: the value_info of the real model's values."""
    return onnx.shape_inference.infer_shapes(_without_weights(model), data_prop=data_prop)


def with_inferred_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model carrying the value_info (and refined output types) that shape inference finds."""
    inferred = infer_shapes(model, data_prop=True)
    out = _clone(model)
    for field in ("value_info", "output"):
        del getattr(out.graph, field)[:]
        getattr(out.graph, field).extend(getattr(inferred.graph, field))
    return out


def constant_values(model: onnx.ModelProto, max_bytes: Optional[int] = None) -> Values:
    """Initializers and Constant-node values by name (with max_bytes: only those up to that size); a weight left in
    its file (mlc.frontends.onnx_weights) is read when asked for."""
    values = Values(model.graph.initializer, max_bytes)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def readers_of(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """{value name: the nodes of the main graph that read it, in graph order}."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _elem_type(model: onnx.ModelProto) -> dict[str, int]:
    types = {}
    for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    for t in model.graph.initializer:
        types[t.name] = t.data_type
    return types


def eliminate_dead_nodes(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """Identity, inference Dropout and same-type Cast are bypassed; nodes nothing needs are dropped."""
    model, weights = _weights_as_inputs(model)  # a copy: node inputs are rewritten in place below
    return _weights_back(_eliminate_dead_nodes(model), weights)


def _eliminate_dead_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    graph_outputs = {o.name for o in model.graph.output}
    types = _elem_type(infer_shapes(model))
    rename: dict[str, str] = {}
    nodes = []
    for node in model.graph.node:
        node.input[:] = [rename.get(i, i) for i in node.input]
        passthrough = (node.op_type == "Identity"
                       or (node.op_type == "Dropout" and (len(node.output) < 2 or not node.output[1])
                           and (len(node.input) < 3 or not node.input[2]))
                       or (node.op_type == "Cast" and node.input[0] in types
                           and types[node.input[0]] == next(a.i for a in node.attribute if a.name == "to")))
        if passthrough and node.domain in ("", "ai.onnx") and node.output[0] not in graph_outputs:
            rename[node.output[0]] = node.input[0]
            continue
        nodes.append(node)
    return _eliminate_unread_nodes(_copy_with_nodes(model, nodes))


def fold_batchnorm(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """Conv/Gemm -> BatchNormalization (inference, constant parameters, Conv/Gemm output read only by
    the BN) becomes one Conv/Gemm with W' = W * scale/sqrt(var+eps) per output channel and a new bias."""
    constants = constant_values(model)
    readers = Counter(i for n in model.graph.node for i in n.input)
    graph_outputs = {o.name for o in model.graph.output}
    producers = {o: n for n in model.graph.node for o in n.output}
    new_inits: list[onnx.TensorProto] = []
    folded: dict[int, onnx.NodeProto] = {}  # id(BN node) -> replacement
    dropped: set[int] = set()
    for bn in model.graph.node:
        if not _inference_batchnorm(bn):
            continue
        prev = producers.get(bn.input[0])
        if prev is None or prev.op_type not in ("Conv", "Gemm") or readers[prev.output[0]] != 1 \
                or prev.output[0] in graph_outputs:
            continue
        if any(i not in constants for i in bn.input[1:5]) or prev.input[1] not in constants \
                or (len(prev.input) > 2 and prev.input[2] and prev.input[2] not in constants):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in prev.attribute}
        if prev.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                                        or attrs.get("beta", 1.0) != 1.0):
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        scale, b, mean, var = (constants[i].astype(np.float64) for i in bn.input[1:5])
        w = constants[prev.input[1]]
        factor = scale / np.sqrt(var + eps)
        bias = constants[prev.input[2]].astype(np.float64) if len(prev.input) > 2 and prev.input[2] else 0.0
        new_bias = (bias - mean) * factor + b
        if prev.op_type == "Conv":
            new_w = w * factor.reshape(-1, *([1] * (w.ndim - 1)))
        elif attrs.get("transB", 0):  # Gemm, W is [N, K]
            new_w = w * factor[:, None]
        else:  # W is [K, N]
            new_w = w * factor[None, :]
        w_name, b_name = f"{prev.output[0]}_bnfold_w", f"{prev.output[0]}_bnfold_b"
        new_inits += [numpy_helper.from_array(new_w.astype(w.dtype), w_name),
                      numpy_helper.from_array(new_bias.astype(w.dtype), b_name)]
        replacement = onnx.NodeProto()
        replacement.CopyFrom(prev)
        replacement.input[:] = [prev.input[0], w_name, b_name]
        replacement.output[:] = [bn.output[0]]
        folded[id(bn)] = replacement
        dropped.add(id(prev))
    if not folded:
        return model
    out = _copy_with_nodes(model, [folded.get(id(n), n) for n in model.graph.node if id(n) not in dropped])
    out.graph.initializer.extend(new_inits)
    return out


def flatten_concats(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """A Concat of a Concat's output along the same axis reads that Concat's inputs instead. DenseNet's block is
    x[k+1] = Concat(x[k], new[k]): each x[k], read by the next Concat and by its layer's BatchNorm, was copied whole
    (quadratic in the block's depth); flattened, x[k] is read only by the BatchNorm's kernel, which fuses it."""
    def axis(node: onnx.NodeProto) -> Optional[int]:
        return next((a.i for a in node.attribute if a.name == "axis"), None)

    flat: dict[str, tuple[int, list[str]]] = {}  # a Concat's output -> (its axis, the inputs it flattens to)
    nodes, changed = [], False
    for node in model.graph.node:
        if node.op_type == "Concat" and node.domain in ("", "ai.onnx"):
            along = axis(node)
            inputs = [p for i in node.input for p in (flat[i][1] if flat.get(i, (None,))[0] == along else [i])]
            flat[node.output[0]] = (along, inputs)
            if inputs != list(node.input):
                node, original = onnx.NodeProto(), node
                node.CopyFrom(original)
                node.input[:] = inputs
                changed = True
        nodes.append(node)
    return _eliminate_unread_nodes(_copy_with_nodes(model, nodes)) if changed else model


def _inference_batchnorm(node: onnx.NodeProto) -> bool:
    return (node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx")
            and len([o for o in node.output if o]) == 1
            and not any(a.name == "training_mode" and a.i for a in node.attribute))


def batchnorm_as_affine(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """An inference BatchNormalization that fold_batchnorm left (DenseNet's, after a concatenation) becomes x * a + b
    per channel, absorbing the Mul/Add by per-channel constants after it (Caffe2's Scale layer): TVM's batch_norm
    computes (x - mean) / sqrt(var + eps) per element, and each Mul/Add is more arithmetic per element. After
    constant_folding, which makes the Scale layer's Unsqueezed parameters initializers."""
    constants = constant_values(model)
    readers = readers_of(model)
    graph_outputs = {o.name for o in model.graph.output}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in infer_shapes(model).graph.value_info
             if v.type.tensor_type.HasField("shape")}
    ranks.update((v.name, len(v.type.tensor_type.shape.dim)) for v in model.graph.input)
    replaced: dict[int, list] = {}  # id(BN node) -> its Mul and Add; the nodes it absorbed map to []
    new_inits: list[onnx.TensorProto] = []
    for bn in model.graph.node:
        if (not _inference_batchnorm(bn) or ranks.get(bn.input[0], 0) < 2
                or any(i not in constants or np.ndim(constants[i]) != 1 for i in bn.input[1:5])):  # (not spatial=0)
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (constants[i].astype(np.float64) for i in bn.input[1:5])
        scale = gamma / np.sqrt(var + eps)
        shift = beta - mean * scale
        rank, out, absorbed = ranks[bn.input[0]], bn.output[0], []
        while (out not in graph_outputs and len(readers.get(out, ())) == 1
               and (factor := _channel_constant(readers[out][0], out, constants, rank, len(scale))) is not None):
            node = readers[out][0]
            if node.op_type == "Mul":
                scale, shift = scale * factor, shift * factor
            else:
                shift = shift + factor
            absorbed.append(node)
            out = node.output[0]
        dtype = constants[bn.input[1]].dtype
        shape = [len(scale)] + [1] * (rank - 2)
        a_name, b_name, mid = f"{out}_affine_scale", f"{out}_affine_shift", f"{out}_affine_scaled"
        new_inits += [numpy_helper.from_array(scale.astype(dtype).reshape(shape), a_name),
                      numpy_helper.from_array(shift.astype(dtype).reshape(shape), b_name)]
        replaced[id(bn)] = [helper.make_node("Mul", [bn.input[0], a_name], [mid], name=f"{bn.name}_scale"),
                            helper.make_node("Add", [mid, b_name], [out], name=f"{bn.name}_shift")]
        replaced.update((id(node), []) for node in absorbed)
    if not replaced:
        return model
    nodes = [new for n in model.graph.node for new in replaced.get(id(n), [n])]
    out_model = _copy_with_nodes(model, nodes)
    out_model.graph.initializer.extend(new_inits)
    return out_model


def _channel_constant(node: onnx.NodeProto, value: str, constants, rank: int, channels: int) -> Optional[np.ndarray]:
    """The per-channel values (axis 1 of a rank-`rank` tensor) of the constant that `node`, a Mul or Add, applies to
    `value`; None for any other node or a constant that varies along another axis."""
    if node.op_type not in ("Mul", "Add") or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    other = node.input[1] if node.input[0] == value else node.input[0]
    if other == value or other not in constants:
        return None
    c = np.asarray(constants[other])
    if c.dtype.kind != "f" or c.ndim > rank:
        return None
    dims = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(dims) if i != 1) or dims[1] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (channels,))


_FOLDING_ROUNDS = 8
_FOLDED_WEIGHT_BYTES = 1 << 20  # constant_folding hands onnxslim the initializers under this whatever reads them


def constant_folding(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    import onnxslim

    # onnxslim prints a summary table to stdout; keep the CLI output ours. Its FusionGemm turns an
    # N-D MatMul+Add into Reshape -> Gemm -> Reshape: Relax imports a Gemm as the same matmul + add, so
    # nothing is gained, and where the last Reshape is a graph output TVM cannot make it a view and
    # copies the tensor (seed 001's 6400x10001 logits: a 256 MB copy, 440 ms of a 1.1 s run).
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Our shape inference (weights left out) instead of onnxslim's, which ran ORT's symbolic shape inference on
        # the whole model after every folding round: bert-base 47 s -> 6 s, the same graph out.
        # One round folds only what the shapes inferred before it make constant: while Shape nodes are left,
        # repeat as long as it shrinks the graph (AllenaiLongformerBase: 888, 302, 106, 90 nodes; its Pads' widths
        # become constants by round 3).
        # onnxslim sees the large weights only where a fold can read them: the others (most: a MatMul's weight
        # beside its activation) go in as graph inputs, so that its graph copies and ONNX Runtime session do not
        # hold them. Small ones stay: onnxslim removes an Add of zeros and merges equal initializers.
        model = _fold_weight_transposes(model)
        # again after fold_small_constants (or in its place where that pass is off): keep_symbolic_dims' rewrites may
        # leave more shape arithmetic, cheaper to fold here than in onnxslim's rounds
        model = _fold_known_values(model)
        for _ in range(_FOLDING_ROUNDS):
            small = {t.name for t in model.graph.initializer if nbytes(t) < _FOLDED_WEIGHT_BYTES}
            light, weights = _weights_as_inputs(model, _read_by_constant_nodes(model) | small)
            light = materialized(light)  # the weights it keeps, with their data
            with _unoptimized_ort_sessions(light):
                slimmed = onnxslim.slim(with_inferred_shapes(light), skip_fusion_patterns=["FusionGemm"],
                                        no_shape_infer=True)
            del light
            if slimmed is None:
                raise PassFailed("onnxslim returned no model")
            shrunk = len(slimmed.graph.node) < len(model.graph.node)
            model = _weights_back(slimmed, weights)
            if not shrunk or not any(n.op_type == "Shape" for n in model.graph.node):
                break
    return model  # the inputs it drops (unread ones, e.g. CastLike's `like`) come back in run()


@contextlib.contextmanager
def _unoptimized_ort_sessions(model: onnx.ModelProto):
    """onnxslim's folding runs the constant subgraph in an ONNX Runtime session it makes with ORT's default graph
    optimizations, which fold the same constants at session start, then copy them out at the run
    (AllenaiLongformerBase: 17 s to start, 21 s to run; without them 0.1 s and 8 s). Its sessions start without
    them here, the same values computed once. Not for a graph with control flow: an If condition computed that way
    got its branch inlined by onnxslim without a value the branch reads (test_affine_grid_2d_expanded, exit 70)."""
    import onnxruntime

    if any(node.op_type in ("If", "Loop", "Scan") for node in model.graph.node):
        yield
        return
    session = onnxruntime.InferenceSession

    class Unoptimized(session):
        def __init__(self, path_or_bytes, sess_options=None, *args, **kwargs):
            if sess_options is None:
                sess_options = onnxruntime.SessionOptions()
                sess_options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            super().__init__(path_or_bytes, sess_options, *args, **kwargs)

    onnxruntime.InferenceSession = Unoptimized
    try:
        yield
    finally:
        onnxruntime.InferenceSession = session


_SMALL_VALUE = 1 << 16  # elements: values folded here are shapes, indices and masks, not tensors of data
_NOT_FOLDED = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}


def fold_small_constants(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    return _fold_known_values(model)


def _fold_known_values(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant nodes -> initializers, then each node whose inputs are known small values (initializers, folded
    values, the Shape of a tensor whose shape inference knows it) and whose outputs are small integer or boolean
    tensors -> initializers too, computed by onnx's reference evaluator; the nodes nothing reads then are dropped.
    Repeated while shape inference learns more. onnxslim's graph surgery costs per node and per round: on a
    TorchScript export of AllenaiLongformerBase (25,523 nodes: 10,598 Constant, 2,220 Shape, their arithmetic) it
    took minutes; what is left for it is the folding of data (floats, large indices) through ONNX Runtime."""
    model, weights = _weights_as_inputs(model)
    for _ in range(_FOLDING_ROUNDS):
        folded = _known_values(model)
        if not folded:
            break
        model = _copy_with_nodes(model, [n for n in model.graph.node if not all(o in folded for o in n.output if o)])
        model.graph.initializer.extend(folded.values())
        model = _eliminate_unread_nodes(model)  # (and the folded values nothing reads now: it prunes initializers)
    return _weights_back(model, weights)


def _known_values(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """{output: value} of every node `_fold_known_values` can fold, in one pass over the graph."""
    from onnx.reference import ReferenceEvaluator

    symbols = _dim_symbols(model)
    known = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
             if not onnx_weights.is_external(t) and np.prod(t.dims, dtype=np.int64) <= _SMALL_VALUE}
    opsets = {o.domain or "": o.version for o in model.opset_import if o.domain in ("", "ai.onnx")}
    # Values an If, Loop or Scan reads (its condition, or names its bodies read) stay nodes' outputs: a folded If
    # condition made the onnx node test test_affine_grid_2d_expanded fail TVM's import of the nested Ifs left after
    # static_control_flow; onnxslim and static_control_flow deal with them as before.
    kept = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for body in onnx_weights.subgraphs(node):
            kept |= {*node.input, *onnx_weights.names_read(body)}
    folded: dict[str, onnx.TensorProto] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_FOLDED or any(o in kept for o in node.output) \
                or onnx_weights.subgraphs(node):
            continue
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            folded[node.output[0]] = tensor = onnx.TensorProto()  # any type or size: a copy, nothing computed
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            if np.prod(tensor.dims, dtype=np.int64) <= _SMALL_VALUE:
                known[node.output[0]] = numpy_helper.to_array(tensor)
            continue
        if node.op_type == "Shape" and all(isinstance(d, int) for d in symbols.get(node.input[0], [None])):
            dims = symbols[node.input[0]]
            attrs = {a.name: a.i for a in node.attribute}
            values = [np.array(dims[attrs.get("start", 0):attrs.get("end", len(dims))], np.int64)]
        elif all(i in known for i in node.input if i) and all(_small(symbols.get(o)) for o in node.output if o):
            try:  # (sized before: an Expand or ConstantOfShape of known inputs may be large)
                values = ReferenceEvaluator(node, opsets=opsets).run(None, {i: known[i] for i in node.input if i})
            except Exception:  # an op or a case the reference evaluator lacks: onnxslim's to fold
                continue
        else:
            continue
        values = [np.asarray(v) for v in values]
        if all(v.dtype.kind in "biu" and v.size <= _SMALL_VALUE for v in values):
            for name, value in zip(node.output, values):
                known[name] = value
                folded[name] = numpy_helper.from_array(value, name)
    return folded


def _small(dims: Optional[list]) -> bool:
    """Whether inferred `dims` are all known and hold at most _SMALL_VALUE elements."""
    return dims is not None and all(isinstance(d, int) for d in dims) and int(np.prod(dims)) <= _SMALL_VALUE


def _eliminate_unread_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` without the nodes no graph output depends on (e.g. the Shape nodes a folded value read)."""
    needed = {o.name for o in model.graph.output}
    kept = []
    for node in reversed(model.graph.node):  # topologically sorted (checked on load)
        if any(o in needed for o in node.output if o):
            kept.append(node)
            needed.update(node.input)
            for body in onnx_weights.subgraphs(node):  # values read inside subgraphs, at any depth
                needed |= onnx_weights.names_read(body)
    return _copy_with_nodes(model, list(reversed(kept)))


def _fold_weight_transposes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Transpose of a large weight left in its file -> the transposed weight, computed in numpy and written to a file
    beside it. onnxslim folded a tied LM head's transpose (a 2.7 GB embedding) through ONNX Runtime: 78 s, and the
    process peaked at 4.8x the weight; this holds it twice, briefly."""
    if onnx_weights.folder() is None:  # weights in the messages: onnxslim folds them
        return model
    weights = {t.name: t for t in model.graph.initializer
               if onnx_weights.is_external(t) and nbytes(t) >= _FOLDED_WEIGHT_BYTES
               # numpy holds bfloat16 or int4 as another type: those are left to onnxslim
               and helper.np_dtype_to_tensor_dtype(helper.tensor_dtype_to_np_dtype(t.data_type)) == t.data_type}
    outputs = {o.name for o in model.graph.output}
    nodes, folded = [], []
    for node in model.graph.node:
        if (node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and node.input[0] in weights
                and node.output[0] not in outputs):
            value = onnx_weights.array(weights[node.input[0]])
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None) or None
            folded.append(onnx_weights.new_weight(node.output[0], _transposed(value, perm)))
            del value
            continue
        nodes.append(node)
    if not folded:
        return model
    out = _copy_with_nodes(model, nodes)  # the original goes if nothing else reads it (an untied head)
    out.graph.initializer.extend(folded)
    return out


def _transposed(value: np.ndarray, perm: Optional[list[int]], tile: int = 256) -> np.ndarray:
    """np.transpose, contiguous; a matrix in tiles that stay in cache (numpy's strided copy of a 671 MB one: 2.8 s;
    in 256 x 256 tiles: 1.7 s)."""
    if value.ndim != 2 or perm not in (None, [1, 0]):
        return np.ascontiguousarray(np.transpose(value, perm))
    out = np.empty(value.shape[::-1], value.dtype)
    for i in range(0, value.shape[0], tile):
        for j in range(0, value.shape[1], tile):
            out[j:j + tile, i:i + tile] = value[i:i + tile, j:j + tile].T
    return out


def _read_by_constant_nodes(model: onnx.ModelProto) -> frozenset:
    """Initializers that a node reading only constants (which constant folding may fold) reads, directly or
    through other such nodes. Nodes with subgraphs count as reading everything."""
    constant = {t.name for t in model.graph.initializer} | {""}
    read: set[str] = set()
    for node in model.graph.node:  # topologically sorted (checked on load)
        subgraph = any(a.HasField("g") or a.graphs for a in node.attribute)
        if subgraph:
            read.update(node.input)
        if not subgraph and all(i in constant for i in node.input):
            constant.update(node.output)
            read.update(node.input)
    return frozenset(read)


def shape_inference(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    return with_inferred_shapes(model)


# --- canonicalize_shapes: a small symbolic evaluator for 1-D int64 shape tensors. A value is a
# list of elements (or one element for a scalar); an element is an int, a hashable symbol for a
# dimension (("param", name) or ("dim", tensor, index)), or None when unknown.

def _dim_symbols(model: onnx.ModelProto) -> dict[str, list]:
    inferred = infer_shapes(model, data_prop=True)  # data_prop: Reshape outputs get dims
    symbols = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = v.type.tensor_type
        if t.HasField("shape"):
            symbols[v.name] = [d.dim_value if d.HasField("dim_value") else ("param", d.dim_param) if d.dim_param
                               else ("dim", v.name, k) for k, d in enumerate(t.shape.dim)]
    return symbols


def _binary(op: str, a, b):
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return {"Mul": a * b, "Add": a + b, "Sub": a - b, "Div": a // b if b else None}[op]
    if a is None or b is None:
        return None
    if op == "Mul" and a == 1:
        return b
    if op in ("Mul", "Div") and b == 1 or op in ("Add", "Sub") and b == 0:
        return a
    return (op, a, b)  # a known expression of dims, never equal to a plain dim


def _elementwise(op: str, a, b):
    """Mul/Add/Sub/Div of two dims or dim lists (a single dim broadcast over a list); None where unknown."""
    if isinstance(a, list) or isinstance(b, list):
        a = a if isinstance(a, list) else [a] * len(b)
        b = b if isinstance(b, list) else [b] * len(a)
        return [_binary(op, x, y) for x, y in zip(a, b)] if len(a) == len(b) else None
    return _binary(op, a, b)


def _extreme(op: str, ins: list):
    """Max/Min of two dims or dim lists; None where some element is unknown."""
    a, b = ([v] if not isinstance(v, list) else v for v in ins)
    if len(a) != len(b):
        a, b = (a * len(b), b) if len(a) == 1 else (a, b * len(a)) if len(b) == 1 else (None, None)
    pick = max if op == "Max" else min
    # dims compare when both are numbers or the same symbol; Max(dim, 1) is the dim, as mlc's
    # dims are at least 1 (einsum exports broadcast with it)
    elems = [pick(x, y) if isinstance(x, (int, np.integer)) and isinstance(y, (int, np.integer))
             else x if x == y and x is not None
             else (y if isinstance(x, (int, np.integer)) else x) if op == "Max" and 1 in (x, y)
             and None not in (x, y) else None for x, y in zip(a or [], b or [])]
    if a is not None and all(e is not None for e in elems):
        return elems if any(isinstance(v, list) for v in ins) else elems[0]
    return None


def _evaluate_node(node: onnx.NodeProto, ins: list, symbols: dict):
    """The node's first output as a dim, a list of dims, or None where it is not a shape computation mlc
    follows (`ins`: its inputs' values so far)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    out = None
    op = node.op_type
    if op == "Shape" and node.input[0] in symbols:
        dims = symbols[node.input[0]]
        out = dims[attrs.get("start", 0):attrs.get("end", len(dims))]
    elif op in ("Cast", "Identity") and ins[0] is not None:
        out = ins[0]
    elif op == "Gather" and isinstance(ins[0], list) and attrs.get("axis", 0) == 0 and ins[1] is not None:
        idx = ins[1]
        try:
            out = ins[0][idx] if isinstance(idx, int) else [ins[0][i] for i in idx]
        except IndexError:
            out = None
    elif op == "Unsqueeze" and ins[0] is not None and not isinstance(ins[0], list):
        out = [ins[0]]
    elif op == "Squeeze" and isinstance(ins[0], list) and len(ins[0]) == 1:
        out = ins[0][0]
    elif op == "Concat" and ins and all(isinstance(v, list) for v in ins):
        out = [e for v in ins for e in v]
    elif op in ("Mul", "Add", "Sub", "Div") and all(v is not None for v in ins[:2]):
        out = _elementwise(op, ins[0], ins[1])
    elif op == "ReduceProd" and isinstance(ins[0], list) and (len(ins) < 2 or ins[1] in (None, [0], [-1])) \
            and attrs.get("axes", [0]) in ([0], [-1]) and not attrs.get("noop_with_empty_axes", 0):
        product = 1
        for e in ins[0]:
            product = _binary("Mul", product, e)
        out = [product] if attrs.get("keepdims", 1) else product
    elif op in ("Max", "Min") and len(ins) == 2 and all(v is not None for v in ins):
        out = _extreme(op, ins)
    elif op == "Slice" and isinstance(ins[0], list) and len(ins) >= 3 and all(
            isinstance(v, list) and len(v) == 1 for v in ins[1:3]) and (len(ins) < 4 or ins[3] in (None, [0])) \
            and (len(ins) < 5 or ins[4] in (None, [1])) \
            and (len(node.input) < 4 or not node.input[3] or ins[3] == [0]):
        out = ins[0][ins[1][0]:ins[2][0]]
    return out


def _evaluate(model: onnx.ModelProto, symbols: dict[str, list]) -> dict[str, object]:
    """Each value the evaluator follows, by name (`symbols`: `_dim_symbols(model)`)."""
    values: dict[str, object] = {}
    for name, array in constant_values(model, max_bytes=_WEIGHT_BYTES).items():
        if array.dtype.kind == "i" and array.ndim <= 1 and array.size <= 16:
            values[name] = int(array) if array.ndim == 0 else [int(v) for v in array]
    for node in model.graph.node:
        out = _evaluate_node(node, [values.get(i) for i in node.input], symbols)
        if out is not None:
            values[node.output[0]] = out
    return values


def canonicalize_shapes(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """Reshape(x, <computed shape>) -> Reshape(x, <constant>): an element equal to x's own dim k at
    position k becomes 0 (copy), a plain number stays, and one remaining element becomes -1."""
    model, weights = _weights_as_inputs(model)  # a copy: Reshape inputs are rewritten in place below
    for _ in range(3):  # a Reshape made constant gives shape inference the dims a later one's shape reads
        before = len(model.graph.node)
        model = _canonicalize_shapes(model)
        if len(model.graph.node) == before:
            break
    return _weights_back(model, weights)


def _canonicalize_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    constants = constant_values(model)
    symbols = _dim_symbols(model)
    values = _evaluate(model, symbols)
    new_inits = []
    for node in model.graph.node:
        if node.op_type != "Reshape" or node.input[1] in constants or not isinstance(values.get(node.input[1]), list):
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        shape, data_dims = values[node.input[1]], symbols.get(node.input[0], [])
        fixed, unknown = [], 0
        for k, e in enumerate(shape):
            if isinstance(e, (int, np.integer)):
                fixed.append(int(e))
                unknown += int(e) == -1
            elif k < len(data_dims) and e is not None and e == data_dims[k] and not isinstance(e, int):
                fixed.append(0)
            else:
                fixed.append(-1)
                unknown += 1
        if unknown > 1:
            continue
        name = f"{node.output[0]}_canonical_shape"
        new_inits.append(numpy_helper.from_array(np.array(fixed, np.int64), name))
        node.input[1] = name
    if not new_inits:
        return model
    model.graph.initializer.extend(new_inits)
    return eliminate_dead_nodes(model, {})  # the Shape arithmetic that fed them is dead now


# --- keep_symbolic_dims: TVM's importer follows a shape symbolically only through Shape, a Gather of
# one scalar index, Slice/Concat/Squeeze/Unsqueeze of shapes and Range over such scalars; a Cast, a
# Gather of a 1-D index or a Slice that may be shorter than its axis turns the dims into runtime
# values and everything after them has an unknown shape. These rewrites keep exporters' shape
# computations on the paths TVM follows.

_WHOLE_AXIS = 1_000_000_000  # a Slice end at or past this takes the whole axis (tf2onnx: 1e9, INT_MAX)
_INT_TYPES = (TensorProto.INT32, TensorProto.INT64)


def _rewritten(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], rename: dict[str, str],
               inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    """The model with `nodes`, every read of a key of `rename` reading its value, and `inits` added."""
    for node in nodes:
        node.input[:] = [rename.get(i, i) for i in node.input]
    out = _copy_with_nodes(model, nodes)
    out.graph.initializer.extend(inits)
    return out


def _ints(constants: dict, name: str) -> Optional[list[int]]:
    value = constants.get(name) if name else None
    return None if value is None or value.dtype.kind not in "iu" else [int(v) for v in value.reshape(-1)]


def _slice_params(node: onnx.NodeProto, constants: dict) -> Optional[tuple[list, list, Optional[list], list]]:
    """(starts, ends, axes or None, steps) of a Slice whose parameters are all constants."""
    starts, ends = _ints(constants, node.input[1]), _ints(constants, node.input[2])
    axes = _ints(constants, node.input[3]) if len(node.input) > 3 and node.input[3] else None
    steps = _ints(constants, node.input[4]) if len(node.input) > 4 and node.input[4] else [1] * len(starts or [])
    if starts is None or ends is None or steps is None or (len(node.input) > 3 and node.input[3] and axes is None):
        return None
    return starts, ends, axes, steps


def _without_whole_slices(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Slice axes taken whole (start 0, step 1, end past any size) are dropped, and a Slice left with
    none is removed: TVM cannot prove min(end, dim) == dim, so the sliced dim became a new unknown."""
    model = _clone(model)
    constants, symbols = constant_values(model), _dim_symbols(model)
    graph_outputs = {o.name for o in model.graph.output}
    nodes, rename, inits, changed = [], {}, [], 0
    for node in model.graph.node:
        params = _slice_params(node, constants) if node.op_type == "Slice" and len(node.input) >= 3 else None
        if params is None or node.output[0] in graph_outputs:
            nodes.append(node)
            continue
        starts, ends, axes, steps = params
        dims = symbols.get(node.input[0])
        axes = axes if axes is not None else list(range(len(starts)))
        keep = [k for k, (s, e, a, st) in enumerate(zip(starts, ends, axes, steps)) if not (
            s == 0 and st == 1 and (e >= _WHOLE_AXIS or (dims is not None and -len(dims) <= a < len(dims)
                                                          and isinstance(dims[a], int) and e >= dims[a])))]
        if len(keep) == len(starts):
            nodes.append(node)
            continue
        changed += 1
        if not keep:
            rename[node.output[0]] = node.input[0]
            continue
        names = []
        for label, values in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)):
            names.append(f"{node.output[0]}_{label}")
            inits.append(numpy_helper.from_array(np.array([values[k] for k in keep], np.int64), names[-1]))
        node.input[:] = [node.input[0]] + names
        nodes.append(node)
    return (_rewritten(model, nodes, rename, inits), changed) if changed else (model, 0)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _gathers_for_one_index(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Slice of one index then Squeeze of that axis -> Gather of a scalar index (TVM: a Squeeze of a
    symbolic extent fails, and of a sliced shape it is a runtime tensor); Gather of a 1-D run of
    indices out of Shape(x) -> Shape(x, start, end) (TVM: a shape expression, not a runtime tensor)."""
    model = _clone(model)
    constants, symbols = constant_values(model), _dim_symbols(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    readers = Counter(i for n in model.graph.node for i in n.input)
    nodes, inits, changed = [], [], 0
    for node in model.graph.node:
        replacement = None
        source = producers.get(node.input[0]) if node.input else None
        if node.op_type == "Squeeze" and source is not None and source.op_type == "Slice" \
                and readers[source.output[0]] == 1 and len(source.input) >= 3:
            params = _slice_params(source, constants)
            axes = _ints(constants, node.input[1]) if len(node.input) > 1 else \
                next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
            rank = len(symbols.get(source.input[0], [])) or None
            if params is not None and axes is not None and len(params[0]) == 1 and params[3] == [1]:
                (start,), (end,), slice_axes, _ = params
                axis = (slice_axes or [0])[0]
                one = end == start + 1 if start != -1 else end >= _WHOLE_AXIS
                same_axis = axes == [axis] or (rank is not None and [a % rank for a in axes] == [axis % rank])
                if one and same_axis:
                    index = f"{node.output[0]}_index"
                    inits.append(numpy_helper.from_array(np.array(start, np.int64), index))
                    replacement = helper.make_node("Gather", [source.input[0], index], [node.output[0]],
                                                   name=f"{node.name or node.output[0]}_gather", axis=axis)
        elif node.op_type == "Gather" and source is not None and source.op_type == "Shape" and _opset(model) >= 15 \
                and next((a.i for a in node.attribute if a.name == "axis"), 0) == 0:
            index = constants.get(node.input[1])
            rank = len(symbols.get(source.input[0], [])) or None
            attrs = {a.name: a.i for a in source.attribute}
            if index is not None and index.ndim == 1 and index.size and rank is not None:
                begin, end = (max(0, min(v + rank if v < 0 else v, rank))
                              for v in (attrs.get("start", 0), attrs.get("end", rank)))
                length = end - begin
                picked = [int(i) + length if i < 0 else int(i) for i in index if -length <= i < length]
                if len(picked) == index.size and picked == list(range(picked[0], picked[0] + len(picked))):
                    replacement = helper.make_node("Shape", [source.input[0]], [node.output[0]],
                                                   name=f"{node.name or node.output[0]}_dims",
                                                   start=begin + picked[0], end=begin + picked[-1] + 1)
        changed += replacement is not None
        nodes.append(replacement or node)
    return (_rewritten(model, nodes, {}, inits), changed) if changed else (model, 0)


def _dim_source(model: onnx.ModelProto, symbols: dict[str, list], symbol,
                before: set[str]) -> Optional[tuple[str, int]]:
    """A tensor available at this point (in `before`) and the axis where it has dim `symbol`."""
    if isinstance(symbol, tuple) and symbol[0] == "dim" and symbol[1] in before:
        return symbol[1], symbol[2]
    if not (isinstance(symbol, tuple) and symbol[0] == "param"):
        return None
    for name in [i.name for i in model.graph.input] + [n for n in symbols if n in before]:
        dims = symbols.get(name, [])
        if name in before and symbol in dims:
            return name, dims.index(symbol)
    return None


def _ranges_over_dims(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Range(start, <a dim of some tensor, computed>, delta) -> Range over Gather(Shape(t), k), int64
    (cast back after): TVM's Range keeps a symbolic length only for a scalar taken from a shape."""
    model = _clone(model)
    constants, symbols = constant_values(model), _dim_symbols(model)
    values = _evaluate(model, symbols)
    producers = {o: n for n in model.graph.node for o in n.output}
    available = {i.name for i in model.graph.input} | set(constants)
    nodes, inits, changed = [], [], 0
    for node in model.graph.node:
        source = None
        if node.op_type == "Range" and _ints(constants, node.input[0]) and _ints(constants, node.input[2]):
            source = _dim_source(model, symbols, values.get(node.input[1]), available)
            gather = producers.get(node.input[1])
            shape = producers.get(gather.input[0]) if gather is not None and gather.op_type == "Gather" else None
            if shape is not None and shape.op_type == "Shape" and constants[node.input[0]].dtype == np.int64 \
                    and constants.get(gather.input[1]) is not None and constants[gather.input[1]].ndim == 0:
                source = None  # already the form TVM follows
        if source is None:
            nodes.append(node)
            available.update(node.output)
            continue
        start, delta = _ints(constants, node.input[0]), _ints(constants, node.input[2])
        out, dtype = node.output[0], constants[node.input[0]].dtype
        names = [f"{out}_dims", f"{out}_axis", f"{out}_limit", f"{out}_start", f"{out}_delta"]
        inits += [numpy_helper.from_array(np.array(source[1], np.int64), names[1]),
                  numpy_helper.from_array(np.array(start[0], np.int64), names[3]),
                  numpy_helper.from_array(np.array(delta[0], np.int64), names[4])]
        ranged = out if dtype == np.int64 else f"{out}_int64"
        nodes += [helper.make_node("Shape", [source[0]], [names[0]]),
                  helper.make_node("Gather", [names[0], names[1]], [names[2]], axis=0),
                  helper.make_node("Range", [names[3], names[2], names[4]], [ranged], name=node.name)]
        if ranged != out:
            nodes.append(helper.make_node("Cast", [ranged], [out], to=helper.np_dtype_to_tensor_dtype(dtype)))
        available.update(node.output)
        changed += 1
    return (_rewritten(model, nodes, {}, inits), changed) if changed else (model, 0)


_DIM_ARITHMETIC = ("Mul", "Add", "Sub", "Div")
_SHAPE_INPUT = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0}  # the input that is a shape


def _followable(name: str, producers: dict, constants: dict) -> bool:
    """Whether TVM's importer sees this shape as a shape: a constant, a Shape, an Unsqueeze of a
    followable scalar, a Concat of those."""
    node = producers.get(name)
    return name in constants or node is not None and (
        node.op_type == "Shape"
        or node.op_type == "Concat" and all(_followable(i, producers, constants) for i in node.input)
        or node.op_type == "Unsqueeze" and _followable_scalar(node.input[0], producers, constants))


def _followable_scalar(name: str, producers: dict, constants: dict) -> bool:
    """Whether TVM's importer sees this scalar as an expression of dims: an int64 constant, a Gather of
    one index out of a Shape, integer arithmetic of those."""
    if name in constants:
        return constants[name].dtype == np.int64 and constants[name].ndim == 0
    node = producers.get(name)
    if node is None:
        return False
    if node.op_type == "Gather":
        source, index = producers.get(node.input[0]), constants.get(node.input[1])
        return source is not None and source.op_type == "Shape" and index is not None and index.ndim == 0
    return node.op_type in _DIM_ARITHMETIC and all(_followable_scalar(i, producers, constants) for i in node.input)


def _dim_expression(expr, out: str, model: onnx.ModelProto, symbols: dict, available: set[str],
                    nodes: list, inits: list) -> Optional[str]:
    """ONNX nodes (appended to `nodes`/`inits`) computing an element `_evaluate` found, an int or an
    expression of dims, as an int64 scalar in the form TVM follows; its name, or None."""
    if isinstance(expr, (int, np.integer)):
        name = f"{out}_{len(nodes) + len(inits)}"
        inits.append(numpy_helper.from_array(np.array(expr, np.int64), name))
        return name
    if isinstance(expr, tuple) and expr and expr[0] in _DIM_ARITHMETIC and len(expr) == 3:
        a = _dim_expression(expr[1], out, model, symbols, available, nodes, inits)
        b = _dim_expression(expr[2], out, model, symbols, available, nodes, inits) if a else None
        if b is None:
            return None
        name = f"{out}_{len(nodes) + len(inits)}"  # named after its operands: names stay unique
        nodes.append(helper.make_node(expr[0], [a, b], [name]))
        return name
    name = f"{out}_{len(nodes) + len(inits)}"
    source = _dim_source(model, symbols, expr, available)
    if source is None:
        return None
    inits.append(numpy_helper.from_array(np.array(source[1], np.int64), f"{name}_axis"))
    nodes += [helper.make_node("Shape", [source[0]], [f"{name}_shape"]),
              helper.make_node("Gather", [f"{name}_shape", f"{name}_axis"], [name], axis=0)]
    return name


def _without_shape_round_trips(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Reshape/Expand/ConstantOfShape shapes that went through Casts (tf2onnx computes them in int32) and
    Gathers are rebuilt from Shape(x, start, end) pieces, constants and int64 arithmetic on dims (TVM: a
    Cast makes a shape a runtime tensor), and a Reshape to its input's own dims (0 = keep) is removed."""
    model = _clone(model)
    constants, symbols = constant_values(model), _dim_symbols(model)
    values = _evaluate(model, symbols)
    producers = {o: n for n in model.graph.node for o in n.output}
    graph_outputs = {o.name for o in model.graph.output}
    available = {i.name for i in model.graph.input} | set(constants)
    taken = available | {o for n in model.graph.node for o in n.output}
    nodes, rename, inits, changed = [], {}, [], 0
    for node in model.graph.node:
        out = node.output[0] if node.output else None
        if node.op_type == "Reshape" and out not in graph_outputs \
                and not any(a.name == "allowzero" and a.i for a in node.attribute):
            target, dims = values.get(node.input[1]), symbols.get(node.input[0])
            if isinstance(target, list) and dims is not None and len(target) == len(dims) and all(
                    e is not None and (e == d or e == 0) for e, d in zip(target, dims)):
                rename[out] = node.input[0]
                changed += 1
                continue
        slot = _SHAPE_INPUT.get(node.op_type)
        target = values.get(node.input[slot]) if slot is not None else None
        if isinstance(target, list) and target and not _followable(node.input[slot], producers, constants):
            # A dim is a Shape slice; an expression of dims (seq * heads) int64 scalar arithmetic on
            # Gathers out of Shapes, unsqueezed; all or nothing.
            new_nodes, new_inits, names = [], [], []
            base = f"{out}_shape"
            while any(n == base or n.startswith(f"{base}") for n in taken):  # the graph may use the name
                base += "_"
            taken.add(base)
            for k, e in enumerate(target):
                names.append(f"{base}{k}")
                if isinstance(e, (int, np.integer)):
                    new_inits.append(numpy_helper.from_array(np.array([e], np.int64), names[-1]))
                    continue
                source = _dim_source(model, symbols, e, available)
                if source is not None:
                    new_nodes.append(helper.make_node("Shape", [source[0]], [names[-1]], start=source[1],
                                                      end=source[1] + 1))
                    continue
                scalar = _dim_expression(e, names[-1], model, symbols, available, new_nodes, new_inits)
                if scalar is None:
                    break
                new_inits.append(numpy_helper.from_array(np.array([0], np.int64), f"{names[-1]}_axes"))
                new_nodes.append(helper.make_node("Unsqueeze", [scalar, f"{names[-1]}_axes"], [names[-1]]))
            else:
                nodes += new_nodes + [helper.make_node("Concat", names, [base], axis=0)]
                inits += new_inits
                node.input[slot] = base
                changed += 1
        nodes.append(node)
        available.update(node.output)
    return (_rewritten(model, nodes, rename, inits), changed) if changed else (model, 0)


def _dim_arithmetic(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """ReduceProd of dims -> Mul of scalar Gathers (TVM multiplies those symbolically, but has no
    ReduceProd of a shape); Max/Min of dims equal to one of its inputs -> that input."""
    model = _clone(model)
    values, constants = _evaluate(model, _dim_symbols(model)), constant_values(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    graph_outputs = {o.name for o in model.graph.output}
    nodes, rename, inits, changed = [], {}, [], 0
    for node in model.graph.node:
        out = node.output[0] if node.output else None
        value = values.get(out)
        source = producers.get(node.input[0]) if node.input else None
        if out in graph_outputs or value is None or source is None or source.op_type != "Shape" \
                or node.op_type not in ("ReduceProd", "Max", "Min"):
            nodes.append(node)
            continue
        if node.op_type in ("Max", "Min"):
            same = next((i for i in node.input if values.get(i) == value and i not in constants), None)
            if same is not None:
                rename[out] = same
                changed += 1
            else:
                nodes.append(node)
            continue
        dims = values.get(node.input[0])
        if not isinstance(dims, list) or not dims or None in dims:
            nodes.append(node)
            continue
        factors = []
        for k in range(len(dims)):
            index = f"{out}_index{k}"
            inits.append(numpy_helper.from_array(np.array(k, np.int64), index))
            nodes.append(helper.make_node("Gather", [node.input[0], index], [f"{out}_dim{k}"], axis=0))
            factors.append(f"{out}_dim{k}")
        for k in range(1, len(factors)):
            nodes.append(helper.make_node("Mul", [factors[k - 1], factors[k]], [f"{out}_prod{k}"]))
            factors[k] = f"{out}_prod{k}"
        if isinstance(value, list):  # keepdims
            inits.append(numpy_helper.from_array(np.array([0], np.int64), f"{out}_axes"))
            nodes.append(helper.make_node("Unsqueeze", [factors[-1], f"{out}_axes"], [out]))
        else:
            nodes.append(helper.make_node("Identity", [factors[-1]], [out]))
        changed += 1
    return (_rewritten(model, nodes, rename, inits), changed) if changed else (model, 0)


def keep_symbolic_dims(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """Exporters' shape subgraphs (tf2onnx, paddle2onnx) rewritten onto paths TVM's importer follows
    symbolically: whole-axis Slices removed, Slice+Squeeze of one index made a Gather, Gathers from a
    Shape made Shape slices, Ranges over a dim read it from a Shape, Reshape/Expand/ConstantOfShape shapes
    computed through Casts rebuilt from Shape slices and int64 arithmetic on dims, identity Reshapes removed,
    ReduceProd of dims made Muls.
    Repeated while something changes: each rewrite lets shape inference see more dims."""
    model, weights = _weights_as_inputs(model)
    for _ in range(8):
        changed = 0
        for rewrite in (_without_whole_slices, _gathers_for_one_index, _ranges_over_dims, _without_shape_round_trips,
                        _dim_arithmetic):
            model, count = rewrite(model)
            changed += count
        if not changed:
            break
    return _weights_back(eliminate_dead_nodes(model, {}), weights)


_WEIGHT_ELEMENTS = 64  # initializers larger than this hold weights, not shape constants


def _weights_as_inputs(model: onnx.ModelProto, keep: frozenset = frozenset()
                       ) -> tuple[onnx.ModelProto, dict[str, tuple[onnx.TensorProto, bool]]]:
    """The model with its large initializers (but those in `keep`) declared as graph inputs instead (same name, type
    and shape): the rewrites clone the model and run shape inference many times, and on bert-base the 440 MB of
    weights made that minutes."""
    weights = {t.name: t for t in model.graph.initializer
               if int(np.prod(t.dims, dtype=np.int64)) > _WEIGHT_ELEMENTS and t.name not in keep}
    light = _copy_without_initializers(model)  # not CopyFrom and delete: protobuf frees only whole messages
    light.graph.initializer.extend(t for t in model.graph.initializer if t.name not in weights)
    if not weights:
        return light, {}
    declared = {i.name for i in light.graph.input}
    light.graph.input.extend(helper.make_tensor_value_info(name, t.data_type, list(t.dims))
                             for name, t in weights.items() if name not in declared)
    return light, {name: (t, name in declared) for name, t in weights.items()}


def _copy_fields(message, source, skipped: str) -> None:
    """Copy every set field of `source` into `message` but `skipped` (a large one: copying it to delete it
    afterwards keeps its memory, as protobuf frees memory only with the whole message)."""
    for field, value in source.ListFields():
        if field.name == skipped:
            continue
        if field.is_repeated:
            getattr(message, field.name).extend(value)
        elif field.message_type is not None:
            getattr(message, field.name).CopyFrom(value)
        else:
            setattr(message, field.name, value)


def _copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    _copy_fields(out, model, "graph")
    _copy_fields(out.graph, model.graph, "initializer")
    return out


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write `model` to `path` with its weights raw in PATH.data beside it (ONNX external data, which onnx.load reads
    back by itself); `model` is left as it is. onnx.save serialised bert-base's 440 MB of weights into the protobuf
    in 2-4 s plus the write, and the compile worker parsed them back; this writes them in about 1. Weights that are
    external data already stay where they are (relative to `path`'s folder)."""
    path = Path(path)
    data_path = path.with_name(path.name + ".data")
    data_path.unlink(missing_ok=True)
    onnx.save(_externalized(model, data_path), str(path))


def _externalized(model: onnx.ModelProto, data_path: Path) -> onnx.ModelProto:
    """A copy of `model` whose initializers of over _WEIGHT_BYTES with their data in the message are appended to
    `data_path` and referenced there (by its name: the model's folder is its folder); `model` when there are none."""
    if not any(t.HasField("raw_data") and len(t.raw_data) > _WEIGHT_BYTES for t in model.graph.initializer):
        return model
    light = _copy_without_initializers(model)
    with open(data_path, "ab") as data:
        for tensor in model.graph.initializer:
            raw = tensor.raw_data if tensor.HasField("raw_data") else b""
            if len(raw) <= _WEIGHT_BYTES:
                light.graph.initializer.append(tensor)
                continue
            external = light.graph.initializer.add()
            _copy_fields(external, tensor, "raw_data")
            onnx_weights.point_at(external, data_path.name, data.tell(), len(raw))
            data.write(raw)
    return light


def _weights_back(model: onnx.ModelProto, weights: dict) -> onnx.ModelProto:
    """Undo `_weights_as_inputs` for the weights the graph still reads."""
    if not weights:
        return model
    used = onnx_weights.names_read(model.graph) | {o.name for o in model.graph.output}  # subgraphs' too
    inputs = [i for i in model.graph.input if i.name not in weights or weights[i.name][1]]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(t for name, (t, _) in weights.items() if name in used)
    return model


# --- the runner

def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node)


def changes(before: Counter, after: Counter) -> dict[str, int]:
    return {op: after[op] - before[op] for op in sorted(set(before) | set(after)) if after[op] != before[op]}


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0][:300] if text else type(error).__name__)


def run(model: onnx.ModelProto, steps: Sequence[Step], dump_dir: Optional[Path] = None,
        weights_dir: Optional[Path] = None) -> tuple[onnx.ModelProto, list[dict], list[str]]:
    """Run the ONNX-level steps in order. Returns the model, one record per pass, and warnings. `weights_dir`: the
    folder the model's external-data weights are relative to (mlc.frontends.onnx_weights.load_light); the weights a
    pass makes go to a file there too."""
    with weights_in(weights_dir):
        return _run(model, steps, dump_dir)


def _run(model: onnx.ModelProto, steps: Sequence[Step], dump_dir: Optional[Path]
         ) -> tuple[onnx.ModelProto, list[dict], list[str]]:
    records, notes = [], []
    onnx_steps = [s for s in steps if s.level == "onnx" and REGISTRY[s.name].run]  # not quantize: prepare runs it
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        _dump(model, dump_dir / "onnx_00_input.onnx")
    for index, step in enumerate(onnx_steps, 1):
        before = op_counts(model)
        start = time.perf_counter()
        try:
            result = REGISTRY[step.name].load()(model, step.config)
            status, reason = "applied", None
        except Exception as e:  # a pass that cannot handle this model must not take the compile down
            if step.explicit:
                raise UnsupportedModelError(f"pass {step.name} (requested explicitly) failed on this model: "
                                            f"{_reason(e)}") from None
            result, status, reason = model, "skipped", _reason(e)
            notes.append(f"pass {step.name} skipped: {reason}")
        elapsed = time.perf_counter() - start
        result = _with_inputs_of(model, result)
        after = op_counts(result)
        records.append({"name": step.name, "level": "onnx", "status": status, "ops_before": sum(before.values()),
                        "ops_after": sum(after.values()), "op_changes": changes(before, after),
                        "time_s": round(elapsed, 4), "reason": reason})
        # A weight a pass made (a folded Transpose of a 2.7 GB LM head) goes to a file as the model's did: the next
        # passes copy and serialise the graph, and a model over 2 GB cannot be serialised.
        folder = onnx_weights.folder()
        model = _externalized(result, folder / FOLDED) if folder is not None else result
        del result
        child_process.release_memory()  # the pass's copies of the weights: RSS grew by one per pass on bert-base
        if dump_dir is not None:
            _dump(model, dump_dir / f"onnx_{index:02d}_{step.name}.onnx")
    return model, records, notes


def _with_inputs_of(before: onnx.ModelProto, after: onnx.ModelProto) -> onnx.ModelProto:
    """`after` with every graph input of `before` (in its order): a pass may drop an input no node reads (onnxslim
    does: an ignored attention mask, CastLike's `like`), but the model's callers still pass it."""
    weights = {t.name for g in (before.graph, after.graph) for t in g.initializer}  # old IRs list them as inputs
    kept = {i.name for i in after.graph.input}
    wanted = [i for i in before.graph.input if i.name not in weights]
    if all(i.name in kept for i in wanted):
        return after
    others = [i for i in after.graph.input if i.name not in {w.name for w in wanted}]
    out = _clone(after)
    del out.graph.input[:]
    out.graph.input.extend(wanted + others)
    return out


def _dump(model: onnx.ModelProto, path: Path) -> None:
    # With its weights (the dump folder has no links to the weights' files), those over 4 KB in PATH.data beside
    # it: a graph whose folded constants pass 2 GB (AllenaiLongformerBase's) cannot be one protobuf message.
    save(materialized(model), path)
