"""A reduction over axes of extent 1 (a 1x1 max pool with stride 2: ResNet50V2's shortcut; a ReduceMax over an axis
of size 1) as the plain elementwise block it is: `out = max(init, x)` with no `T.init()`. Imports tvm.

dlight's `normalize_prim_func` (which mlc's default CPU rule and TVM's GPU rules start from) drops unit iteration
axes, so such a block comes out all spatial ("SSSS", `is_injective()`) while it keeps its `T.init()`. Then
`try_inline_contiguous_spatial` reverse-inlines the epilogue into it, and TVM 0.27 writes the epilogue into both the
init and the update: ResNet50V2's max pool -> skip add -> pre-activation BN -> ReLU computed
`relu((max(relu((-inf + b) * c), a) + b) * c)`, ReLU applied to the pool's running value (negative inputs read 0).
Folding the init into the update first leaves nothing to misplace; the result is the same number (one step of the
reduction)."""

from __future__ import annotations

from typing import Optional


def _same_indices(a, b) -> bool:
    import tvm_ffi

    return len(a) == len(b) and all(tvm_ffi.structural_equal(x, y) for x, y in zip(a, b))


def _own_load(expr, store) -> bool:
    from tvm import ir

    return isinstance(expr, ir.TensorLoad) and expr.source.same_as(store.buffer) \
        and _same_indices(expr.indices, store.indices)


def folded_block(block) -> Optional[object]:
    """`block` without its init when every reduction axis has extent 1 and the update is the usual
    `out = combine(out, x)` (sum, product, max, min, and, or): `out = combine(init, x)`. None when it is not such a
    block (multi-output reductions such as argmax are left alone)."""
    from tvm import s_tir, tirx

    init, body = block.init, block.body
    if init is None or not isinstance(init, tirx.BufferStore) or not isinstance(body, tirx.BufferStore):
        return None
    reductions = [iv for iv in block.iter_vars if int(iv.iter_type) == tirx.IterVar.CommReduce]
    if not all(isinstance(iv.dom.extent, tirx.IntImm) and int(iv.dom.extent) == 1 for iv in reductions):
        return None
    if not init.buffer.same_as(body.buffer) or not _same_indices(init.indices, body.indices):
        return None
    value = body.value
    combiners = (tirx.Add, tirx.Mul, tirx.Max, tirx.Min, tirx.And, tirx.Or)
    if not isinstance(value, combiners):
        return None
    if _own_load(value.a, body):
        value = type(value)(init.value, value.b)
    elif _own_load(value.b, body):
        value = type(value)(value.a, init.value)
    else:
        return None
    reads = [r for r in block.reads if not r.source.same_as(body.buffer)]
    return s_tir.SBlock(block.iter_vars, reads, block.writes, block.name_hint,
                        tirx.BufferStore(body.buffer, value, body.indices), None, block.alloc_buffers,
                        block.match_buffers, block.annotations)


def _fold_function(func):
    from tvm import s_tir

    from mlc.compiler.inplace import all_blocks

    try:
        sch = s_tir.Schedule(func)
        blocks = all_blocks(sch, sch.get_sblock("root"), [])[1:]
    except Exception:  # no "root" block, or a kernel TVM finds ill-formed: nothing this pass can read
        return func
    changed = False
    for rv in blocks:
        block = sch.get(rv)
        folded = folded_block(block)
        if folded is not None:
            sch.state.replace(sch.get_sref(rv), folded, {block: folded})
            changed = True
    return sch.mod["main"] if changed else func


def fold_unit_reductions():
    """A PrimFunc pass folding every unit reduction (`folded_block`); run it after FuseTIR, before any schedule."""
    from tvm import tirx

    return tirx.transform.prim_func_pass(lambda func, _mod, _ctx: _fold_function(func), opt_level=0,
                                         name="mlc.FoldUnitReductions")
