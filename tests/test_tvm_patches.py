"""mlc.compiler.tvm_patches: the one place mlc changes TVM's ONNX importer at run time."""

from __future__ import annotations

import pytest

from mlc.errors import MissingDependencyError


def test_apply_refuses_another_tvm_release_in_one_line(monkeypatch):
    import tvm

    from mlc.compiler import tvm_patches

    tvm_patches.apply.cache_clear()
    monkeypatch.setattr(tvm, "__version__", "0.28.0")
    with pytest.raises(MissingDependencyError) as caught:
        tvm_patches.apply()
    message = str(caught.value)
    assert "\n" not in message and "0.28.0" in message and "apache-tvm==0.27" in message


def test_apply_twice_patches_once():
    """A second apply() (the cache cleared: as after a failed first one) wraps nothing twice."""
    from tvm.relax.frontend.onnx import onnx_frontend

    from mlc.compiler import tvm_patches

    tvm_patches.apply()
    importer_cls = onnx_frontend.ONNXGraphImporter
    patched = (importer_cls._convert_operator, importer_cls._parse_array, onnx_frontend._get_convert_map,
               onnx_frontend.Clip._impl_v13.__func__, onnx_frontend.Resize._impl_v11.__func__)
    assert patched[0].__module__ == "mlc.compiler.tvm_patches"
    tvm_patches.apply.cache_clear()
    tvm_patches.apply()
    assert (importer_cls._convert_operator, importer_cls._parse_array, onnx_frontend._get_convert_map,
            onnx_frontend.Clip._impl_v13.__func__, onnx_frontend.Resize._impl_v11.__func__) == patched
