"""Relax -> executable for a target, and the signature of the compiled `main`. Imports tvm."""

from __future__ import annotations

from typing import Any


def build(mod, target_json: dict[str, Any], lifted: list, cuda_graphs: bool = False):
    """TVM's default pipeline for the target (GPU: with DLight schedules), then the weights lifted out of the
    executable into `lifted` (mlc.compiler.weights). `cuda_graphs` (CUDA): TVM's RewriteCUDAGraph captures the
    stretches of `main` whose shapes are static (their kernels and planned memory) on the first call and replays each
    as one graph launch after; stretches with dynamic shapes run kernel by kernel as before."""
    import tvm
    from tvm import relax

    from mlc.compiler import weights
    from mlc.compiler.sorting import portable_topk

    target = tvm.target.Target(target_json)
    with target:
        mod = portable_topk(mod, target)
    if cuda_graphs:
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            return tvm.compile(mod, target=target, relax_pipeline=_cuda_graph_pipeline(target, lifted))
    default = relax.get_pipeline("default")  # what tvm.compile picks for relax_pipeline="default"
    if "gpu" in target.keys:
        try:
            default = relax.get_default_pipeline(target)
        except (ValueError, AttributeError):
            pass
    return tvm.compile(mod, target=target, relax_pipeline=tvm.transform.Sequential([default,
                                                                                    weights.lift_constants(lifted)]))


def _cuda_graph_pipeline(target, lifted: list):
    """TVM's CUDA pipeline with the weights lifted before its finalisation, marked as weights (`num_input`): the
    memory planning and RewriteCUDAGraph then treat them as fixed, and capture the kernels that read them. Lifted
    last, as on the other targets, they were still constants there, and the captured functions took them into the
    library."""
    import tvm
    from tvm.relax.backend.cuda import pipeline as cuda

    from mlc.compiler import weights

    passes = [*cuda.library_dispatch_passes(target), *cuda.legalize_passes(target),
              *cuda.dataflow_lower_passes(target), weights.lift_constants(lifted, mark_weights=True),
              *cuda.finalize_passes(target)]

    @tvm.transform.module_pass(opt_level=0, name="mlc.CUDAGraphPipeline")
    def pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return pipeline


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
