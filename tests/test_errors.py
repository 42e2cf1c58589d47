"""Every error named in the foundation issue: one line, documented exit code, no traceback."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
from onnx import TensorProto, helper

from helpers import assert_clean_error, run_mlc


def test_missing_file(tmp_path):
    assert_clean_error(run_mlc("compile", tmp_path / "nope.onnx"), 1, "model file not found")


def test_random_bytes_are_not_onnx(tmp_path):
    bad = tmp_path / "random.onnx"
    bad.write_bytes(np.random.default_rng(0).bytes(4096))
    assert_clean_error(run_mlc("compile", bad), 1, "is not an ONNX model")


def test_truncated_model(mlp_model, tmp_path):
    data = mlp_model.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    proc = run_mlc("compile", cut)
    assert_clean_error(proc, 1)
    assert "not an ONNX model" in proc.stderr or "not a valid ONNX model" in proc.stderr


def test_empty_graph(tmp_path):
    graph = helper.make_graph([], "empty", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = tmp_path / "empty.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert_clean_error(run_mlc("compile", path), 1, "empty graph")


def test_unsupported_ops_are_all_listed(tmp_path):
    """RandomUniformLike (no TVM converter) twice and a custom-domain op: every type, its count, first nodes.
    (LSTM is no longer one: the lower_rnn pass rewrites it, see test_passes.py.)"""
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["y1"], name="rand_a"),
        helper.make_node("Relu", ["y1"], ["y2"], name="relu"),
        helper.make_node("RandomUniformLike", ["y2"], ["y3"], name="rand_b"),
        helper.make_node("FancyOp", ["y3"], ["out"], name="fancy", domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "unsupported", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["s", "d"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "unsupported.onnx"
    onnx.save(model, path)
    # Checked before anything runs the model (ONNX Runtime has no kernel for FancyOp either).
    proc = run_mlc("compile", path)
    assert_clean_error(proc, 1, "2 op type(s)", "RandomUniformLike x2 (first: rand_a, rand_b)",
                       "com.example.FancyOp x1 (first: fancy)")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_unknown_target_suggests_nearest(mlp_model):
    proc = run_mlc("compile", mlp_model, "--target", "x68")
    assert_clean_error(proc, 1, "unknown target 'x68'", "did you mean 'x86'", "x86-avx512")


def test_malformed_input_shape(mlp_model):
    assert_clean_error(run_mlc("compile", mlp_model, "--input-shape", "x:1by16"), 1, "malformed")
    assert_clean_error(run_mlc("compile", mlp_model, "--input-shape", "nope:1x16"), 1, "unknown input 'nope'",
                       "inputs are: x")
    assert_clean_error(run_mlc("compile", mlp_model, "--input-shape", "x:1x17"), 1,
                       "conflicts with the model's fixed shape")
    assert_clean_error(run_mlc("compile", mlp_model, "--input-shape", "x:0x16"), 1, "outside 1..")


def test_run_input_mismatches(mlp_artifact, tmp_path):
    cases = {
        "name": ({"z": np.zeros((2, 16), np.float32)}, "missing x; unexpected z"),
        "shape": ({"x": np.zeros((2, 15), np.float32)}, "expects shape (batch, 16), got (2, 15)"),
        "rank": ({"x": np.zeros((2, 16, 1), np.float32)}, "expects rank 2"),
        "dtype": ({"x": np.zeros((2, 16), np.float64)}, "expects dtype float32, got float64"),
    }
    for case, (feeds, message) in cases.items():
        path = tmp_path / f"{case}.npz"
        np.savez(path, **feeds)
        assert_clean_error(run_mlc("run", mlp_artifact, "-i", path), 1, message)


def test_run_rejects_pickles_and_garbage(mlp_artifact, tmp_path):
    pickled = tmp_path / "obj.npz"
    np.savez(pickled, x=np.array([{"a": 1}], dtype=object))
    assert_clean_error(run_mlc("run", mlp_artifact, "-i", pickled), 1, "cannot read")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    assert_clean_error(run_mlc("run", mlp_artifact, "-i", garbage), 1, "cannot read")
    assert_clean_error(run_mlc("run", mlp_artifact, "-i", tmp_path / "missing.npz"), 1, "not found")


def test_nan_inputs_warn(mlp_artifact, tmp_path):
    path = tmp_path / "nan.npz"
    np.savez(path, x=np.full((1, 16), np.nan, np.float32))
    proc = run_mlc("run", mlp_artifact, "-i", path, "--repeat", "0")
    assert proc.returncode == 0 and "contains NaN or Inf" in proc.stderr


def test_tampered_artifact_is_refused_naming_the_file(mlp_artifact, tmp_path):
    art = tmp_path / "tampered"
    shutil.copytree(mlp_artifact, art)
    with open(art / "model.so", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01")
    for command in ("run", "check"):
        assert_clean_error(run_mlc(command, art), 1, "model.so fails its sha256 check")


def test_missing_artifact_file_and_not_an_artifact(mlp_artifact, tmp_path):
    art = tmp_path / "incomplete"
    shutil.copytree(mlp_artifact, art)
    (art / "reference/outputs.npz").unlink()
    assert_clean_error(run_mlc("check", art), 1, "reference/outputs.npz is missing")
    assert_clean_error(run_mlc("check", tmp_path), 1, "is not an mlc artifact")
    assert_clean_error(run_mlc("check", tmp_path / "nowhere"), 1, "artifact not found")


def test_newer_schema_asks_to_upgrade(mlp_artifact, tmp_path):
    art = tmp_path / "future"
    shutil.copytree(mlp_artifact, art)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["schema_version"] = 99
    (art / "manifest.json").write_text(json.dumps(manifest))
    assert_clean_error(run_mlc("check", art), 1, "upgrade mlc")


def test_manifest_escaping_the_artifact_is_refused(mlp_artifact, tmp_path):
    art = tmp_path / "escape"
    shutil.copytree(mlp_artifact, art)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"]["../outside.txt"] = "0" * 64
    (art / "manifest.json").write_text(json.dumps(manifest))
    assert_clean_error(run_mlc("check", art), 1, "outside the artifact")


def test_bad_tolerance_and_usage(mlp_artifact):
    assert_clean_error(run_mlc("check", mlp_artifact, "--atol", "-1"), 1, "--atol must be")
    assert run_mlc("compile").returncode == 2
    assert run_mlc("frobnicate").returncode == 2


def test_failed_compile_keeps_the_previous_artifact(mlp_artifact, tmp_path):
    """Nothing half-written: a compile that fails leaves the old artifact untouched."""
    out = tmp_path / "keep"
    shutil.copytree(mlp_artifact, out)
    before = {p.name: p.stat().st_mtime_ns for p in out.rglob("*")}
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk")
    assert_clean_error(run_mlc("compile", bad, "-o", out), 1)
    assert {p.name: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".keep")]
    assert run_mlc("check", out).returncode == 0


def test_out_of_range_token_ids_are_refused_not_segfaulted(tmp_path):
    """TVM's gather reads out of bounds (and can segfault) on ids past the embedding table."""
    art = tmp_path / "bert"
    run_mlc("compile", "zoo:transformer", "-o", art, check=True)
    feeds = dict(np.load(art / "reference/inputs.npz"))
    feeds["input_ids"][0, 0] = 1000  # vocab is 1000
    np.savez(tmp_path / "ids.npz", **feeds)
    assert_clean_error(run_mlc("run", art, "-i", tmp_path / "ids.npz"), 1, "input 'input_ids' has values in [",
                       "accepts only [0, 999]")


def test_interrupted_compile_leaves_old_artifact_and_no_debris(mlp_artifact, mlp_model, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "art"
    shutil.copytree(mlp_artifact, out)
    before = (out / "manifest.json").read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "mlc", "compile", "zoo:transformer", "-o", out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not any(p.name.startswith(".art.tmp-") for p in tmp_path.iterdir()):
        time.sleep(0.05)  # wait until the staging directory exists: TVM is compiling
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    assert (out / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]
    assert run_mlc("check", out).returncode == 0


def test_missing_external_data_file(tmp_path):
    """An .onnx whose weights file was not copied along: one line naming that file, exit 1 (was exit 70)."""
    from onnx import numpy_helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "0.weight"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(np.ones((4, 4), np.float32), "0.weight")])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path),
              save_as_external_data=True, location="model.weights.bin", size_threshold=0)
    (tmp_path / "model.weights.bin").unlink()
    proc = run_mlc("compile", path, "-o", tmp_path / "art")
    assert_clean_error(proc, 1, "in a file that is missing", "model.weights.bin")
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "art").exists()
