"""The typed contracts of the tuning, frontend (convert) and benchmark workers, and the compile worker's failure
payload, as mlc.compiler.contract's compile request and result (tests/test_contract.py): every field survives the
JSON the process boundary carries, and a field one side does not know, or one it needs and lacks, is an error
naming it, never dropped or defaulted."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mlc.bench import contract as bench
from mlc.compiler.contract import (CompileFailure, ContractError, FailureKind, Note, NoteKind, RpcDevice, TuneRequest,
                                   TuneResult, TuneStop)
from mlc.pipeline.convert_contract import ConvertRequest, ConvertResult


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))  # what child_process.run writes and the child reads


# Each value sets every field away from its default: a field to_json dropped would come back as the default.
def _tune_request() -> TuneRequest:
    return TuneRequest(
        onnx="/w/cleaned.onnx", target={"kind": "llvm", "num-cores": 4}, db="/db", logs="/w/logs",
        events="/w/events.jsonl", trials_per_task=64, trials_per_iter=16, threads=4,
        relax_passes=[{"name": "fuse_ops", "level": "relax", "config": {}, "explicit": False}], budget_s=30.0,
        deadline=1.7e9, seed=7, rpc=RpcDevice("host:9190", "pi4", timeout=30), population=64, generations=3)


def _tune_result() -> TuneResult:
    return TuneResult(tasks=3, trials=48, reason=TuneStop.BUDGET, threads=4, left_to_default=["concat"],
                      notes=[Note(NoteKind.RECORDS, "2 records set aside")], dropped=1, dropped_reason="why",
                      killed=True)


def _convert_request() -> ConvertRequest:
    return ConvertRequest(source="zoo:resnet18", framework="torch", out_dir="/w/frontend-torch", dynamic=["batch"],
                          input_shapes=["x=1x3x224x224"], exporter="dynamo", inputs="/data/samples.npz")


def _convert_result() -> ConvertResult:
    return ConvertResult(framework="torch", framework_version="2.13.0", exporter="torch.onnx (dynamo)",
                         dynamic=["batch"], notes=[Note(NoteKind.FRONTEND, "a frontend note")],
                         declared_dynamic={"batch": [1, 64], "seq": None}, onnx_opset=18, onnx_nodes=42, onnx_ir=10)


def _prepare_request() -> bench.PrepareRequest:
    return bench.PrepareRequest(source="zoo:bert-tiny", framework="torch", out_dir="/w/bert-torch", batch=[1, 4],
                                seq=[32, 128], threads=2)


def _prepare_result() -> bench.PrepareResult:
    return bench.PrepareResult(
        exporter="torch.onnx (dynamo)", reference="torch 2.13.0 eager", params=4_000_000, inputs=["input_ids"],
        outputs=["logits"], symbolic=["batch", "seq"],
        shapes=[bench.PreparedShape(1, 32, "b1-s32", shapes={"input_ids": [1, 32]}),
                bench.PreparedShape(4, None, "b4", error="MemoryError: out of memory")],
        notes=[Note(NoteKind.FRONTEND, "tiny config (MLC_SUITE_TINY)")])


def _measure_request() -> bench.MeasureRequest:
    return bench.MeasureRequest(backend="mlc", source="zoo:mlp", framework="torch", threads=2, warmup=3, repeat=10,
                                feeds="/w/feeds-b1.npz", reference="/w/reference-b1.npz", onnx="/w/model.onnx",
                                inputs=["x"], scratch="/w/scratch", artifact="/w/art")


def _measure_result() -> bench.MeasureResult:
    return bench.MeasureResult(
        skipped="openvino is not installed", setup_s=0.5, compile_s=0.4, precision="bf16", latency_ms={"p50": 1.0},
        throughput={"batch": 8, "batches_per_call": 2}, runtime_precisions={"f32": 3}, accuracy={"passed": True},
        peak_rss_mb=120.5, load_average=1.5, emulated=True)


def _sequence_request() -> bench.SequenceRequest:
    return bench.SequenceRequest(backend="mlc", dir="/w/prepared", lengths=[5, 17, 5], inputs=["input_ids"],
                                 outputs=["logits"], source="zoo:bert-tiny", threads=1,
                                 artifacts={"*": "/w/dynamic"})


def _sequence_result() -> bench.SequenceResult:
    return bench.SequenceResult(setup_s=0.1, run_total_s=0.02, run_ms=[1.0, 2.0], run_cpu_total_s=0.01,
                                run_cpu_ms=[0.5, 1.5], accuracy={"passed": True}, peak_rss_mb=99.0, load_average=0.7)


def _compile_job_request() -> bench.CompileJobRequest:
    return bench.CompileJobRequest(source="/w/model.onnx", target="x86", output="/w/static-5",
                                   options={"input_shapes": ["input_ids:1x5"]}, threads=1)


def _compile_job_result() -> bench.CompileJobResult:
    return bench.CompileJobResult(path="/w/static-5")


def _compile_failure() -> CompileFailure:
    return CompileFailure(ops={"Foo": {"count": 2, "first_nodes": ["foo_1"]}}, reproducer="/w/m.reproducer.onnx",
                          reproducer_nodes=1, model_nodes=9)


CONTRACTS = [_compile_failure, _tune_request, _tune_result, _convert_request, _convert_result, _prepare_request,
             _prepare_result, _measure_request, _measure_result, _sequence_request, _sequence_result,
             _compile_job_request, _compile_job_result]


@pytest.mark.parametrize("make", CONTRACTS, ids=lambda make: make.__name__.strip("_"))
def test_every_field_survives_the_json_round_trip(make):
    value = make()
    cls = type(value)
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    assert all(getattr(value, name) != default for name, default in defaults.items())
    data = _through_json(value.to_json())
    assert set(data) - {"job"} == {f.name for f in dataclasses.fields(cls)}
    assert cls.from_json(data) == value


@pytest.mark.parametrize("make", CONTRACTS, ids=lambda make: make.__name__.strip("_"))
def test_an_unknown_or_missing_field_is_refused_by_name(make):
    cls = type(make())
    data = _through_json(make().to_json())
    with pytest.raises(ContractError, match="unknown field.*from_a_newer_mlc.*differ in version"):
        cls.from_json({**data, "from_a_newer_mlc": 1})
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    for name in required:
        with pytest.raises(ContractError, match=f"missing field.*{name}"):
            cls.from_json({k: v for k, v in data.items() if k != name})


def test_nested_parts_and_kinds_are_strict_too():
    request = _through_json(_tune_request().to_json())
    with pytest.raises(ContractError, match="rpc: unknown field.*port"):
        TuneRequest.from_json({**request, "rpc": {**request["rpc"], "port": 9090}})
    result = _through_json(_tune_result().to_json())
    with pytest.raises(ContractError, match="unknown reason 'bored'"):
        TuneResult.from_json({**result, "reason": "bored"})
    converted = _through_json(_convert_result().to_json())
    with pytest.raises(ContractError, match="note: unknown kind 'whatever'"):
        ConvertResult.from_json({**converted, "notes": [{"kind": "whatever", "text": "x"}]})
    with pytest.raises(ContractError, match="frontend worker differ"):
        ConvertResult.from_json({**converted, "notes": [{"kind": "frontend", "text": "x", "extra": 1}]})


def test_a_worker_result_without_the_optional_fields_takes_their_defaults():
    """The tuning worker's shortest result (no kernel to tune) and the one the parent makes from the events."""
    assert TuneResult.from_json({"tasks": 0, "trials": 0}) == TuneResult(0, 0)
    assert TuneResult.from_json({"tasks": 0, "trials": 0}).reason is TuneStop.TRIALS


