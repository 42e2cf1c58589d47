"""mlc bench's int8 and throughput baselines (issue #39): openvino-int8 (NNCF), ort-int8 (quantize_static) and
openvino-throughput (THROUGHPUT hint, AsyncInferQueue), on a tiny conv net built here."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlc.bench import baselines, report, worker
from mlc.bench.contract import MeasureRequest


def conv_onnx(path: Path, opset: int = 17) -> Path:
    """Conv 3->8 (3x3) + Relu + Conv 8->8 + Relu + global pool + Gemm 8->5, batch dynamic, seeded weights."""
    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(8) * 0.1,
               "w2": rng.standard_normal((8, 8, 3, 3)) * 0.2, "b2": rng.standard_normal(8) * 0.1,
               "w3": rng.standard_normal((5, 8)), "b3": rng.standard_normal(5) * 0.1}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
         helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
         helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
         helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
         helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
         helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
         helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1, name="fc")],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)
    return path


def context(tmp_path: Path, batch: int, threads: int = 1, opset: int = 17) -> baselines.Context:
    x = np.random.default_rng(1234).standard_normal((batch, 3, 16, 16)).astype(np.float32)
    return baselines.Context(None, conv_onnx(tmp_path / "conv.onnx", opset), ["x"], [x], threads,
                             tmp_path / "scratch")


def close_to_fp32(ctx: baselines.Context, outputs: list[np.ndarray]) -> None:
    fp32 = baselines.get("ort").setup(ctx)()
    assert outputs[0].shape == fp32[0].shape
    scale = np.abs(fp32[0]).max()
    assert np.abs(outputs[0] - fp32[0]).max() < 0.05 * scale  # int8: within a few uint8 steps of the range
    assert (outputs[0].argmax(1) == fp32[0].argmax(1)).mean() >= 0.75
    assert not np.array_equal(outputs[0], fp32[0])  # quantised, not the fp32 graph


def test_openvino_int8_runs_int8_layers_close_to_fp32(tmp_path):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    ctx = context(tmp_path, batch=4)
    run = baselines.get("openvino-int8").setup(ctx)
    close_to_fp32(ctx, run())
    assert run.precision == "int8"
    # The CPU plugin's executed graph: the convs run on u8 activations, not f32.
    kinds = {(op.get_rt_info()["layerType"].astype(str), op.get_rt_info()["runtimePrecision"].astype(str))
             for op in run.compiled.get_runtime_model().get_ops()}
    assert ("Convolution", "u8") in kinds and ("Convolution", "f32") not in kinds, kinds
    counts = baselines.runtime_precisions(run.compiled)
    assert counts.get("u8", 0) + counts.get("i8", 0) >= 2, counts
    assert baselines.runtime_precisions(baselines.get("openvino").setup(ctx).compiled).keys() == {"f32"}


def test_int8_baselines_calibrate_on_the_given_inputs(tmp_path):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    ctx = context(tmp_path, batch=4)
    seeded = baselines.calibration_feeds(ctx)  # mlc's: 8 seeded inputs of the cell's shape
    assert len(seeded) == 8 and seeded[0]["x"].shape == (4, 3, 16, 16)
    default = baselines.get("openvino-int8").setup(ctx)()
    # Calibrated on inputs 100x smaller, the activation ranges clip the cell's inputs: the outputs change.
    ctx.calibration = [{"x": f["x"] * 0.01} for f in seeded]
    assert not np.allclose(baselines.get("openvino-int8").setup(ctx)()[0], default[0], atol=1e-3)


@pytest.mark.parametrize("opset", [17, 9])
def test_ort_int8_quantizes_the_convs_close_to_fp32(tmp_path, opset):
    """At opset 9 too (the Caffe2 zoo's): converted to 13 first, where per-channel QDQ exists (ORT wrote an opset-9
    model its own loader refused: DequantizeLinear has no axis there)."""
    ctx = context(tmp_path, batch=4, opset=opset)
    run = baselines.get("ort-int8").setup(ctx)
    close_to_fp32(ctx, run())
    assert run.precision == "int8"
    quantized = onnx.load(str(ctx.scratch / "ort-int8" / "model.ort-int8.onnx"))
    ops = [n.op_type for n in quantized.graph.node]
    assert ops.count("QuantizeLinear") >= 2 and "DequantizeLinear" in ops


def test_missing_nncf_is_a_one_line_error_with_the_install_command(tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    monkeypatch.setitem(sys.modules, "nncf", None)  # import nncf raises ImportError
    with pytest.raises(baselines.Unavailable) as caught:
        baselines.get("openvino-int8").setup(context(tmp_path, batch=1))
    assert "pip install" in str(caught.value) and "nncf" in str(caught.value) and "\n" not in str(caught.value)


def test_openvino_throughput_cell_records_samples_per_second(tmp_path):
    pytest.importorskip("openvino")
    from mlc.runtime.runner import save_npz

    ctx = context(tmp_path, batch=8, threads=2)
    feeds, reference = tmp_path / "feeds.npz", tmp_path / "reference.npz"
    save_npz(feeds, {"x": ctx.inputs[0]})
    save_npz(reference, {"y": baselines.get("ort").setup(ctx)()[0]})
    request = MeasureRequest(backend="openvino-throughput", framework="onnx", source="conv.onnx", threads=2,
                             warmup=1, repeat=3, feeds=str(feeds), reference=str(reference),
                             onnx=str(ctx.onnx_path), inputs=["x"], scratch=str(tmp_path / "scratch"))
    result = {k: v for k, v in worker.measure(request).to_json().items() if v is not None}  # as the cell has it
    throughput = result["throughput"]
    assert throughput["batch"] == 8 and throughput["batches_per_call"] >= 1 and throughput["streams"] >= 1
    assert throughput["samples_per_s"] > 0 and "latency_ms" not in result  # its call time is no latency
    assert result["accuracy"]["passed"] and result["precision"] == "fp32"
    # The report's throughput table shows it beside a latency cell's batch / mean time.
    cell = {"model": "conv", "batch": 8, "seq": None, "threads": 2, "backend": "openvino-throughput",
            "status": "ok", "machine": "m", **result}
    plain = {**cell, "backend": "ort", "throughput": None, "latency_ms": {"p50": 2.0, "samples_per_s": 4000.0}}
    section = report._throughput_section([cell, plain])
    row = section.parts[0].rows[0]
    assert row[4:] == [f"{throughput['samples_per_s']:.0f}", "4000"]
    assert report._throughput_section([{**plain, "batch": 1}]) is None  # batch-1 latency runs: no such table
