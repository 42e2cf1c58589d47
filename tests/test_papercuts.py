"""What a new user hits on bad input (issue #20): each case gets a one-line error with the right exit code."""

from __future__ import annotations

import shutil
import subprocess
import venv

import pytest

from helpers import assert_clean_error, run_mlc


def test_run_inputs_that_are_not_npz(mlp_artifact, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("these are my notes\n")
    proc = run_mlc("run", mlp_artifact, "-i", notes)
    assert_clean_error(proc, 1, "not an .npz file", "numpy.savez")
    assert "pickle" not in proc.stderr


def test_run_outputs_into_a_folder_that_cannot_be_written(mlp_artifact, tmp_path):
    # A file where a folder should be fails like a read-only folder (root ignores write permissions).
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    assert_clean_error(run_mlc("run", mlp_artifact, "-o", blocker / "out.npz", "--repeat", "1"), 1, "cannot write")


def test_unpack_a_file_that_is_not_an_archive(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    proc = run_mlc("unpack", notes, "-d", tmp_path / "out")
    assert_clean_error(proc, 1, "not a .tar.gz archive")
    assert "\\n" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_unpack_refuses_to_replace_an_existing_folder(mlp_model, tmp_path):
    run_mlc("compile", mlp_model, "-o", tmp_path / "mlp-x86", "--archive", check=True)
    dest = tmp_path / "dest"
    (dest / "mlp-x86").mkdir(parents=True)
    mine = dest / "mlp-x86" / "mine.txt"
    mine.write_text("keep me")
    proc = run_mlc("unpack", tmp_path / "mlp-x86.tar.gz", "-d", dest)
    assert_clean_error(proc, 1, "already exists")
    assert mine.read_text() == "keep me" and sorted(p.name for p in (dest / "mlp-x86").iterdir()) == ["mine.txt"]


def test_run_py_under_a_python_without_the_runtime_packages(mlp_artifact, tmp_path):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # no numpy, no tvm_ffi
    artifact = tmp_path / "art"
    shutil.copytree(mlp_artifact, artifact)
    proc = subprocess.run([str(bare / "bin" / "python"), str(artifact / "run.py")], capture_output=True, text=True)
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "pip install numpy apache-tvm-ffi==" in proc.stderr


def test_compile_a_folder_that_is_no_model(tmp_path):
    (tmp_path / "stuff").mkdir()
    assert_clean_error(run_mlc("compile", tmp_path / "stuff"), 1, "not a TensorFlow SavedModel", ".onnx")


def test_torch_export_archive_named_pt(tmp_path):
    torch = pytest.importorskip("torch")
    program = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    shutil.copyfile(tmp_path / "model.pt2", tmp_path / "model.pt")
    proc = run_mlc("compile", tmp_path / "model.pt", "--input-shape", "x:1x3", "-o", tmp_path / "out")
    assert_clean_error(proc, 1, "torch.export archive", "name it .pt2")
    assert "miniz" not in proc.stderr


FACTORY = '''
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)

    def forward(self, ids):
        h = self.embed(ids).mean(1)
        return {"score": h.softmax(-1), "count": (h > 0).sum(-1)}


def make():
    torch.manual_seed(0)
    return Model(), (torch.randint(0, 50, (2, 5)),)
'''


def test_factory_compiles_at_its_example_shapes_with_its_output_names(tmp_path):
    pytest.importorskip("torch")
    import numpy as np

    from mlc import api

    (tmp_path / "model.py").write_text(FACTORY)
    result = api.compile(f"{tmp_path / 'model.py'}:make", output=tmp_path / "art")
    assert result.check.passed
    assert [(i.name, i.shape) for i in result.manifest.inputs] == [("ids", [2, 5])]
    assert [o.name for o in result.manifest.outputs] == ["score", "count"]
    ids = np.random.default_rng(1).integers(0, 50, (2, 5))
    np.savez(tmp_path / "mine.npz", ids=ids)
    run = api.run(tmp_path / "art", inputs=tmp_path / "mine.npz", warmup=0, repeat=1)
    assert sorted(run.outputs) == ["count", "score"] and run.outputs["score"].shape == (2, 8)


def test_onnx_model_with_an_unused_input(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                               helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    run_mlc("compile", tmp_path / "m.onnx", "-o", tmp_path / "art", check=True)
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32), mask=np.zeros((2, 4), np.float32))
    proc = run_mlc("run", tmp_path / "art", "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz", "--repeat", "1")
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["y"], np.ones((2, 4), np.float32) @ numpy_helper.to_array(weight), rtol=1e-5)


UNUSED_MASK = '''
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, mask):
        return self.linear(x)


def make():
    torch.manual_seed(0)
    return Model(), (torch.randn(2, 4), torch.ones(2, 4))
'''


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_torch_model_that_ignores_its_mask(tmp_path, exporter):
    pytest.importorskip("torch")
    (tmp_path / "model.py").write_text(UNUSED_MASK)
    proc = run_mlc("compile", f"{tmp_path / 'model.py'}:make", "--exporter", exporter, "-o", tmp_path / "art")
    assert proc.returncode == 0, proc.stderr
    assert run_mlc("check", tmp_path / "art").returncode == 0


