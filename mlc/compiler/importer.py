"""ONNX -> TVM Relax. Imports tvm: runs only inside the compile worker process."""

from __future__ import annotations

from collections import Counter

import onnx

STANDARD_DOMAINS = {"", "ai.onnx"}


def unsupported_ops(model: onnx.ModelProto) -> dict[str, dict]:
    """Every op type TVM's ONNX importer has no converter for: {op: {count, first_nodes}}."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    known = set(_get_convert_map())
    counts: Counter[str] = Counter()
    first: dict[str, list[str]] = {}
    for index, node in enumerate(model.graph.node):
        op = node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}.{node.op_type}"
        if node.domain in STANDARD_DOMAINS and node.op_type in known:
            continue
        counts[op] += 1
        names = first.setdefault(op, [])
        if len(names) < 3:
            names.append(node.name or f"#{index}")
    return {op: {"count": n, "first_nodes": first[op]} for op, n in counts.most_common()}


def to_relax(model: onnx.ModelProto):
    from tvm.relax.frontend.onnx import from_onnx

    # Weights become constants of the module so the compiled library is self-contained.
    return from_onnx(model, keep_params_in_input=False)
