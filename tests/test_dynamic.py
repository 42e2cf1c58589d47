"""`mlc compile --dynamic`: one artifact with symbolic dims answers every size in its range."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mlc import api
from mlc.runtime import runner as thin_runtime
from helpers import assert_clean_error, run_mlc

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def dynamic_bert(tmp_path_factory):
    out = tmp_path_factory.mktemp("dynamic") / "bert-tiny"
    return api.compile("zoo:bert-tiny", framework="torch", output=out, dynamic=["batch=1..4", "seq=1..64"])


def _feeds(batch: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(length)
    mask = np.ones((batch, length), dtype=np.int64)
    mask[-1, length // 2 + 1:] = 0  # the last sentence is shorter, padded by the user
    return {"input_ids": rng.integers(1, 30522, size=(batch, length), dtype=np.int64), "attention_mask": mask}


def test_manifest_keeps_dims_symbolic_with_ranges(dynamic_bert):
    assert dynamic_bert.check.passed
    manifest = json.loads((dynamic_bert.path / "manifest.json").read_text())
    assert [i["shape"] for i in manifest["inputs"]] == [["batch", "seq"], ["batch", "seq"]]
    assert manifest["outputs"][0]["shape"] == ["batch", "seq", 128]
    assert manifest["dynamic_ranges"] == {"batch": [1, 4], "seq": [1, 64]}
    assert manifest["source"]["dynamic"] == ["batch", "seq"]


def test_one_artifact_matches_eager_at_every_size(dynamic_bert):
    from mlc import models

    eager = models.get("zoo:bert-tiny").builder("torch")().eager
    runner = thin_runtime.Runner(dynamic_bert.path)
    for batch, length in ((1, 5), (3, 17), (1, 64), (4, 1)):
        feeds = _feeds(batch, length)
        got = runner.run(feeds)
        want = eager([feeds["input_ids"], feeds["attention_mask"]])
        assert got["last_hidden_state"].shape == (batch, length, 128)
        np.testing.assert_allclose(got["last_hidden_state"], want[0], atol=2e-4, rtol=1e-3)
        np.testing.assert_allclose(got["pooler_output"], want[1], atol=2e-4, rtol=1e-3)


def test_sizes_outside_the_range_are_refused(dynamic_bert, tmp_path):
    inputs = tmp_path / "long.npz"
    np.savez(inputs, **_feeds(1, 65))
    assert_clean_error(run_mlc("run", dynamic_bert.path, "-i", inputs), 1,
                       "dimension 'seq' is 65, outside the compiled range 1..64", "--dynamic seq=1..65")
    np.savez(inputs, **_feeds(5, 8))
    assert_clean_error(run_mlc("run", dynamic_bert.path, "-i", inputs), 1, "'batch' is 5, outside")


def test_bad_dynamic_options(tmp_path):
    proc = run_mlc("compile", "zoo:mlp", "--dynamic", "seq=1..8", "-o", tmp_path / "a")
    assert_clean_error(proc, 1, "--dynamic seq", "no dim named 'seq'", "batch")
    proc = run_mlc("compile", "zoo:mlp", "--dynamic", "batch=4..8", "-o", tmp_path / "a")
    assert_clean_error(proc, 1, "the reference inputs have batch=", "widen the range")
    proc = run_mlc("compile", "zoo:mlp", "--dynamic", "batch=9..2", "-o", tmp_path / "a")
    assert_clean_error(proc, 1, "1 <= MIN <= MAX")
    proc = run_mlc("compile", "zoo:mlp", "--dynamic", "batch=1..99999999999", "-o", tmp_path / "a")
    assert_clean_error(proc, 1, "MAX <= 2147483647")


def test_range_of_a_symbolic_length_keeps_shapes_known(tmp_path):
    """arange(seq) feeding a Reshape: TVM's own Range importer loses the length (see importer.py)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "seq", 1])
    const = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
        helper.make_node("Range", ["zero", "length", "step"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["positions_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "positions_f"], ["sum"]),
        helper.make_node("Reshape", ["sum", "to3d"], ["y"]),  # -1 needs the input's shape
    ]
    scalars = [helper.make_tensor(n, TensorProto.INT64, [], [v]) for n, v in (("zero", 0), ("one", 1), ("step", 1))]
    graph = helper.make_graph(nodes, "range", [x], [y], scalars + [const("to3d", [2, -1, 1])])
    path = tmp_path / "range.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    result = api.compile(str(path), output=tmp_path / "range", pass_options=api.graph_passes.Options(opt_level=0))
    assert result.check.passed
    runner = thin_runtime.Runner(result.path)
    session = ort.InferenceSession(str(path))
    for length in (3, 11):
        feeds = {"x": np.random.default_rng(length).standard_normal((2, length)).astype(np.float32)}
        np.testing.assert_allclose(runner.run(feeds)["y"], session.run(None, feeds)[0], rtol=1e-6)


def test_exporters_shape_subgraphs_keep_seq_symbolic(tmp_path):
    """tf2onnx's and paddle2onnx's shape subgraphs (see test_passes.exporter_shapes_model): after
    keep_symbolic_dims TVM imports them with batch and seq symbolic, and one artifact serves every size."""
    from tests.test_passes import exporter_shapes_model

    path = tmp_path / "shapes.onnx"
    onnx.save(exporter_shapes_model(), path)
    result = api.compile(str(path), output=tmp_path / "shapes", dynamic=["batch=1..4", "seq=1..64"])
    assert result.check.passed
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == ["batch", "seq", 8]
    assert [o["shape"] for o in manifest["outputs"]] == [["batch", 8], ["batch", "seq", 4, 2], ["batch * seq", 8]]
    runner = thin_runtime.Runner(result.path)
    session = ort.InferenceSession(str(path))
    for batch, length in ((1, 1), (3, 9), (2, 64)):
        feeds = {"x": np.random.default_rng(length).standard_normal((batch, length, 8)).astype(np.float32)}
        got = runner.run(feeds)
        for name, want in zip(("pooled", "y", "flat"), session.run(None, feeds)):
            np.testing.assert_allclose(got[name], want, rtol=1e-6)


def test_a_graph_tvm_cannot_import_with_symbolic_dims_says_what_to_do(tmp_path):
    """A Squeeze of a slice of the seq axis, the slice also read elsewhere (keep_symbolic_dims then
    leaves it): TVM cannot prove that extent is 1."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 1])
    const = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)  # noqa: E731
    nodes = [helper.make_node("Slice", ["x", "start", "end", "axis"], ["first"]),
             helper.make_node("Squeeze", ["first", "axis"], ["y"]),
             helper.make_node("Neg", ["first"], ["z"])]
    graph = helper.make_graph(nodes, "squeeze", [x], [y, z],
                              [const("start", [0]), const("end", [1]), const("axis", [1])])
    path = tmp_path / "squeeze.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    proc = run_mlc("compile", path, "--dynamic", "seq=1..64", "-o", tmp_path / "out")
    assert_clean_error(proc, 1, "TVM cannot import this model with seq symbolic", "without --dynamic", "--buckets")
    assert not (tmp_path / "out").exists()
