"""A tied token table stored once. A language model's token lookup reads the embedding table E [V, K], and its LM
head multiplies by E's transpose, which the schedules prepack ([K, V] -> [V/16, K, 16] on AVX-512); the artifact
held both, 1 GB of Llama-3.2-1B's 4.7 and 2.7 GB of gemma-3's. Here the lookup reads its rows from the prepacked head
instead (a row's elements are 16 floats apart there: one cache line each, for a few rows per call), so E is no
longer stored. Runs on the module after TVM's SplitLayoutRewritePreproc, before its prepacking calls are folded. Imports
tvm."""

from __future__ import annotations

import numpy as np


def _copy_map(func):
    """The index map of a PrimFunc that only moves each element of its one input to a new place in its one output
    (the prepacking that SplitLayoutRewritePreproc split out of a kernel), or None: any other kernel, or one that
    pads or casts on the way."""
    import tvm
    from tvm import s_tir, tirx

    if len(func.params) != 2:
        return None
    source, packed = func.params
    sch = s_tir.Schedule(func)
    blocks = _blocks(sch)
    if len(blocks) != 1 or str(source.dtype) != str(packed.dtype) or _size(source.shape) != _size(packed.shape):
        return None  # (a size that differs: padding)
    block = sch.get(blocks[0])
    store, iters = block.body, [iv.var for iv in block.iter_vars]
    if not (isinstance(store, tirx.BufferStore) and store.buffer.same_as(packed)
            and isinstance(store.value, tvm.ir.expr.TensorLoad) and store.value.source.same_as(source)
            and len(store.value.indices) == len(iters) == len(source.shape)
            and all(i.same_as(v) for i, v in zip(store.value.indices, iters))
            and all(_const(iv.dom.extent) == _const(n) for iv, n in zip(block.iter_vars, source.shape))):
        return None
    return iters, list(store.indices)


def _const(n) -> int | None:
    return int(n.value) if hasattr(n, "value") and isinstance(n.value, int) else None


def _size(shape) -> int | None:
    sizes = [_const(n) for n in shape]
    return None if None in sizes else int(np.prod(sizes))


def _loads_in(expr):
    """Whether `expr` (an index) reads a buffer."""
    import tvm

    return isinstance(expr, tvm.ir.expr.TensorLoad) or any(_loads_in(getattr(expr, part)) for part in ("a", "b")
                                                            if hasattr(expr, part))


def _gathered(sch, table) -> bool:
    """Whether every block that reads the buffer `table` reads it at rows that come from another buffer's values (a
    lookup, `take`), so that reading it in a new layout costs a few scattered rows, not a sweep."""
    regions = [r for b in _blocks(sch) for r in sch.get(b).reads if r.source.same_as(table)]
    return bool(regions) and all(_loads_in(r.region[0].min) for r in regions)


_NUMPY_DTYPES = {"float32", "float16", "float64", "int8", "uint8", "int32", "int64"}  # dlpack has no bfloat16


def _relation(table, source) -> str | None:
    """"same" when the lookup's table holds the prepacked weight's values, "transposed" when it holds them
    transposed (the head folded as Transpose(E)), else None. Compared in place (dlpack views): a sample first,
    then whole, in blocks of rows."""
    if str(table.value.dtype) != str(source.value.dtype) or str(table.value.dtype) not in _NUMPY_DTYPES:
        return None
    a, b = np.from_dlpack(table.value), np.from_dlpack(source.value)
    if a.ndim != 2:
        return None
    for relation, other in (("same", b), ("transposed", b.T)):
        if a.shape != other.shape:
            continue
        rows = np.random.default_rng(0).integers(0, a.shape[0], 64)
        if not np.array_equal(a[rows], other[rows]):
            continue
        step = max(1, (64 << 20) // max(1, a.shape[1] * a.itemsize))
        if all(np.array_equal(a[i:i + step], other[i:i + step]) for i in range(0, a.shape[0], step)):
            return relation
    return None


def read_lookups_from_packed(mod):
    """`mod` (split, not yet folded) with each lookup kernel whose table equals (or is the transpose of) a prepacked
    constant reading the prepacked tensor instead: its table parameter re-laid out with the prepacking's index map
    (composed with the transpose). The table itself is then unused and dropped."""
    from tvm import relax, s_tir
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from mlc.compiler.mutators import rewrite_functions

    rewrites = _lookups_of_packed_tables(mod)
    if not rewrites:
        return mod
    added: dict = {}  # (kernel, table argument) -> the kernel reading the packed table

    def relaid(builder, call, index, index_map):
        key = (call.args[0], index)
        if key not in added:
            sch = s_tir.Schedule(mod[call.args[0]])
            table = sch.mod["main"].params[index]
            reader = next(b for b in _blocks(sch) if any(r.source.same_as(table) for r in sch.get(b).reads))
            sch.transform_layout(reader, table, index_map, assume_injective_transform=True)
            added[key] = builder.add_func(sch.mod["main"], f"{call.args[0].name_hint}_from_packed")
        return added[key]

    @mutator
    class ReadPacked(PyExprMutator):
        def visit_call_(self, call):
            rewrite = rewrites.get(call)
            call = super().visit_call_(call)
            if rewrite is None:
                return call
            index, packing, index_map = rewrite
            try:
                kernel = relaid(self.builder_, call, index, index_map)
            except Exception:  # a layout the kernel cannot take: it keeps its own table
                return call
            args = list(call.args[1].fields)
            args[index] = self.builder_.emit(packing)  # EliminateCommonSubexpr merges it with the head's own
            return relax.call_tir(kernel, args, call.ty_args[0])

    return rewrite_functions(ReadPacked(mod), mod)


def _lookups_of_packed_tables(mod) -> dict:
    """{lookup call: (its table's argument index, the prepacking call whose constant holds the table's values, the
    index map from the table's [row, column] to the packed tensor)}."""
    import tvm
    from tvm import relax, s_tir

    call_tir = tvm.ir.Op.get("relax.call_tir")
    packings = []  # (the prepacking call, its constant, (its block's iter vars, where it writes each element))
    lookups = []  # (call, argument index, its constant)
    bindings = [b for func in mod.functions.values() if isinstance(func, relax.Function)
                for block in getattr(func.body, "blocks", []) for b in block.bindings]
    for binding in bindings:
        call = binding.value
        if not (isinstance(call, relax.Call) and call.op.same_as(call_tir)
                and isinstance(call.args[0], tvm.ir.GlobalVar) and isinstance(call.args[1], relax.Tuple)
                and isinstance(mod[call.args[0]], tvm.tirx.PrimFunc)):
            continue
        prim, args = mod[call.args[0]], list(call.args[1].fields)
        found = _copy_map(prim) if len(args) == 1 and isinstance(args[0], tvm.ir.GenericConst) else None
        if found:
            packings.append((call, args[0], found))
        tables = [i for i, a in enumerate(args) if isinstance(a, tvm.ir.GenericConst) and a.value.ndim == 2]
        if tables:
            sch = s_tir.Schedule(prim)
            lookups += [(call, i, args[i]) for i in tables if _gathered(sch, prim.params[i])]
    rewrites = {}
    for call, index, table in lookups:
        for packing, source, (iters, places) in packings:
            relation = _relation(table, source)
            if relation:
                rows = iters if relation == "same" else iters[::-1]  # the table's [row, column] in the packed one
                rewrites[call] = (index, packing, tvm.tirx.IndexMap(rows, places, None))
                break
    return rewrites


def _blocks(sch) -> list:
    from mlc.compiler.inplace import all_blocks

    return all_blocks(sch, sch.get_sblock("root"), [])[1:]
