"""Every change mlc makes to TVM 0.27 at run time, applied by `apply()` (once per process; the compile worker calls
it through importer.to_relax), and the one place that reads TVM's source. Written against apache-tvm 0.27: `apply()`
refuses any other version in one line, since each patch wraps or replaces a private TVM function by name.

What is changed, and why (TVM's relax.frontend.onnx.onnx_frontend unless named; #19: found by
benchmarks/onnx_node_tests):

  ONNXGraphImporter._parse_array        a weight left in its file is read from it then, one at a time (bert-base's
                                        worker held 1.3 GB with the weights loaded into the message first)
  get_type, _parse_array                BFLOAT16 imports as TVM's bfloat16 (TVM took it for float32)
  Range._impl_v12                       a symbolic limit keeps the length an expression of the dims (torch's
                                        attention mask lost its shape, and a later Reshape failed)
  ONNXGraphImporter._construct_nodes    shape inputs of ops outside TVM's ShapeExpr list become int64 tensors; a
                                        returned shape is a tensor (transformers 5's mask code, #19)
  Split                                 constant sizes holding a 0 (relax's split needs increasing indices)
  Dropout                               its mask output (TVM returns the data twice)
  BatchNormalization._impl_v15          training_mode=1 (the batch's own statistics)
  ConvTranspose._impl_v1                the output_shape attribute (TVM ignores it)
  QuantizeLinear, DequantizeLinear      block_size (opset 21/23)
  Cast._impl_v13                        to FLOAT8E4M3FN as its bits in uint8 (TVM casts to float32)
  Resize, Upsample                      the forms TVM computes wrongly or fails on, through mlc.compiler.resize
  Max, Min, Sum, Mean._impl_v1          folded pairwise (TVM's stacked reduction fails to build: "Invalid SLayout")
  _get_convert_map                      converters TVM lacks: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss,
                                        QLinearMatMul, Celu, CenterCropPad, the windows, MelWeightMatrix (here),
                                        and mlc.compiler.onnx_ops.converters() (OneHot, ..., TreeEnsemble)
  ONNXGraphImporter._convert_operator   any converter failure -> ConversionError naming the op (exit 1, not 70)
  LayerNormalization._impl_v17          its Mean and InvStdDev outputs (TVM returns placeholders)
  Pow._impl_v7                          mixed base/exponent types and integer bases
  IsInf._impl_v10                       detect_positive / detect_negative (TVM ignores them)
  ReduceMax, ReduceMin                  of booleans (TVM has no bool max/min identity)
  Clip._impl_v1, _impl_v13              NaN kept (relax maximum/minimum); constant bounds as one fusable clip
  legalize relax.dynamic_strided_slice  an empty slice (start past end) has extent 0 (TVM's shape function gave a
                                        negative one and the run died in std::bad_alloc: test_slice_default_axes)
  _normalize_negative_indices           constant indices with no negative entry are left as they are (FoldConstant
                                        ran three TVM kernels on each to find nothing to change)
  dlight gpu MatmulTensorization        a kernel it cannot tensorize is scheduled without tensor cores (its
                                        schedule error failed the whole build, and fp16 fell back to fp32); bf16
                                        kernels are tensorized too, with bf16 wmma intrinsics registered here
  tvm_ffi global functions              the thin runtime's numpy functions for value-dependent ops
                                        (mlc.runtime.runner.register_host_functions), so a run here computes what
                                        the artifact will

Read, not changed: `_get_convert_map`'s dict literal in onnx_frontend.py (tvm_converter_ops), so the op check runs
before the 6 s `import tvm`. Not here, as they last only a block or a module load: sorting.portable_argsort swaps
tvm.topi.argsort during a CPU legalization; metaschedule.register_intrinsics stubs the tvm.s_tir.tensor_intrin
package to load one architecture's intrinsics."""

from __future__ import annotations

import ast
import contextvars
import functools
import math

import numpy as np
import onnx

from mlc.compiler import onnx_ops
from mlc.compiler import resize as mlc_resize
from mlc.compiler.onnx_fixes import FLOAT8
from mlc.compiler.onnx_ops import round_half_even
from mlc.compiler.tvm_install import TVM_PIN, tvm_package_dir
from mlc.errors import MissingDependencyError
from mlc.frontends import onnx_weights

