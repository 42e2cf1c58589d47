"""The smallest failing subgraph of a model TVM fails on in a mandatory step (exit 70), written as an ONNX file
for the bug report: the shortest failing prefix of the graph (bisection over its nodes, in graph order), then
the shortest window ending at that prefix's last node that still fails the same way (same stage, same message
but for numbers). Runs in the compile worker after the failure, within a time budget."""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import onnx
from onnx import helper

from mlc.child_process import WorkerResult
from mlc.compiler.contract import REPRODUCER_BUDGET_S as BUDGET_S
from mlc.compiler.contract import CompileFailure, CompileRequest, FailureKind
from mlc.frontends.onnx_weights import subgraphs

STAGES = ("import", "build", "export")  # the worker stages a subgraph can reproduce


def _names_in_subgraphs(node: onnx.NodeProto) -> set[str]:
    """Outer-scope names a node's subgraphs (If/Loop bodies) read."""
    names: set[str] = set()
    for graph in subgraphs(node):
        local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
        local |= {o for inner in graph.node for o in inner.output}
        names |= set().union(*(_consumed(inner) for inner in graph.node)) - local if graph.node else set()
    return names


def _consumed(node: onnx.NodeProto) -> set[str]:
    return {i for i in node.input if i} | _names_in_subgraphs(node)


def subgraph(model: onnx.ModelProto, types: dict[str, onnx.TypeProto], start: int, end: int
             ) -> Optional[onnx.ModelProto]:
    """Nodes [start, end) as a model: what they read from outside becomes graph inputs (initializers stay
    initializers), what the rest of the graph reads of them becomes outputs. None where a type is unknown."""
    nodes = list(model.graph.node)
    window = nodes[start:end]
    produced = {o for n in window for o in n.output if o}
    read_inside = set().union(*(_consumed(n) for n in window)) if window else set()
    read_outside = set().union(*(_consumed(n) for n in nodes[:start] + nodes[end:])) if len(window) < len(nodes) \
        else set()
    graph_outputs = {o.name for o in model.graph.output}
    initializers = {t.name: t for t in model.graph.initializer}
    outputs = [o for n in window for o in n.output if o and (o in read_outside or o in graph_outputs)]
    if not outputs:
        outputs = [o for o in window[-1].output if o]
    inputs = sorted(read_inside - produced - set(initializers), key=lambda name: name)
    if any(name not in types for name in inputs + outputs):
        return None
    graph = helper.make_graph(window, f"{model.graph.name or 'model'}_nodes_{start}_{end}",
                              [helper.make_value_info(n, types[n]) for n in inputs],
                              [helper.make_value_info(n, types[n]) for n in outputs],
                              [initializers[n] for n in sorted(read_inside & set(initializers))])
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    sub.functions.extend(model.functions)
    return sub


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The type of every named value shape inference knows (inputs, outputs, intermediates)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is best effort here
        inferred = model
    values = list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
    return {v.name: v.type for v in values if v.type.WhichOneof("value")}


def same_failure(a: str, b: str) -> bool:
    """Two one-line failure messages, alike but for numbers (value and buffer names carry counters)."""
    def norm(text: str) -> str:
        return re.sub(r"\d+", "N", text).strip()

    return norm(a) == norm(b)


def reduce(model: onnx.ModelProto, fails: Callable[[onnx.ModelProto], bool], budget_s: float = BUDGET_S
           ) -> Optional[onnx.ModelProto]:
    """The smallest subgraph `fails` holds for: the shortest failing prefix, then the shortest failing window
    ending at its last node. When the budget runs out, the smallest failing one found so far (None if none is
    smaller than the model)."""
    deadline = time.monotonic() + budget_s
    types = value_types(model)
    count = len(model.graph.node)
    tried: dict[tuple[int, int], bool] = {}

    def check(start: int, end: int) -> bool:
        if (start, end) not in tried:
            candidate = subgraph(model, types, start, end)
            tried[(start, end)] = candidate is not None and fails(candidate)
        return tried[(start, end)]

    best = (0, count)
    try:
        lo, hi = 0, count  # the prefix of lo nodes passes (none), that of hi fails (the model)
        while hi - lo > 1:
            if time.monotonic() > deadline:
                raise TimeoutError
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if check(0, mid) else (mid, hi)
        best = (0, hi)
        if check(hi - 1, hi):  # the last node alone
            return subgraph(model, types, hi - 1, hi)
        lo, top = 0, hi - 1  # the window from lo fails; from top (one node) it does not
        while top - lo > 1:
            if time.monotonic() > deadline:
                raise TimeoutError
            mid = (lo + top) // 2
            lo, top = (mid, top) if check(mid, hi) else (lo, mid)
        best = (lo, hi)
    except TimeoutError:
        pass
    if best == (0, count):
        return None
    return subgraph(model, types, *best)


def write(model: onnx.ModelProto, request: CompileRequest, stage: str, message: str,
          compile_request) -> CompileFailure:
    """Search the smallest subgraph that fails the worker's `stage` with `message` within the request's
    reproducer_budget_s and write it to request.reproducer; the failure's payload that names it (empty when none
    was found). `compile_request`: the worker's (passed in: the worker imports this module)."""
    from mlc.compiler import importer
    from mlc.compiler.log import summarize

    path = Path(request.reproducer)
    scratch = tempfile.TemporaryDirectory(prefix="mlc-reproducer-")

    def fails(candidate: onnx.ModelProto) -> bool:
        print(f"mlc: reproducer search: trying {len(candidate.graph.node)} node(s)", flush=True)
        if stage == "import":  # no need to build what imports
            try:
                importer.to_relax(candidate, request.dim_upper_bounds)
            except importer.ConversionError:
                return False
            except Exception as e:  # the failure looked for
                return same_failure(summarize(e), message)
            return False
        onnx_path = Path(scratch.name) / "candidate.onnx"
        onnx.save(candidate, str(onnx_path))
        sub = dataclasses.replace(request, onnx=str(onnx_path), unquantized_onnx=None, reproducer=None, run=None,
                                  kernels_dir=None, object_dir=None,
                                  library=str(Path(scratch.name) / "candidate.so") if stage == "export" else None)
        result = compile_request(sub)  # a CompileResult where it builds, else a WorkerResult
        return isinstance(result, WorkerResult) and result.kind == FailureKind.COMPILE and result.stage == stage \
            and same_failure(result.message, message)

    try:
        with scratch:
            found = reduce(model, fails, request.reproducer_budget_s)
        if found is None:
            return CompileFailure()
        onnx.save(found, str(path))
    except Exception as e:  # the search must never hide the failure it is about
        print(f"mlc: reproducer search failed: {type(e).__name__}: {e}", flush=True)
        return CompileFailure()
    return CompileFailure(reproducer=str(path), reproducer_nodes=len(found.graph.node),
                          model_nodes=len(model.graph.node))
