"""The foundation slice end to end, through the real CLI: compile, run, check."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from helpers import assert_clean_error, reseal, run_mlc, torch_bert_onnx, torch_cnn_onnx
from mlc.runtime import Runner
from mlc.runtime.runner import ArtifactError


@pytest.mark.parametrize("build", [torch_cnn_onnx, torch_bert_onnx], ids=["torch-cnn", "torch-bert-2layer"])
def test_compile_run_check_torch_exports(build, tmp_path):
    model = build(tmp_path / "model.onnx")
    out = tmp_path / "art"
    proc = run_mlc("compile", model, "--target", "x86", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "pass" in proc.stdout and "FAIL" not in proc.stdout

    check = run_mlc("check", out, "--json")
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout)
    assert report["passed"] and report["outputs"][0]["max_abs_error"] < 1e-4

    run = run_mlc("run", out, "--repeat", "5", "--warmup", "1")
    assert run.returncode == 0, run.stderr
    assert "p50" in run.stdout and "p99" in run.stdout and "runs/s" in run.stdout


def test_dynamic_batch_answers_every_batch_size(mlp_model, mlp_artifact):
    manifest = json.loads((mlp_artifact / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == ["batch", 16] and manifest["inputs"][0]["model_shape"] is None
    assert manifest["outputs"][0]["shape"] == ["batch", 4]
    runner = Runner(mlp_artifact)
    session = ort.InferenceSession(str(mlp_model))
    for batch in (1, 5, 17):
        x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
        got = runner.run({"x": x})["y"]
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_input_shape_fixes_dynamic_dims(mlp_model, tmp_path):
    out = tmp_path / "fixed"
    proc = run_mlc("compile", mlp_model, "--input-shape", "x:3x16", "-o", out, check=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == [3, 16]
    # Which dims the model fixed (16) and which it left open and the compile fixed (batch), in both places.
    assert manifest["inputs"][0]["model_shape"] == ["batch", 16]
    assert "dims the model leaves open, fixed at the reference size: batch=3 (--dynamic batch" in proc.stdout
    np.testing.assert_equal(np.load(out / "reference/inputs.npz")["x"].shape, (3, 16))
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.zeros((2, 16), np.float32))
    assert_clean_error(run_mlc("run", out, "-i", inputs), 1, "expects shape (3, 16), got (2, 16)")


def test_run_reads_and_writes_npz(mlp_artifact, tmp_path):
    x = np.random.default_rng(7).standard_normal((4, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    proc = run_mlc("run", mlp_artifact, "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz", "--repeat", "3",
                   "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["outputs"]["y"]["shape"] == [4, 4] and report["threads"] == 1
    assert report["latency"]["runs"] == 3 and report["latency"]["p50_ms"] > 0
    expected = Runner(mlp_artifact).run({"x": x})["y"]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], expected)


def test_run_profile_times_every_kernel(mlp_artifact):
    proc = run_mlc("run", mlp_artifact, "--repeat", "2", "--profile", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["profile"]
    kernels = json.loads((mlp_artifact / "manifest.json").read_text())["compile"]["schedules"]["default"]
    assert any(row["name"].startswith(tuple(kernels)) for row in rows), (rows, kernels)
    assert all(row["calls"] >= 1 and row["ms"] >= 0 for row in rows)
    assert [row["ms"] for row in rows] == sorted((row["ms"] for row in rows), reverse=True)
    assert abs(sum(row["share"] for row in rows) - 1) < 1e-6
    table = run_mlc("run", mlp_artifact, "--repeat", "0", "--profile")
    assert table.returncode == 0 and "by kernel" in table.stdout, table.stdout + table.stderr


def test_perturbed_reference_fails_check_with_exit_3(mlp_artifact, tmp_path):
    art = tmp_path / "perturbed"
    shutil.copytree(mlp_artifact, art)
    ref = dict(np.load(art / "reference/outputs.npz"))
    ref["y"] = ref["y"] + 0.01  # what a miscompiled model would look like
    np.savez(art / "reference/outputs.npz", **ref)
    reseal(art)
    proc = run_mlc("check", art)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout
    assert "accuracy check failed for output(s): y" in proc.stderr
    # Loosening the tolerance past the perturbation passes again: the check measures, it does not guess.
    assert run_mlc("check", art, "--atol", "0.02").returncode == 0


def test_artifact_runs_with_its_own_run_py(mlp_artifact):
    proc = subprocess.run([sys.executable, str(mlp_artifact / "run.py"), "--repeat", "2"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "y: shape (2, 4)" in proc.stdout and "latency over 2 runs" in proc.stdout


def test_archive_round_trip(mlp_model, tmp_path):
    out = tmp_path / "a" / "mlp-x86"
    run_mlc("compile", mlp_model, "-o", out, "--archive", check=True)
    archive = out.with_name("mlp-x86.tar.gz")
    assert archive.is_file()
    proc = run_mlc("unpack", archive, "--dest", tmp_path / "unpacked")
    assert proc.returncode == 0, proc.stderr
    assert run_mlc("check", tmp_path / "unpacked" / "mlp-x86").returncode == 0


def test_zoo_models_compile_and_pass(tmp_path):
    for name in ("mlp", "cnn", "transformer"):
        proc = run_mlc("compile", f"zoo:{name}", "-o", tmp_path / name, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["check"]["passed"]


def test_manifest_records_what_the_issue_asks(mlp_artifact, mlp_model):
    manifest = json.loads((mlp_artifact / "manifest.json").read_text())
    assert manifest["schema_version"] == 5
    assert manifest["tvm_version"].startswith("0.27")
    assert manifest["target"]["tvm"]["kind"] == "llvm" and manifest["target"]["tvm"]["num-cores"] >= 1
    from mlc.runtime.runner import sha256_file

    assert manifest["source"]["sha256"] == sha256_file(mlp_model)
    for rel, digest in manifest["files"].items():
        assert sha256_file(mlp_artifact / rel) == digest
    assert set(manifest["files"]) >= {"model.so", "run.py", "runtime/libtvm_runtime.so", "runtime/mlc_runtime.py",
                                      "reference/inputs.npz", "reference/outputs.npz"}
    assert {"load", "reference", "onnx_passes", "tvm", "tvm_build"} <= set(manifest["compile"]["timings_s"])
    assert manifest["compile"]["recipe"].startswith("mlc compile")


def test_weights_live_beside_the_library(tmp_path):
    """The weights are in model.weights, not in model.so, and both runtimes read them from there."""
    import mlc.api as api
    from mlc.runtime.runner import NativeRunner

    art = api.compile("zoo:mlp", output=tmp_path / "mlp").path
    info = json.loads((art / "manifest.json").read_text())["weights"]["model.so"]
    data = (art / info["file"]).read_bytes()
    assert sum(t["nbytes"] for t in info["tensors"]) >= 64 * 128 * 4  # the mlp's first layer, at least
    library = (art / "model.so").read_bytes()
    for tensor in info["tensors"]:
        assert data[tensor["offset"]:tensor["offset"] + tensor["nbytes"]] not in library
    x = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    expected = Runner(art).run(x)["logits"]
    np.testing.assert_array_equal(NativeRunner(art).run(x)["logits"], expected)
    (art / info["file"]).write_bytes(bytes(len(data)))  # zeroed weights must change the outputs
    for runner in (Runner(art, verify=False), NativeRunner(art, verify=False)):
        assert not np.array_equal(runner.run(x)["logits"], expected)
    (art / info["file"]).write_bytes(data[:len(data) // 2])  # truncated: a clean error even unverified
    with pytest.raises(ArtifactError, match="does not hold the weights"):
        Runner(art, verify=False)


def test_version_targets_help():
    assert run_mlc("--version").stdout.startswith("mlc ")
    targets = run_mlc("targets")
    assert targets.returncode == 0 and "x86-avx512" in targets.stdout
    assert "compile" in run_mlc("--help").stdout
    # Help text is rich markup: a literal "[default: 64]" would be swallowed as a tag.
    assert "(default: 64)" in " ".join(run_mlc("tune", "--help").stdout.split())


def test_unaligned_inputs_are_safe(tmp_path):
    """TVM conv kernels segfault on buffers that are not 64-byte aligned; the runner must align."""
    import mlc.api as api

    art = api.compile("zoo:cnn", output=tmp_path / "cnn").path
    runner = Runner(art)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    expected = runner.run({"image": x})["logits"]
    backing = np.empty(x.size + 16, np.float32)
    for offset in range(1, 16):  # 4-byte steps through every misalignment
        view = backing[offset:offset + x.size].reshape(x.shape)
        view[...] = x
        np.testing.assert_array_equal(runner.run({"image": view})["logits"], expected)
    strided = np.asfortranarray(x)
    np.testing.assert_array_equal(runner.run({"image": strided})["logits"], expected)


def test_device_copy_functions_round_trip(mlp_artifact):
    """The runner moves GPU inputs and outputs with TVM's runtime copy functions; exercise them
    between CPU tensors (no GPU here) so their use is checked on every CI run."""
    import tvm_ffi

    from mlc.runtime.runner import copy_tensor

    Runner(mlp_artifact)  # loads the TVM runtime that registers the copy functions
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    copied = copy_tensor(tvm_ffi.from_dlpack(x), tvm_ffi.device("cpu", 0))
    assert tuple(copied.shape) == (2, 3, 4) and str(copied.dtype) == "float32"
    np.testing.assert_array_equal(np.from_dlpack(copied), x)
