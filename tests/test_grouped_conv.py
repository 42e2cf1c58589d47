"""Grouped convs (#39): the default CPU rule runs a grouped conv's register tile per group (the group an outer loop,
the tile over one group's output channels), so a tile's lanes read one group's input channels. Before, the tile
ran over all output channels and its lanes straddled groups (a resnext-style 3x3 conv of 4-channel groups: 7x the
time, benchmarks/grouped-conv). Tiny ONNX convs, compiled as `mlc compile` does, against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

# (channels in, channels out, size, kernel, groups): groups 2, 3 (ShuffleNet's 20 channels a group) and 4, and
# many groups of 4 and 8 channels (resnext)
CASES = [(32, 32, 6, 1, 2), (60, 60, 8, 1, 3), (48, 96, 5, 3, 4), (128, 128, 6, 3, 32), (64, 64, 5, 3, 8)]


def _model(cin: int, cout: int, size: int, kernel: int, groups: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((cout, cin // groups, kernel, kernel)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=groups, kernel_shape=[kernel] * 2,
                              pads=[kernel // 2] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def tools():
    tvm = pytest.importorskip("tvm")
    from mlc import targets
    from mlc.compiler import importer, schedule_rules, schedules

    return tvm, importer, schedule_rules, schedules, tvm.target.Target(targets.resolve("x86").tvm)


def _conv_kernel(tools, model):
    tvm, importer, rules, schedules, target = tools
    mod = rules.apply_default_schedules(schedules._legalize_and_fuse(importer.to_relax(model, None), target), target)
    (func,) = [f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint]
    return func


def _conv_block(tvm, func):
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    return sch.get(sch.get_sblock("group_conv2d_nhwc_update"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"g{c[4]}-{c[0]}to{c[1]}-k{c[3]}")
def test_grouped_conv_runs_its_tile_per_group(tools, case):
    """The conv block's outermost iterator is the group (extent `groups`), then the output rows and columns (the
    unit batch is normalized away), then one group's output channels."""
    tvm = tools[0]
    cin, cout, size, kernel, groups = case
    block = _conv_block(tvm, _conv_kernel(tools, _model(*case)))
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    assert extents[:4] == [groups, size, size, cout // groups], (block.name_hint, extents)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"g{c[4]}-{c[0]}to{c[1]}-k{c[3]}")
def test_grouped_conv_matches_onnx_runtime(case, tmp_path):
    import mlc.api as api

    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "grouped.onnx"
    onnx.save(_model(*case), path)
    result = api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False)
    assert result.check.passed and not result.manifest.compile.schedules["unscheduled"]
    from mlc.runtime.runner import Runner

    x = np.random.default_rng(1).standard_normal((1, case[0], case[2], case[2])).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Runner(tmp_path / "art").run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [(32, 32, 6, 3, 1), (48, 48, 6, 3, 48), (64, 64, 4, 1, 1)],
                         ids=["plain-3x3", "depthwise", "plain-1x1"])
def test_other_convs_keep_their_kernels(tools, case, monkeypatch):
    """Plain and depthwise convs get the same scheduled kernel with the group split on and off."""
    rules = tools[2]
    model = _model(*case)
    monkeypatch.setattr(rules, "SPLIT_GROUPS", False)
    without = _conv_kernel(tools, model).script()
    monkeypatch.setattr(rules, "SPLIT_GROUPS", True)
    assert _conv_kernel(tools, model).script() == without


def test_zoo_shufflenet_v1_exports_its_group_convs(tmp_path):
    """zoo:shufflenet-v1 (the benchmark's model): ONNX Runtime matches torch eager, and its 1x1 convs are grouped
    by 3 but for the first unit's (24 stem channels)."""
    pytest.importorskip("torch")
    import mlc.api as api

    path = tmp_path / "shufflenet.onnx"
    assert api.export("zoo:shufflenet-v1", path).conversion.passed
    groups = [next((a.i for a in n.attribute if a.name == "group"), 1) for n in onnx.load(path).graph.node
              if n.op_type == "Conv"]
    assert groups.count(3) == 31 and len(groups) == 1 + 16 * 3
