"""TopK and argsort on CPU as plain TIR. TVM's CPU topk/argsort are extern calls to
`tvm.contrib.sort.*`, packed functions that live in libtvm_runtime_extra.so, which artifacts do not
ship: the model compiled and then failed on its first run ("Cannot find function
tvm.contrib.sort.topk"; NonMaxSuppression's legalization argsorts its scores).
Here each row keeps its k best in the output, kept sorted by insertion (O(n k)); equal values
keep their input order, as ONNX Runtime does (and as the extern's stable sort did). Imports tvm."""

from __future__ import annotations

import contextlib
from mlc.compiler.mutators import rewrite_functions


def _topk_te(data, k: int, axis: int, ret_type: str, largest: bool, dtype: str):
    import tvm
    from tvm import te
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T
    from tvm.topi.utils import get_const_tuple

    shape = list(get_const_tuple(data.shape))
    axis = axis + len(shape) if axis < 0 else axis
    n = shape[axis]
    k = n if k < 1 else min(k, n)
    before, after = 1, 1
    for i, extent in enumerate(shape):
        if i < axis:
            before *= extent
        elif i > axis:
            after *= extent
    out_shape = shape[:axis] + [k] + shape[axis + 1:]

    def gen_ir(data_buf, values_buf, indices_buf):
        with IRBuilder() as ib:
            src = T.buffer_proxy(data_buf)
            values = T.buffer_proxy(values_buf)
            indices = T.buffer_proxy(indices_buf)
            with T.parallel(0, before * after) as row:
                base_in = (row // after) * n * after + row % after
                base_out = (row // after) * k * after + row % after
                pos_buf = T.alloc_buffer((1,), "int32", scope="local")
                pos = T.buffer_proxy(pos_buf)
                with T.serial(0, n) as t:
                    v = src[base_in + t * after]
                    filled = tvm.te.min(t, k)
                    # slot of v: after every kept value that ranks before it or ties with it
                    pos[0] = T.int32(0)
                    with T.serial(0, k) as q:
                        kept = values[base_out + q * after]
                        ahead = kept >= v if largest else kept <= v
                        with T.If(tvm.tirx.all(q < filled, ahead)):
                            with T.Then():
                                pos[0] = q + 1
                    with T.If(pos[0] < k):
                        with T.Then():
                            with T.serial(0, k - 1) as s:
                                q = k - 1 - s
                                with T.If(tvm.tirx.all(q > pos[0], q <= filled)):
                                    with T.Then():
                                        values[base_out + q * after] = values[base_out + (q - 1) * after]
                                        indices[base_out + q * after] = indices[base_out + (q - 1) * after]
                            values[base_out + pos[0] * after] = v
                            indices[base_out + pos[0] * after] = tvm.tirx.Cast(dtype, t)
            return ib.get()

    values, indices = te.extern(
        [out_shape, out_shape], [data], lambda ins, outs: gen_ir(ins[0], outs[0], outs[1]),
        dtype=[data.dtype, dtype], name="topk_cpu_tir", tag="topk_cpu_tir")
    if ret_type == "values":
        return values
    if ret_type == "indices":
        return indices
    return [values, indices]


def portable_topk(mod, target):
    """`mod` with every relax.topk on a CPU (llvm) target computed by plain TIR (see the module doc)."""
    import tvm
    from tvm.relax.expr_functor import PyExprMutator, mutator

    if target.kind.name != "llvm":
        return mod
    topk = tvm.ir.Op.get("relax.topk")

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(topk):
                return call
            a = call.attrs
            return self.builder_.call_te(_topk_te, call.args[0], int(a.k), int(a.axis), str(a.ret_type),
                                         bool(a.largest), str(a.dtype), primfunc_name_hint="topk")

    return rewrite_functions(Rewrite(mod), mod)


@contextlib.contextmanager
def portable_argsort(target):
    """Within the block, TVM's legalizations on a CPU (llvm) target argsort with plain TIR (a topk of
    the whole row) where the shape is static and no valid_count is given; else with TVM's extern."""
    import tvm.topi
    import tvm.topi.vision.nms as nms

    original = tvm.topi.argsort
    if target.kind.name != "llvm":
        yield
        return

    def argsort(data, valid_count=None, axis=-1, is_ascend=1, dtype="float32"):
        if valid_count is not None or not all(isinstance(d, tvm.tirx.IntImm) for d in data.shape):
            return original(data, valid_count=valid_count, axis=axis, is_ascend=is_ascend, dtype=dtype)
        return _topk_te(data, 0, axis, "indices", not is_ascend, dtype)

    tvm.topi.argsort = nms.argsort = argsort  # nms imported the name itself
    try:
        yield
    finally:
        tvm.topi.argsort = nms.argsort = original
