"""mlc's ONNX converters (mlc/compiler/onnx_ops.py) and the importer's shape outputs on cases the shipped node
tests leave out, each compiled for x86 and compared with ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlc import api

RNG = np.random.default_rng(0)


def _compiled_matches_onnxruntime(model, feed_sets, tmp_path, rtol=1e-5, **shapes):
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False, **shapes)
    runner = api.open_runner(tmp_path / "art")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for feeds in feed_sets:
        got = runner.run(feeds)
        for name, expected in zip(names, session.run(names, feeds)):
            assert got[name].shape == expected.shape and got[name].dtype == expected.dtype, name
            np.testing.assert_allclose(got[name], expected, rtol=rtol, err_msg=name)


def test_shape_values_returned_with_a_symbolic_batch(tmp_path):
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["batch"]),
             helper.make_node("Size", ["x"], ["size"]), helper.make_node("Shape", ["x"], ["tail"], start=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 4])],
                              [helper.make_tensor_value_info("shape", TensorProto.INT64, [3]),
                               helper.make_tensor_value_info("batch", TensorProto.INT64, []),
                               helper.make_tensor_value_info("size", TensorProto.INT64, []),
                               helper.make_tensor_value_info("tail", TensorProto.INT64, [2])],
                              [numpy_helper.from_array(np.array(0, np.int64), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _compiled_matches_onnxruntime(model, [{"x": np.zeros((b, 3, 4), np.float32)} for b in (2, 5)], tmp_path)


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_modes_missing_values_and_aggregates(aggregate, tmp_path):
    # tree 0: f0 <= 0.5 ? (f1 > 0.1 ? leaf1 : leaf2) : leaf0; tree 1: f1 != 0 ? leaf3 : (f0 < -1 ? leaf4 : leaf5)
    node = helper.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain="ai.onnx.ml", nodes_featureids=[0, 1, 1, 0],
        nodes_splits=numpy_helper.from_array(np.array([0.5, 0.1, 0.0, -1.0], np.float32)),
        nodes_modes=numpy_helper.from_array(np.array([0, 3, 5, 1], np.uint8)), nodes_truenodeids=[1, 1, 3, 4],
        nodes_trueleafs=[0, 1, 1, 1], nodes_falsenodeids=[0, 2, 3, 5], nodes_falseleafs=[1, 1, 0, 1],
        nodes_missing_value_tracks_true=[1, 0, 0, 1], leaf_targetids=[0, 1, 2, 0, 1, 2],
        leaf_weights=numpy_helper.from_array(np.arange(1, 7, dtype=np.float32)), tree_roots=[0, 2], n_targets=3,
        aggregate_function=aggregate)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [6, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [6, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)])
    x = np.array([[0.2, 0.3], [0.9, 0.0], [np.nan, 0.05], [-2, np.nan], [0.5, 0.1], [-1.5, 0.0]], np.float32)
    _compiled_matches_onnxruntime(model, [{"X": x}], tmp_path)


def test_max_pool_indices_3d_dilated_ceil_mode(tmp_path):
    node = helper.make_node("MaxPool", ["x"], ["y", "indices"], kernel_shape=[2, 3, 2], strides=[2, 1, 2],
                            dilations=[1, 2, 1], ceil_mode=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 6, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("indices", TensorProto.INT64, None)])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]))
    _compiled_matches_onnxruntime(model, [{"x": RNG.standard_normal((1, 2, 5, 6, 7)).astype(np.float32)}], tmp_path)


def test_expand_to_a_shape_with_symbolic_dims(tmp_path):
    """TVM 0.27's Expand compares shape lists with `==`, which raises on a symbolic dim against a constant one. A
    symbolic dim that broadcasts to a constant is checked at run time to be that constant (TVM's broadcast reads
    it so): a 1 there is refused, not read past."""
    nodes = [helper.make_node("Shape", ["z"], ["shape"]), helper.make_node("Expand", ["x", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", 1, "b", "c"]),
                                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, 4, "c"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", 1, 4, "c"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    z = np.zeros((1, 1, 4, 3), np.float32)
    feeds = [{"x": RNG.standard_normal((2, 1, 4, 3)).astype(np.float32), "z": z}]
    _compiled_matches_onnxruntime(model, feeds, tmp_path, input_shapes=["x:2x1x4x3", "z:1x1x4x3"], dynamic=["b=1..4"])
    with pytest.raises(Exception, match="mismatch"):
        api.open_runner(tmp_path / "art").run({"x": np.ones((2, 1, 1, 3), np.float32), "z": z})


@pytest.mark.parametrize("inverse, onesided, length, complex_input", [(0, 0, None, True), (1, 0, None, True),
                                                                      (0, 1, 6, False), (0, 0, 10, False)])
def test_dft_matches_numpy_fft(inverse, onesided, length, complex_input, tmp_path):
    """DFT along axis 1 of [2, 8, 3, 1 or 2] (real or complex), forward or inverse, onesided, dft_length cutting
    or zero-padding the signal."""
    shape = (2, 8, 3, 2 if complex_input else 1)
    inputs = ["x", "length" if length else "", "axis"]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "axis")]
    if length:
        inits.append(numpy_helper.from_array(np.array(length, np.int64), "length"))
    n = length or shape[1]
    node = helper.make_node("DFT", inputs, ["y"], inverse=inverse, onesided=onesided)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [2, n // 2 + 1 if onesided else n, 3, 2])], inits)
    path = tmp_path / "dft.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    x = RNG.standard_normal(shape).astype(np.float32)
    api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False)
    got = api.open_runner(tmp_path / "art").run({"x": x})["y"]
    signal = x[..., 0] + 1j * x[..., 1] if complex_input else x[..., 0]
    expected = (np.fft.ifft if inverse else np.fft.fft)(signal, n=n, axis=1)
    if onesided:
        expected = expected[:, : n // 2 + 1]
    np.testing.assert_allclose(got, np.stack([expected.real, expected.imag], -1), atol=1e-5)


EINSUMS = {  # equation: operand shapes (a letter is a symbolic dim)
    "ibnd,jbnd->bnij": [(5, 1, 2, 4), (7, 1, 2, 4)],  # XLNet's attention scores
    "bnij,jbnd->ibnd": [(1, 2, 5, 7), (7, 1, 2, 4)],  # attention x values
    "ibnd,hnd->ibh": [("s", 1, 2, 4), (6, 2, 4)],  # output projection, a symbolic length
    "ij,jk": [(3, 4), (4, 5)],  # implicit output
    "abx,bc->ac": [(2, 3, 4), (3, 5)],  # x summed in its operand alone
    "i,i->": [(6,), (6,)],
    "ij,kl->ijkl": [(2, 3), (4, 1)],  # nothing contracted
    "ii->i": [(3, 3)],  # a diagonal: TVM's einsum
}


def test_einsum_as_matmul_matches_onnxruntime(tmp_path):
    """Two-operand einsums become a matmul between transposes and reshapes (no naive einsum loop nest left); the
    diagonal stays TVM's einsum."""
    from mlc.compiler import importer

    nodes, inputs, outputs, feeds = [], [], [], {}
    for k, (equation, shapes) in enumerate(EINSUMS.items()):
        names = [f"x{k}_{n}" for n in range(len(shapes))]
        nodes.append(helper.make_node("Einsum", names, [f"y{k}"], equation=equation))
        outputs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None))
        for name, shape in zip(names, shapes):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
            feeds[name] = RNG.standard_normal([7 if isinstance(d, str) else d for d in shape]).astype(np.float32)
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    model = onnx.shape_inference.infer_shapes(model)
    mod = importer.to_relax(model)
    naive = [gv.name_hint for gv, f in mod.functions_items() if gv.name_hint.startswith("einsum")]
    assert naive == ["einsum"], naive  # the diagonal's alone
    _compiled_matches_onnxruntime(model, [feeds], tmp_path, rtol=1e-4)


