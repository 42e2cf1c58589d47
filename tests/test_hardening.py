"""Hardening: malformed models and arguments, crash safety, integrity, untrusted files, soak."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import mlc.api as api
from helpers import assert_clean_error, mlp_onnx, reseal, run_mlc
from mlc.errors import CompilerError, ExitCode, MlcError


def _save(tmp_path: Path, name: str, nodes, inputs, outputs, inits=(), opset: int = 17) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)
    return path


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_malformed_graphs_get_clear_errors(tmp_path):
    cycle = _save(tmp_path, "cycle", [helper.make_node("Relu", ["b"], ["a"], name="r1"),
                                      helper.make_node("Relu", ["a"], ["b"], name="r2")],
                  [_vi("x", [1])], [_vi("a", [1])])
    assert_clean_error(run_mlc("compile", cycle), 1, "node r1 uses 'b' before node r2 computes it")
    missing = _save(tmp_path, "missing_init", [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                    [_vi("x", [1, 2])], [_vi("y", [1, 2])])
    assert_clean_error(run_mlc("compile", missing), 1, "node mm uses 'W', which no node", "missing initializer")
    future = _save(tmp_path, "future", [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1])], [_vi("y", [1])],
                   opset=999)
    assert_clean_error(run_mlc("compile", future), 1, "uses ONNX opset 999")
    absurd = _save(tmp_path, "absurd", [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1, 2**40])],
                   [_vi("y", [1, 2**40])])
    assert_clean_error(run_mlc("compile", absurd), 1, "absurd dimension")
    huge = _save(tmp_path, "huge", [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n", 4096])],
                 [_vi("y", ["n", 4096])])
    assert_clean_error(run_mlc("compile", huge, "--input-shape", "x:1000000x4096"), 1, "GiB", "choose smaller shapes")
    dangling = _save(tmp_path, "dangling", [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1])], [_vi("z", [1])])
    assert_clean_error(run_mlc("compile", dangling), 1, "graph output(s) z are not computed")


def _find_worker(parent_pid: int, timeout: float = 60) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if b"mlc.compiler.worker" in cmdline and int(stat[1]) == parent_pid:
                return int(proc.name)
        time.sleep(0.05)
    raise AssertionError("no worker process appeared")


def test_tvm_crash_is_contained(mlp_model, tmp_path):
    """A crash inside TVM (here: the worker killed mid-compile) is a clean exit 70, not a dead mlc."""
    out = tmp_path / "art"
    proc = subprocess.Popen([sys.executable, "-m", "mlc", "compile", mlp_model, "-o", out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.kill(_find_worker(proc.pid), signal.SIGSEGV)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 70, stderr
    assert "TVM compile process was killed by SIGSEGV" in stderr and "Traceback" not in stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_killed_compile_leaves_old_artifact_and_next_run_sweeps(mlp_artifact, mlp_model, tmp_path):
    out = tmp_path / "art"
    shutil.copytree(mlp_artifact, out)
    before = (out / "manifest.json").read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "mlc", "compile", mlp_model, "-o", out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _find_worker(proc.pid)
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait()
    assert (out / "manifest.json").read_bytes() == before and run_mlc("check", out).returncode == 0
    assert any(p.name.startswith(".art.tmp-") for p in tmp_path.iterdir())  # debris of the killed run
    run_mlc("compile", mlp_model, "-o", out, check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_concurrent_compiles_to_one_output(mlp_model, tmp_path):
    out = tmp_path / "art"
    procs = [subprocess.Popen([sys.executable, "-m", "mlc", "compile", mlp_model, "-o", out],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
    assert run_mlc("check", out).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def _archive_with(tmp_path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def test_archive_escapes_are_refused(tmp_path):
    dest = tmp_path / "dest"
    slip = _archive_with(tmp_path, {"art/manifest.json": b"{}", "art/../../escaped.txt": b"x"})
    assert_clean_error(run_mlc("unpack", slip, "-d", dest), 1)
    link = _archive_with(tmp_path, {"art/manifest.json": b"{}"}, {"art/passwd": "/etc/passwd"})
    assert_clean_error(run_mlc("unpack", link, "-d", dest), 1)
    assert not (tmp_path / "escaped.txt").exists() and not (dest / "art").exists()


def test_invalid_manifest_is_named(mlp_artifact, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(mlp_artifact, art)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["inputs"][0]["shape"] = "not a list"
    (art / "manifest.json").write_text(json.dumps(manifest))
    assert_clean_error(run_mlc("check", art), 1, "manifest.json is invalid at 'inputs.0.shape'")
    (art / "manifest.json").write_text("{ truncated")
    assert_clean_error(run_mlc("check", art), 1, "is not valid JSON")


def test_nothing_is_unpickled(mlp_artifact, tmp_path):
    """A pickled array smuggled into an artifact is refused, not loaded (even with valid hashes)."""
    art = tmp_path / "art"
    shutil.copytree(mlp_artifact, art)
    np.savez(art / "reference/inputs.npz", x=np.array([{"payload": 1}], dtype=object))
    reseal(art)
    assert_clean_error(run_mlc("check", art), 1, "cannot read", "inputs.npz")


# -- property-based: mutated models and arguments always end in success or a clean MlcError --

_MLP_BYTES = None


def _mlp_bytes(tmp_path_factory) -> bytes:
    global _MLP_BYTES
    if _MLP_BYTES is None:
        _MLP_BYTES = mlp_onnx(tmp_path_factory.mktemp("prop") / "mlp.onnx").read_bytes()
    return _MLP_BYTES


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_model_bytes_fail_cleanly(tmp_path_factory, data):
    model = bytearray(_mlp_bytes(tmp_path_factory))
    for _ in range(data.draw(st.integers(1, 8))):
        model[data.draw(st.integers(0, len(model) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(model)))
    path = tmp_path_factory.mktemp("mut") / "m.onnx"
    path.write_bytes(bytes(model[:cut]))
    try:
        api.compile(str(path), output=path.parent / "out")
    except MlcError as e:
        # A damaged file is the user's to fix (exit 1), never an internal error of mlc (CompilerError, exit 70).
        assert not isinstance(e, CompilerError) and e.exit_code != ExitCode.INTERNAL, f"{type(e).__name__}: {e}"
        assert str(e) and "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(shape=st.text(max_size=24), target=st.text(max_size=16))
def test_arbitrary_option_values_fail_cleanly(shape, target):
    """Any --input-shape or --target string is accepted or refused with a one-line MlcError."""
    from mlc import targets
    from mlc.frontends import onnx as frontend
    from mlc.models import ZOO

    specs = frontend.input_specs(ZOO["mlp"].build())
    for attempt in (lambda: frontend.resolve_input_shapes(specs, [shape]), lambda: targets.resolve(target)):
        try:
            attempt()
        except MlcError as e:
            assert str(e) and "\n" not in str(e)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.parametrize("cycles", [20, pytest.param(50, marks=pytest.mark.slow)])
def test_soak_compile_run_check_cycles(tmp_path, monkeypatch, cycles):
    """Compile/run/check cycles in one process: memory grows by under 1 MiB a cycle after the first ten, no leaked
    temporary files. (A cycle takes about 7 s of CI: the 50-cycle soak is `slow`.)"""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    model = mlp_onnx(tmp_path / "mlp.onnx")
    out = tmp_path / "art"
    x = np.ones((3, 16), np.float32)
    rss = []
    for cycle in range(cycles):
        result = api.compile(str(model), output=out, isolate=False)
        assert result.check.passed
        assert api.run(out, {"x": x}, warmup=0, repeat=1).outputs["y"].shape == (3, 4)
        assert api.check(out).passed
        if cycle in (9, cycles - 1):
            rss.append(_rss_mib())
    measured = cycles - 10
    assert rss[1] - rss[0] < measured, f"memory grew from {rss[0]:.0f} to {rss[1]:.0f} MiB over {measured} cycles"
    assert list(scratch.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "mlp.onnx", "tmp"]


def test_output_never_replaces_a_folder_mlc_did_not_write(mlp_model, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("precious")
    assert_clean_error(run_mlc("compile", mlp_model, "-o", mine), 1, "is not empty and holds no manifest.json")
    assert (mine / "keep.txt").read_text() == "precious" and sorted(p.name for p in mine.iterdir()) == ["keep.txt"]
    assert_clean_error(run_mlc("debug", "zoo:mlp", "--extract", mine), 1, "holds no report.json")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_clean_error(run_mlc("compile", mlp_model, "-o", a_file / "sub"), 1, "which is a file, not a folder")
    assert_clean_error(run_mlc("compile", mlp_model, "-o", a_file), 1, "is not a directory mlc wrote")


def test_output_keeps_the_files_mlc_did_not_write(mlp_model, mlp_artifact, tmp_path):
    """Any manifest.json is not an artifact; replacing an artifact replaces only the files its manifest lists."""
    webapp = tmp_path / "webapp"
    webapp.mkdir()
    (webapp / "manifest.json").write_text('{"name": "app"}')
    (webapp / "index.html").write_text("<html>")
    assert_clean_error(run_mlc("compile", mlp_model, "-o", webapp), 1, "its manifest.json is not one mlc wrote")
    assert sorted(p.name for p in webapp.iterdir()) == ["index.html", "manifest.json"]

    art = tmp_path / "art"
    shutil.copytree(mlp_artifact, art)
    shutil.copyfile(mlp_model, art / "src_model.onnx")
    (art / "NOTES.md").write_text("mine")
    (art / "reference" / "mine").mkdir()
    (art / "reference" / "mine" / "x.npy").write_bytes(b"mine too")
    (art / "empty").mkdir()
    (art / "link").symlink_to("NOTES.md")
    result = api.compile(str(art / "src_model.onnx"), output=art, isolate=False)
    assert result.check.passed and Path(result.manifest.source.path).is_file()
    assert (art / "NOTES.md").read_text() == "mine" and (art / "reference/mine/x.npy").read_bytes() == b"mine too"
    assert (art / "empty").is_dir() and os.readlink(art / "link") == "NOTES.md"
    reseal(art)  # sealing again lists what mlc wrote, never the user's files
    assert not {"NOTES.md", "src_model.onnx", "link"} & set(json.loads((art / "manifest.json").read_text())["files"])


def test_replacing_refuses_a_user_file_where_the_new_artifact_writes(tmp_path):
    import pytest

    from mlc import artifacts
    from mlc.errors import InputError

    final = tmp_path / "art"
    final.mkdir()
    (final / "manifest.json").write_text(json.dumps({"schema_version": 1, "files": {}}))
    (final / "run.py").write_text("the user's")  # not listed: the user's
    with artifacts.staging_dir(final) as staged:
        (staged / "run.py").write_text("mlc's")
        with pytest.raises(InputError, match="is not a file mlc wrote"):
            artifacts.publish(staged, final)
    assert (final / "run.py").read_text() == "the user's"


def test_a_run_killed_mid_publish_leaves_the_old_folder_to_be_put_back(tmp_path):
    """Killed between publish's two renames, the old folder (with the user's files) sits aside: put it back."""
    from mlc import artifacts

    dead = subprocess.Popen(["true"])
    dead.wait()
    aside = tmp_path / f".art.old-{dead.pid}-0000abcd"
    aside.mkdir()
    (aside / "NOTES.md").write_text("mine")
    artifacts.sweep_stale(tmp_path / "art")
    assert (tmp_path / "art" / "NOTES.md").read_text() == "mine" and not aside.exists()


def test_bad_tolerance_is_refused_before_compiling(mlp_model, tmp_path):
    assert_clean_error(run_mlc("compile", mlp_model, "--atol", "-1", "-o", tmp_path / "a"), 1, "--atol must be")
    assert not (tmp_path / "a").exists()


def test_run_output_into_missing_folder(mlp_artifact, tmp_path):
    assert_clean_error(run_mlc("run", mlp_artifact, "-o", tmp_path / "no" / "out.npz", "--repeat", "0"), 1,
                       "cannot write")


def test_tensor_names_that_clash_with_numpy_keywords(tmp_path):
    """np.savez(**arrays) breaks on a tensor called 'file'; mlc writes .npz files itself."""
    graph = helper.make_graph([helper.make_node("Relu", ["file"], ["allow_pickle"])], "names",
                              [_vi("file", ["n", 4])], [_vi("allow_pickle", ["n", 4])])
    path = tmp_path / "names.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    run_mlc("compile", path, "-o", tmp_path / "art", check=True)
    proc = run_mlc("run", tmp_path / "art", "-o", tmp_path / "out.npz", "--repeat", "0")
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "out.npz")["allow_pickle"].shape == (2, 4)


def test_non_tensor_output_is_unsupported(tmp_path):
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["s"])], "shape", [_vi("x", [2, 3])],
                              [helper.make_tensor_value_info("s", TensorProto.INT64, [2])])
    path = tmp_path / "shape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    proc = run_mlc("compile", path, "-o", tmp_path / "art")
    assert proc.returncode in (0, 1), proc.stderr  # TVM may fold it to a constant tensor; never exit 70
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


# Test-only fault injection into the TVM compile worker, on PYTHONPATH as sitecustomize: when the worker first
# imports mlc.compiler.relax_passes (after tvm is loaded) it hangs, or segfaults inside malloc_stats while holding
# glibc's malloc lock, where a crash inside malloc (a corrupted heap) would hold it.
_FAULT_SITE = '''
import os
import sys


def _segfault_holding_the_malloc_lock():
    import ctypes
    import threading
    import time

    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # glibc locks its arena with threads
    libc = ctypes.CDLL("libc.so.6")
    write_t = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)

    class Functions(ctypes.Structure):
        _fields_ = [("read", ctypes.c_void_p), ("write", write_t), ("seek", ctypes.c_void_p),
                    ("close", ctypes.c_void_p)]

    def write(_cookie, _data, size):
        ctypes.string_at(0)  # SIGSEGV, called from malloc_stats' fprintf with the arena locked
        return size

    functions = Functions(None, write_t(write), None, None)
    libc.fopencookie.restype = ctypes.c_void_p
    libc.fopencookie.argtypes = [ctypes.c_void_p, ctypes.c_char_p, Functions]
    stream = libc.fopencookie(None, b"w", functions)
    libc.setvbuf(ctypes.c_void_p(stream), None, 2, 0)
    ctypes.c_void_p.in_dll(libc, "stderr").value = stream  # malloc_stats prints to stderr
    libc.malloc_stats()


def _hook(event, args):
    if event != "import" or args[0] != "mlc.compiler.relax_passes":
        return
    if getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) != "mlc.compiler.worker":
        return
    if os.environ["MLC_TEST_FAULT"] == "hang":
        import time

        time.sleep(3600)
    else:
        _segfault_holding_the_malloc_lock()


if os.environ.get("MLC_TEST_FAULT"):
    sys.addaudithook(_hook)
'''


def _compile_with_fault(tmp_path: Path, fault: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_FAULT_SITE)
    model = mlp_onnx(tmp_path / "mlp.onnx")
    repo = Path(__file__).resolve().parent.parent
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mlc", "compile", model, "-o", tmp_path / "art"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]),
                               "MLC_TEST_FAULT": fault, "COLUMNS": "200", **env})
    return proc, time.monotonic() - start


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_segfault_inside_malloc_is_reported_not_deadlocked(tmp_path):
    """TVM's SIGSEGV handler allocates while it prints a backtrace: a fault with the malloc lock held hung the
    compile for ever. The worker now dies at once, and the error names the signal and the log."""
    proc, seconds = _compile_with_fault(tmp_path, "segv-in-malloc")
    assert_clean_error(proc, int(ExitCode.INTERNAL), "TVM compile process was killed by SIGSEGV")
    assert seconds < 120, seconds  # import tvm and an MLP compile; a deadlock never ends
    line = _error_line(proc)
    log = Path(line.rsplit("(full log: ", 1)[1].rstrip(")"))
    text = log.read_text()
    assert "Fatal Python error: Segmentation fault" in text and "Segfault encountered" not in text
    assert "Fatal Python error" not in line  # the dump stays in the log
    log.unlink()
    assert not (tmp_path / "art").exists()


def test_stalled_worker_is_killed_and_reported(tmp_path):
    proc, seconds = _compile_with_fault(tmp_path, "hang", MLC_STALL_TIMEOUT="3")
    assert_clean_error(proc, int(ExitCode.INTERNAL), "TVM compile process made no progress for 3 s",
                       "MLC_STALL_TIMEOUT=SECONDS changes this limit")
    assert seconds < 120, seconds
    Path(_error_line(proc).rsplit("(log: ", 1)[1].rstrip(")")).unlink()
    assert not (tmp_path / "art").exists()


def test_bad_stall_timeout_is_a_one_line_error(mlp_model, tmp_path):
    for value in ("soon", "-1", "inf"):
        proc = subprocess.run([sys.executable, "-m", "mlc", "compile", mlp_model, "-o", tmp_path / "art"],
                              capture_output=True, text=True, env={**os.environ, "MLC_STALL_TIMEOUT": value})
        assert_clean_error(proc, 1, f"MLC_STALL_TIMEOUT must be a number of seconds (0: no limit), not '{value}'")
