"""ONNX control flow with a condition known before run time. TVM imports an If as a Relax If with both branches
converted, and a branch that is never taken may not import at all (ONNX functions branch on the input's rank, e.g.
AffineGrid's 2-D and 3-D bodies: the other branch's shapes are nonsense)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import helper


def _static_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    shapes = {}
    for value in list(graph.input) + list(graph.value_info):
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes


def _condition(name: str, model: onnx.ModelProto, producers: dict) -> Optional[bool]:
    """The value of If condition `name` when it depends only on weights, constants and the static shapes of
    graph inputs (Shape/Size of them), evaluated with onnx's reference evaluator; else None."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    inputs = {v.name: v for v in graph.input if v.name not in weights}
    shapes = _static_shapes(graph)
    cone, needed, feeds, stack = [], set(), {}, [name]
    while stack:
        value = stack.pop()
        if value in needed or value == "":
            continue
        needed.add(value)
        if value in weights:
            continue
        node = producers.get(value)
        if node is None or node.op_type in ("If", "Loop", "Scan") or node.domain not in ("", "ai.onnx"):
            return None
        cone.append(node)
        for source in node.input:
            if source in inputs:  # a graph input: only its shape may be read, and it must be static
                if node.op_type not in ("Shape", "Size") or source not in shapes:
                    return None
                feeds[source] = np.zeros(shapes[source], helper.tensor_dtype_to_np_dtype(
                    inputs[source].type.tensor_type.elem_type))
                needed.add(source)
            else:
                stack.append(source)
    order = {id(n): i for i, n in enumerate(graph.node)}
    cone = sorted({id(n): n for n in cone}.values(), key=lambda n: order[id(n)])
    outputs = [helper.make_value_info(name, onnx.TypeProto())]
    sub = helper.make_graph(cone, "condition", [inputs[n] for n in feeds], outputs,
                            [weights[n] for n in needed if n in weights])
    try:
        evaluator = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import,
                                                         ir_version=model.ir_version))
        value = evaluator.run(None, feeds)[0]
    except Exception:  # noqa: BLE001 - a condition we cannot evaluate stays an If
        return None
    value = np.asarray(value)
    return bool(value.reshape(-1)[0]) if value.size == 1 else None


def _inlined(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    graph = model.graph
    producers = {out: n for n in graph.node for out in n.output}
    nodes, added, count = [], [], 0
    for node in graph.node:
        taken = None
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            condition = _condition(node.input[0], model, producers)
            if condition is not None:
                branch = "then_branch" if condition else "else_branch"
                taken = next(a.g for a in node.attribute if a.name == branch)
        if taken is None:
            nodes.append(node)
            continue
        count += 1
        added.extend(taken.initializer)
        nodes.extend(taken.node)
        for inner, outer in zip(taken.output, node.output):
            nodes.append(helper.make_node("Identity", [inner.name], [outer]))
    if not count:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(added)
    return out, count


MAX_FOLDED_ELEMENTS = 1 << 20


def _folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes whose inputs are all weights (or Shape/Size of a static input) -> weights holding their outputs,
    computed with onnx's reference evaluator node by node (onnxslim leaves such chains when one of its nodes is
    one ONNX Runtime's folding rejects, e.g. Split by num_outputs)."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    shapes = _static_shapes(graph)
    opsets = {o.domain: o.version for o in model.opset_import}
    kept, added = [], []
    for node in graph.node:
        known = all(i == "" or i in values for i in node.input)
        reads_shape = node.op_type in ("Shape", "Size") and node.input[0] in shapes
        if node.domain not in ("", "ai.onnx") or node.op_type in ("If", "Loop", "Scan") or not (known or reads_shape):
            kept.append(node)
            continue
        try:
            if reads_shape and not known:
                feeds = {node.input[0]: np.zeros(shapes[node.input[0]], np.float32)}
            else:
                feeds = {i: values[i] for i in node.input if i}
            one = helper.make_graph([node], "fold", [helper.make_value_info(i, onnx.TypeProto()) for i in feeds],
                                    [helper.make_value_info(o, onnx.TypeProto()) for o in node.output])
            results = ReferenceEvaluator(helper.make_model(one, opset_imports=[helper.make_opsetid("", opsets.get(
                "", 18))], ir_version=model.ir_version)).run(None, feeds)
        except Exception:  # noqa: BLE001 - a node the evaluator cannot run stays
            kept.append(node)
            continue
        arrays = [np.asarray(r) for r in results]
        if any(a.dtype == object or a.size > MAX_FOLDED_ELEMENTS for a in arrays):
            kept.append(node)
            continue
        for name, array in zip(node.output, arrays):
            values[name] = array
            added.append(numpy_helper.from_array(array, name))
    if not added:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend(added)
    return out


def inline_constant_ifs(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """Each If whose condition is a constant -> its taken branch's nodes; then fold the constants that exposes
    (the branch's shape arithmetic), again until no such If is left."""
    from mlc.passes.onnx import constant_folding

    inlined = False
    for _ in range(8):  # nested Ifs surface one level per round
        model, count = _inlined(model)
        if not count:
            break
        inlined = True
        model = _folded(model)
    return constant_folding(model, config) if inlined else model
