"""Converter overrides for ONNX node forms TVM 0.27 builds wrongly or not at all (#19, found by
benchmarks/onnx_node_tests): Split with empty parts; Resize and Upsample (see resize.py)."""

from __future__ import annotations

import functools


def apply() -> None:
    _split_with_empty_parts()
    from mlc.compiler import resize

    resize.override()


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
