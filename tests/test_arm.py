"""ARM targets: cross-compiled artifacts verified here under qemu with their own native runner.
Needs Debian's g++-aarch64-linux-gnu and qemu-user (`make test` installs them where it can; CI must)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import mlc.api as api
from helpers import assert_clean_error, reseal, run_mlc
from mlc.compiler import runtimes
from mlc.errors import MissingDependencyError
from mlc.runtime import runner as thin_runtime

HAVE_TOOLS = shutil.which("aarch64-linux-gnu-g++") and thin_runtime.emulator_command("aarch64")
if not HAVE_TOOLS and os.environ.get("CI"):
    raise RuntimeError("CI must have g++-aarch64-linux-gnu and qemu-user installed (see .ci/run)")
needs_tools = pytest.mark.skipif(not HAVE_TOOLS, reason="apt-get install g++-aarch64-linux-gnu qemu-user")

ELF_MACHINE = {183: "aarch64", 62: "x86_64"}


def elf_machine(path) -> str:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", path
    return ELF_MACHINE.get(int.from_bytes(header[18:20], "little"), "other")


@pytest.fixture(scope="module")
def arm_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("arm") / "mlp-graviton3"
    proc = run_mlc("compile", "zoo:mlp", "--target", "graviton3", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "pass" in proc.stdout and "under qemu emulation" in proc.stderr
    return out


@needs_tools
def test_arm_artifact_is_aarch64_and_checks_under_qemu(arm_artifact):
    manifest = json.loads((arm_artifact / "manifest.json").read_text())
    assert manifest["target"]["runtime_arch"] == "aarch64"
    assert manifest["target"]["tvm"]["mcpu"] == "neoverse-v1" and "+sve" in manifest["target"]["tvm"]["mattr"]
    for rel in ("model.so", "runtime/libtvm_runtime.so", "runtime/libtvm_ffi.so", "runtime/mlc_runner"):
        assert elf_machine(arm_artifact / rel) == "aarch64", rel
    assert os.access(arm_artifact / "runtime/mlc_runner", os.X_OK)
    check = run_mlc("check", arm_artifact, "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["outputs"][0]["max_abs_error"] < 1e-4


@needs_tools
def test_arm_run_on_new_inputs_matches_host_build(arm_artifact, tmp_path):
    x = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    proc = run_mlc("run", arm_artifact, "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz", "--repeat", "2",
                   "--warmup", "0")
    assert proc.returncode == 0, proc.stderr
    assert "qemu emulation" in proc.stderr and "not a measurement" in proc.stderr
    host = api.compile("zoo:mlp", output=tmp_path / "host").path
    expected = thin_runtime.Runner(host).run({"x": x})["logits"]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["logits"], expected, rtol=1e-4, atol=1e-5)


@needs_tools
def test_arm_accuracy_failure_exits_3(arm_artifact, tmp_path):
    art = tmp_path / "bad"
    shutil.copytree(arm_artifact, art)
    ref = dict(np.load(art / "reference/outputs.npz"))
    ref["logits"] = ref["logits"] * 1.1
    np.savez(art / "reference/outputs.npz", **ref)
    reseal(art)
    assert run_mlc("check", art).returncode == 3


@needs_tools
def test_arm_native_runner_errors_are_clean(arm_artifact, tmp_path):
    np.savez(tmp_path / "wrong.npz", x=np.zeros((2, 63), np.float32))
    assert_clean_error(run_mlc("run", arm_artifact, "-i", tmp_path / "wrong.npz"), 1, "expects shape (batch, 64)")


@needs_tools
def test_arm_bf16_conv_rows_are_padded_for_the_arm_tile(tmp_path):
    """A bf16 conv's output rows are padded for the target's tile: a 14-wide output divides x86's 7-row tile but
    not bfdot's (4 floats a vector: 6 rows at most), so for Graviton3 it is computed 15 wide (three 5-row tiles)
    and sliced. Padded for x86's tile instead, the conv ran off bfdot on a predicated row tail beside its
    channels' slice, and its values were wrong (the gate failed: cosine 0.989, 36 % of the values off). Checked
    under qemu by the bf16 gate."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = (np.random.default_rng(0).standard_normal((40, 32, 3, 3)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40, 14, 14])],
        [numpy_helper.from_array(weight, "w")])
    model = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    out = tmp_path / "conv-bf16"
    proc = run_mlc("compile", model, "--target", "graviton3", "--precision", "bf16", "--json", "-o", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "bf16" and manifest["gate"]["passed"]
    assert manifest["compile"]["schedules"]["default"] and not manifest["compile"]["schedules"]["unscheduled"]
    disassembly = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(out / manifest["library"])],
                                 capture_output=True, text=True, check=True).stdout
    assert disassembly.count("bfdot") >= 10  # the 5-row x 2-vector tile, unrolled


def test_native_runner_on_the_host_matches_python_runner(mlp_artifact):
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    native = thin_runtime.NativeRunner(mlp_artifact).run({"x": x})["y"]
    np.testing.assert_array_equal(native, thin_runtime.Runner(mlp_artifact).run({"x": x})["y"])
    assert thin_runtime.NativeRunner(mlp_artifact).benchmark({"x": x}, warmup=1, repeat=3)["runs"] == 3


def test_missing_cross_toolchain_is_exit_4_with_apt_command(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(runtimes.shutil, "which", lambda name: None if "aarch64" in name else real_which(name))
    with pytest.raises(MissingDependencyError, match="apt-get install g\\+\\+-aarch64-linux-gnu") as info:
        runtimes.toolchain("aarch64")
    assert info.value.exit_code == 4


@needs_tools
def test_without_emulator_the_artifact_is_built_but_not_verified(monkeypatch, tmp_path, arm_artifact):
    monkeypatch.setattr(thin_runtime, "emulator_command", lambda arch: None)
    result = api.compile("zoo:mlp", target="rpi4", output=tmp_path / "rpi4")
    assert result.check is None and any("not verified" in n for n in result.notes)
    with pytest.raises(MissingDependencyError, match="install qemu-aarch64"):
        api.check(arm_artifact)


@needs_tools
def test_arm_bf16_runs_on_bfdot_and_passes_the_gate_under_qemu(tmp_path):
    """--precision bf16 for Graviton3 (Neoverse V1's BF16): the convs and the classifier on bfdot, checked under
    qemu by the bf16 gate; the artifact requires the bf16 CPU feature. A core without BF16 (Raspberry Pi 5) gets
    the one-line error."""
    out = tmp_path / "cnn-bf16"
    proc = run_mlc("compile", "zoo:cnn", "--target", "graviton3", "--precision", "bf16", "-o", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bf16 accuracy gate" in proc.stdout and "under qemu emulation" in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "bf16" and manifest["gate"]["passed"]
    assert "bf16" in manifest["target"]["required_cpu_features"]
    disassembly = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(out / manifest["library"])],
                                 capture_output=True, text=True, check=True).stdout
    assert disassembly.count("bfdot") >= 4
    assert_clean_error(run_mlc("compile", "zoo:mlp", "--target", "rpi5", "--precision", "bf16"), 1,
                       "no bf16 dot-product instructions", "graviton3")
