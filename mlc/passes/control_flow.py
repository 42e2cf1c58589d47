"""ONNX control flow decided before run time. TVM imports an If as a Relax If with both branches converted, and a
branch that is never taken may not import at all (ONNX functions branch on the input's rank, e.g. AffineGrid's 2-D
and 3-D bodies: the other branch's shapes are nonsense). TVM has no Loop, Scan or SequenceMap converter: a Loop with
a constant trip count (and a condition that stays true), a Scan over static lengths and a SequenceMap over sequences
of known length (TVM's sequences are tuples of static length) are unrolled."""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import helper

from mlc.frontends.onnx_weights import Values, loaded

UNROLLED = ("Loop", "Scan", "SequenceMap")  # the ops static_control_flow replaces (TVM has no converter for them)


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
                            [loaded(weights[n]) for n in needed if n in weights])
    try:
        evaluator = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import,
                                                         ir_version=model.ir_version))
        value = evaluator.run(None, feeds)[0]
    except Exception:  # a condition we cannot evaluate stays an If
        return None
    value = np.asarray(value)
    return bool(value.reshape(-1)[0]) if value.size == 1 else None


def _inlined(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    graph = model.graph
    producers = {out: n for n in graph.node for out in n.output}
    nodes, added, count = [], [], 0
    for index, node in enumerate(graph.node):
        taken = None
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            condition = _condition(node.input[0], model, producers)
            if condition is not None:
                branch = "then_branch" if condition else "else_branch"
                taken = onnx.GraphProto()
                taken.CopyFrom(next(a.g for a in node.attribute if a.name == branch))
        if taken is None:
            nodes.append(node)
            continue
        count += 1
        # The branch's own values renamed: copies of one If (an unrolled loop's) would define the same names
        local = [t.name for t in taken.initializer] + [out for n in taken.node for out in n.output if out]
        names = {name: f"{name}__if{index}" for name in local}
        for weight in taken.initializer:
            weight.name = names[weight.name]
        for inner in taken.node:
            inner.output[:] = [names.get(o, o) for o in inner.output]
        _rename_outer(taken, names)
        added.extend(taken.initializer)
        nodes.extend(taken.node)
        for inner, outer in zip(taken.output, node.output):
            nodes.append(helper.make_node("Identity", [inner.name], [outer]))
    return _rebuilt(model, nodes, added, count)


def _sequence_items(graph: onnx.GraphProto) -> dict[str, list[str]]:
    """The sequences whose items are known by name: built by SequenceConstruct or SequenceEmpty, grown at the end by
    SequenceInsert."""
    items: dict[str, list[str]] = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "SequenceConstruct":
            items[node.output[0]] = list(node.input)
        elif node.op_type == "SequenceEmpty":
            items[node.output[0]] = []
        elif node.op_type == "SequenceInsert" and node.input[0] in items and len(node.input) == 2:
            items[node.output[0]] = items[node.input[0]] + [node.input[1]]
    return items


def _structural_value(node: onnx.NodeProto, items: dict, producers: dict) -> Optional[np.ndarray]:
    """What a node answers from the graph's structure alone, else None: SequenceLength of a sequence whose items are
    known (a tuple's length is static); OptionalHasElement where the node that made its input says it (Optional() is
    empty; Optional(x), and any value a plain op makes, a sequence or a tensor, is not)."""
    if node.op_type == "SequenceLength" and node.input[0] in items:
        return np.array(len(items[node.input[0]]), np.int64)
    if node.op_type != "OptionalHasElement" or not node.input or not node.input[0]:
        return None
    source = producers.get(node.input[0])
    if source is None or source.op_type in ("If", "Loop", "Scan", "Identity", "OptionalGetElement"):
        return None
    return np.array(not (source.op_type == "Optional" and not [i for i in source.input if i]))


# Only small values are folded (shape arithmetic, trip counts): a weight stays as the model has it (a QDQ pair
# folded to float would lose its int8 kernel).
MAX_FOLDED_ELEMENTS = 4096


def _folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes whose inputs are all weights (or Shape/Size of a static input) -> weights holding their outputs,
    computed with onnx's reference evaluator node by node (onnxslim leaves such chains when one of its nodes is
    one ONNX Runtime's folding rejects, e.g. Split by num_outputs)."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    values = Values(graph.initializer)
    shapes = _static_shapes(graph)
    items = _sequence_items(graph)
    opsets = {o.domain: o.version for o in model.opset_import}
    kept, added = [], []
    producers = {out: n for n in graph.node for out in n.output}
    for node in graph.node:
        structural = _structural_value(node, items, producers)
        if structural is not None:
            values[node.output[0]] = structural
            added.append(numpy_helper.from_array(structural, node.output[0]))
            continue
        known = all(i == "" or i in values for i in node.input)
        reads_shape = node.op_type in ("Shape", "Size") and node.input[0] in shapes
        if node.domain not in ("", "ai.onnx") or node.op_type in ("If", *UNROLLED) or not (known or reads_shape):
            kept.append(node)
            continue
        if known and any(values[i].size > MAX_FOLDED_ELEMENTS for i in node.input if i):
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
        except Exception:  # a node the evaluator cannot run stays
            kept.append(node)
            continue
        if any(r is None or isinstance(r, (list, tuple)) for r in results):  # a sequence or optional stays
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


MAX_UNROLLED_NODES = 20000


def _body(node: onnx.NodeProto) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == "body")


