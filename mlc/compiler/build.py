"""Relax -> executable for a target, and the signature of the compiled `main`. Imports tvm."""

from __future__ import annotations

from typing import Any


def build(mod, target_json: dict[str, Any], lifted: list):
    """TVM's default pipeline for the target (GPU: with DLight schedules), then the weights lifted out of the
    executable into `lifted` (mlc.compiler.weights)."""
    import tvm
    from tvm import relax

    from mlc.compiler import weights
    from mlc.compiler.sorting import portable_topk

    target = tvm.target.Target(target_json)
    with target:
        mod = portable_topk(mod, target)
    default = relax.get_pipeline("default")  # what tvm.compile picks for relax_pipeline="default"
    if "gpu" in target.keys:
        try:
            default = relax.get_default_pipeline(target)
        except (ValueError, AttributeError):
            pass
    return tvm.compile(mod, target=target, relax_pipeline=tvm.transform.Sequential([default,
                                                                                    weights.lift_constants(lifted)]))


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