@pytest.mark.parametrize("make", [_prepare_request, _measure_request, _sequence_request, _compile_job_request],
                         ids=lambda make: make.__name__.strip("_"))
def test_a_bench_request_names_its_job_and_is_parsed_as_that_job(make):
    data = _through_json(make().to_json())
    assert data["job"] == type(make()).job.value
    assert bench.request_from_json(data) == make()
    with pytest.raises(ContractError, match="unknown job 'train'"):
        bench.request_from_json({**data, "job": "train"})
    other = next(job for job in bench.BenchJob if job.value != data["job"])
    with pytest.raises(ContractError, match=f"job '{other.value}', not '{data['job']}'"):
        type(make()).from_json({**data, "job": other.value})


def test_a_prepared_shape_is_recorded_without_the_keys_it_lacks():
    """The results files keep their shape entries as before: {"batch", "seq", "key"} and "shapes" or "error"."""
    record = _prepare_result().record()
    assert record["shapes"] == [{"batch": 1, "seq": 32, "key": "b1-s32", "shapes": {"input_ids": [1, 32]}},
                                {"batch": 4, "seq": None, "key": "b4", "error": "MemoryError: out of memory"}]
    assert record["notes"] == ["tiny config (MLC_SUITE_TINY)"]


def test_a_compile_failure_payload_is_typed_and_strict():
    """The client reads a failure of the worker's kinds through CompileFailure: a key it does not know is an error."""
    from mlc import child_process
    from mlc.compiler import client

    details = CompileFailure(ops={"Foo": {"count": 2, "first_nodes": ["f"]}})
    unsupported = child_process.WorkerResult.failure(FailureKind.UNSUPPORTED.value, "", None, **details.to_json())
    with pytest.raises(Exception, match="Foo x2 \\(first: f\\)"):
        client._check_result(unsupported, None)
    renamed = child_process.WorkerResult.failure(FailureKind.UNSUPPORTED.value, "", None, op_types={"Foo": {}})
    with pytest.raises(ContractError, match="compile failure: unknown field.*op_types"):
        client._check_result(renamed, None)
