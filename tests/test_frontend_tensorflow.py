"""TensorFlow/Keras frontend: zoo models and saved files exported with tf2onnx, ONNX Runtime and the
compiled artifact checked against Keras run eagerly. TensorFlow runs only in child processes."""

from __future__ import annotations

import importlib.util
import sys
import zipfile

import numpy as np
import pytest
from framework_jobs import (BERT_SIZES, assert_matches, check_compiled, check_fixed_seq, check_zoo_export, load_case,
                            ort_outputs, run_jobs)

from mlc.frontends import tensorflow as frontend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None
                                or importlib.util.find_spec("tf2onnx") is None, reason="needs mlc[tf]")

FW = "tensorflow"
ZOO = ["cnn", "lstm", "lstm_lm", "bert_tiny"]
# The inputs mlc feeds (batch 2, other symbolic dims 16); lstm_lm at seed 001's batch of 128.
SHAPES = {"lstm_lm": {"tokens": [128, 50]}}
# Tokens over the whole vocabulary (mlc's own feeds may stay in 0..3 when it cannot see the embedding).
VOCAB = {"lstm": {"tokens": 1000}, "lstm_lm": {"tokens": 10001}, "bert_tiny": {"input_ids": 1000}}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Everything TensorFlow does for this file, in one child process (TF takes seconds to import)."""
    out = tmp_path_factory.mktemp("tf")
    files = out / "files"
    files.mkdir()
    (files / "random.h5").write_bytes(np.random.default_rng(0).bytes(4096))
    (files / "random.keras").write_bytes(np.random.default_rng(1).bytes(4096))
    (files / "model.txt").write_text("not a model")
    (files / "corrupt_sm").mkdir()
    (files / "corrupt_sm" / "saved_model.pb").write_bytes(np.random.default_rng(2).bytes(512))
    saves = [("cnn", "cnn.keras"), ("cnn", "cnn.h5"), ("lstm", "lstm_savedmodel"), ("bert_tiny", "bert_custom.keras")]
    plan = [{"id": name, "kind": "zoo", "framework": FW, "name": name, "shapes": SHAPES.get(name, {}),
             "vocab": VOCAB.get(name, {}), "sizes": BERT_SIZES if name == "bert_tiny" else []} for name in ZOO]
    plan.append({"id": "bert_tiny seq fixed", "kind": "zoo", "framework": FW, "name": "bert_tiny",
                 "dynamic": ["batch"]})
    plan += [{"id": f"save {path}", "kind": "save", "framework": FW, "name": name, "path": str(files / path)}
             for name, path in saves]
    plan += [{"id": f"open {path}", "kind": "open", "framework": FW, "path": str(files / path),
              "vocab": VOCAB.get(name, {})} for name, path in saves]
    plan.append({"id": "save open_image.keras", "kind": "keras_open_image", "path": str(files / "open_image.keras")})
    mixed = str(files / "mixed.keras")
    plan += [{"id": "save mixed.keras", "kind": "keras_mixed_layers", "path": mixed},
             {"id": "open mixed.keras", "kind": "open", "framework": FW, "path": mixed},
             {"id": "open mixed.keras, weights as inputs", "kind": "open", "framework": FW, "path": mixed,
              "weights_as_inputs_bytes": 0}]
    grouped = str(files / "grouped_gelu.keras")
    plan += [{"id": "save grouped_gelu.keras", "kind": "keras_grouped_gelu", "path": grouped},
             {"id": "open grouped_gelu.keras", "kind": "open", "framework": FW, "path": grouped}]
    plan += [{"id": "save norm.keras", "kind": "keras_normalization", "path": str(files / "norm.keras")},
             {"id": "open norm.keras", "kind": "open", "framework": FW, "path": str(files / "norm.keras")}]
    for suffix in ("keras", "h5"):  # after the saves, in the same process
        plan.append({"id": f"truncate {suffix}", "kind": "truncate", "src": str(files / f"cnn.{suffix}"),
                     "path": str(files / f"truncated.{suffix}")})
    bad = ["random.h5", "random.keras", "model.txt", "corrupt_sm", "truncated.keras", "truncated.h5", "missing.keras"]
    plan += [{"id": f"open {p}", "kind": "open", "framework": FW, "path": str(files / p)} for p in bad]
    return out, run_jobs(out, plan)


@pytest.mark.parametrize("name", ZOO)
def test_zoo_export_matches_eager(jobs, name):
    check_zoo_export(jobs, name, "tf2onnx")


def test_zoo_dims_are_named(jobs):
    out, _ = jobs
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in load_case(out, "bert_tiny")[0].graph.input}
    assert dims == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    assert [d.dim_param or d.dim_value for d in load_case(out, "cnn")[0].graph.input[0].type.tensor_type.shape.dim] \
        == ["batch", 3, 32, 32]
    assert [o.name for o in load_case(out, "bert_tiny")[0].graph.output] == ["last_hidden_state", "pooler_output"]


def test_dims_left_out_of_dynamic_are_fixed_at_the_example_sizes(jobs):
    check_fixed_seq(jobs)


@pytest.mark.parametrize("name", ["cnn", "bert_tiny", "lstm"])  # lstm: lowered by the lower_rnn pass
def test_zoo_compiles_and_matches_eager(jobs, tmp_path, name):
    check_compiled(jobs, tmp_path / "artifact", name)


@pytest.mark.parametrize("path,zoo", [("cnn.keras", "cnn"), ("cnn.h5", "cnn"), ("lstm_savedmodel", "lstm")])
def test_file_sources(jobs, path, zoo):
    out, results = jobs
    job = f"open {path}"
    assert results[f"save {path}"]["ok"], results[f"save {path}"]
    assert results[job]["ok"] and results[job]["detect"], results[job]
    _, inputs, eager = load_case(out, job)
    assert_matches(ort_outputs(out, job), eager)
    # The file holds the zoo model's weights: same inputs, same eager outputs.
    _, zoo_inputs, zoo_eager = load_case(out, zoo)
    assert all(np.array_equal(a, b) for a, b in zip(inputs.values(), zoo_inputs.values()))
    np.testing.assert_allclose(list(eager.values())[0], list(zoo_eager.values())[0], rtol=1e-6, atol=1e-6)
    assert results[job]["dims"][0][0] == "batch"  # None in the Keras signature -> symbolic "batch"
    assert results[job]["notes"] == []  # the SavedModel's serving_default signature is no warning


def test_captured_constants_are_weights_not_inputs(jobs):
    """Keras Normalization's adapted mean and variance (and Rescaling's scale) are captured by the traced function;
    tf2onnx made them graph inputs, which users would have to feed. They are folded into the graph."""
    out, results = jobs
    assert results["save norm.keras"]["ok"], results["save norm.keras"]
    result = results["open norm.keras"]
    assert result["ok"], result
    model, inputs, eager = load_case(out, "open norm.keras")
    assert [v.name for v in model.graph.input] == ["features"] == list(inputs)
    assert_matches(ort_outputs(out, "open norm.keras"), eager)


def test_weights_traced_as_inputs_export_the_same_model(jobs):
    """Above WEIGHTS_AS_INPUTS_BYTES a Keras model is traced with its variables as inputs (tf2onnx held ~25 copies of
    frozen weights: VGG16 went past 10 GiB), and their values become initializers: the ONNX takes the model's one
    input, and ONNX Runtime matches Keras eager as closely as the frozen export does."""
    out, results = jobs
    assert results["save mixed.keras"]["ok"], results["save mixed.keras"]
    for job, how in (("open mixed.keras", "tf.function, opset"), ("open mixed.keras, weights as inputs",
                                                                  "the weights as inputs")):
        assert results[job]["ok"] and how in results[job]["exporter"], results[job]
        model, inputs, eager = load_case(out, job)
        assert [v.name for v in model.graph.input] == ["image"] == list(inputs)
        assert_matches(ort_outputs(out, job), eager)
    assert len(load_case(out, "open mixed.keras, weights as inputs")[0].graph.initializer) > 10


def test_grouped_convolution_and_exact_gelu_convert(jobs):
    """Keras ConvNeXt's constructs: a grouped Conv2D (Keras 3 runs it as a nested jit_compile tf.function, which
    tf2onnx kept as an opaque StatefulPartitionedCall) and exact GELU (TF's Erfc, which tf2onnx has no handler for)
    export to a Conv with `group` and Erf, and ONNX Runtime matches Keras eager."""
    out, results = jobs
    assert results["save grouped_gelu.keras"]["ok"], results["save grouped_gelu.keras"]
    result = results["open grouped_gelu.keras"]
    assert result["ok"], result
    model, _, eager = load_case(out, "open grouped_gelu.keras")
    ops = {n.op_type for n in model.graph.node}
    assert "StatefulPartitionedCall" not in ops and "Erf" in ops, ops
    groups = [a.i for n in model.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "group"]
    assert 4 in groups, groups
    assert_matches(ort_outputs(out, "open grouped_gelu.keras"), eager)


def test_an_image_input_left_open_is_run_at_224(jobs, tmp_path):
    """A Keras image model saved without an input size ((None, None, None, 3): MobileNetV3 built with weights=None)
    runs its reference at 224x224, not at the generic 16 where a convnet has nothing left to convolve or pool."""
    from mlc.pipeline.convert import convert

    out, results = jobs
    assert results["save open_image.keras"]["ok"], results["save open_image.keras"]
    done = convert(str(out / "files" / "open_image.keras"), FW, tmp_path)
    assert [list(v.shape) for v in done.feeds.values()] == [[2, 224, 224, 3]]
    eager = next(iter(done.eager.values()))
    assert eager.shape == (2, 4) and np.isfinite(eager).all() and eager.any()


def test_an_export_that_gains_inputs_stops_naming_them(tmp_path, monkeypatch):
    """An export with a graph input the framework model does not take stops the compile with a one-line error
    naming it (exit 1), never ships it as an input. No framework runs: the frontend is a stand-in."""
    import onnx
    from onnx import TensorProto, helper

    from mlc.errors import UnsupportedModelError
    from mlc.frontends.base import FrameworkModel, InputDecl
    from mlc.pipeline import convert_worker
    from mlc.pipeline.convert_contract import ConvertRequest

    def export(path, dynamic):
        x, mean, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "norm/Sub/y:0", "y"))
        graph = helper.make_graph([helper.make_node("Sub", ["x", "norm/Sub/y:0"], ["y"])], "g", [x, mean], [y])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
        return "a stand-in exporter"

    model = FrameworkModel("tensorflow", [InputDecl("x", "float32", [2, 3])], {}, export, lambda values: values[:1])
    monkeypatch.setattr(convert_worker, "framework_model", lambda *args, **options: model)
    with pytest.raises(UnsupportedModelError, match=r"does not take: norm/Sub/y:0 ") as error:
        convert_worker.convert(ConvertRequest(source="m.keras", framework=FW, out_dir=str(tmp_path)))
    assert "\n" not in str(error.value) and error.value.exit_code == 1


@pytest.mark.parametrize("path,fragment", [
    ("random.h5", "cannot load"),
    ("random.keras", "not a Keras archive"),
    ("truncated.keras", "not a Keras archive"),
    ("truncated.h5", "cannot load"),
    ("model.txt", "not a TensorFlow model"),
    ("corrupt_sm", "cannot load the SavedModel"),
    ("missing.keras", "not found"),
])
def test_bad_files_give_input_error(jobs, path, fragment):
    _, results = jobs
    result = results[f"open {path}"]
    assert result["ok"] is False and result["error"] == "InputError", result
    assert fragment in result["message"] and "\n" not in result["message"], result


def test_custom_layers_point_to_savedmodel(jobs):
    _, results = jobs
    result = results["open bert_custom.keras"]  # bert_tiny has a custom layer and a Python activation
    assert result["ok"] is False and result["error"] == "UnsupportedModelError", result
    assert "model.export" in result["message"], result


def test_a_long_keras_error_is_cut_after_a_whole_sentence():
    """Keras's error for an unregistered subclass runs on into the model's config: it was cut mid-word."""
    error = ValueError("Could not locate class 'Sub'. Make sure custom classes and functions are decorated with "
                       "`@keras.saving.register_keras_serializable()`. If they are already decorated, make sure they "
                       "are all imported so that the decorator is run before trying to load them. Full object config: "
                       "{'module': None, 'class_name': 'Sub', 'config': {'trainable': True, 'dtype': 'float32'}}")
    assert frontend._first_line(error).endswith("before trying to load them.")
    assert frontend._first_line(ValueError("word " * 100)).endswith("word ...")


def test_detect_imports_nothing(tmp_path):
    (tmp_path / "sm").mkdir()
    (tmp_path / "sm" / "saved_model.pb").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "m.keras", "w"):
        pass
    assert frontend.detect(str(tmp_path / "sm"))
    assert frontend.detect(str(tmp_path / "m.keras")) and frontend.detect(str(tmp_path / "w.H5"))
    assert not frontend.detect(str(tmp_path)) and not frontend.detect(str(tmp_path / "m.onnx"))
    assert "tensorflow" not in sys.modules