def _attr(node: onnx.NodeProto, name: str, default):
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


class _Unroller:
    """Copies of a body graph, its values renamed per copy, appended to `nodes`."""

    def __init__(self, model: onnx.ModelProto, tag: str):
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self.tag = tag
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 18)
        self.count = 0

    def fresh(self, name: str) -> str:
        self.count += 1
        return f"{name}__{self.tag}_{self.count}"

    def constant(self, array: np.ndarray, name: str) -> str:
        from onnx import numpy_helper

        name = self.fresh(name)
        self.weights.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def copy(self, body: onnx.GraphProto, bound: dict[str, str]) -> list[str]:
        """One copy of `body` with its inputs bound to `bound` (input name -> value); returns its outputs' names."""
        names = dict(bound)
        for weight in body.initializer:
            renamed = onnx.TensorProto()
            renamed.CopyFrom(weight)
            renamed.name = names[weight.name] = self.fresh(weight.name)
            self.weights.append(renamed)
        for node in body.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [names.get(i, i) for i in node.input]
            for graph in _subgraphs(copy):  # an If's branches read the body's values by name
                _rename_outer(graph, names)
            for k, out in enumerate(node.output):
                if out:
                    names[out] = self.fresh(out)
                    copy.output[k] = names[out]
            copy.name = self.fresh(node.name or node.op_type)
            self.nodes.append(copy)
        return [names.get(o.name, o.name) for o in body.output]

    def emit(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=self.fresh(op), **attrs))
        return output

    def stack(self, values: list[str], axis: int, output: str) -> str:
        """The values (same shapes) stacked along a new `axis`."""
        expanded = []
        for value in values:
            if self.opset >= 13:
                axes = self.constant(np.array([axis], np.int64), "axes")
                expanded.append(self.emit("Unsqueeze", [value, axes], self.fresh(value)))
            else:
                expanded.append(self.emit("Unsqueeze", [value], self.fresh(value), axes=[axis]))
        return self.emit("Concat", expanded, output, axis=axis)

    def take(self, value: str, index: int, axis: int) -> str:
        position = self.constant(np.array(index, np.int64), "index")
        return self.emit("Gather", [value, position], self.fresh(value), axis=axis)


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds as attributes (an If's branches, a Loop's body)."""
    return [g for a in node.attribute
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))]


def _rename_outer(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename in place the values `graph` (a subgraph, and its own subgraphs) reads from its enclosing scope."""
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    local |= {out for node in graph.node for out in node.output}
    outer = {name: renamed for name, renamed in names.items() if name not in local}
    for node in graph.node:
        node.input[:] = [outer.get(i, i) for i in node.input]
        for inner in _subgraphs(node):
            _rename_outer(inner, outer)
    for value in graph.output:
        value.name = outer.get(value.name, value.name)


def _has_subgraphs(graph: onnx.GraphProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node
               for a in n.attribute)


