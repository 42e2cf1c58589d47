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


def _index_graph(nodes, extra_inputs=(), constants=None):
    """ids (int64, 1x3) -> nodes -> Gather(table of 10 rows, "index") -> y."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    inits = [table] + [numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in (constants or {}).items()]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, 3]) for n in ("ids", *extra_inputs)]
    graph = helper.make_graph([*nodes, helper.make_node("Gather", ["table", "index"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("nodes, constants, extra, expected", [
    # a LabelEncoder's -1 for unknown words, shifted onto row 0: -1 is valid, the last row + 1 reads past the table
    ([("Add", ["ids", "one"], "index")], {"one": 1}, (), (-1, 8)),
    # Keras's wrap, Where(ids < 0, ids + vocab, ids): every index from -vocab
    ([("Less", ["ids", "zero"], "neg"), ("Add", ["ids", "ten"], "wrapped"),
      ("Where", ["neg", "wrapped", "ids"], "index")], {"zero": 0, "ten": 10}, (), (-10, 9)),
    ([("Cast", ["ids"], "index")], {}, (), (0, 9)),
    ([("Mul", ["ids", "two"], "index")], {"two": 2}, (), (0, 4)),
    # an operand from another input: not followed, the table's rows as if indexed directly
    ([("Add", ["ids", "offset"], "index")], {}, ("offset",), (0, 9)),
])
def test_index_ranges_follow_the_arithmetic_before_the_gather(nodes, constants, extra, expected):
    from onnx import helper

    made = [helper.make_node(op, ins, [out], **({"to": 7} if op == "Cast" else {})) for op, ins, out in nodes]
    specs = {s.name: s for s in frontend.input_specs(_index_graph(made, extra, constants))}
    assert specs["ids"].value_range == expected
    ids = frontend.make_inputs(list(specs.values()), {"ids": [1, 3], "offset": [1, 3]})["ids"]
    assert ids.min() >= 0 and ids.max() <= expected[1]  # seeded ids as an eager framework takes them


def test_the_runtime_refuses_ids_the_shift_takes_past_the_table_and_takes_those_it_brings_in(tmp_path):
    """Gather(table, ids + 1): the compiled take reads unchecked, so ids = 9 must be refused (it read other memory
    before) and ids = -1, row 0, taken."""
    import onnx
    from onnx import helper

    from mlc.runtime.runner import FeedError, Runner
    from helpers import run_mlc

    onnx.save(_index_graph([helper.make_node("Add", ["ids", "one"], ["index"])], constants={"one": 1}),
              tmp_path / "shift.onnx")
    run_mlc("compile", tmp_path / "shift.onnx", "-o", tmp_path / "art", check=True)
    runner = Runner(tmp_path / "art")
    np.testing.assert_array_equal(runner.run({"ids": np.array([[-1, 8, 0]])})["y"][0, :, 0], [0, 36, 4])
    with pytest.raises(FeedError, match=r"accepts only \[-1, 8\]"):
        runner.run({"ids": np.array([[9, 0, 0]])})


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


def _bf16_graph(path):
    """x (bf16) -> Cast float32 -> MatMul float32 weight -> y (float32), and x @ bf16 weight -> Relu -> z (bf16): a bf16
    input, and bf16 weights as raw data (the dynamo export of `m.bfloat16()`)."""
    import ml_dtypes
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w32 = rng.standard_normal((8, 4)).astype(np.float32)
    w16 = rng.standard_normal((8, 4)).astype(ml_dtypes.bfloat16)
    bf16_weight = helper.make_tensor("w16", TensorProto.BFLOAT16, [8, 4], w16.view(np.uint16).tobytes(), raw=True)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["x32", "w32"], ["y"]),
         helper.make_node("MatMul", ["x", "w16"], ["xw"]), helper.make_node("Relu", ["xw"], ["z"])],
        "bf16", [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("z", TensorProto.BFLOAT16, ["batch", 4])],
        [numpy_helper.from_array(w32, "w32"), bf16_weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), path)
    return w32, w16


def test_bf16_inputs_outputs_and_weights_compile_and_run(tmp_path):
    """A bf16 input was taken for float32 (its rounding lost, bf16 data refused) and bf16 weights ended in exit 70
    (TVM's importer and onnx 1.17 read them wrong): both compile, and the artifact takes and gives ml_dtypes.bfloat16,
    from an .npz too (np.save writes bf16 as 2-byte voids)."""
    import ml_dtypes

    import mlc.api as api
    from mlc.runtime.runner import Runner, load_npz, save_npz

    w32, w16 = _bf16_graph(tmp_path / "bf16.onnx")
    result = api.compile(str(tmp_path / "bf16.onnx"), target="x86", output=tmp_path / "art")
    assert result.check.passed, result.check.to_json()
    assert [(i.name, i.dtype) for i in result.manifest.inputs] == [("x", "bfloat16")]
    assert [o.dtype for o in result.manifest.outputs] == ["float32", "bfloat16"]
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    save_npz(tmp_path / "x.npz", {"x": x})
    assert load_npz(tmp_path / "x.npz")["x"].dtype == ml_dtypes.bfloat16
    runner = Runner(result.path)
    for feeds in ({"x": x}, {"x": x.view("V2")}):
        out = runner.run(feeds)
        assert out["y"].dtype == np.float32 and out["z"].dtype == ml_dtypes.bfloat16
        np.testing.assert_allclose(out["y"], x.astype(np.float32) @ w32, rtol=1e-5, atol=1e-5)
        expected = np.maximum(x.astype(np.float32) @ w16.astype(np.float32), 0)
        np.testing.assert_allclose(out["z"].astype(np.float32), expected, rtol=2e-2, atol=2e-2)
