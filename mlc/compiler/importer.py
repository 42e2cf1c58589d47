"""ONNX -> TVM Relax: which ops TVM can import, and the import itself."""

from __future__ import annotations

import ast
import functools
import math
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np
import onnx

from mlc.compiler import onnx_fixes, onnx_ops
from mlc.compiler.client import tvm_package_dir
from mlc.frontends import onnx_weights

STANDARD_DOMAINS = {"", "ai.onnx"}
_FRONTEND_SOURCE = "relax/frontend/onnx/onnx_frontend.py"
# Ops the importer converts itself, outside its converter table.
DIRECTLY_HANDLED = frozenset({"If"})
# Ops TVM 0.27's importer has no converter for and mlc adds (apply_conformance_overrides).
ADDED_CONVERTERS = frozenset({"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "QLinearMatMul", "Celu",
                              "CenterCropPad", "BlackmanWindow", "HannWindow", "HammingWindow", "MelWeightMatrix"})


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
            return keys | ADDED_CONVERTERS | DIRECTLY_HANDLED | onnx_ops.ADDED
    except (OSError, SyntaxError, StopIteration, AttributeError):
        pass
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return frozenset(_get_convert_map()) | ADDED_CONVERTERS | DIRECTLY_HANDLED | onnx_ops.ADDED


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

    _read_external_weights()
    _bfloat16_as_bfloat16()
    _keep_symbolic_range_lengths()
    _shape_inputs_as_tensors()
    apply_conformance_overrides()
    onnx_ops.register()
    problem = onnx_fixes.float8_problem(model)
    if problem:
        raise ConversionError("Cast", problem)
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


@functools.lru_cache(maxsize=1)
def _read_external_weights() -> None:
    """TVM's importer converts a weight with onnx's to_array, which needs its bytes in the message: loaded so, the
    model's weights and the module's constants were both in memory (bert-base's worker: 1.3 GB). A weight left in its
    file is read from it now, one at a time."""
    from tvm import runtime
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    original = ONNXGraphImporter._parse_array

    def parse_array(self, tensor_proto):
        if onnx_weights.is_external(tensor_proto):
            return runtime.tensor(onnx_weights.array(tensor_proto))
        return original(self, tensor_proto)

    ONNXGraphImporter._parse_array = parse_array


@functools.lru_cache(maxsize=1)
def _bfloat16_as_bfloat16() -> None:
    """TVM's importer takes ONNX's BFLOAT16 for float32 (onnx 1.17's numpy mapping): a bf16 input became a float32
    one, and a bf16 weight (onnx's structured uint16) failed ("unknown dtype"). Both as TVM's bfloat16."""
    from tvm import runtime
    from tvm.relax.frontend.onnx import onnx_frontend

    get_type, parse_array = onnx_frontend.get_type, onnx_frontend.ONNXGraphImporter._parse_array

    def bf16_type(elem_type):
        return "bfloat16" if elem_type == onnx.TensorProto.BFLOAT16 else get_type(elem_type)

    def bf16_array(self, tensor_proto):
        if tensor_proto.data_type != onnx.TensorProto.BFLOAT16:
            return parse_array(self, tensor_proto)
        return runtime.tensor(np.ascontiguousarray(onnx_weights.array(tensor_proto)))

    onnx_frontend.get_type = bf16_type
    onnx_frontend.ONNXGraphImporter._parse_array = bf16_array


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


# --- symbolic dims (issue #19): TVM 0.27's importer keeps Shape outputs as ShapeExprs and a scalar taken
# from one as a PrimExpr, but only a fixed list of ops accepts a ShapeExpr ("Node /m/Mul cannot handle
# ShapeExpr inputs"): transformers 5's mask code multiplies arange(batch) by Shape(mask)[1:2]. Such a
# node gets its shape inputs as int64 tensors instead (what ONNX means by them anyway).

# The ops TVM's _construct_nodes lets see a ShapeExpr (its own list, onnx_frontend.py).
_SHAPE_COMPATIBLE_OPS = frozenset({"Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand",
                                   "Concat", "Equal", "Where", "Cast", "CastLike", "Squeeze"})


