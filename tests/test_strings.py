"""Models with string ops: TVM compiles their numeric part and the artifact runs the string ops on the host
(mlc.frontends.onnx_strings splits them, mlc.runtime.host_ops runs them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import WORDS, assert_clean_error, run_mlc, string_model_onnx
from onnx import numpy_helper

import mlc.api as api
from mlc.check import compare
from mlc.frontends import onnx_strings
from mlc.runtime import host_ops

NODE_TESTS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
# Every string node test of onnx 1.17 (ONNX Runtime fails five of them: its locale and float-to-string formatting)
STRING_CASES = sorted(p.name for p in NODE_TESTS.iterdir()
                      if any(k in p.name for k in ("string", "label_encoder", "STRING", "regex", "strnormalizer")))


def _tensor(path: Path) -> np.ndarray:
    proto = onnx.TensorProto()
    proto.ParseFromString(path.read_bytes())
    array = numpy_helper.to_array(proto)
    return host_ops.as_strings(array) if host_ops.is_strings(array) else array


def test_the_string_node_tests_are_all_found():
    assert len(STRING_CASES) == 32, STRING_CASES


@pytest.mark.parametrize("name", STRING_CASES)
def test_host_ops_compute_the_shipped_outputs(name):
    """The host program of each string node test, on its shipped inputs, gives its shipped outputs exactly."""
    case = NODE_TESTS / name
    model = onnx.load(case / "model.onnx")
    parts = onnx_strings.split(model)
    values = {v.name: _tensor(case / "test_data_set_0" / f"input_{i}.pb") for i, v in enumerate(model.graph.input)}
    host_ops.run(parts.program, "before", values)
    host_ops.run(parts.program, "after", values)
    for i, output in enumerate(model.graph.output):
        expected = _tensor(case / "test_data_set_0" / f"output_{i}.pb")
        got = values[output.name]
        assert got.shape == expected.shape and got.dtype.kind == expected.dtype.kind, (got, expected)
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(got, expected, rtol=1e-6)
        else:
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name, shipped", [("test_string_split_maxsplit", True),
                                           ("test_ai_onnx_ml_label_encoder_tensor_mapping", True),
                                           ("test_cast_STRING_to_FLOAT", False)])
def test_string_node_tests_compile_and_pass(node_tests, name, shipped):
    """Through mlc compile and the artifact's runtime, with the shipped inputs as --inputs or seeded ones (numbers
    written out where a Cast reads the strings)."""
    record = node_tests.run_case(name, shipped_inputs=shipped)
    assert record["ort"]["pass"], record["ort"]
    assert record["mlc"]["pass"], record["mlc"]


@pytest.fixture(scope="module")
def text_artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    result = api.compile(str(string_model_onnx(root / "text.onnx")), target="x86", output=root / "art")
    assert result.check.passed
    return result


def test_a_text_classifier_runs_its_string_ops_around_the_compiled_part(text_artifact):
    """words -> ids on the host, numbers compiled (symbolic length kept), ids -> labels on the host; on words the
    reference never saw, of another length, and one the vocabulary lacks."""
    manifest = text_artifact.manifest
    assert [(s.name, s.dtype, s.shape) for s in manifest.inputs] == [("words", "string", ["n"])]
    assert [(s.name, s.dtype) for s in manifest.outputs] == [("label", "string"), ("scores", "float32")]
    assert [n["op"] for n in manifest.host.before] == ["LabelEncoder"]
    assert [n["op"] for n in manifest.host.after] == ["LabelEncoder"]
    assert [s.name for s in manifest.host.core_inputs] == ["ids"]
    words = np.array(WORDS[::-1] + ["zebra", WORDS[0], WORDS[2]])
    got = api.open_runner(text_artifact.path).run({"words": words})
    session = ort.InferenceSession(str(text_artifact.path.parent / "text.onnx"), providers=["CPUExecutionProvider"])
    label, scores = session.run(["label", "scores"], {"words": words.astype(object)})
    np.testing.assert_array_equal(got["label"], label.astype(str))
    np.testing.assert_allclose(got["scores"], scores, rtol=1e-5, atol=1e-6)
    assert (text_artifact.path / "runtime" / "mlc_host_ops.py").is_file()


def test_a_string_op_between_numeric_parts_is_refused(tmp_path):
    model = string_model_onnx(tmp_path / "sandwich.onnx", sandwich=True)
    proc = run_mlc("compile", model, "-o", tmp_path / "art")
    assert_clean_error(proc, 1, "Neg", "a string op that itself reads a numeric result")
    assert not (tmp_path / "art").exists()


def test_options_a_string_model_cannot_take_yet_are_refused(tmp_path):
    model = string_model_onnx(tmp_path / "text.onnx")
    proc = run_mlc("compile", model, "-o", tmp_path / "art", "--dynamic", "n")
    assert_clean_error(proc, 1, "--dynamic is not supported yet for a model with string ops")
    assert not (tmp_path / "art").exists()


def test_strings_that_differ_fail_the_check():
    result = compare({"label": np.array(["low", "high"])}, {"label": np.array(["low", "low"])})
    assert not result.passed and "1 of 2 strings differ" in result.outputs[0].problem
    assert compare({"label": np.array(["low", "high"], dtype=object)}, {"label": np.array(["low", "high"])}).passed
