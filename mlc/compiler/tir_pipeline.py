"""TVM's TIR lowering for CPU targets, with one change: small "local" buffers live on the stack.

TVM 0.27's LowerTVMBuiltin turns every CPU allocation that is not a "global" buffer under 1 KB into
a TVMBackendAllocWorkspace/FreeWorkspace pair. A register tile's accumulator (up to 12 rows x 32
floats, "local") was therefore allocated, zeroed with memset and freed once per output tile, and
spilled to it at the end: resnet50's 64 -> 256 channel 1x1 conv ran at 59 GFLOP/s instead of 103. With TVM's
own `disable_lower_builtin` annotation, such a buffer becomes an LLVM alloca, which LLVM promotes to
registers. Imports tvm."""

from __future__ import annotations

NAME = "mlc_cpu"
STACK_BYTES = 4096  # a tile's accumulators; far below a worker thread's stack


def _on_stack(stmt):
    """`stmt` with its small constant-size "local" AllocBuffers annotated; unchanged nodes are
    returned as they are (so callers can tell, by identity, whether anything changed)."""
    from tvm import tirx

    if isinstance(stmt, tirx.AllocBuffer):
        buffer = stmt.buffer
        shape = [getattr(d, "value", None) for d in buffer.shape]
        annotations = dict(stmt.annotations or {})
        if (buffer.scope() != "local" or None in shape or "disable_lower_builtin" in annotations
                or _bytes(shape, buffer.dtype) > STACK_BYTES):
            return stmt
        return tirx.AllocBuffer(buffer, {**annotations, "disable_lower_builtin": tirx.IntImm("int32", 1)}, stmt.span)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_on_stack(s) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq, stmt.span)
    if isinstance(stmt, tirx.For):
        body = _on_stack(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.For(
            stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations,
            stmt.step, stmt.span)
    if isinstance(stmt, tirx.AttrStmt):
        body = _on_stack(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body, stmt.span)
    if isinstance(stmt, tirx.IfThenElse):
        then_case = _on_stack(stmt.then_case)
        else_case = _on_stack(stmt.else_case) if stmt.else_case is not None else None
        if then_case.same_as(stmt.then_case) and (else_case is None or else_case.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then_case, else_case, stmt.span)
    if isinstance(stmt, tirx.While):
        body = _on_stack(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.While(stmt.condition, body, stmt.span)
    return stmt  # leaves, and nodes without a statement body


def _bytes(shape, dtype) -> int:
    import tvm

    size = 1
    for extent in shape:
        size *= extent
    return size * tvm.DataType(str(dtype)).itemsize


def small_buffers_on_stack():
    """A PrimFunc pass: annotate small "local" buffers so LowerTVMBuiltin leaves them on the stack."""
    from tvm import tirx

    def transform(func, _mod, _ctx):
        body = _on_stack(func.body)
        return func if body.same_as(func.body) else func.with_body(body)

    return tirx.transform.prim_func_pass(transform, opt_level=0, name="mlc.SmallBuffersOnStack")


def register() -> str:
    """Register the pipeline with TVM (idempotent); returns its name for tvm.compile(tir_pipeline=)."""
    import tvm
    from tvm.tirx import compilation_pipeline

    if NAME not in compilation_pipeline.PIPELINE_MAP:
        def factory():
            lower, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir")
            return (lower, lambda: tvm.transform.Sequential([small_buffers_on_stack(), finalize_host()]),
                    finalize_device)

        compilation_pipeline.register_tir_pipeline(NAME, factory)
    return NAME