@functools.lru_cache(maxsize=1)
def _shape_inputs_as_tensors() -> None:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    importer = onnx_frontend.ONNXGraphImporter
    construct = importer._construct_nodes

    def is_shape(value) -> bool:
        return isinstance(value, relax.Expr) and isinstance(getattr(value, "ty", None), relax.ShapeType)

    def construct_nodes(self, graph):
        for node in graph.node:
            if node.op_type not in _SHAPE_COMPATIBLE_OPS and any(is_shape(self._nodes.get(i)) for i in node.input):
                copy = onnx.NodeProto()
                copy.CopyFrom(node)
                for k, name in enumerate(node.input):
                    if is_shape(self._nodes.get(name)):
                        alias = f"{name}__mlc_tensor"
                        if alias not in self._nodes:
                            self._nodes[alias] = self.bb.normalize(relax.op.shape_to_tensor(self._nodes[name]))
                        copy.input[k] = alias
                node = copy
            construct(self, _OneNode(node))
        for value in graph.output:  # a shape (or a dim of one) the model returns is an int64 tensor in ONNX
            result = self._nodes.get(value.name)
            if tvm.ir.is_prim_expr(result) and str(result.ty.dtype) == "int64":
                result = relax.op.reshape(self.bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr([result]))), [])
            elif is_shape(result):
                result = relax.op.shape_to_tensor(result)
            if result is not self._nodes.get(value.name):
                self._nodes[value.name] = self.bb.normalize(result)

    importer._construct_nodes = construct_nodes


class _OneNode:
    """What TVM's _construct_nodes reads of a graph: its nodes."""

    def __init__(self, node: onnx.NodeProto):
        self.node = [node]

# ---- Converter overrides for ONNX conformance (#19): each function patches one converter family, once.

def apply_conformance_overrides() -> None:
    """Converters TVM 0.27 lacks or gets wrong, found by benchmarks/onnx_node_tests."""
    onnx_fixes.apply()
    _fold_variadic_pairwise()
    _add_loss_converters()
    _name_failing_converter()
    _layer_norm_statistics()
    _pow_mixed_types()
    _is_inf_signs()
    _bool_extreme_reductions()
    _clip_keeps_nan()


@functools.lru_cache(maxsize=1)
def _clip_keeps_nan() -> None:
    """Clip as relax maximum/minimum, which mlc legalizes NaN-preserving (compiler/relax_passes.py), instead of
    TVM's finished topi kernels: there LLVM's max turned a NaN input into the bound, where ONNX Runtime keeps NaN."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    clip = onnx_frontend.Clip

    def bounded(x, lo, hi):
        if lo is not None:
            x = relax.op.maximum(x, lo)
        return relax.op.minimum(x, hi) if hi is not None else x

    def v1(cls, bb, inputs, attr, params):
        dtype = inputs[0].ty.dtype
        lo, hi = (relax.const(float(attr[k]), dtype) if k in attr else None for k in ("min", "max"))
        return bounded(inputs[0], lo, hi)

    def constant_bound(x):
        """A scalar float constant bound's value, None for any other bound."""
        if not isinstance(x, tvm.ir.expr.Constant) or not hasattr(x.value, "numpy"):
            return None
        array = x.value.numpy()
        if array.size != 1 or array.dtype.kind != "f":
            return None
        value = float(array.reshape(()))
        return None if value != value else value

    def v13(cls, bb, inputs, attr, params):
        # Constant bounds (ReLU6): one clip, elementwise, that FuseOps folds into the conv before it; as
        # maximum/minimum of 0-d tensors it stayed a kernel of its own (mobilenetv2: 9 of 25 ms)
        given = [inputs[k] if len(inputs) > k else None for k in (1, 2)]
        values = [constant_bound(b) if b is not None else None for b in given]
        if any(b is not None for b in given) and all(v is not None or b is None for v, b in zip(values, given)):
            lo, hi = (v if v is not None else inf for v, inf in zip(values, (-math.inf, math.inf)))
            return relax.op.clip(inputs[0], lo, hi)
        lo, hi = (cls._sanitize_nan_clip_bound(bb, inputs[k], for_min=k == 1)
                  if len(inputs) > k and inputs[k] is not None else None for k in (1, 2))
        return bounded(inputs[0], lo, hi)

    clip._impl_v1 = classmethod(v1)
    clip._impl_v13 = classmethod(v13)


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

    added = {"NegativeLogLikelihoodLoss": NegativeLogLikelihoodLoss, "SoftmaxCrossEntropyLoss": SoftmaxCrossEntropyLoss,
             "QLinearMatMul": _qlinear_matmul_converter(), **_elementwise_and_shape_converters()}
    assert set(added) == ADDED_CONVERTERS
    onnx_ops.extend_convert_map(added)


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


