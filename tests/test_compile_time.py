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
    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 1}
    executable, report = schedules.build(bb.get(), target, None, True, lifted=lifted)
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
