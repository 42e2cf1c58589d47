"""Target presets: detection, portability, errors, and validity as TVM targets."""

import json
import subprocess
import sys

import pytest

from mlc import targets
from mlc.targets import presets
from mlc.errors import TargetError


def test_presets_resolve_to_valid_tvm_targets():
    """Every preset's JSON is accepted by TVM 0.27 (checked in a child: `import tvm` must not
    share a process with an artifact runtime loaded by other tests)."""
    presets = {name: targets.resolve(name).tvm for name in targets.PRESETS}
    script = (
        "import json, sys, tvm\n"
        "for name, spec in json.loads(sys.argv[1]).items():\n"
        "    t = tvm.target.Target(spec)\n"
        "    key = 'mcpu' if 'mcpu' in t.attrs else 'arch' if 'arch' in t.attrs else None\n"
        "    print(name, t.kind.name, t.attrs[key] if key else '-')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(presets)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["x86-avx2"] == "llvm haswell"
    assert lines["x86-avx512"] == "llvm skylake-avx512"
    assert lines["graviton3"] == "llvm neoverse-v1" and lines["rpi5"] == "llvm cortex-a76"
    assert lines["cuda-h100"] == "cuda sm_90" and lines["metal"] == "metal -"
    assert set(lines) == set(targets.PRESETS)


@pytest.mark.parametrize(
    "flags, mcpu",
    [
        ({"sse2"}, "x86-64"),
        ({"avx2", "fma", "bmi2"}, "haswell"),
        ({"avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}, "skylake-avx512"),
        ({"avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_vnni"},
         "cascadelake"),
    ],
)
def test_host_detection_by_cpu_flags(monkeypatch, flags, mcpu):
    monkeypatch.setattr(presets, "host_cpu_flags", lambda: flags)
    monkeypatch.setattr(presets, "_cpuinfo_fields", lambda names: {"vendor_id": "GenuineIntel"})
    monkeypatch.setattr(presets.platform, "machine", lambda: "x86_64")
    target = targets.resolve("x86")
    assert target.tvm["mcpu"] == mcpu and target.tvm["num-cores"] >= 1
    assert set(target.required_cpu_features) <= flags  # never require what the host lacks


def test_detection_refuses_other_architectures(monkeypatch):
    monkeypatch.setattr(presets.platform, "machine", lambda: "aarch64")
    with pytest.raises(TargetError, match="this host is aarch64"):
        targets.resolve("x86")
    rows = {r["name"]: r for r in targets.describe_all()}
    assert rows["x86"]["description"].startswith("unavailable here")


def test_unknown_target_lists_presets_and_suggests():
    with pytest.raises(TargetError, match="did you mean 'x86-avx2'"):
        targets.resolve("x86_avx2")
    with pytest.raises(TargetError, match="known targets: x86, x86-avx2, x86-avx512, graviton2"):
        targets.resolve("tpu")


def test_runner_refuses_a_cpu_without_the_features(mlp_artifact, monkeypatch):
    from mlc.runtime import runner

    monkeypatch.setattr(runner, "host_cpu_flags", lambda: {"sse2"})
    with pytest.raises(runner.ArtifactError, match="this CPU lacks"):
        runner.Runner(mlp_artifact)


def test_raw_json_targets():
    target = targets.resolve('{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a55"}')
    assert (target.name, target.runtime_arch, target.tvm["num-cores"]) == ("llvm-cortex-a55", "aarch64", 4)
    assert targets.resolve('{"kind": "llvm", "mcpu": "haswell"}').runtime_arch == targets.HOST_ARCH
    cuda = targets.resolve('{"kind": "cuda", "arch": "sm_86"}')
    assert (cuda.name, cuda.device, cuda.runtime_arch, cuda.tvm["host"]["kind"]) == \
        ("cuda-sm_86", "cuda", "x86_64", "llvm")
    metal = targets.resolve('{"kind": "metal"}')
    assert (metal.device, metal.runtime_os, metal.tvm["host"]["mtriple"]) == ("metal", "macos", "arm64-apple-macos")
    for bad, message in [('{"kind"', "does not parse"), ("{}", 'object with a "kind"'),
                         ('{"kind": "rocm"}', "not supported yet"), ('{"kind": "cuda", "host": 3}', '"host"'),
                         ('{"kind": "llvm", "mtriple": "riscv64-linux"}', "riscv64")]:
        with pytest.raises(TargetError, match=message):
            targets.resolve(bad)


def test_several_targets_in_one_run(tmp_path):
    from helpers import assert_clean_error, run_mlc

    proc = run_mlc("compile", "zoo:mlp", "-t", "x86", "-t", "x86-avx2", "-o", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp-x86", "mlp-x86-avx2"]
    avx2 = json.loads((tmp_path / "mlp-x86-avx2" / "manifest.json").read_text())
    assert avx2["target"]["tvm"]["mcpu"] == "haswell"
    # Every target is checked before anything compiles.
    assert_clean_error(run_mlc("compile", "zoo:mlp", "-t", "x86", "-t", "nope", "-o", tmp_path / "x"), 1,
                       "unknown target 'nope'")
    assert not (tmp_path / "x").exists()
    bad = run_mlc("compile", "zoo:mlp", "-t", '{"kind": "llvm", "mattr": "oops"}', "-o", tmp_path / "y")
    assert_clean_error(bad, 1, "TVM rejects the target")


@pytest.mark.parametrize("family, model, flags, mcpu", [
    ("25", "17", {"avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_vnni",
                  "avx512_bf16"}, "znver4"),
    ("25", "1", {"avx2", "fma", "bmi2"}, "znver3"),
    ("26", "2", {"avx2", "fma", "bmi2", "avx512f"}, "znver5"),
    ("23", "49", {"avx2", "fma", "bmi2"}, "znver2"),
])
def test_amd_zen_cores_get_their_own_scheduling_model(monkeypatch, family, model, flags, mcpu):
    """Zen 4 has Cooper Lake's features, but LLVM's znver4 model has its instruction costs."""
    monkeypatch.setattr(presets, "host_cpu_flags", lambda: flags)
    monkeypatch.setattr(presets, "_cpuinfo_fields",
                        lambda names: {"vendor_id": "AuthenticAMD", "cpu family": family, "model": model})
    monkeypatch.setattr(presets.platform, "machine", lambda: "x86_64")
    target = targets.resolve("x86")
    assert target.tvm["mcpu"] == mcpu
    assert set(target.required_cpu_features) <= flags  # the runtime check still reads the features


def test_cpu_table_is_llvms_own():
    """The presets' int8/bf16 checks and the schedules' vector width read one table; it must be what the pinned
    TVM's LLVM says (regenerate with mlc.compiler.cpu_table.write() after an upgrade)."""
    from mlc.compiler import cpu_table
    from mlc.targets.llvm_cpu_table import CPUS_WITH

    assert cpu_table.table_from_llvm() == CPUS_WITH


@pytest.mark.parametrize("mcpu", ["tigerlake", "rocketlake", "emeraldrapids", "graniterapids", "znver5"])
def test_every_avx512_cpu_gets_16_lanes_and_its_dot_products(mcpu):
    """The schedules' own substring list gave these 8 lanes while the presets treated them as AVX-512."""
    from tvm.target import Target as TVMTarget

    from mlc.compiler.schedule_rules import vector_lanes

    spec = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu}
    assert vector_lanes(TVMTarget(spec)) == 16
    assert targets.int8_dot_feature(presets.from_json(json.dumps(spec))) == "avx512_vnni"
    assert vector_lanes(TVMTarget({**spec, "mattr": ["-avx512f"]})) == 8