def _unrolled_loop(node, model, values, shapes, unroller: _Unroller) -> bool:
    """Loop with a constant trip count M > 0, a constant true condition, and a body that passes its condition
    through: M copies of the body; scan outputs stacked on axis 0."""
    body = _body(node)
    trip = values.get(node.input[0]) if node.input and node.input[0] else None
    start = values.get(node.input[1]) if len(node.input) > 1 and node.input[1] else np.array(True)
    if trip is None or start is None or not bool(np.asarray(start).reshape(-1)[0]):
        return False
    trips = int(np.asarray(trip).reshape(-1)[0])
    if trips <= 0 or trips * max(len(body.node), 1) > MAX_UNROLLED_NODES:
        return False
    cond_in, cond_out = body.input[1].name, body.output[0].name
    passes_through = cond_out == cond_in or any(
        n.op_type == "Identity" and n.output[0] == cond_out and n.input[0] == cond_in for n in body.node)
    if not passes_through:
        return False
    carried = list(node.input[2:])
    true = unroller.constant(np.array(True), "cond")
    scans: list[list[str]] = [[] for _ in range(len(body.output) - 1 - len(carried))]
    for step in range(trips):
        bound = {body.input[0].name: unroller.constant(np.array(step, np.int64), "iteration"), cond_in: true}
        bound.update({v.name: c for v, c in zip(body.input[2:], carried)})
        outputs = unroller.copy(body, bound)
        carried = outputs[1:1 + len(carried)]
        for scan, value in zip(scans, outputs[1 + len(carried):]):
            scan.append(value)
    results = carried + scans
    for name, value in zip(node.output, results):
        if not name:
            continue
        if isinstance(value, list):
            unroller.stack(value, 0, name)
        else:
            unroller.emit("Identity", [value], name)
    return True


def _unrolled_scan(node, model, values, shapes, unroller: _Unroller, opset: int) -> bool:
    """Scan over static lengths: one copy of the body per element along the scan axis (per batch row for
    Scan-8, whose axis 0 is a batch and axis 1 the sequence)."""
    body = _body(node)
    if _has_subgraphs(body):
        return False
    scan_count = _attr(node, "num_scan_inputs", 0)
    inputs = list(node.input)
    if opset < 9:
        if inputs[0]:  # sequence_lens
            return False
        inputs = inputs[1:]
    states, scanned = inputs[:len(inputs) - scan_count], inputs[len(inputs) - scan_count:]
    if any(s not in shapes for s in scanned):
        return False
    batched = opset < 9
    in_axes = [0] * scan_count if batched else list(_attr(node, "scan_input_axes", [0] * scan_count))
    directions = list(_attr(node, "directions" if batched else "scan_input_directions", [0] * scan_count))
    out_count = len(body.output) - len(states)
    out_axes = [0] * out_count if batched else list(_attr(node, "scan_output_axes", [0] * out_count))
    out_directions = [0] * out_count if batched else list(_attr(node, "scan_output_directions", [0] * out_count))
    ranks = [len(shapes[s]) for s in scanned]
    in_axes = [a + r if a < 0 else a for a, r in zip(in_axes, ranks)]
    lengths = {shapes[s][a + (1 if batched else 0)] for s, a in zip(scanned, in_axes)}
    batches = shapes[scanned[0]][0] if batched else 1
    if len(lengths) != 1:
        return False
    length = lengths.pop()
    if length <= 0 or length * batches * max(len(body.node), 1) > MAX_UNROLLED_NODES:
        return False
    final_states, final_scans = [], []
    for row in range(batches):
        carried = [unroller.take(s, row, 0) for s in states] if batched else list(states)
        rows = [unroller.take(s, row, 0) for s in scanned] if batched else list(scanned)
        scans: list[list[str]] = [[] for _ in range(out_count)]
        for step in range(length):
            bound = {v.name: c for v, c in zip(body.input, carried)}
            for v, source, axis, direction in zip(body.input[len(states):], rows, in_axes, directions):
                bound[v.name] = unroller.take(source, length - 1 - step if direction else step, axis)
            outputs = unroller.copy(body, bound)
            carried = outputs[:len(states)]
            for scan, value in zip(scans, outputs[len(states):]):
                scan.append(value)
        final_states.append(carried)
        final_scans.append([list(reversed(s)) if d else s for s, d in zip(scans, out_directions)])
    for k, name in enumerate(node.output[:len(states)]):
        if name:
            if batched:
                unroller.stack([f[k] for f in final_states], 0, name)
            else:
                unroller.emit("Identity", [final_states[0][k]], name)
    for k, name in enumerate(node.output[len(states):]):
        if not name:
            continue
        if batched:
            per_row = [unroller.stack(f[k], 0, unroller.fresh(name)) for f in final_scans]
            unroller.stack(per_row, 0, name)
        else:
            unroller.stack(final_scans[0][k], out_axes[k], name)  # a negative axis counts from the stacked rank
    return True


