"""PaddlePaddle frontend: zoo models and jit.save prefixes exported with paddle2onnx, ONNX Runtime and
the compiled artifact checked against Paddle run eagerly. Paddle runs only in child processes."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from framework_jobs import (BERT_SIZES, assert_matches, check_compiled, check_fixed_seq, check_zoo_export, load_case,
                            ort_outputs, run_jobs)

from mlc.frontends import onnx as onnx_frontend
from mlc.frontends import paddle as frontend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddle") is None
                                or importlib.util.find_spec("paddle2onnx") is None, reason="needs mlc[paddle]")

FW = "paddle"
ZOO = ["cnn", "lstm", "lstm_lm", "bert_tiny"]
# The inputs mlc feeds (batch 2, other symbolic dims 16); lstm_lm at seed 001's batch of 128.
SHAPES = {"lstm_lm": {"tokens": [128, 50]}}
# Tokens over the whole vocabulary (mlc's own feeds may stay in 0..3 when it cannot see the embedding).
VOCAB = {"lstm": {"tokens": 1000}, "lstm_lm": {"tokens": 10001}, "bert_tiny": {"input_ids": 1000}}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Everything Paddle does for this file: one child process in Paddle 3's default (PIR) mode, one in
    the legacy mode that writes .pdmodel programs."""
    out = tmp_path_factory.mktemp("paddle")
    files = out / "files"
    files.mkdir()
    (files / "random.json").write_bytes(np.random.default_rng(0).bytes(4096))
    (files / "random.pdiparams").write_bytes(np.random.default_rng(1).bytes(4096))
    (files / "plain.json").write_text('{"not": "a paddle program"}')
    legacy = run_jobs(out, [{"id": "save legacy", "kind": "legacy_paddle", "path": str(files / "legacy")}],
                      env={"FLAGS_enable_pir_api": "0"})
    plan = [{"id": name, "kind": "zoo", "framework": FW, "name": name, "shapes": SHAPES.get(name, {}),
             "vocab": VOCAB.get(name, {}), "sizes": BERT_SIZES if name == "bert_tiny" else []} for name in ZOO]
    plan.append({"id": "bert_tiny seq fixed", "kind": "zoo", "framework": FW, "name": "bert_tiny",
                 "dynamic": ["batch"]})
    plan += [{"id": f"save {name}", "kind": "save", "framework": FW, "name": name, "path": str(files / name)}
             for name in ("cnn", "bert_tiny")]
    # Whole program + half the weights, and half the program + whole weights.
    for prefix, program, weights in (("short_params", 1, 0.5), ("short_program", 0.5, 1)):
        plan += [{"id": f"copy {prefix}{suffix}", "kind": "truncate", "src": str(files / f"cnn{suffix}"),
                  "path": str(files / f"{prefix}{suffix}"), "keep": keep}
                 for suffix, keep in ((".json", program), (".pdiparams", weights))]
    plan.append({"id": "save static_batch", "kind": "static_batch_paddle", "path": str(files / "static_batch")})
    sources = ["cnn", "bert_tiny.json", "legacy.pdmodel", "random", "plain.json", "short_params", "short_program",
               "missing", "static_batch"]
    plan += [{"id": f"open {p}", "kind": "open", "framework": FW, "path": str(files / p)} for p in sources]
    return out, {**legacy, **run_jobs(out, plan)}


def test_never_asks_pip_to_install(jobs):
    _, results = jobs
    assert results["_env"]["POLYGRAPHY_AUTOINSTALL_DEPS"] != "1"


@pytest.mark.parametrize("name", ZOO)
def test_zoo_export_matches_eager(jobs, name):
    check_zoo_export(jobs, name, "paddle2onnx")


def test_zoo_dims_are_named(jobs):
    out, _ = jobs
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in load_case(out, "bert_tiny")[0].graph.input}
    assert dims == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    assert [o.name for o in load_case(out, "bert_tiny")[0].graph.output] == ["last_hidden_state", "pooler_output"]
    # Weights come out as initializers (paddle2onnx writes Constant nodes), so mlc sees the embedding
    # table and feeds token ids over the whole vocabulary.
    specs = onnx_frontend.input_specs(load_case(out, "lstm")[0])
    assert specs[0].value_range == (0, 999)


def test_dims_left_out_of_dynamic_are_fixed_at_the_example_sizes(jobs):
    check_fixed_seq(jobs)


@pytest.mark.parametrize("name", ["cnn", "bert_tiny", "lstm"])  # lstm: lowered by the lower_rnn pass
def test_zoo_compiles_and_matches_eager(jobs, tmp_path, name):
    check_compiled(jobs, tmp_path / "artifact", name)


@pytest.mark.parametrize("source", ["cnn", "bert_tiny.json", "legacy.pdmodel"])
def test_saved_prefixes(jobs, source):
    out, results = jobs
    job = f"open {source}"
    assert results[job]["ok"] and results[job]["detect"], results[job]
    assert results[job]["dims"][0][0] == "batch"  # None in the saved InputSpec -> symbolic "batch"
    outputs = results[job]["outputs"]  # a saved program's fetch_name_0...: named as torch's bare outputs are
    assert outputs == (["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]), outputs
    _, inputs, eager = load_case(out, job)
    assert_matches(ort_outputs(out, job), eager)
    if source == "cnn":  # jit.load runs the zoo model's saved weights: same inputs, same outputs
        _, zoo_inputs, zoo_eager = load_case(out, "cnn")
        np.testing.assert_array_equal(inputs["image"], zoo_inputs["image"])
        np.testing.assert_allclose(list(eager.values())[0], zoo_eager["logits"], rtol=1e-5, atol=1e-5)


def test_a_static_input_spec_is_the_compile_shape(jobs):
    """Saved with InputSpec([1, 4, 8, 8]) and a reshape that holds that batch of 1 (as shufflenet's channel
    shuffle does): the declared batch is kept, never made a symbolic batch that mlc runs at 2."""
    out, results = jobs
    job = "open static_batch"
    assert results["save static_batch"]["ok"], results["save static_batch"]
    assert results[job]["ok"], results[job]
    assert results[job]["dims"] == [[1, 4, 8, 8]]
    _, inputs, eager = load_case(out, job)
    assert inputs["x"].shape == (1, 4, 8, 8)
    assert_matches(ort_outputs(out, job), eager)


@pytest.mark.parametrize("source,fragment", [
    ("random", "cannot load the Paddle model"),
    ("plain.json", "cannot load the Paddle model"),
    ("short_params", "cannot load the Paddle model"),
    ("short_program", "cannot load the Paddle model"),
    ("missing", "no Paddle model"),
])
def test_bad_files_give_input_error(jobs, source, fragment):
    _, results = jobs
    result = results[f"open {source}"]
    assert result["ok"] is False and result["error"] == "InputError", result
    assert fragment in result["message"] and "\n" not in result["message"], result


def test_detect_imports_nothing(tmp_path):
    for name in ("m.json", "m.pdiparams", "old.pdmodel", "lone.json"):
        (tmp_path / name).write_bytes(b"")
    assert frontend.detect(str(tmp_path / "m")) and frontend.detect(str(tmp_path / "m.json"))
    assert frontend.detect(str(tmp_path / "m.pdiparams")) and frontend.detect(str(tmp_path / "old.pdmodel"))
    assert not frontend.detect(str(tmp_path / "lone.json")) and not frontend.detect(str(tmp_path))
    assert "paddle" not in sys.modules