def _qlinear_matmul_converter():
    """QLinearMatMul as ONNX defines it: (a - a_zp) @ (b - b_zp) in int32, times a_scale * b_scale / y_scale
    (in the scales' type), plus y_zp, rounded half to even and saturated to y's type."""
    import numpy as np
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    def dtype(x) -> str:
        return str(x.ty.dtype)

    def centred(x, zero_point, per_row: bool):
        rank = len(getattr(zero_point.ty, "shape", None) or [])
        zero_point = relax.op.astype(zero_point, "int32")
        if per_row and rank == 1:  # a's zero point per row: [M] -> [M, 1]
            zero_point = relax.op.expand_dims(zero_point, -1)
        return relax.op.subtract(relax.op.astype(x, "int32"), zero_point)

    class QLinearMatMul(onnx_frontend.OnnxOpConverter):
        @classmethod
        def _impl_v10(cls, bb, inputs, attr, params):
            a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
            product = bb.normalize(relax.op.matmul(bb.normalize(centred(a, a_zp, True)),
                                                   bb.normalize(centred(b, b_zp, False))))
            ratio = relax.op.divide(relax.op.multiply(a_scale, b_scale), y_scale)
            scaled = relax.op.multiply(relax.op.astype(product, "float64"), relax.op.astype(ratio, "float64"))
            shifted = relax.op.add(scaled, relax.op.astype(y_zp, "float64"))
            out = dtype(y_zp)
            info = np.iinfo(out)
            rounded = _round_half_even(shifted)
            clipped = relax.op.minimum(relax.op.maximum(rounded, relax.const(float(info.min), "float64")),
                                       relax.const(float(info.max), "float64"))
            return relax.op.astype(clipped, out)

        _impl_v21 = _impl_v10

    return QLinearMatMul


def _round_half_even(x):
    """numpy's rint: round half to even (TVM's round rounds halves away from zero)."""
    from tvm import relax

    floor = relax.op.floor(x)
    diff = relax.op.subtract(x, floor)
    half = relax.const(0.5, "float64")
    up = relax.op.add(floor, relax.const(1.0, "float64"))
    floor_is_even = relax.op.equal(relax.op.floor_mod(floor, relax.const(2.0, "float64")), relax.const(0.0, "float64"))
    tie = relax.op.where(floor_is_even, floor, up)
    return relax.op.where(relax.op.less(diff, half), floor, relax.op.where(relax.op.greater(diff, half), up, tie))


