"""A kernel whose epilogue adds a tensor that nothing reads afterwards (a resnet block's skip) writes its output
over that tensor (`call_tir_inplace`), as OpenVINO's fused sum does: the write-back then stores to the cache
lines it has just read, not to lines it must first fetch, and the model holds one tensor less. Imports tvm."""

from __future__ import annotations


def all_blocks(sch, block, found: list) -> list:
    """`block` and every block under it, depth first, appended to `found`."""
    found.append(block)
    for child in sch.get_child_blocks(block):
        all_blocks(sch, child, found)
    return found


def _same_region(a, b) -> bool:
    import tvm_ffi

    return len(a.region) == len(b.region) and all(
        tvm_ffi.structural_equal(x.min, y.min) and tvm_ffi.structural_equal(x.extent, y.extent)
        for x, y in zip(a.region, b.region))


def writes_over(func, source, output) -> bool:
    """Whether the PrimFunc `func` may write its `output` buffer over its `source` input: `source` is read only by
    spatial blocks that write `output` at the indices they read it (an elementwise epilogue: each element is read
    before its own write, and by no other; a reduction's init would write first: a 1x1 average pool read zeros),
    and no block reads `output`."""
    import tvm_ffi
    from tvm import s_tir

    if len(source.shape) != len(output.shape) or str(source.dtype) != str(output.dtype) \
            or not all(tvm_ffi.structural_equal(a, b) for a, b in zip(source.shape, output.shape)):
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = all_blocks(sch, sch.get_sblock("root"), [])[1:]
    except Exception:  # ill-formed (schedule_rules.well_formed), or one opaque block not named "root" (TVM's
        return False   # generic cumsum): nothing this pass can read
    reads_source = False
    for block in blocks:
        stmt = sch.get(block)
        if any(r.source.same_as(output) for r in stmt.reads):
            return False
        ours = [r for r in stmt.reads if r.source.same_as(source)]
        if not ours:
            continue
        if len(stmt.writes) != 1 or not stmt.writes[0].source.same_as(output) or stmt.init is not None \
                or any(int(iv.iter_type) != 0 for iv in stmt.iter_vars) \
                or not all(_same_region(r, stmt.writes[0]) for r in ours):
            return False
        reads_source = True
    return reads_source


def _fresh_outputs_and_last_uses(mod, copies) -> tuple[set, set, dict]:
    """(vars bound to a copying kernel's fresh output; vars some use may alias, or a function returns; var -> the
    call that uses it last), over every Relax function of `mod`."""
    from tvm import relax

    made, unsafe, last_use = set(), set(), {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in getattr(func.body, "blocks", []):
            for b in block.bindings:
                copy = copies(b.value)
                if copy:  # (not a reshape: a view of its input, later)
                    made.add(b.var)
                for var in relax.analysis.free_vars(b.value):
                    last_use[var] = b.value
                    if not copy or sum(a.same_as(var) for a in b.value.args[1].fields) != 1:
                        unsafe.add(var)
        unsafe.update(relax.analysis.free_vars(func.body.body))  # the function's outputs
    return made, unsafe, last_use


def write_over_dead_inputs(mod):
    """`mod` with each `call_tir` whose kernel `writes_over` an argument turned into a `call_tir_inplace` on it,
    where that argument is another kernel's fresh output and this call is its last use, before memory planning.
    Every use must be a kernel that copies it (a reshape kernel becomes a view of it later: RewriteDataflowReshape)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from mlc.compiler.mutators import rewrite_functions

    call_tir, call_tir_inplace = tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.call_tir_inplace")
    mod = relax.transform.CanonicalizeBindings()(mod)  # `y = x` bindings would hide x's later uses as y's

    def kernel_call(value) -> bool:
        return isinstance(value, relax.Call) and (value.op.same_as(call_tir) or value.op.same_as(call_tir_inplace)) \
            and isinstance(value.args[1], relax.Tuple)

    def copies(value) -> bool:  # reads its arguments into new memory
        kernel = mod[value.args[0]] if kernel_call(value) and isinstance(value.args[0], tvm.ir.GlobalVar) else None
        return isinstance(kernel, tvm.tirx.PrimFunc) and not relax.analysis.has_reshape_pattern(kernel)

    made, unsafe, last_use = _fresh_outputs_and_last_uses(mod, copies)
    replaced: dict = {}  # (kernel, argument index) -> the in-place PrimFunc, or False

    def written_over(call):
        """The index of the argument `call` (a call_tir) may write its output over, or None."""
        func = mod[call.args[0]] if isinstance(call.args[0], tvm.ir.GlobalVar) else None
        if not isinstance(func, tvm.tirx.PrimFunc) or len(call.args) > 2:
            return None
        arguments, params = list(call.args[1].fields), list(func.params)
        if len(params) != len(arguments) + 1:  # one output, no symbolic-shape arguments
            return None
        for i, arg in enumerate(arguments):
            if arg not in made or arg in unsafe or not last_use[arg].same_as(call):
                continue
            if (call.args[0], i) not in replaced:
                replaced[(call.args[0], i)] = writes_over(func, params[i], params[-1]) and func.specialize(
                    {params[-1]: params[i]})
            if replaced[(call.args[0], i)]:
                return i
        return None

    new_kernels: dict = {}

    @mutator
    class InPlace(PyExprMutator):
        def visit_call_(self, call):
            index = written_over(call) if call.op.same_as(call_tir) and kernel_call(call) else None
            call = super().visit_call_(call)
            if index is None:
                return call
            key = (call.args[0], index)
            if key not in new_kernels:
                new_kernels[key] = self.builder_.add_func(replaced[key], f"{call.args[0].name_hint}_inplace")
            return relax.op.call_tir_inplace(new_kernels[key], call.args[1], [index], call.ty_args[0])

    if not made:
        return mod
    mod = rewrite_functions(InPlace(mod), mod)
    return relax.transform.DeadCodeElimination()(mod) if new_kernels else mod  # kernels no call uses now
