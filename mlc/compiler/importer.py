"""ONNX -> TVM Relax: which ops TVM can import, and the import itself."""

from __future__ import annotations

import ast
import functools
from collections import Counter

import onnx

from mlc.compiler import tvm_package_dir

STANDARD_DOMAINS = {"", "ai.onnx"}
_FRONTEND_SOURCE = "relax/frontend/onnx/onnx_frontend.py"


@functools.lru_cache(maxsize=1)
def supported_ops() -> frozenset[str]:
    """Op types TVM's ONNX importer has converters for. Read from the importer's source (its
    `_get_convert_map` dict literal) so the check runs before the 6 s `import tvm`; falls back
    to importing it if the source ever stops being a plain literal."""
    try:
        tree = ast.parse((tvm_package_dir() / _FRONTEND_SOURCE).read_text())
        func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_get_convert_map")
        table = next(n.value for n in ast.walk(func) if isinstance(n, ast.Return))
        keys = frozenset(k.value for k in table.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
        if keys:
            return keys
    except (OSError, SyntaxError, StopIteration, AttributeError):
        pass
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return frozenset(_get_convert_map())


def unsupported_ops(model: onnx.ModelProto) -> dict[str, dict]:
    """Every op type TVM's ONNX importer cannot convert: {op: {count, first_nodes}}."""
    known = supported_ops()
    counts: Counter[str] = Counter()
    first: dict[str, list[str]] = {}
    for index, node in enumerate(model.graph.node):
        standard = node.domain in STANDARD_DOMAINS
        if standard and node.op_type in known:
            continue
        op = node.op_type if standard else f"{node.domain}.{node.op_type}"
        counts[op] += 1
        names = first.setdefault(op, [])
        if len(names) < 3:
            names.append(node.name or f"#{index}")
    return {op: {"count": n, "first_nodes": first[op]} for op, n in counts.most_common()}


def to_relax(model: onnx.ModelProto):
    from tvm.relax.frontend.onnx import from_onnx

    # Weights become constants of the module so the compiled library is self-contained.
    return from_onnx(model, keep_params_in_input=False)
