"""ONNX frontend helpers: input descriptions, --input-shape parsing, reference inputs."""

import numpy as np
import pytest

from mlc.frontends import onnx as frontend
from mlc.errors import InputError
from mlc.models import ZOO


def test_input_specs_keep_symbolic_dims_and_find_index_ranges():
    specs = {s.name: s for s in frontend.input_specs(ZOO["transformer"].build())}
    assert specs["input_ids"].shape == ["batch", 32] and specs["input_ids"].dtype == "int64"
    assert specs["input_ids"].value_range == (0, 999)  # vocab 1000 embedding table
    assert specs["attention_mask"].value_range is None


def test_parse_input_shape():
    assert frontend.parse_input_shape("input_ids:1x128") == ("input_ids", [1, 128])
    assert frontend.parse_input_shape("serving_default:0:1x3") == ("serving_default:0", [1, 3])
    assert frontend.parse_input_shape("4x16") == (None, [4, 16])
    for bad in ("x:", "x:1x", "x:-1x3", "x:1.5", "x:0x3"):
        with pytest.raises(InputError):
            frontend.parse_input_shape(bad)


def test_reference_inputs_are_seeded_and_in_range():
    specs = frontend.input_specs(ZOO["transformer"].build())
    shapes = frontend.concrete_shapes(specs, {})
    assert shapes == {"input_ids": [2, 32], "attention_mask": [2, 32]}  # one size per symbolic name
    a, b = frontend.make_inputs(specs, shapes), frontend.make_inputs(specs, shapes)
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert a["input_ids"].max() <= 999 and a["input_ids"].min() >= 0
    assert (a["attention_mask"] == 1).all()


def test_a_model_with_external_data_is_checked_from_its_file(tmp_path):
    """The checker reads a model whose weights lie beside it from the file (one over 2 GB cannot be serialised
    again: XGLM, DebertaV2 at published size); a broken one is still refused in one line."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, size_threshold=0)
    loaded = frontend.load(tmp_path / "m.onnx")
    assert numpy_helper.to_array(loaded.graph.initializer[0]).sum() == 64 * 64
    model.graph.node[0].op_type = "NoSuchOp"
    onnx.save(model, str(tmp_path / "bad.onnx"), save_as_external_data=True, size_threshold=0,
              location="bad.onnx.data")
    with pytest.raises(InputError, match="not a valid ONNX model"):
        frontend.load(tmp_path / "bad.onnx")
