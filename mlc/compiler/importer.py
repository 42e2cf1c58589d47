"""ONNX -> TVM Relax: which ops TVM can import, and the import itself."""

from __future__ import annotations

import ast
import re
import functools
from collections import Counter
from typing import Optional

import onnx

from mlc.compiler.client import tvm_package_dir

STANDARD_DOMAINS = {"", "ai.onnx"}
_FRONTEND_SOURCE = "relax/frontend/onnx/onnx_frontend.py"
# Ops TVM 0.27's importer has no converter for and mlc adds (apply_conformance_overrides).
ADDED_CONVERTERS = frozenset({"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"})


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
            return keys | ADDED_CONVERTERS
    except (OSError, SyntaxError, StopIteration, AttributeError):
        pass
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return frozenset(_get_convert_map()) | ADDED_CONVERTERS


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


def to_relax(model: onnx.ModelProto, dim_upper_bounds: Optional[dict[str, int]] = None):
    """The Relax module; `dim_upper_bounds` ({symbolic dim: largest size}) lets TVM plan memory
    for symbolic shapes once, at the largest size, instead of allocating per call."""
    from tvm.relax.frontend.onnx import from_onnx

    _keep_symbolic_range_lengths()
    apply_conformance_overrides()
    # Weights become constants of the module so the compiled library is self-contained.
    try:
        mod = from_onnx(model, keep_params_in_input=False)
    except AssertionError as e:  # e.g. MaxPool's Indices output, which TVM's converter does not produce
        found = re.search(r"Missing outputs during conversion.* in (\w+)", str(e))
        if not found:
            raise
        raise ConversionError(found.group(1), "it computes fewer outputs than the node has") from None
    if dim_upper_bounds:
        mod["main"] = mod["main"].with_attr("tir_var_upper_bound", dict(dim_upper_bounds))
    return mod