def _unrolled_sequence_map(node, items: dict[str, list[str]], unroller: _Unroller) -> bool:
    """SequenceMap over sequences of known items: one copy of the body per item (a tensor input is passed to each
    copy whole); each output a SequenceConstruct of the copies' outputs."""
    body = _body(node)
    if node.input[0] not in items or _has_subgraphs(body):
        return False
    length = len(items[node.input[0]])
    sequences = [name in items for name in node.input]
    if any(seq and len(items[name]) != length for name, seq in zip(node.input, sequences)):
        return False
    if length * max(len(body.node), 1) > MAX_UNROLLED_NODES:
        return False
    outputs: list[list[str]] = [[] for _ in body.output]
    for step in range(length):
        bound = {v.name: items[name][step] if seq else name
                 for v, name, seq in zip(body.input, node.input, sequences)}
        for collected, value in zip(outputs, unroller.copy(body, bound)):
            collected.append(value)
    for name, collected, value in zip(node.output, outputs, body.output):
        if collected:
            unroller.emit("SequenceConstruct", collected, name)
        else:
            unroller.emit("SequenceEmpty", [], name, dtype=value.type.sequence_type.elem_type.tensor_type.elem_type)
    return True


def _unrolled(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:

    graph = model.graph
    values = Values(graph.initializer)
    shapes = _static_shapes(graph)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 18)
    nodes, weights, count = [], [], 0
    items = _sequence_items(graph)
    for index, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in UNROLLED:
            nodes.append(node)
            continue
        unroller = _Unroller(model, f"unroll{index}")
        if node.op_type == "Loop":
            done = _unrolled_loop(node, model, values, shapes, unroller)
        elif node.op_type == "Scan":
            done = _unrolled_scan(node, model, values, shapes, unroller, opset)
        else:
            done = _unrolled_sequence_map(node, items, unroller)
        if done:
            nodes.extend(unroller.nodes)
            weights.extend(unroller.weights)
            count += 1
        else:
            nodes.append(node)
    return _rebuilt(model, nodes, weights, count)


def static_control_flow(model: onnx.ModelProto, config: dict) -> onnx.ModelProto:
    """Each If whose condition is known -> its taken branch; each Loop with a constant trip count, Scan over
    static lengths and SequenceMap over sequences of known length -> unrolled; the constants that exposes (a
    branch's shape arithmetic, a trip count) folded; again until nothing changes."""
    from mlc.passes.onnx import constant_folding

    if not any(n.op_type in ("If", *UNROLLED) for n in model.graph.node):
        return model
    original, changed = model, False
    for _ in range(8):  # nested control flow surfaces one level per round
        model = _folded(model)
        model, inlined = _inlined(model)
        model, unrolled = _unrolled(model)
        if not inlined and not unrolled:
            break
        changed = True
    if not changed:
        return original
    model = _without_identities(model)
    try:
        return constant_folding(model, config)
    except Exception:  # onnxslim's folding fails on some graphs (a SequenceConstruct of constants): unfolded, then
        return model


def _without_identities(model: onnx.ModelProto) -> onnx.ModelProto:
    """The Identity nodes inlining and unrolling leave, their readers reading the source: TVM's importer takes a
    sequence of several items through an Identity as its first item (it unpacks what a single-output node returns)."""
    graph = model.graph
    keep = {o.name for o in graph.output}
    source = {n.output[0]: n.input[0] for n in graph.node
              if n.op_type == "Identity" and n.domain in ("", "ai.onnx") and n.output[0] not in keep}
    if not source:
        return model
    for name in list(source):  # chains: the first value that no dropped Identity made
        while source[name] in source:
            source[name] = source[source[name]]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = [n for n in out.graph.node if not (n.op_type == "Identity" and n.output and n.output[0] in source)]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    for node in out.graph.node:
        node.input[:] = [source.get(i, i) for i in node.input]
        for inner in _subgraphs(node):
            _rename_outer(inner, source)
    return out


def _rebuilt(model: onnx.ModelProto, nodes: list, initializers: list, count: int) -> tuple[onnx.ModelProto, int]:
    """`model` with `nodes` as its graph and `initializers` added; itself when nothing changed (`count` 0)."""
    if not count:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(initializers)
    return out, count
