"""The weights beside the library: the build's constants become parameters of `main`, written to a file of their own.

TVM serialises a module's constants into the library (`export_library`), and loading that library copies them out
of it and deserialises them again: a 714 MB model held 3.8x its library at load, and the compile worker held the
weights in the IR, in the serialised executable and in its copy at once. Lifted out, the library holds code only,
the worker writes each weight once, and the runtime maps the file (the pages are the page cache's, shared and
never copied on CPU)."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

# Constants smaller than this stay in the executable (scalars, shapes, small tables): each lifted one is one more
# argument of every call.
MIN_BYTES = 4096
SUFFIX = ".weights"  # beside the library: model.so, model.weights
# TVM's kernels declare their buffers 64-byte aligned: every weight starts at a multiple of it in the file.
ALIGNMENT = 64


def lift_constants(collected: list, mark_weights: bool = False) -> Any:
    """A module pass, run last in the Relax pipeline (after FoldConstant has prepacked the weights and the VM
    lowering, whose shape checks the lifted parameters then skip): each distinct constant of `main` of at least
    MIN_BYTES becomes a trailing parameter of `main`; their tensors are appended to `collected`, in order.
    `mark_weights`: `main`'s `num_input` attribute says which parameters are inputs, the rest weights (for passes
    that run after it)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Lift(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.params: list = []
            self.seen: dict[int, Any] = {}
            self.same_bytes = _EqualTensors()

        def visit_generic_const_(self, const):  # TVM 0.27's relax.Constant; dtype literals are ones too
            data = const.value
            if not isinstance(data, tvm.runtime.Tensor) or _nbytes(data) < MIN_BYTES:
                return const
            key = data.__chandle__()  # the same tensor in several places: one parameter
            if key not in self.seen:
                # Equal values in different tensors too: the importer and FoldConstant make one per use
                # (AllenaiLongformerBase's attention indices, folded from the same ONNX initializer: 12 copies each)
                self.seen[key] = self.same_bytes.find_or_add(data, lambda: self.new_param(const, data))
            return self.seen[key]

        def new_param(self, const, data):
            param = relax.Var(f"weight{len(self.params)}", const.ty)
            self.params.append(param)
            collected.append(data)
            return param

    @tvm.transform.module_pass(opt_level=0, name="mlc.LiftConstants")
    def lift(mod, _ctx):
        if collected:
            raise RuntimeError("lift_constants ran twice in one build")
        main = next((gv for gv in mod.get_global_vars() if gv.name_hint == "main"), None)
        if main is None or not isinstance(mod[main], relax.Function):
            return mod
        func = mod[main]
        rewriter = Lift(mod)
        try:
            body = rewriter.visit_expr(func.body)
        except Exception:  # optional: the weights then stay inside the executable, which runs as well
            traceback.print_exc()  # into the worker's log
            collected.clear()
            return mod
        if not rewriter.params:
            return mod
        mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
        lifted_main = relax.Function(list(func.params) + rewriter.params, body, func.ret_ty, func.is_pure,
                                     func.attrs, func.span)
        mod[main] = lifted_main.with_attr("num_input", len(func.params)) if mark_weights else lifted_main
        return mod

    return lift


class _EqualTensors:
    """Tensors by content: one value per dtype, shape and bytes. A sample of each tensor's bytes picks the
    candidates, which are then compared whole (random weights never get that far)."""

    SAMPLES = 64

    def __init__(self):
        self.groups: dict[tuple, list] = {}

    def find_or_add(self, tensor, make):
        """The value added for a tensor equal to `tensor`, else make()'s, added for it."""
        import numpy as np

        try:
            raw = np.from_dlpack(tensor).reshape(-1).view(np.uint8)  # a view: no copy of the weights
        except (BufferError, TypeError, RuntimeError, ValueError):  # dtypes numpy lacks (bfloat16): not merged
            return make()
        step = max(raw.size // self.SAMPLES, 1)
        sample = b"".join(raw[i:i + 64].tobytes() for i in range(0, raw.size, step))
        group = self.groups.setdefault((str(tensor.dtype), tuple(int(d) for d in tensor.shape), sample), [])
        for other, value in group:
            if np.array_equal(raw, other):
                return value
        value = make()
        group.append((raw, value))
        return value


def _nbytes(tensor) -> int:
    count = 1
    for d in tensor.shape:
        count *= int(d)
    dtype = tensor.dtype
    return count * ((dtype.bits * dtype.lanes + 7) // 8)


def write(tensors: list, path: Path) -> list[dict[str, Any]]:
    """Write `tensors` (CPU) to `path`, each at an ALIGNMENT-aligned offset; returns their index (dtype, shape,
    offset, nbytes) in the order given."""
    import numpy as np

    index, offset = [], 0
    with open(path, "wb") as f:
        for tensor in tensors:
            try:
                data = np.from_dlpack(tensor)  # a view
            except (BufferError, TypeError, RuntimeError):  # bfloat16 and others numpy has no dtype for: a copy
                data = tensor.numpy()
            pad = -offset % ALIGNMENT
            f.write(bytes(pad))
            offset += pad
            raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            index.append({"dtype": str(tensor.dtype), "shape": [int(d) for d in tensor.shape], "offset": offset,
                          "nbytes": raw.size})
            f.write(memoryview(raw))
            offset += raw.size
    return index
