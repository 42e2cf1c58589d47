"""The artifact runs in a fresh virtual environment holding only numpy and apache-tvm-ffi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv

import numpy as np
import pytest

TVM_FFI = "apache-tvm-ffi==0.1.14.post1"
# A fresh venv lists pip (and setuptools on older Pythons) besides what the test installs.
INSTALLER = {"pip", "setuptools", "wheel"}
# What `pip install numpy apache-tvm-ffi` brings: the two and tvm-ffi's one dependency.
THIN = {"numpy", "apache-tvm-ffi", "typing-extensions"}


def thin_env() -> dict[str, str]:
    """The environment without a developer's checkout on the path: what the venv holds is all it can import."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def thin_python(tmp_path_factory):
    env_dir = tmp_path_factory.mktemp("thin-venv")
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "numpy", TVM_FFI], check=True, env=thin_env())
    return python


def test_thin_venv_has_no_compiler(thin_python, tmp_path):
    listed = subprocess.run([thin_python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True, env=thin_env())
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)} - INSTALLER
    assert names == THIN, names
    probe = ("import importlib.util, json; print(json.dumps("
             "{m: importlib.util.find_spec(m) is not None for m in ('tvm', 'mlc', 'onnx', 'tvm_ffi')}))")
    # cwd: `python -c` puts the working directory first on sys.path, and the repo root holds mlc/
    found = json.loads(subprocess.run([thin_python, "-c", probe], capture_output=True, text=True, check=True,
                                      env=thin_env(), cwd=tmp_path).stdout)
    assert found == {"tvm": False, "mlc": False, "onnx": False, "tvm_ffi": True}


def test_run_py_in_thin_venv(thin_python, mlp_artifact, tmp_path):
    proc = subprocess.run([thin_python, mlp_artifact / "run.py", "-o", tmp_path / "out.npz", "--repeat", "3"],
                          capture_output=True, text=True, env=thin_env())
    assert proc.returncode == 0, proc.stderr
    reference = np.load(mlp_artifact / "reference/outputs.npz")["y"]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], reference, rtol=1e-3, atol=1e-4)


def test_runner_api_in_thin_venv(thin_python, mlp_artifact, tmp_path):
    """The bundled Runner, in the thin venv, on the reference inputs: the compiled outputs, and no tvm loaded."""
    script = (
        "import sys, json, numpy as np; sys.path.insert(0, sys.argv[1] + '/runtime');"
        "from mlc_runtime import Runner; r = Runner(sys.argv[1]);"
        "feeds = dict(np.load(sys.argv[1] + '/reference/inputs.npz'));"
        "np.savez(sys.argv[2], **r.run(feeds));"
        "print(json.dumps({'prefix': sys.prefix, 'tvm': 'tvm' in sys.modules, 'mlc': 'mlc' in sys.modules}))"
    )
    out = tmp_path / "runner.npz"
    proc = subprocess.run([thin_python, "-c", script, mlp_artifact, out], capture_output=True, text=True,
                          env=thin_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ran = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ran == {"prefix": str(thin_python.parent.parent), "tvm": False, "mlc": False}
    reference = np.load(mlp_artifact / "reference/outputs.npz")
    outputs = np.load(out)
    assert sorted(outputs.files) == sorted(reference.files)
    for name in reference.files:
        np.testing.assert_allclose(outputs[name], reference[name], rtol=1e-5, atol=1e-6)


def _fake_sys(root, cores: list[tuple[int, int]], cpu_max: str | None = None):
    """A /sys tree: logical CPU i on (package, core) cores[i]; cgroup v2's cpu.max where given."""
    for cpu, (package, core) in enumerate(cores):
        topology = root / f"devices/system/cpu/cpu{cpu}/topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    if cpu_max is not None:
        (root / "fs/cgroup").mkdir(parents=True)
        (root / "fs/cgroup/cpu.max").write_text(cpu_max + "\n")
    return root


@pytest.mark.parametrize("cores, cpu_max, expected", [
    ([(0, 0), (0, 1), (0, 0), (0, 1)], None, 2),          # two cores with two hyper-threads each
    ([(0, 0), (0, 1), (1, 0), (1, 1)], "max 100000", 4),  # two sockets, core ids repeat across them
    ([(0, 0), (0, 1), (0, 2), (0, 3)], "150000 100000", 2),  # a container limited to 1.5 CPUs
])
def test_physical_cores_counts_each_core_once_within_the_cpu_quota(tmp_path, monkeypatch, cores, cpu_max, expected):
    from mlc.runtime.runner import physical_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(len(cores))))
    assert physical_cores(_fake_sys(tmp_path, cores, cpu_max)) == expected


