"""ONNX -> TVM Relax: which ops TVM can import, and the import itself (through TVM's importer as
mlc.compiler.tvm_patches changes it)."""

from __future__ import annotations

import functools
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Optional

import onnx

from mlc.compiler import onnx_fixes, onnx_ops, tvm_patches
from mlc.compiler.tvm_patches import ConversionError
from mlc.frontends import onnx_weights

STANDARD_DOMAINS = {"", "ai.onnx"}
# Ops the importer converts itself, outside its converter table.
DIRECTLY_HANDLED = frozenset({"If"})


@functools.lru_cache(maxsize=1)
def supported_ops() -> frozenset[str]:
    """Op types TVM's ONNX importer converts once mlc.compiler.tvm_patches has added its converters (read without
    importing tvm)."""
    return tvm_patches.tvm_converter_ops() | tvm_patches.ADDED_CONVERTERS | DIRECTLY_HANDLED | onnx_ops.ADDED


def unsupported_ops(model: onnx.ModelProto) -> dict[str, dict]:
    """Every op type TVM's ONNX importer cannot convert: {op: {count, first_nodes}}."""
    known = supported_ops()
    counts: Counter[str] = Counter()
    first: dict[str, list[str]] = {}
    for index, node in enumerate(model.graph.node):
        standard = node.domain in STANDARD_DOMAINS
        if standard and node.op_type in known or (node.domain, node.op_type) in onnx_ops.ML_OPS:
            continue
        op = node.op_type if standard else f"{node.domain}.{node.op_type}"
        counts[op] += 1
        names = first.setdefault(op, [])
        if len(names) < 3:
            names.append(node.name or f"#{index}")
    return {op: {"count": n, "first_nodes": first[op]} for op, n in counts.most_common()}


def to_relax(model: onnx.ModelProto, dim_upper_bounds: Optional[dict[str, int]] = None,
             weights_dir: Optional[Path] = None):
    """The Relax module; `dim_upper_bounds` ({symbolic dim: largest size}) lets TVM plan memory
    for symbolic shapes once, at the largest size, instead of allocating per call. `weights_dir`: where the
    model's external data lies when it was loaded without it (each weight is then read as TVM takes it)."""
    from tvm.relax.frontend.onnx import from_onnx

    tvm_patches.apply()
    problem = onnx_fixes.float8_problem(model)
    if problem:
        raise ConversionError("Cast", problem)
    if onnx_fixes.empty_optional_branch(model):
        raise ConversionError("If", "a branch returns an empty optional, which TVM cannot return at run time; give "
                                    "the condition's value with --inputs FILE.npz and --freeze NAME")
    # Weights become constants of the module so the compiled library is self-contained.
    try:
        with warnings.catch_warnings(), onnx_weights.weights_in(weights_dir):
            # from_onnx runs onnx's checker, which cannot find the external data from the model alone; the parent
            # checked the model (mlc.frontends.onnx.validate)
            warnings.filterwarnings("ignore", message="Data of TensorProto")
            mod = from_onnx(model, keep_params_in_input=False)
    except AssertionError as e:  # e.g. MaxPool's Indices output, which TVM's converter does not produce
        found = re.search(r"Missing outputs during conversion.* in (\w+)", str(e))
        if not found:
            raise
        raise ConversionError(found.group(1), "it computes fewer outputs than the node has") from None
    if dim_upper_bounds:
        mod["main"] = mod["main"].with_attr("tir_var_upper_bound", dict(dim_upper_bounds))
    return mod
