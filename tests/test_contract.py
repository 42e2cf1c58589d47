"""mlc.compiler.contract, the compile worker's typed request and result: every field survives the JSON the process
boundary carries, a field one side does not know is an error, and code acts on note kinds, never on note text."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from mlc import child_process
from mlc.compiler import client, contract, worker
from mlc.compiler.contract import (CompileRequest, CompileResult, ContractError, Note, NoteKind, RunFiles,
                                   ScheduleRequest)
from mlc.errors import CompilerError, UnsupportedModelError
from mlc.pipeline import prepare


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))  # what child_process.run writes and the child reads


def _request() -> CompileRequest:
    """A request with no field at its default: a field to_json dropped would come back as the default."""
    return CompileRequest(
        onnx="/w/cleaned.onnx", target={"kind": "llvm", "mcpu": "skylake"}, unquantized_onnx="/w/unquantized.onnx",
        library="/a/model.so",
        run=RunFiles("/w/in.npz", "/w/out.npz"), cross_compiler="aarch64-linux-gnu-g++", kernels_dir="/a/kernels",
        object_dir="/a/objects", schedules=ScheduleRequest(db="/db", default=False),
        relax_passes=[{"name": "fuse_ops", "level": "relax", "config": {}, "explicit": False}], dump_ir="/w/ir",
        dim_upper_bounds={"seq": 512}, precision="bf16", cuda_graphs=True,
        reproducer="/w/cleaned.reproducer.onnx",
        reproducer_budget_s=7.5)


def _result() -> CompileResult:
    return CompileResult(
        tvm_version="0.27.0", outputs=[{"dtype": "float32", "shape": ["batch", 10]}], timings={"build": 1.5},
        pass_records=[{"name": "fuse_ops", "status": "applied"}],
        notes=[Note(kind, f"note of kind {kind.value}") for kind in NoteKind],
        kernels={"cuda": ["main_kernel"]}, schedules={"tuned": [], "default": ["matmul"], "unscheduled": []},
        weights={"file": "model.weights", "tensors": []}, precision="bf16", left_out=["quantize"],
        gpu_code={"arch": "sm_90"})


@pytest.mark.parametrize("make", [_request, _result])
def test_every_field_survives_the_json_round_trip(make):
    value = make()
    cls = type(value)
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    assert all(getattr(value, name) != default for name, default in defaults.items())
    data = _through_json(value.to_json())
    assert set(data) == {f.name for f in dataclasses.fields(cls)}
    assert cls.from_json(data) == value


def test_the_reproducer_budget_is_a_request_field_with_the_default_the_search_assumed():
    from mlc.compiler import reproducer

    request = CompileRequest(onnx="m.onnx", target={"kind": "llvm"})
    assert request.reproducer_budget_s == reproducer.BUDGET_S == 120.0
    assert CompileRequest.from_json(_through_json(request.to_json())).reproducer_budget_s == 120.0


@pytest.mark.parametrize("make, parse", [(_request, CompileRequest.from_json), (_result, CompileResult.from_json)])
def test_an_unknown_or_missing_field_is_an_error_not_dropped(make, parse):
    data = _through_json(make().to_json())
    with pytest.raises(ContractError, match="unknown field.*from_a_newer_mlc.*differ in version"):
        parse({**data, "from_a_newer_mlc": 1})
    required = next(f.name for f in dataclasses.fields(type(make())) if f.default is dataclasses.MISSING)
    with pytest.raises(ContractError, match=f"missing field.*{required}"):
        parse({k: v for k, v in data.items() if k != required})


def test_nested_parts_are_strict_too():
    data = _through_json(_request().to_json())
    with pytest.raises(ContractError, match="run: unknown field.*extra"):
        CompileRequest.from_json({**data, "run": {**data["run"], "extra": 1}})
    with pytest.raises(ContractError, match="schedules: unknown field.*repair"):
        CompileRequest.from_json({**data, "schedules": {**data["schedules"], "repair": True}})
    result = _through_json(_result().to_json())
    with pytest.raises(ContractError, match="unknown kind 'gossip'"):
        CompileResult.from_json({**result, "notes": [{"kind": "gossip", "text": "x"}]})


def test_the_worker_refuses_a_request_it_does_not_understand():
    """Parsed at the child's entry, before any TVM: the parent gets a CompilerError naming the field."""
    data = {**_through_json(_request().to_json()), "new_option": True}
    result = child_process.handle(data, worker._serve)
    assert not result.ok and result.kind == child_process.ERROR and "new_option" in result.message
    error = result.error(default=CompilerError)
    assert isinstance(error, CompilerError) and "unknown field(s) new_option" in str(error)


def test_the_client_refuses_a_result_it_does_not_understand():
    payload = {**_through_json(_result().to_json()), "new_result": 1}
    with pytest.raises(ContractError, match="compile result: unknown field.*new_result"):
        client._check_result(child_process.WorkerResult.success(payload), None)


def _unsupported_model() -> onnx.ModelProto:
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="example.custom")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("example.custom", 1)])


def test_the_unsupported_op_error_names_the_skipped_passes_by_kind():
    """Only PASS_SKIPPED notes are named, whatever their text says."""
    notes = [Note(NoteKind.PASS_SKIPPED, "lower_rnn left the LSTM: its length is dynamic"),
             Note(NoteKind.FALLBACK, "pass through: text that is no skipped pass")]
    with pytest.raises(UnsupportedModelError, match="example.custom.NoSuchOp") as caught:
        client.check_supported(_unsupported_model(), notes=notes)
    assert str(caught.value).endswith("(lower_rnn left the LSTM: its length is dynamic)")
    assert "pass through" not in str(caught.value)


def test_dropping_quantization_drops_the_calibration_note_by_kind(tmp_path):
    """The note about seeded calibration goes with the quantisation, found by its kind, not its wording."""
    unquantized = tmp_path / "unquantized.onnx"
    onnx.save(_unsupported_model(), str(unquantized))
    prepared = SimpleNamespace(
        quantization={"mode": "int8"}, unquantized_path=unquantized, cleaned_path=tmp_path / "cleaned.onnx",
        cleaned=None, calibration=[{}], pass_records=[{"name": "quantize"}, {"name": "fold_constant"}],
        notes=[Note(NoteKind.CALIBRATION, "seeded calibration, worded any way"),
               Note(NoteKind.PASS_SKIPPED, "--quantize int8: calibrated on ... (a note of another kind)")])
    prepare.drop_quantization(prepared)
    assert [n.kind for n in prepared.notes] == [NoteKind.PASS_SKIPPED]
    assert prepared.quantization is None and [r["name"] for r in prepared.pass_records] == ["fold_constant"]
    assert prepared.cleaned_path == unquantized


def test_a_compile_error_carries_tvms_own_message():
    """What bind_to_reference quotes: TVM's message, not the client's sentence around it."""
    failure = child_process.WorkerResult.failure(contract.FailureKind.COMPILE.value, "Check failed: x", stage="import")
    with pytest.raises(CompilerError) as caught:
        client._check_result(failure, None)
    assert str(caught.value) == "TVM failed during import: Check failed: x"
    assert caught.value.detail == "Check failed: x" and caught.value.stage == "import"
