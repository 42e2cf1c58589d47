"""Exit 70 comes with a reproducer: the smallest subgraph that fails the same way, written as an ONNX file and
named in the one-line error. Build failures are injected in-process (isolate=False) for chosen ops."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from mlc import api
from mlc.errors import CompilerError, ExitCode

CHAIN = ["Relu", "Sigmoid", "Neg", "Tanh", "Abs", "Exp"]


def _chain(path: Path) -> Path:
    """x -> Relu -> Sigmoid -> Neg -> Tanh -> Abs -> Exp -> y, with a second input joining at the end."""
    names = ["x"] + [f"t{i}" for i in range(len(CHAIN))]
    nodes = [helper.make_node(op, [names[i]], [names[i + 1]], name=f"n{i}_{op}") for i, op in enumerate(CHAIN)]
    nodes.append(helper.make_node("Add", [names[-1], "z"], ["y"], name="join"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8])
                                               for n in ("x", "z")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _fail_build_with(monkeypatch, *ops: str) -> None:
    """Every build of a module naming all of `ops` (relax ops, or kernels after the passes) fails, as TVM does on
    its bugs; other builds succeed without building (the search only asks whether they fail)."""
    from mlc.compiler import worker

    def build(mod, request, default_schedules, notes, use_db=True, cuda_graphs=False):
        text = mod.script()
        if all(op in text for op in ops):
            raise RuntimeError("InternalError: Check failed: (it != flat_map_.end()) is false: Buffer T_12 used "
                               "before its definition (injected)")
        return object(), None

    monkeypatch.setattr(worker, "_build", build)


def _reproducer(error: CompilerError) -> onnx.ModelProto:
    message = str(error)
    assert "\n" not in message and error.exit_code == ExitCode.INTERNAL
    found = re.search(r"smallest failing subgraph \((\d+) of (\d+) nodes\): (\S+\.onnx)\)", message)
    assert found, message
    model = onnx.load(found.group(3))
    onnx.checker.check_model(model, full_check=True)
    assert len(model.graph.node) == int(found.group(1)) and found.group(2) == str(len(CHAIN) + 1)
    Path(found.group(3)).unlink()
    return model


@pytest.mark.parametrize("ops, expected", [
    (["tanh"], ["Tanh"]),  # one node alone fails
    (["sigmoid", "tanh"], ["Sigmoid", "Neg", "Tanh"]),  # the failure needs both: the window between them
])
def test_build_failure_writes_the_smallest_failing_subgraph(monkeypatch, tmp_path, ops, expected):
    _fail_build_with(monkeypatch, *ops)
    with pytest.raises(CompilerError, match="TVM failed during build: .*injected") as caught:
        api.compile(str(_chain(tmp_path / "chain.onnx")), output=tmp_path / "art", isolate=False)
    model = _reproducer(caught.value)
    assert [n.op_type for n in model.graph.node] == expected
    # its inputs are what the window reads, typed; it fails the same way when compiled on its own
    first = CHAIN.index(expected[0])
    assert [i.name for i in model.graph.input] == ["x" if first == 0 else f"t{first - 1}"]
    onnx.save(model, str(tmp_path / "repro.onnx"))
    with pytest.raises(CompilerError, match="injected"):
        api.compile(str(tmp_path / "repro.onnx"), output=tmp_path / "art2", isolate=False)


def test_reproducer_is_kept_beside_the_log(tmp_path):
    """The worker writes it into the compile's scratch folder; the parent moves it beside the log it names."""
    from mlc import child_process
    from mlc.compiler import client

    written, log = tmp_path / "scratch.reproducer.onnx", tmp_path / "mlc-worker-x.log"
    written.write_bytes(b"onnx")
    log.write_text("trace")
    result = child_process.WorkerResult.failure("compile", "Check failed: boom", stage="build", reproducer=str(written),
                                        reproducer_nodes=1, model_nodes=9)
    with pytest.raises(CompilerError) as caught:
        client._check_result(result, log)
    kept = tmp_path / "mlc-worker-x.onnx"
    assert str(caught.value) == (f"TVM failed during build: Check failed: boom (full log: {log}; smallest failing "
                                 f"subgraph (1 of 9 nodes): {kept})")
    assert kept.read_bytes() == b"onnx" and not written.exists()



def test_import_failure_writes_the_failing_node(monkeypatch, tmp_path):
    """A failure of TVM's importer outside a converter (exit 70 at import): the search imports only."""
    from mlc.compiler import importer

    original = importer.to_relax

    def to_relax(model, bounds=None, weights_dir=None):
        if any(n.op_type == "Neg" for n in model.graph.node):
            raise RuntimeError("InternalError: Check failed: normalize (injected)")
        return original(model, bounds, weights_dir)

    monkeypatch.setattr(importer, "to_relax", to_relax)
    with pytest.raises(CompilerError, match="TVM failed during import: .*injected") as caught:
        api.compile(str(_chain(tmp_path / "chain.onnx")), output=tmp_path / "art", isolate=False)
    assert [n.op_type for n in _reproducer(caught.value).graph.node] == ["Neg"]
