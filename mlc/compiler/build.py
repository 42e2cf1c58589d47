"""Relax -> executable for a target, and the signature of the compiled `main`. Imports tvm."""

from __future__ import annotations

from typing import Any


def build(mod, target_json: dict[str, Any]):
    import tvm

    from mlc.compiler.sorting import portable_topk

    target = tvm.target.Target(target_json)
    with target:
        mod = portable_topk(mod, target)
    return tvm.compile(mod, target=target)


def _dim(value) -> int | str:
    # TVM 0.27 moved IntImm/Var between modules (tirx, ir.prim); duck-type instead.
    if hasattr(value, "value") and isinstance(value.value, int):
        return int(value.value)
    if hasattr(value, "name"):
        return str(value.name)
    return str(value)


def _tensors(ty) -> list[dict[str, Any]]:
    # In TVM 0.27 Relax "struct info" is `ty`/`ret_ty` with TensorType and TupleType.
    if hasattr(ty, "fields"):
        return [t for field in ty.fields for t in _tensors(field)]
    if hasattr(ty, "dtype") and hasattr(ty, "shape"):
        shape = [_dim(v) for v in ty.shape.values] if getattr(ty, "shape", None) is not None else []
        return [{"dtype": str(ty.dtype), "shape": shape}]
    raise TypeError(f"unsupported output kind {type(ty).__name__}")


def output_signature(mod) -> list[dict[str, Any]]:
    """dtype and shape (ints or symbolic names) of each flattened output of `main`."""
    return _tensors(mod["main"].ret_ty)
