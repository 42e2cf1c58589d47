"""Issue #23's faster, leaner compile keeps what it replaced: the cleaned graph's weights written beside it, the
library's serialized executable as its own ELF object, the packed-call search, the combined matmul weights, and
the weights lifted out of the library, a shared one once."""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlc.passes import onnx as onnx_passes
from mlc.pipeline import package


def _matmul_model(n: int = 64) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.arange(n * n, dtype=np.float32).reshape(n, n), "w")
    bias = numpy_helper.from_array(np.ones(n, np.float32), "b")  # small: stays in the protobuf
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [weight, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_save_puts_weights_beside_the_model_and_onnx_loads_them_back(tmp_path):
    model = _matmul_model()
    before = model.SerializeToString()
    onnx_passes.save(model, tmp_path / "m.onnx")
    assert model.SerializeToString() == before  # the model in memory is left as it is
    assert (tmp_path / "m.onnx.data").stat().st_size == 64 * 64 * 4  # the weight, raw; the bias stays inline
    loaded = onnx.load(str(tmp_path / "m.onnx"))
    for tensor in loaded.graph.initializer:
        assert tensor.data_location == TensorProto.DEFAULT
        tensor.ClearField("data_location")  # onnx sets it back explicitly: two bytes more, the same model
    assert loaded.SerializeToString() == before


def test_packed_call_search_finds_what_the_regex_finds(tmp_path):
    rng = np.random.default_rng(0)
    parts = [b"relax.run.foo", b"tvm.contrib.sort.argsort\0", b"relax.run.", b"tvm.contrib.relax.run.bar",
             b"tvm.contrib", b"relax.run.a.b..c", b"relax.run.relax.run.q", b"xx"]
    data = b"".join(parts[rng.integers(len(parts))] + rng.bytes(int(rng.integers(4))) for _ in range(5000))
    (tmp_path / "model.so").write_bytes(data)
    found = package._packed_calls(tmp_path / "model.so")
    assert found == set(package._PACKED_CALL.findall(data))
    assert b"tvm.contrib.relax.run.bar" in found


def _constant_add_module():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, relax.const(np.arange(6, dtype="float32").reshape(2, 3))))
        bb.emit_func_output(y)
    return bb.get()


def test_weights_object_links_into_a_library_that_runs(tmp_path):
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import worker

    executable = tvm.compile(_constant_add_module(), target="llvm")
    blobs = {}
    for name, pack in (("tvm", None), ("mlc", worker._pack_imports)):
        path = tmp_path / f"{name}.so"
        executable.export_library(str(path), fpack_imports=pack)
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(np.ones((2, 3), "float32"))).numpy()
        np.testing.assert_array_equal(out, np.arange(6, dtype="float32").reshape(2, 3) + 1)
        symbols = subprocess.run(["nm", "-S", "-D", "--defined-only", str(path)], capture_output=True, text=True,
                                 check=True).stdout
        blobs[name] = next(line.split()[1:] for line in symbols.splitlines() if line.endswith("__tvm_ffi__library_bin"))
        program_headers = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True,
                                         check=True).stdout
        stack = next(line for line in program_headers.splitlines() if "GNU_STACK" in line)
        assert stack.split()[-2] == "RW"  # not executable
    assert blobs["mlc"] == blobs["tvm"]  # same size, read-only data


def test_combined_weights_concatenated_in_numpy_match_fold_constant(monkeypatch):
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((8, 8 + k)).astype("float32"))))
                    for k in range(3)]
            y = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(y)
    mod = bb.get()
    ours = relax_passes.combine_parallel_matmul(mod, {}, None)
    monkeypatch.setattr(relax_passes, "_concat_constants", lambda m: m)  # FoldConstant does the concatenation
    theirs = relax_passes.combine_parallel_matmul(mod, {}, None)
    tvm.ir.assert_structural_equal(ours, theirs)
    assert "concat" not in ours.script()  # folded: one combined weight constant