TVM_SERIES = "0.27."  # the release these patches were written and checked against (pyproject pins 0.27.0.post1)
_FRONTEND_SOURCE = "relax/frontend/onnx/onnx_frontend.py"
# Ops TVM 0.27's importer has no converter for and mlc adds (_add_loss_converters).
ADDED_CONVERTERS = frozenset({"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "QLinearMatMul", "Celu",
                              "CenterCropPad", "BlackmanWindow", "HannWindow", "HammingWindow", "MelWeightMatrix"})


@functools.lru_cache(maxsize=1)
def apply() -> None:
    """Apply every patch, in the order the importer always applied them (each one also runs once only)."""
    import tvm

    if not tvm.__version__.startswith(TVM_SERIES):
        raise MissingDependencyError(f"mlc patches TVM {TVM_SERIES}x's ONNX importer and found TVM {tvm.__version__}; "
                                     f"run: pip install {TVM_PIN}")
    for patch in _PATCHES:
        patch()


def tvm_converter_ops() -> frozenset[str]:
    """Op types TVM's own ONNX importer has converters for. Read from the importer's source (its
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


class ConversionError(Exception):
    """TVM's importer has a converter for the op but cannot convert this node of a valid model (dynamic
    axes, pads or sizes; a type combination it lacks): the model is unsupported, not an mlc bug."""

    def __init__(self, op: str, reason: str):
        super().__init__(f"TVM's ONNX importer cannot convert a {op} node ({reason}); replace or decompose it in "
                         "the source model (constant axes, shapes and sizes import) before compiling")
        self.op = op


# ---- the importer's own behaviour

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


def _constant_indices_as_given() -> None:
    """Gather/ScatterND/... indices that are a constant with no negative entry go in as they are: the importer wrapped
    every index tensor in where(less(i, 0), i + extent, i), and FoldConstant then compiled and ran those three
    kernels on each constant (Longformer's folded sliding-window indices, 2.2 M entries each, 108 of them: 25 s of
    its build)."""
    import tvm
    from tvm.relax.frontend.onnx import onnx_frontend

    normalized = onnx_frontend._normalize_negative_indices

    def normalize(bb, indices, axis_extent):
        if isinstance(indices, tvm.ir.GenericConst) and (indices.value.numpy() >= 0).all():
            return indices
        return normalized(bb, indices, axis_extent)

    onnx_frontend._normalize_negative_indices = normalize


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
    _extend_convert_map(added)


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
        except Exception as e:  # converters raise anything (NotImplementedError, ValueError, TVMError)
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
            rounded = round_half_even(shifted)
            clipped = relax.op.minimum(relax.op.maximum(rounded, relax.const(float(info.min), "float64")),
                                       relax.const(float(info.max), "float64"))
            return relax.op.astype(clipped, out)

        _impl_v21 = _impl_v10

    return QLinearMatMul


def _evaluated(op: str):
    """A converter for an op whose inputs are all constants (a window's size, after mlc freezes it): onnx's
    reference evaluator computes the values at import; the model holds them as a constant."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

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


def _elementwise_and_shape_converters() -> dict:
    """Celu; CenterCropPad with a static input shape and a constant target shape (a slice, then a zero pad); the
    window ops on constant inputs."""
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

    windows = {op: _evaluated(op) for op in ("BlackmanWindow", "HannWindow", "HammingWindow", "MelWeightMatrix")}
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


# ---- more converter overrides (#19): node forms TVM builds wrongly (Resize's numerics are in resize.py)

@functools.lru_cache(maxsize=1)
def _split_with_empty_parts() -> None:
    """Split whose constant sizes hold a 0: relax's split needs strictly increasing indices ("split_indices must
    be sorted" at build), so each part becomes a strided slice."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    split = onnx_frontend.Split

    def sizes_of(inputs, attr, params, version: int):
        if version < 13:
            return attr.get("split")
        if len(inputs) < 2 or inputs[1] is None:
            return None
        value = onnx_frontend.get_constant(inputs[1], params)
        return value.value.numpy().reshape(-1).tolist() if isinstance(value, tvm.ir.GenericConst) else None

    for version in (1, 13):
        original = getattr(split, f"_impl_v{version}").__func__

        def impl(cls, bb, inputs, attr, params, _original=original, _version=version):
            sizes = sizes_of(inputs, attr, params, _version)
            if not sizes or all(int(s) > 0 for s in sizes):
                return _original(cls, bb, inputs, attr, params)
            axis = attr.get("axis", 0)
            ends = np.cumsum([int(s) for s in sizes]).tolist()
            starts = [0] + ends[:-1]
            return relax.Tuple([bb.normalize(relax.op.strided_slice(inputs[0], [axis], [b], [e]))
                                for b, e in zip(starts, ends)])

        setattr(split, f"_impl_v{version}", classmethod(impl))


@functools.lru_cache(maxsize=1)
def _dropout_mask() -> None:
    """Dropout's mask output (TVM returns the data twice): all ones, bool from opset 10 (the input's type
    before). Training mode with a ratio above 0 is random: refused (exit 1), not compiled."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    def identity(x, attr, mask_dtype: str):
        if attr["tvm_custom"]["num_outputs"] < 2:
            return x
        return relax.Tuple([x, relax.op.ones_like(x, mask_dtype)])

    def v1(cls, bb, inputs, attr, params):
        return identity(inputs[0], attr, str(inputs[0].ty.dtype))

    def v10(cls, bb, inputs, attr, params):
        return identity(inputs[0], attr, "bool")

    def v12(cls, bb, inputs, attr, params):
        values = []
        for k in (1, 2):
            value = onnx_frontend.get_constant(inputs[k], params) if len(inputs) > k and inputs[k] is not None \
                else None
            if value is not None and not isinstance(value, tvm.ir.GenericConst):
                raise NotImplementedError("Dropout needs a constant ratio and training_mode")
            values.append(None if value is None else value.value.numpy())
        ratio, training = values
        if training is not None and bool(np.asarray(training)) and (ratio is None or float(ratio) > 0):
            raise NotImplementedError("Dropout in training mode is random; mlc compiles inference graphs")
        return identity(inputs[0], attr, "bool")

    dropout = onnx_frontend.Dropout
    dropout._impl_v1 = classmethod(v1)
    dropout._impl_v10 = classmethod(v10)
    dropout._impl_v12 = classmethod(v12)