def _elementwise_and_shape_converters() -> dict:
    """Celu; CenterCropPad with a static input shape and a constant target shape (a slice, then a zero pad)."""
    import tvm
    from tvm import relax, topi
    from tvm.relax.frontend.onnx import onnx_frontend

    class Celu(onnx_frontend.OnnxOpConverter):
        @classmethod
        def _impl_v12(cls, bb, inputs, attr, params):
            x = inputs[0]
            dtype = str(x.ty.dtype)
            alpha = relax.const(attr.get("alpha", 1.0), dtype)
            zero = relax.const(0.0, dtype)
            negative = relax.op.multiply(alpha, relax.op.subtract(relax.op.exp(relax.op.divide(x, alpha)),
                                                                  relax.const(1.0, dtype)))
            return relax.op.add(relax.op.maximum(zero, x), relax.op.minimum(zero, negative))

    class CenterCropPad(onnx_frontend.OnnxOpConverter):
        @classmethod
        def _impl_v18(cls, bb, inputs, attr, params):
            data, target = inputs[0], onnx_frontend.get_constant(inputs[1], params)
            shape = [int(d) for d in data.ty.shape.values] if data.ty.shape is not None else None
            if not isinstance(target, tvm.ir.GenericConst) or shape is None:
                raise NotImplementedError("CenterCropPad needs a static input shape and a constant target shape")
            sizes = [int(v) for v in target.value.numpy().reshape(-1)]
            rank = len(shape)
            axes = [a + rank if a < 0 else a for a in attr.get("axes", list(range(rank)))]
            begin, end, before, after = [], [], [0] * rank, [0] * rank
            for axis, size in zip(axes, sizes):
                dim = shape[axis]
                if size < dim:
                    begin.append((dim - size) // 2)
                    end.append((dim - size) // 2 + size)
                else:
                    begin.append(0)
                    end.append(dim)
                    before[axis] = (size - dim) // 2
                    after[axis] = size - dim - before[axis]
            out = relax.op.strided_slice(data, axes, begin, end)
            if any(before) or any(after):
                out = bb.emit_te(topi.nn.pad, bb.normalize(out), before, after, 0.0)
            return out

    def evaluated(op: str):
        """An op whose inputs are all constants (a window's size, after mlc freezes it): onnx's reference
        evaluator computes the values at import; the model holds them as a constant."""

        class Evaluated(onnx_frontend.OnnxOpConverter):
            @classmethod
            def _impl_v17(cls, bb, inputs, attr, params):
                from onnx import helper
                from onnx.reference import ReferenceEvaluator

                values = [onnx_frontend.get_constant(x, params) for x in inputs]
                if not all(isinstance(v, tvm.ir.GenericConst) for v in values):
                    raise NotImplementedError(f"{op} needs constant inputs")
                names = [f"input{i}" for i in range(len(values))]
                kept = {k: v for k, v in attr.items() if not k.startswith("tvm_")}  # TVM adds its own
                node = helper.make_node(op, names, ["output"], **kept)
                result = ReferenceEvaluator(node).run(None, {n: v.value.numpy() for n, v in zip(names, values)})[0]
                return relax.const(result, str(result.dtype))

        Evaluated.__name__ = op
        return Evaluated

    windows = {op: evaluated(op) for op in ("BlackmanWindow", "HannWindow", "HammingWindow", "MelWeightMatrix")}
    return {"Celu": Celu, "CenterCropPad": CenterCropPad, **windows}


@functools.lru_cache(maxsize=1)
def _is_inf_signs() -> None:
    """IsInf's detect_positive / detect_negative: TVM ignores them and reports both infinities."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    def impl(cls, bb, inputs, attr, params):
        x = inputs[0]
        positive, negative = attr.get("detect_positive", 1), attr.get("detect_negative", 1)
        infinite = relax.op.isinf(x)
        if positive and negative:
            return infinite
        zero = relax.const(0, str(x.ty.dtype))
        if positive or negative:
            sign = relax.op.greater(x, zero) if positive else relax.op.less(x, zero)
            return relax.op.logical_and(infinite, sign)
        return relax.op.logical_and(infinite, relax.op.isnan(x))  # neither: all false

    onnx_frontend.IsInf._impl_v10 = classmethod(impl)


@functools.lru_cache(maxsize=1)
def _bool_extreme_reductions() -> None:
    """ReduceMax/ReduceMin of booleans (any/all): TVM has no max/min identity for bool and fails to build;
    reduce as uint8 and cast back."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    for cls in (onnx_frontend.ReduceMax, onnx_frontend.ReduceMin):
        for name in [n for n in vars(cls) if n.startswith("_impl_v")]:
            original = getattr(cls, name).__func__

            def impl(cls, bb, inputs, attr, params, _original=original):
                if str(getattr(getattr(inputs[0], "ty", None), "dtype", "")) != "bool":
                    return _original(cls, bb, inputs, attr, params)
                as_bytes = bb.normalize(relax.op.astype(inputs[0], "uint8"))
                reduced = bb.normalize(_original(cls, bb, [as_bytes, *inputs[1:]], attr, params))
                return relax.op.astype(reduced, "bool")

            setattr(cls, name, classmethod(impl))
