"""`mlc compile --buckets`: one artifact, one static build per length; padded runs equal unpadded eager."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mlc import api
from mlc.runtime import runner as thin_runtime
from helpers import assert_clean_error, run_mlc

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory):
    out = tmp_path_factory.mktemp("buckets") / "bert-tiny"
    result = api.compile("zoo:bert-tiny", output=out, buckets=["8,16,32"])
    return result


def _feeds(length: int, batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(1, 1000, size=(batch, length), dtype=np.int64),
            "attention_mask": np.ones((batch, length), dtype=np.int64)}


def test_manifest_and_check(bucketed):
    manifest = json.loads((bucketed.path / "manifest.json").read_text())
    buckets = manifest["buckets"]
    assert buckets["dim"] == "seq" and buckets["sizes"] == [8, 16, 32] and buckets["mask"] == "attention_mask"
    for library in buckets["libraries"].values():
        assert (bucketed.path / library).is_file() and library in manifest["files"]
    assert [c["length"] for c in buckets["checks"]] == [1, 9, 17]
    # one weights file for the three libraries, each distinct tensor in it once
    assert set(manifest["weights"]) == set(buckets["libraries"].values())
    files = {info["file"] for info in manifest["weights"].values()}
    one_bucket = sum(t["nbytes"] for t in manifest["weights"][buckets["libraries"]["8"]]["tensors"])
    assert len(files) == 1 and (bucketed.path / files.pop()).stat().st_size < 1.1 * one_bucket
    assert manifest["outputs"][0]["shape"] == [2, "seq", 128] and manifest["outputs"][1]["shape"] == [2, 128]
    assert bucketed.check.passed
    # every bucket was checked, at its most padded length
    names = [o.name for o in bucketed.check.outputs]
    assert any("seq=1 in bucket 8" in n for n in names) and any("seq=17 in bucket 32" in n for n in names)
    assert api.check(bucketed.path).passed


def test_padded_runs_equal_unpadded_eager(bucketed):
    from mlc import models

    eager = models.get("zoo:bert-tiny").builder("torch")().eager
    runner = thin_runtime.Runner(bucketed.path)
    for length, bucket in ((5, 8), (16, 16), (20, 32)):
        feeds = _feeds(length, seed=length)
        if length == 20:  # the second sentence is shorter: its own padding, masked out by the user
            feeds["attention_mask"][1, 14:] = 0
        got = runner.run(feeds)
        assert runner.last_bucket == (length, bucket)  # padding waste: bucket - length tokens
        want = eager([feeds["input_ids"], feeds["attention_mask"]])
        assert got["last_hidden_state"].shape == (2, length, 128)
        np.testing.assert_allclose(got["last_hidden_state"], want[0], atol=2e-4, rtol=1e-3)
        np.testing.assert_allclose(got["pooler_output"], want[1], atol=2e-4, rtol=1e-3)


def test_run_py_and_over_length(bucketed, tmp_path):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **_feeds(12))
    proc = subprocess.run([sys.executable, str(bucketed.path / "run.py"), "-i", str(inputs), "--repeat", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "last_hidden_state: shape (2, 12, 128)" in proc.stdout
    np.savez(inputs, **_feeds(33))
    assert_clean_error(run_mlc("run", bucketed.path, "-i", inputs), 1, "'seq' is 33 but the largest bucket is 32")


def test_model_without_mask_is_refused(tmp_path):
    tokens = helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "seq"])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 4])
    table = helper.make_tensor("table", TensorProto.FLOAT, [10, 4], np.ones(40, dtype=np.float32))
    graph = helper.make_graph([helper.make_node("Gather", ["table", "tokens"], ["y"])], "g", [tokens], [out], [table])
    path = tmp_path / "nomask.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    proc = run_mlc("compile", path, "--buckets", "8,16", "-o", tmp_path / "a")
    assert_clean_error(proc, 1, "no mask input", "tokens")
    proc = run_mlc("compile", path, "--buckets", "len=8,16", "-o", tmp_path / "a")
    assert_clean_error(proc, 1, "names dim 'len'")
    proc = run_mlc("compile", path, "--buckets", "8,x", "-o", tmp_path / "a")
    assert_clean_error(proc, 1, "--buckets", "malformed")