def test_conv1d_as_conv2d_matches_onnxruntime(tmp_path):
    """1-D Convs (strides, pads, dilations, groups, auto_pad, with and without a bias) import as 2-D ones over a
    height of 1, which mlc's conv schedules tile."""
    from mlc.compiler import importer

    cases = [dict(pads=[1, 1], strides=[2]), dict(dilations=[2], group=2), dict(auto_pad="SAME_UPPER", strides=[3])]
    nodes, outputs, inits = [], [], []
    for k, attrs in enumerate(cases):
        inits.append(numpy_helper.from_array(RNG.standard_normal((6, 4 // attrs.get("group", 1), 3))
                                             .astype(np.float32), f"w{k}"))
        inputs = ["x", f"w{k}"]
        if k != 1:
            inits.append(numpy_helper.from_array(RNG.standard_normal(6).astype(np.float32), f"b{k}"))
            inputs.append(f"b{k}")
        nodes.append(helper.make_node("Conv", inputs, [f"y{k}"], kernel_shape=[3], **attrs))
        outputs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 11])],
                              outputs, inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    script = importer.to_relax(model).script()
    assert "conv1d" not in script and script.count("R.nn.conv2d(") == 3
    _compiled_matches_onnxruntime(model, [{"x": RNG.standard_normal((1, 4, 11)).astype(np.float32)}], tmp_path,
                                  rtol=1e-4)