def test_cli_help_and_debug_flag_anywhere(tmp_path):
    top = run_mlc("--help")
    assert "PyTorch, TensorFlow/Keras, PaddlePaddle and ONNX" in top.stdout
    assert "<bool>" not in run_mlc("compile", "--help").stdout  # flags take no value: `--archive true` is an error
    missing = tmp_path / "missing.onnx"
    after = run_mlc("compile", missing, "--debug")
    assert after.returncode == 1 and "Traceback" in after.stderr and "model file not found" in after.stderr
    assert "Traceback" not in run_mlc("compile", missing).stderr


def test_run_a_single_npy_for_a_one_input_model(mlp_artifact, tmp_path):
    """A .npy feeds a one-input model (`mlc run` and run.py); for a model with more inputs, one line asks for an .npz
    (it was exit 70, and a traceback from run.py)."""
    import sys

    import numpy as np

    from mlc.runtime import FeedError, load_npz

    x = tmp_path / "x.npy"
    np.save(x, np.ones((3, 16), np.float32))
    proc = run_mlc("run", mlp_artifact, "-i", x, "--repeat", "0", "-o", tmp_path / "out.npz")
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "out.npz")["y"].shape == (3, 4)
    proc = subprocess.run([sys.executable, str(mlp_artifact / "run.py"), "-i", str(x), "--repeat", "0"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "y: shape (3, 4)" in proc.stdout, proc.stderr
    with pytest.raises(FeedError, match="single .npy array.*the model's inputs are a, b.*numpy.savez"):
        load_npz(x, ["a", "b"])


def test_unpack_a_truncated_archive(tmp_path):
    """A .tar.gz cut short in the copy: one line saying so (it was a bare "Aborted.", even with --debug)."""
    import io
    import tarfile

    import numpy as np

    data = np.random.default_rng(0).bytes(200_000)  # incompressible: the cut lands inside the member
    whole = tmp_path / "art.tar.gz"
    with tarfile.open(whole, "w:gz") as tar:
        info = tarfile.TarInfo("art/model.so")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[:100_000])
    proc = run_mlc("unpack", cut, "-d", tmp_path / "out")
    assert_clean_error(proc, 1, "truncated or corrupt", "copy it again")
    assert "Aborted" not in proc.stderr + proc.stdout and not (tmp_path / "out" / "art").exists()


TORCHSCRIPT_FIXED_VIEW = '''
import sys
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.linear(x.view(2, 8))


torch.jit.script(Model().eval()).save(sys.argv[1])
'''


@pytest.fixture(scope="module")
def torchscript_fixed_view(tmp_path_factory):
    import sys

    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("torchscript")
    (folder / "make.py").write_text(TORCHSCRIPT_FIXED_VIEW)
    subprocess.run([sys.executable, str(folder / "make.py"), str(folder / "m.pt")], check=True)
    return folder / "m.pt"


def test_torchscript_failing_at_a_new_input_shape_names_the_cause(torchscript_fixed_view, tmp_path):
    """TorchScript's error starts with a header ("The following operation failed in the TorchScript interpreter."):
    the message gives its last line, the cause."""
    proc = run_mlc("compile", torchscript_fixed_view, "--input-shape", "x:3x8", "-o", tmp_path / "art")
    assert_clean_error(proc, 1, "shape '[2, 8]' is invalid for input of size 24")
    assert "TorchScript interpreter" not in proc.stderr


def test_torchscript_input_shape_for_an_unknown_input(torchscript_fixed_view, tmp_path):
    """`--input-shape y:2x8` for a model whose input is x says y is unknown (it asked for x's shape again)."""
    proc = run_mlc("compile", torchscript_fixed_view, "--input-shape", "y:2x8", "-o", tmp_path / "art")
    assert_clean_error(proc, 1, "names unknown input 'y'; the model's inputs are: x")


def test_a_0d_input_is_listed_as_a_scalar(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    proc = run_mlc("compile", tmp_path / "m.onnx", "-o", tmp_path / "art", check=True)
    assert "inputs: x 3 float32, s scalar float32)" in proc.stdout, proc.stdout


def test_output_names_follow_one_rule_on_every_route(tmp_path):
    """Outputs the model does not name are `output` (or output_0, output_1...) for a .pt2 as for a factory; a dict's
    keys name them. torch.export named them after graph nodes (`linear`). Paddle: test_frontend_paddle."""
    torch = pytest.importorskip("torch")
    import onnx

    from mlc.frontends import torch as frontend

    class Pair(torch.nn.Module):
        def forward(self, x):
            return {"a": x + 1, "b": (x * 2, x - 1)}

    for module, want in ((torch.nn.Linear(3, 2), ["output"]), (Pair(), ["a", "b_0", "b_1"])):
        path = tmp_path / f"{type(module).__name__}.pt2"
        torch.export.save(torch.export.export(module, (torch.randn(4, 3),)), str(path))
        frontend.open_model(str(path)).export(tmp_path / "m.onnx", set())
        assert [o.name for o in onnx.load(str(tmp_path / "m.onnx")).graph.output] == want


def test_check_titles_stay_whole_under_a_long_path(mlp_artifact, tmp_path):
    """`mlc check` named the artifact inside each table's title, which rich cuts to the table's width: under a
    long path the title lost what was compared ("... vs onnxruntime" became "..."). The path has a line of its own."""
    deep = tmp_path / ("a-long-folder-name-" * 8) / "mlp"
    shutil.copytree(mlp_artifact, deep)
    proc = run_mlc("check", deep)
    assert proc.returncode == 0, proc.stderr
    assert f"{deep}:" in proc.stdout and "check against onnxruntime" in proc.stdout, proc.stdout