@functools.lru_cache(maxsize=1)
def _batch_norm_training() -> None:
    """BatchNormalization with training_mode=1: normalized by the batch's own mean and (biased) variance, and the
    running statistics as ONNX defines them (input * momentum + batch * (1 - momentum)); TVM mixed them up."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.BatchNormalization._impl_v15.__func__

    def impl(cls, bb, inputs, attr, params):
        if not attr.get("training_mode", 0):
            return original(cls, bb, inputs, attr, params)
        data, scale, bias, mean, var = inputs[:5]
        dtype, stats_dtype = str(data.ty.dtype), str(mean.ty.dtype)
        compute = "float32" if dtype == "float16" else dtype

        def cast(x):
            return x if str(x.ty.dtype) == compute else bb.normalize(relax.op.astype(x, compute))

        x = cast(data)
        rank = len(data.ty.shape)
        axes = [0] + list(range(2, rank))

        def per_channel(v):
            return relax.op.reshape(cast(v), [-1] + [1] * (rank - 2))

        batch_mean = bb.normalize(relax.op.mean(x, axes))
        batch_var = bb.normalize(relax.op.variance(x, axes))
        eps = relax.const(float(attr.get("epsilon", 1e-5)), compute)
        centred = relax.op.subtract(x, relax.op.reshape(batch_mean, [-1] + [1] * (rank - 2)))
        normalized = relax.op.divide(centred, relax.op.sqrt(relax.op.add(
            relax.op.reshape(batch_var, [-1] + [1] * (rank - 2)), eps)))
        y = relax.op.add(relax.op.multiply(normalized, per_channel(scale)), per_channel(bias))
        momentum = float(attr.get("momentum", 0.9))

        def running(old, batch):
            mixed = relax.op.add(relax.op.multiply(cast(old), relax.const(momentum, compute)),
                                 relax.op.multiply(batch, relax.const(1 - momentum, compute)))
            return mixed if compute == stats_dtype else relax.op.astype(mixed, stats_dtype)

        y = y if compute == dtype else relax.op.astype(y, dtype)
        return relax.Tuple([y, running(mean, batch_mean), running(var, batch_var)])

    onnx_frontend.BatchNormalization._impl_v15 = classmethod(impl)


@functools.lru_cache(maxsize=1)
def _conv_transpose_output_shape() -> None:
    """ConvTranspose's output_shape attribute (TVM ignores it): the pads it implies, as onnx's reference derives
    them; a negative pad (a larger output than the full result) becomes zero rows, then the bias."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.ConvTranspose._impl_v1.__func__

    def impl(cls, bb, inputs, attr, params):
        shape = getattr(inputs[0].ty, "shape", None)
        if "output_shape" not in attr or shape is None:
            return original(cls, bb, inputs, attr, params)
        spatial = [int(d) for d in shape.values[2:]]
        n = len(spatial)
        out_shape = list(attr["output_shape"])[-n:]
        strides = list(attr.get("strides", [1] * n))
        dilations = list(attr.get("dilations", [1] * n))
        output_padding = list(attr.get("output_padding", [0] * n))
        kernel = list(attr["kernel_shape"]) if "kernel_shape" in attr else \
            [int(d) for d in inputs[1].ty.shape.values[2:]]
        auto_pad = attr.get("auto_pad", b"NOTSET")
        upper = (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) == "SAME_UPPER"
        begin, end = [], []
        for i in range(n):
            full = strides[i] * (spatial[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1
            total = full - out_shape[i]
            small, large = total // 2, total - total // 2
            begin.append(small if upper else large)
            end.append(large if upper else small)
        kept = {k: v for k, v in attr.items() if k not in ("output_shape", "auto_pad")}
        kept["pads"] = [max(p, 0) for p in begin + end]
        out = bb.normalize(original(cls, bb, [inputs[0], inputs[1], None], kept, params))
        if any(p < 0 for p in begin + end):
            widths = [0, 0, 0, 0] + [w for b, e in zip(begin, end) for w in (max(-b, 0), max(-e, 0))]
            out = bb.normalize(relax.op.nn.pad(out, widths))
        if len(inputs) > 2 and inputs[2] is not None:
            out = relax.op.add(out, relax.op.reshape(inputs[2], [1, -1] + [1] * n))
        return out

    onnx_frontend.ConvTranspose._impl_v1 = classmethod(impl)


@functools.lru_cache(maxsize=1)
def _blocked_quantization() -> None:
    """QuantizeLinear/DequantizeLinear with block_size (opset 21): one scale (and zero point) per block of
    block_size elements along `axis`, repeated to the data's shape, then the elementwise formula (round half to
    even and saturate to the output type when quantizing)."""
    import numpy as np
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    def expanded(value, data, axis: int, block: int):
        """`value` per element of `data`: each repeated block_size times along axis, the last block cut."""
        size = int(data.ty.shape.values[axis])
        return relax.op.strided_slice(relax.op.repeat(value, block, axis), [axis], [0], [size])

    def layout(inputs, attr):
        x = inputs[0]
        axis = attr.get("axis", 1)
        axis = axis + x.ty.ndim if axis < 0 else axis
        zp = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        return x, axis, zp

    def quantize(cls, bb, inputs, attr, params):
        x, axis, zp = layout(inputs, attr)
        block = int(attr["block_size"])
        output_dtype = attr.get("output_dtype", 0)
        out = onnx_frontend.get_type(output_dtype) if output_dtype else str(zp.ty.dtype) if zp is not None \
            else "uint8"
        if out not in ("int8", "uint8", "int16", "uint16", "int32", "uint32"):
            raise NotImplementedError(f"blocked QuantizeLinear to {out}")
        scale = expanded(inputs[1], x, axis, block)
        ratio = relax.op.astype(relax.op.divide(x, bb.normalize(scale)), "float64")
        shifted = round_half_even(bb.normalize(ratio))
        if zp is not None:
            shifted = relax.op.add(shifted, relax.op.astype(expanded(zp, x, axis, block), "float64"))
        info = np.iinfo(out)
        return relax.op.astype(relax.op.clip(shifted, float(info.min), float(info.max)), out)

    def dequantize(cls, bb, inputs, attr, params):
        x, axis, zp = layout(inputs, attr)
        block = int(attr["block_size"])
        scale = bb.normalize(expanded(inputs[1], x, axis, block))
        dtype = str(scale.ty.dtype)
        value = relax.op.astype(x, "int32")
        if zp is not None:
            value = relax.op.subtract(value, relax.op.astype(expanded(zp, x, axis, block), "int32"))
        return relax.op.multiply(relax.op.astype(value, dtype), scale)

    for cls, blocked in ((onnx_frontend.QuantizeLinear, quantize), (onnx_frontend.DequantizeLinear, dequantize)):
        for version in (21, 23):
            original = getattr(cls, f"_impl_v{version}").__func__

            def impl(cls, bb, inputs, attr, params, _original=original, _blocked=blocked):
                if attr.get("block_size", 0):
                    return _blocked(cls, bb, inputs, attr, params)
                return _original(cls, bb, inputs, attr, params)

            setattr(cls, f"_impl_v{version}", classmethod(impl))


@functools.lru_cache(maxsize=1)
def _cast_to_float8() -> None:
    """Cast to FLOAT8E4M3FN as its bit pattern in uint8 (TVM casts to float32: get_type maps float8 to it):
    rounded to nearest even, saturated to 448 (or NaN with saturate=0), NaN 0x7F, the sign kept (-0 too).
    The other float8 types are refused."""
    from tvm import relax, topi
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.Cast._impl_v13.__func__

    def i32(value: int):
        return relax.const(value, "int32")

    def power_of_two(bb, exponent):
        """2**exponent (int32 tensor, a normal float32 exponent) as float32, exactly."""
        return bb.emit_te(topi.reinterpret, bb.normalize(relax.op.left_shift(
            relax.op.add(exponent, i32(127)), i32(23))), "float32")

    def exponent_of(bb, x):
        bits = bb.emit_te(topi.reinterpret, x, "int32")
        return bits, bb.normalize(relax.op.subtract(relax.op.bitwise_and(relax.op.right_shift(bits, i32(23)),
                                                                         i32(255)), i32(127)))

    def e4m3fn_bits(bb, x, saturate: bool):
        x = x if str(x.ty.dtype) == "float32" else bb.normalize(relax.op.astype(x, "float32"))
        bits, exponent = exponent_of(bb, x)
        magnitude = bb.normalize(relax.op.abs(x))
        quantum = power_of_two(bb, relax.op.subtract(relax.op.maximum(exponent, i32(-6)), i32(3)))
        steps = round_half_even(bb.normalize(relax.op.astype(relax.op.divide(magnitude, quantum), "float64")))
        rounded = bb.normalize(relax.op.multiply(relax.op.astype(steps, "float32"), quantum))
        _, rounded_exponent = exponent_of(bb, rounded)
        scale = power_of_two(bb, relax.op.subtract(rounded_exponent, i32(3)))
        normal_code = relax.op.add(relax.op.multiply(relax.op.astype(relax.op.add(rounded_exponent, i32(6)),
                                                                     "float32"), relax.const(8.0, "float32")),
                                   relax.op.divide(rounded, scale))
        code = relax.op.where(relax.op.greater_equal(rounded, relax.const(2.0 ** -6, "float32")), normal_code,
                              relax.op.multiply(rounded, relax.const(512.0, "float32")))
        too_large = relax.const(126.0 if saturate else 127.0, "float32")
        code = relax.op.where(relax.op.greater(rounded, relax.const(448.0, "float32")), too_large, code)
        if not saturate:  # as onnx's reference and ONNX Runtime: their truncation keeps [480, 496) at 448
            quirk = relax.op.logical_and(relax.op.greater_equal(magnitude, relax.const(480.0, "float32")),
                                         relax.op.less(magnitude, relax.const(496.0, "float32")))
            code = relax.op.where(quirk, relax.const(126.0, "float32"), code)
        code = relax.op.where(relax.op.isnan(x), relax.const(127.0, "float32"), code)
        sign = relax.op.where(relax.op.less(bits, i32(0)), relax.const(128.0, "float32"),
                              relax.const(0.0, "float32"))
        return relax.op.astype(relax.op.add(code, sign), "uint8")

    def impl(cls, bb, inputs, attr, params):
        to = attr.get("to")
        if to not in FLOAT8:
            return original(cls, bb, inputs, attr, params)
        if to != onnx.TensorProto.FLOAT8E4M3FN:
            raise NotImplementedError(f"Cast to {onnx.TensorProto.DataType.Name(to)}")
        x = inputs[0]
        if not isinstance(x, relax.Expr) or not str(getattr(x.ty, "dtype", "")).startswith("float"):
            raise NotImplementedError("Cast to FLOAT8E4M3FN of a value that is not a float tensor")
        return e4m3fn_bits(bb, x, bool(attr.get("saturate", 1)))

    onnx_frontend.Cast._impl_v13 = classmethod(impl)


@functools.lru_cache(maxsize=1)
def _resize_through_mlc() -> None:
    """Resize-10/11/18 and Upsample-7/9 through `emit` where TVM's converter would be wrong or fails."""
    from tvm.relax.frontend.onnx import onnx_frontend

    resize_cls, upsample_cls = onnx_frontend.Resize, onnx_frontend.Upsample
    tvm_resize = resize_cls._impl_v18.__func__

    def resize_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        in_shape = mlc_resize.static_dims(x)
        mode = mlc_resize.Mode(mode=mlc_resize.attr_text(attr, "mode", "nearest"),
                               coordinate=mlc_resize.attr_text(attr, "coordinate_transformation_mode", "half_pixel"),
                               nearest=mlc_resize.attr_text(attr, "nearest_mode", "round_prefer_floor"),
                               cubic_a=float(attr.get("cubic_coeff_a", -0.75)),
                               exclude_outside=bool(attr.get("exclude_outside", 0)),
                               antialias=bool(attr.get("antialias", 0)),
                               extrapolation=float(attr.get("extrapolation_value", 0.0)))
        try:
            roi, scales, sizes = (mlc_resize.constant_input(inputs[k], params) if len(inputs) > k else None
                                  for k in (1, 2, 3))
        except mlc_resize.NotConstant:
            return tvm_resize(cls, bb, inputs, attr, params)
        if in_shape is None or (scales is None) == (sizes is None):
            return tvm_resize(cls, bb, inputs, attr, params)
        axes = list(attr["axes"]) if "axes" in attr else None
        resize = mlc_resize.plan(in_shape, scales, sizes, axes, roi,
                                 mlc_resize.attr_text(attr, "keep_aspect_ratio_policy", "stretch"))
        if resize is None or mlc_resize.tvm_is_exact(in_shape, resize, mode, attr, scales is not None):
            return tvm_resize(cls, bb, inputs, attr, params)
        return mlc_resize.emit(bb, x, resize, mode)

    def simple(cls, bb, x, scales, attr):
        """Resize-10 and Upsample: asymmetric coordinates, nearest by ORT's rule (floor up, ceil down)."""
        in_shape = mlc_resize.static_dims(x)
        resize = mlc_resize.plan(in_shape, np.asarray(scales, np.float32), None, None, None) \
            if in_shape is not None and scales is not None else None
        if resize is None:
            raise NotImplementedError(f"{cls.__name__} needs constant scales and static dims where they resize")
        mode = mlc_resize.attr_text(attr, "mode", "nearest")
        mode = mlc_resize.Mode(mode="linear" if mode == "bilinear" else mode, coordinate="asymmetric", nearest="simple")
        return mlc_resize.emit(bb, x, resize, mode)

    def resize_v10(cls, bb, inputs, attr, params):
        try:
            scales = mlc_resize.constant_input(inputs[1], params)
        except mlc_resize.NotConstant:
            scales = None
        return simple(cls, bb, inputs[0], scales, attr)

    def upsample_v7(cls, bb, inputs, attr, params):
        return simple(cls, bb, inputs[0], attr.get("scales"), attr)

    def upsample_v9(cls, bb, inputs, attr, params):
        return resize_v10(cls, bb, inputs, attr, params)

    resize_cls._impl_v10 = classmethod(resize_v10)
    resize_cls._impl_v11 = classmethod(resize_v11)
    resize_cls._impl_v18 = classmethod(resize_v11)
    upsample_cls._impl_v7 = classmethod(upsample_v7)
    upsample_cls._impl_v9 = classmethod(upsample_v9)


# ---- mlc's converters and host functions

@functools.lru_cache(maxsize=1)
def _mlc_converters() -> None:
    """Put mlc's converters (onnx_ops) in TVM's converter table, and the artifact runtime's numpy functions
    for value-dependent ops in place of TVM's, so a model run in this process computes what its artifact will."""
    import tvm_ffi

    from mlc.runtime import runner

    runner.register_host_functions(tvm_ffi)

    table = onnx_ops.converters()
    assert onnx_ops.ADDED | onnx_ops.ML_ADDED <= set(table)
    _extend_convert_map(table)


def _extend_convert_map(table: dict) -> None:
    """Add `table` (op type -> converter class) to TVM's ONNX converter table, which it rebuilds on each import."""
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend._get_convert_map

    def convert_map():
        converters = original()
        converters.update(table)
        return converters

    onnx_frontend._get_convert_map = convert_map


@functools.lru_cache(maxsize=1)
def _empty_dynamic_slices() -> None:
    """TVM's legalization of dynamic_strided_slice, with each extent at least 0: ONNX's Slice with start past
    end (for its step's sign) is empty, and TVM's ceildiv(end - start, step) went negative."""
    from tvm import te, tirx, topi
    from tvm.ir import register_op_attr
    from tvm.relax.op import tensor_to_shape
    from tvm.relax.type import ShapeType

    def clamped(index, extent, step):
        index = tirx.Select(index < 0, index + extent, index)
        low = tirx.Select(step < 0, tirx.const(-1, "int64"), tirx.const(0, "int64"))
        return tirx.Min(tirx.Max(index, low), tirx.Select(step < 0, extent - 1, extent))

    def shape_func(data, begin, end, steps):
        def extent_of(i):
            dim = tirx.const(-1, "int64")
            for axis in range(data.ndim):
                dim = tirx.Select(i == tirx.const(axis, "int64"), data.shape[axis], dim)
            start, stop, step = clamped(begin[i], dim, steps[i]), clamped(end[i], dim, steps[i]), steps[i]
            length = tirx.Select(step < 0, tirx.ceildiv(start - stop, -step), tirx.ceildiv(stop - start, step))
            return tirx.Max(length, tirx.const(0, "int64"))

        return te.compute((begin.shape[0],), extent_of, name="T_shape_func_strided_slice_dynamic")

    def legalize(bb, call):
        shape = bb.normalize(bb.call_te(shape_func, *call.args))
        dims = [tirx.Var("s", "int64") for _ in range(int(shape.ty.shape[0]))]
        bb.match_cast(bb.emit(tensor_to_shape(shape)), ShapeType(dims))
        return bb.call_te(topi.dynamic_strided_slice, *call.args, output_shape=dims)

    register_op_attr("relax.dynamic_strided_slice", "FLegalize", legalize, level=11)


# The order the importer applied them in (to_relax, then conformance overrides, then onnx_ops' converters).
def _tensorization_falls_back() -> None:
    """dlight's GPU Matmul rule returns its tensor-core schedule without catching that schedule's failures: one
    kernel it cannot tensorize (a conv's im2col matmul with a dynamic batch, at fp16) failed the whole build, and the
    model fell back to fp32. A failed tensorization now returns None, and the rule schedules that kernel without
    tensor cores."""
    from tvm.s_tir.dlight.gpu import matmul
    from tvm.s_tir.schedule import ScheduleError

    for rule in (matmul.MatmulTensorization, matmul.MatmulInt8Tensorization):
        def apply(self, func, target, tunable, _original=rule.apply):
            try:
                return _original(self, func, target, tunable)
            except ScheduleError:
                return None

        rule.apply = apply


# The input type of the kernel dlight's tensor-core rule is scheduling (float16 or bfloat16)
_WMMA_INPUT = contextvars.ContextVar("mlc_wmma_input", default="float16")


def _bf16_tensor_cores() -> None:
    """dlight's GPU Matmul rule tensorizes float16 matmuls only, and TVM registers no bf16 wmma intrinsics, so a bf16
    build ran its matmuls and convs on CUDA cores. The rule now takes bf16 x bf16 -> fp32 as it takes fp16, with bf16
    intrinsics (nvcuda::wmma on nv_bfloat16 fragments, sm_80+) made by TVM's own generators on first use: importing
    TVM's CUDA intrinsics takes ~30 s, which CPU builds do not pay."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.dlight.gpu import matmul

    in_out_dtypes, tensorize = matmul.get_in_out_dtypes, matmul.MatmulTensorization.apply

    def dispatched_dtypes(block):
        # the rule's dispatch: bf16 -> fp32 goes where fp16 does
        read, written = in_out_dtypes(block)
        return ("float16", written) if (read, written) == ("bfloat16", "float32") else (read, written)

    def apply(self, func, target, tunable):
        _register_bf16_wmma()
        sch = Schedule(func)
        blocks = matmul.get_reduction_blocks(sch, sch.get_child_blocks(matmul.get_root_block(sch))) or []
        token = _WMMA_INPUT.set(in_out_dtypes(sch.get(blocks[0]))[0] if len(blocks) == 1 else "float16")
        try:
            return tensorize(self, func, target, tunable)
        finally:
            _WMMA_INPUT.reset(token)

    matmul.get_in_out_dtypes = dispatched_dtypes
    matmul.MatmulTensorization.apply = apply


@functools.cache
def _register_bf16_wmma() -> None:
    """The bf16 wmma intrinsics, and TVM's intrinsic-group lookup giving them for a bf16 kernel (the rule asks for
    the float16 group by name)."""
    from tvm.s_tir.tensor_intrin import cuda as intrinsics

    shape = "16x16x16"
    for name, desc_impl in (
            (f"wmma_load_{shape}_bf16_a_shared_dyn", intrinsics.get_wmma_load_intrin(
                16, 16, 16, "bfloat16", "shared.dyn", False, False)),
            (f"wmma_load_{shape}_bf16_b_trans_shared_dyn", intrinsics.get_wmma_load_intrin(
                16, 16, 16, "bfloat16", "shared.dyn", True, True)),
            (f"wmma_sync_{shape}_bf16bf16f32_trans", intrinsics.get_wmma_sync_intrin(
                16, 16, 16, "bfloat16", "float32", True))):
        intrinsics.TensorIntrin.register(name, *desc_impl, override=True)
    intrin_group = intrinsics.get_wmma_intrin_group

    def group(load_scope, store_scope, in_dtype, out_dtype, trans_b):
        names = intrin_group(load_scope, store_scope, in_dtype, out_dtype, trans_b)
        if _WMMA_INPUT.get() != "bfloat16" or (in_dtype, out_dtype) != ("float16", "float32"):
            return names  # the rule's retry with an fp16 accumulator stays fp16: it fails on a bf16 kernel
        return {role: name.replace("_f16_", "_bf16_").replace("f16f16", "bf16bf16") for role, name in names.items()}

    intrinsics.get_wmma_intrin_group = group


_PATCHES = (_read_external_weights, _bfloat16_as_bfloat16, _keep_symbolic_range_lengths, _shape_inputs_as_tensors,
            _split_with_empty_parts, _dropout_mask, _batch_norm_training, _conv_transpose_output_shape,
            _blocked_quantization, _cast_to_float8, _resize_through_mlc, _fold_variadic_pairwise,
            _add_loss_converters, _name_failing_converter, _layer_norm_statistics, _pow_mixed_types, _is_inf_signs,
            _bool_extreme_reductions, _clip_keeps_nan, _constant_indices_as_given, _empty_dynamic_slices,
            _mlc_converters, _tensorization_falls_back, _bf16_tensor_cores)