def test_a_weight_shared_by_layers_is_lifted_once_and_runs():
    """ALBERT's layers share their weights: the build repacks a shared weight once and lifts that one copy out of
    the executable (mlc.compiler.weights); main takes it after the inputs."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc import targets
    from mlc.compiler import schedules

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((256, 256)).astype(np.float32)
    x = relax.Var("x", relax.TensorType((4, 256), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(3):  # the same constant in three layers
                h = bb.emit(relax.op.nn.relu(relax.op.matmul(h, relax.const(weight))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    lifted: list = []
    executable, report = schedules.build(bb.get(), {**targets.resolve("x86").tvm, "num-cores": 1}, None, True,
                                         lifted=lifted)
    assert report["default"] == ["fused_matmul_relu"]
    assert len(lifted) == 1 and np.prod(lifted[0].shape) >= weight.size  # one repacked copy
    data = rng.standard_normal((4, 256)).astype(np.float32)
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(data), *lifted).numpy()
    want = data
    for _ in range(3):
        want = np.maximum(want @ weight, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_constant_folding_hands_onnxslim_only_the_large_weights_a_fold_reads(monkeypatch):
    """A MatMul's large weight next to its activation never folds: onnxslim gets it as a graph input (its copies of
    the model and its ONNX Runtime session then do not hold it); a large weight under a Transpose still folds, and
    the model's weights all come back."""
    import onnxslim

    rng = np.random.default_rng(0)
    big, folded = rng.standard_normal((512, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "big"], ["h"]), helper.make_node("Transpose", ["folded"], ["t"]),
             helper.make_node("MatMul", ["h", "t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])],
                              [numpy_helper.from_array(big, "big"), numpy_helper.from_array(folded, "folded")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    seen, slim = [], onnxslim.slim
    monkeypatch.setattr(onnxslim, "slim", lambda m, **kw: (seen.append({t.name for t in m.graph.initializer}),
                                                              slim(m, **kw))[1])
    out = onnx_passes.constant_folding(model, {})
    assert seen and all("big" not in names and "folded" in names for names in seen)
    assert [n.op_type for n in out.graph.node] == ["MatMul", "MatMul"]  # the Transpose folded
    assert "x" in [i.name for i in out.graph.input] and "big" not in [i.name for i in out.graph.input]
    values = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    np.testing.assert_array_equal(values["big"], big)
    np.testing.assert_array_equal(next(v for k, v in values.items() if k != "big"), folded.T)


def _conv_bn_transpose_model(tmp_path, external: bool):
    """A Conv + BatchNormalization (fold_batchnorm reads the conv weight), a weight under a Transpose (constant folding
    reads it), a large MatMul weight nothing reads but TVM, and a Constant node; saved with its weights inside, or
    with them (and the Constant's tensor) in a file beside it."""
    rng = np.random.default_rng(0)
    conv_w = rng.standard_normal((64, 3, 3, 3)).astype(np.float32) * 0.1
    scale, bias, mean = (rng.standard_normal(64).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, 64).astype(np.float32)
    folded = rng.standard_normal((256, 64)).astype(np.float32) * 0.05
    big = rng.standard_normal((4096, 64)).astype(np.float32) * 0.05
    offset = rng.standard_normal((1, 256)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "conv_w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
             helper.make_node("Flatten", ["bn"], ["f"]),  # 64 x 8 x 8 = 4096
             helper.make_node("MatMul", ["f", "big"], ["h"]),
             helper.make_node("Transpose", ["folded"], ["t"]),
             helper.make_node("MatMul", ["h", "t"], ["g"]),
             helper.make_node("Constant", [], ["offset"], value=numpy_helper.from_array(offset)),
             helper.make_node("Add", ["g", "offset"], ["y"])]
    inits = [numpy_helper.from_array(v, n) for n, v in
             (("conv_w", conv_w), ("scale", scale), ("bias", bias), ("mean", mean), ("var", var), ("big", big),
              ("folded", folded))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    values = {t.name: numpy_helper.to_array(t) for t in inits}
    path = tmp_path / "src" / "m.onnx"
    path.parent.mkdir()
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location="m.bin", size_threshold=1024)
    else:
        onnx.save(model, str(path))
    return values, path


@pytest.mark.parametrize("external", [False, True])
def test_weights_stay_in_their_file_through_load_and_passes(tmp_path, external):
    """Loaded for a compile, a model's weights stay in its file (or its external-data file): each large initializer
    is a reference to it, read only where a pass needs its value; the cleaned graph computes what the model does."""
    import onnxruntime as ort

    from mlc import passes
    from mlc.frontends import onnx as onnx_frontend
    from mlc.frontends import onnx_weights

    values, path = _conv_bn_transpose_model(tmp_path, external)
    work = tmp_path / "work"
    work.mkdir()
    light = onnx_frontend.load(path, weights_dir=work)
    assert light.ByteSize() < 8192  # 1.1 MB of weights left in the file
    kept = {t.name for t in light.graph.initializer if onnx_weights.is_external(t)}
    assert kept == {"conv_w", "big", "folded"}  # the BatchNormalization's vectors are small: inline
    constant = next(n for n in light.graph.node if n.op_type == "Constant").attribute[0].t
    assert not onnx_weights.is_external(constant)  # read now: TVM's Constant converter has no folder to read from
    with onnx_weights.weights_in(work):
        assert {t.name for t in light.graph.initializer} == set(values)
        for tensor in light.graph.initializer:
            np.testing.assert_array_equal(onnx_weights.array(tensor), values[tensor.name])
    onnx_frontend.load(path, weights_dir=work)  # loaded again (bind_to_reference): the same links
    assert len([p for p in work.glob("weights-*") if p.is_symlink()]) == 1

    cleaned, records, _ = onnx_passes.run(light, passes.plan(device="cpu"), weights_dir=work)
    assert [r["name"] for r in records if r["status"] == "skipped"] == []  # no pass failed on a weight's value
    applied = {r["name"] for r in records if r["ops_before"] != r["ops_after"]}
    assert {"fold_batchnorm", "constant_folding"} <= applied
    assert [n.op_type for n in cleaned.graph.node] == ["Conv", "Flatten", "MatMul", "MatMul", "Add"]  # both folded
    assert "big" in {t.name for t in cleaned.graph.initializer if onnx_weights.is_external(t)}  # never read
    # the weights the passes made (the folded conv and Transpose) went to a file too
    assert all(onnx_weights.is_external(t) for t in cleaned.graph.initializer if onnx_weights.nbytes(t) > 4096)
    onnx_passes.save(cleaned, work / "cleaned.onnx")
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    got = ort.InferenceSession(onnx.load(str(work / "cleaned.onnx")).SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_file_that_is_not_a_model_is_still_a_one_line_input_error(tmp_path):
    from mlc.errors import InputError
    from mlc.frontends import onnx as onnx_frontend

    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x0a\xff\xff\xff\xff\x0f not a model")
    with pytest.raises(InputError, match="is not an ONNX model"):
        onnx_frontend.load(path, weights_dir=tmp_path)


def test_a_model_file_rewritten_during_the_compile_is_an_input_error(tmp_path, monkeypatch):
    """The TVM worker reads the weights from the model file: rewritten meanwhile, the compile stops with a one-line
    error, and no artifact is published."""
    import os

    from mlc import api, compiler
    from mlc.errors import InputError

    path = tmp_path / "m.onnx"
    onnx.save(_matmul_model(), str(path))
    original = compiler.compile_in_worker

    def rewritten_meanwhile(*args, **kwargs):
        result = original(*args, **kwargs)
        info = path.stat()
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))
        return result

    monkeypatch.setattr(compiler, "compile_in_worker", rewritten_meanwhile)
    with pytest.raises(InputError, match="changed during the compile"):
        api.compile(str(path), output=tmp_path / "art")
    assert not (tmp_path / "art").exists()


def test_a_tied_heads_transpose_is_folded_in_numpy_not_by_onnxslim(tmp_path, monkeypatch):
    """Transpose of a large weight left in its file (a tied LM head's) is computed in numpy and written beside it;
    onnxslim never gets that weight, and the embedding its Gather reads stays as it was."""
    import onnxslim

    from mlc.frontends import onnx as onnx_frontend
    from mlc.frontends import onnx_weights

    embedding = np.random.default_rng(0).standard_normal((1024, 256)).astype(np.float32)  # 1 MB: onnxslim's share
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"]), helper.make_node("Transpose", ["table"], ["head"]),
             helper.make_node("MatMul", ["h", "head"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8, 1024])],
                              [numpy_helper.from_array(embedding, "table")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    light = onnx_frontend.load(tmp_path / "m.onnx", weights_dir=tmp_path)
    seen, slim = [], onnxslim.slim
    monkeypatch.setattr(onnxslim, "slim", lambda m, **kw: (seen.append({t.name for t in m.graph.initializer}),
                                                              slim(m, **kw))[1])
    with onnx_weights.weights_in(tmp_path):
        out = onnx_passes.constant_folding(light, {})
        values = {t.name: onnx_weights.array(t) for t in out.graph.initializer}
    assert [n.op_type for n in out.graph.node] == ["Gather", "MatMul"]
    assert all("table" not in names for names in seen)
    np.testing.assert_array_equal(values["head"], embedding.T)
    np.testing.assert_array_equal(values["table"], embedding)
    head = next(t for t in out.graph.initializer if t.name == "head")
    assert onnx_weights.is_external(head) and head.external_data[0].value == onnx_weights.FOLDED