@functools.lru_cache(maxsize=1)
def _keep_symbolic_range_lengths() -> None:
    """TVM 0.27's ONNX Range, given a symbolic limit (`seq` from Shape->Gather), computes the
    length through a tensor and names it afresh (`range_len`): the attention mask torch builds
    from arange(seq) then has an unknown shape, and a later Reshape fails ("Reshape expects the
    input tensor to have known shape"). When every input is a constant int or a symbolic dim,
    relax's own arange keeps the length as an expression of the input dims."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    tvm_range = onnx_frontend.Range._impl_v12.__func__

    def scalar(value):
        if isinstance(value, tvm.ir.GenericConst):
            array = value.value.numpy()
            return array.item() if array.size == 1 and array.dtype.kind in "iu" else None
        return value if tvm.ir.is_prim_expr(value) else None

    def range_v12(cls, bb, inputs, attr, params):
        values = [scalar(onnx_frontend.get_constant(x, params)) for x in inputs]
        dtype = str(getattr(inputs[0], "ty", None) and inputs[0].ty.dtype or "int64")
        if all(v is not None for v in values) and any(tvm.ir.is_prim_expr(v) for v in values) \
                and dtype.startswith("int"):
            return relax.op.arange(*values, dtype=dtype)
        return tvm_range(cls, bb, inputs, attr, params)

    onnx_frontend.Range._impl_v12 = classmethod(range_v12)


# ---- Converter overrides for ONNX conformance (#19): each function patches one converter family, once.

def apply_conformance_overrides() -> None:
    """Converters TVM 0.27 lacks or gets wrong, found by benchmarks/onnx_node_tests."""
    _fold_variadic_pairwise()
    _add_loss_converters()
    _name_failing_converter()
    _layer_norm_statistics()
    _pow_mixed_types()


@functools.lru_cache(maxsize=1)
def _fold_variadic_pairwise() -> None:
    """Max, Min, Sum and Mean: TVM stacks the broadcast inputs and reduces over the new axis, and that
    reduction fails to build ("Invalid SLayout"); ONNX defines them elementwise, so fold the inputs
    pairwise with maximum/minimum/add (TVM's own path for unknown shapes)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    for cls in (onnx_frontend.Max, onnx_frontend.Min, onnx_frontend.Sum, onnx_frontend.Mean):
        original = cls._impl_v1.__func__

        def impl(cls, bb, inputs, attr, params, _original=original):
            import tvm

            if all(isinstance(x, tvm.ir.GenericConst) for x in inputs):
                return _original(cls, bb, inputs, attr, params)
            if len(inputs) == 1:
                return inputs[0]
            return cls._impl_dynamic(bb, inputs)

        cls._impl_v1 = classmethod(impl)


@functools.lru_cache(maxsize=1)
def _add_loss_converters() -> None:
    """NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (inference graphs that report a loss):
    gather each target's score, weight it (weight[target], 0 where target == ignore_index), reduce."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    def nll(input_, target, weight, attr):
        reduction = attr.get("reduction", b"mean")
        reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
        ignore = attr.get("ignore_index")
        dtype = input_.ty.dtype
        target_dtype = target.ty.dtype
        if ignore is not None:
            keep = relax.op.not_equal(target, relax.const(ignore, target_dtype))
            target = relax.op.where(keep, target, relax.op.zeros_like(target))
        picked = relax.op.squeeze(relax.op.gather_elements(input_, relax.op.expand_dims(target, 1), axis=1), [1])
        scale = relax.op.take(weight, target, axis=0) if weight is not None else relax.op.ones_like(picked)
        if ignore is not None:
            scale = relax.op.where(keep, scale, relax.op.zeros_like(scale))
        loss = relax.op.negative(relax.op.multiply(picked, scale))
        if reduction == "none":
            return loss
        total = relax.op.sum(loss)
        if reduction == "sum":
            return total
        return relax.op.divide(total, relax.op.astype(relax.op.sum(scale), dtype))

    def optional(inputs, index):
        return inputs[index] if len(inputs) > index and inputs[index] is not None else None

    class NegativeLogLikelihoodLoss(onnx_frontend.OnnxOpConverter):
        @classmethod
        def _impl_v12(cls, bb, inputs, attr, params):
            return nll(inputs[0], inputs[1], optional(inputs, 2), attr)

    class SoftmaxCrossEntropyLoss(onnx_frontend.OnnxOpConverter):
        @classmethod
        def _impl_v12(cls, bb, inputs, attr, params):
            log_prob = bb.normalize(relax.op.nn.log_softmax(inputs[0], axis=1))
            loss = nll(log_prob, inputs[1], optional(inputs, 2), attr)
            return relax.Tuple([loss, log_prob])

    added = {"NegativeLogLikelihoodLoss": NegativeLogLikelihoodLoss, "SoftmaxCrossEntropyLoss": SoftmaxCrossEntropyLoss}
    assert set(added) == ADDED_CONVERTERS
    original = onnx_frontend._get_convert_map

    def convert_map():
        table = original()
        table.update(added)
        return table

    onnx_frontend._get_convert_map = convert_map


class ConversionError(Exception):
    """TVM's importer has a converter for the op but cannot convert this node of a valid model (dynamic
    axes, pads or sizes; a type combination it lacks): the model is unsupported, not an mlc bug."""

    def __init__(self, op: str, reason: str):
        super().__init__(f"TVM's ONNX importer cannot convert a {op} node ({reason}); replace or decompose it in "
                         "the source model (constant axes, shapes and sizes import) before compiling")
        self.op = op


@functools.lru_cache(maxsize=1)
def _name_failing_converter() -> None:
    """Any converter failure -> ConversionError naming the op."""
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.ONNXGraphImporter._convert_operator

    def convert_operator(self, op_name, *args, **kwargs):
        try:
            return original(self, op_name, *args, **kwargs)
        except ConversionError:
            raise
        except Exception as e:  # noqa: BLE001 - converters raise anything (NotImplementedError, ValueError, TVMError)
            lines = str(e).strip().splitlines() or [type(e).__name__]
            raise ConversionError(op_name, lines[0][:200]) from e

    onnx_frontend.ONNXGraphImporter._convert_operator = convert_operator


@functools.lru_cache(maxsize=1)
def _layer_norm_statistics() -> None:
    """LayerNormalization's optional Mean and InvStdDev outputs: TVM returns scalar placeholders; compute
    them over the normalized axes, kept as size-1 dims, in the stash type (unused, they are dead code)."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.LayerNormalization._impl_v17.__func__

    def impl(cls, bb, inputs, attr, params):
        result = original(cls, bb, inputs, attr, params)
        data = inputs[0]
        shape = getattr(data.ty, "shape", None)
        if shape is None:
            return result
        rank = len(shape)
        axis = attr.get("axis", -1)
        axis = axis + rank if axis < 0 else axis
        axes = list(range(axis, rank))
        stash = "float32" if attr.get("stash_type", 1) == 1 else str(data.ty.dtype)
        x = data if str(data.ty.dtype) == stash else relax.op.astype(data, stash)
        mean = bb.normalize(relax.op.mean(x, axes, keepdims=True))
        variance = relax.op.mean(relax.op.square(relax.op.subtract(x, mean)), axes, keepdims=True)
        inv_std = relax.op.rsqrt(relax.op.add(variance, relax.const(attr.get("epsilon", 1e-5), stash)))
        return relax.Tuple([result[0], mean, inv_std])

    onnx_frontend.LayerNormalization._impl_v17 = classmethod(impl)


@functools.lru_cache(maxsize=1)
def _pow_mixed_types() -> None:
    """Pow with a base and an exponent of different types (ONNX allows it; the result has the base's type), or
    an integer base: TVM's power needs one float type. A float base takes the exponent cast to it; an integer
    base is raised in float64 and cast back."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.Pow._impl_v7.__func__

    def impl(cls, bb, inputs, attr, params):
        base, exponent = inputs[0], inputs[1]
        base_type = str(getattr(getattr(base, "ty", None), "dtype", ""))
        exponent_type = str(getattr(getattr(exponent, "ty", None), "dtype", ""))
        floating = base_type.startswith(("float", "bfloat"))
        if not base_type or not exponent_type or floating and base_type == exponent_type:
            return original(cls, bb, inputs, attr, params)
        if floating:
            return relax.op.power(base, relax.op.astype(exponent, base_type))
        wide = relax.op.power(relax.op.astype(base, "float64"), relax.op.astype(exponent, "float64"))
        return relax.op.astype(wide, base_type)

    onnx_frontend.Pow._impl_v7 = classmethod(impl)