def test_runner_starts_one_thread_per_physical_core(mlp_artifact):
    """With no TVM_NUM_THREADS, TVM's pool takes half the logical CPUs on x86 (hyper-threads): half the cores where
    there are none. The runtime sets one thread per physical core, and --threads overrides it."""
    from mlc.runtime.runner import physical_cores

    script = ("import sys, numpy as np; sys.path.insert(0, sys.argv[1] + '/runtime');"
              "from mlc_runtime import Runner; threads = int(sys.argv[2]) if len(sys.argv) > 2 else None;"
              "r = Runner(sys.argv[1], threads=threads); r.run(dict(np.load(sys.argv[1] + '/reference/inputs.npz')));"
              "print(r.threads, r._tvm_ffi.get_global_func('runtime.NumThreads')())")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}

    def pool(*threads: str) -> list[int]:
        proc = subprocess.run([sys.executable, "-c", script, mlp_artifact, *threads], capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        return [int(n) for n in proc.stdout.split()]

    cores = physical_cores()
    assert pool() == [cores, cores]
    assert pool("1") == [1, 1]


def test_run_py_check_in_thin_venv_judges_against_the_reference(thin_python, mlp_artifact, tmp_path):
    """`python run.py --check` needs nothing of mlc: it passes on the artifact as built, and exits 3 naming the output
    once the reference it is judged against is not what the model computes."""
    import shutil

    from helpers import reseal

    proc = subprocess.run([thin_python, mlp_artifact / "run.py", "--check", "--repeat", "0"], capture_output=True,
                          text=True, env=thin_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "check passed on cpu:0" in proc.stdout
    wrong = tmp_path / "wrong"
    shutil.copytree(mlp_artifact, wrong)
    reference = dict(np.load(wrong / "reference/outputs.npz"))
    np.savez(wrong / "reference/outputs.npz", **{k: v + 1 for k, v in reference.items()})
    reseal(wrong)
    proc = subprocess.run([thin_python, wrong / "run.py", "--check", "--repeat", "0"], capture_output=True,
                          text=True, env=thin_env(), cwd=tmp_path)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "check FAILED for y" in proc.stdout and "Traceback" not in proc.stderr


def test_a_string_model_runs_and_checks_in_thin_venv(thin_python, tmp_path):
    """The host's string ops ship with the artifact (runtime/mlc_host_ops.py): run.py --check passes on new words
    without mlc or onnx, and fails naming the label output once its reference strings are wrong."""
    import mlc.api as api
    from helpers import reseal, string_model_onnx

    art = api.compile(str(string_model_onnx(tmp_path / "text.onnx")), target="x86", output=tmp_path / "art").path
    np.savez(tmp_path / "words.npz", words=np.array(["fish", "zebra", "cat"]))
    proc = subprocess.run([thin_python, art / "run.py", "-i", tmp_path / "words.npz", "-o", tmp_path / "out.npz"],
                          capture_output=True, text=True, env=thin_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "out.npz")["label"].shape == (3,)
    reference = dict(np.load(art / "reference/outputs.npz"))
    reference["label"] = np.array(["nonsense"] * reference["label"].size)
    np.savez(art / "reference/outputs.npz", **reference)
    reseal(art)
    proc = subprocess.run([thin_python, art / "run.py", "--check", "--repeat", "0"], capture_output=True,
                          text=True, env=thin_env(), cwd=tmp_path)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "check FAILED for label" in proc.stdout and "Traceback" not in proc.stderr


def test_runner_closes_what_it_loaded_once_and_refuses_to_run_after(tmp_path):
    """close() (or the end of a `with` block) drops the VM and the weights: their file is no longer mapped. (The
    library's code stays: its shared object is never unloaded.)"""
    import gc
    from pathlib import Path

    from mlc import api
    from mlc.runtime.runner import NativeRunner, Runner, RunnerClosed

    artifact = api.compile("zoo:mlp", target="x86", output=tmp_path / "mlp").path  # weights big enough for a file
    feeds = dict(np.load(artifact / "reference/inputs.npz"))
    manifest = json.loads((artifact / "manifest.json").read_text())
    weights = str((artifact / manifest["weights"][manifest["library"]]["file"]).resolve())

    def mapped() -> bool:
        gc.collect()
        return weights in Path("/proc/self/maps").read_text()

    with Runner(artifact) as runner:
        expected = runner.run(feeds)
        assert mapped() and not runner.closed
    assert runner.closed and not mapped()
    for call in (lambda: runner.run(feeds), lambda: runner.measure(feeds), lambda: runner.benchmark(feeds),
                 lambda: runner.profile(feeds)):
        with pytest.raises(RunnerClosed, match=r"^this runner of .+ is closed; open the artifact again to run it$"):
            call()
    runner.close()  # again: nothing to do
    again = Runner(artifact)
    for name, value in again.run(feeds).items():
        np.testing.assert_array_equal(value, expected[name])
    again.close()
    assert not mapped()
    with NativeRunner(artifact) as native:
        native.run(feeds)
    with pytest.raises(RunnerClosed):
        native.run(feeds)
