"""Inception blocks as the Caffe2 zoo's inception v1 / v2 build them (#39, benchmarks/inception): v1's LRN becomes a
sum of shifted channel slices of the squares in one kernel (no 3-d pool in NCDHW, no powf per element), and v2's
batch norm as Mul / Add by Unsqueeze'd (C, 1, 1) constants stays in NHWC as its conv's epilogue (no transposes,
pools and concatenations in NCHW). Tiny graphs, built as `mlc compile` builds them, checked against ONNX Runtime."""

from __future__ import annotations

import re

import numpy as np
import pytest

RNG = np.random.default_rng(0)
onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402


@pytest.fixture(scope="module")
def tvm_tools():
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc import targets
    from mlc.compiler import schedule_rules as rules, schedules

    return tvm, relax, rules, schedules, targets.resolve("x86").tvm


def _model(nodes, weights, x_shape, y_shape):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(w.astype(np.float32), n) for n, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _kernels_and_outputs(tools, model, x):
    """Kernel names after the default schedules, and (mlc's output, ONNX Runtime's) on `x`."""
    import onnxruntime as ort

    from mlc.compiler import importer

    tvm, relax, rules, schedules, target_json = tools
    target = tvm.target.Target(target_json)
    mod = importer.to_relax(model, None)
    fused = rules.apply_default_schedules(schedules._legalize_and_fuse(mod, target), target)
    names = [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    executable, _ = schedules.build(mod, target_json, None, True)
    actual = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return names, actual, session.run(None, {"x": x})[0]


@pytest.mark.parametrize("size,beta", [(5, 0.75), (3, 0.5), (5, 0.6)])
def test_lrn_is_one_window_sum_kernel_without_pool_or_power(tvm_tools, size, beta):
    """conv -> LRN -> conv (inception v1's stem): the LRN is one kernel of channel slices (with sqrt for beta 0.75 /
    0.5), no 3-d pool, no conv of its own and no transpose kernel around it; another beta keeps its power."""
    c = 24
    weights = {"w0": RNG.standard_normal((c, 8, 3, 3)) * 0.5, "w1": RNG.standard_normal((16, c, 1, 1)) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4),
             helper.make_node("LRN", ["c0"], ["n0"], size=size, alpha=0.5, beta=beta, bias=2.0),
             helper.make_node("Conv", ["n0", "w1"], ["y"])]
    x = RNG.standard_normal((1, 8, 7, 7)).astype(np.float32)
    names, actual, expected = _kernels_and_outputs(tvm_tools, _model(nodes, weights, [1, 8, 7, 7], [1, 16, 7, 7]), x)
    assert not [n for n in names if "pool" in n], names
    epilogue = "sqrt.*divide" if beta in (0.75, 0.5) else "power.*divide"
    assert len([n for n in names if re.match(f"fused_.*pad.*strided_slice.*{epilogue}", n)]) == 1, names
    assert len([n for n in names if "conv2d" in n]) == 2, names  # the model's two: the LRN adds none
    assert beta not in (0.75, 0.5) or not [n for n in names if "power" in n], names
    assert len([n for n in names if re.fullmatch(r"transpose\d*", n)]) <= 2, names  # the model's input and output
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def test_lrn_window_sum_pads_channels_last_after_an_nhwc_conv(tvm_tools):
    """The LRN after a conv (NHWC) pads and slices the channel axis in NHWC: its padded squares are a (1, H, W, C + 4)
    buffer, read along the vector (was (1, C + 4, H, W) between transposes: strided both ways, 3x slower on zfnet)."""
    tvm, relax, rules, schedules, target_json = tvm_tools
    from mlc.compiler import importer

    c, hw = 24, 7
    weights = {"w0": RNG.standard_normal((c, 8, 3, 3)) * 0.5, "w1": RNG.standard_normal((16, c, 1, 1)) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4),
             helper.make_node("LRN", ["c0"], ["n0"], size=5, alpha=0.5, beta=0.75, bias=2.0),
             helper.make_node("Conv", ["n0", "w1"], ["y"])]
    model = _model(nodes, weights, [1, 8, hw, hw], [1, 16, hw, hw])
    target = tvm.target.Target(target_json)
    fused = schedules._legalize_and_fuse(importer.to_relax(model, None), target)
    lrn = [f for gv, f in fused.functions_items() if "strided_slice" in gv.name_hint]
    assert len(lrn) == 1, [gv.name_hint for gv in fused.functions]
    shapes = [[int(d) for d in re.findall(r"T\.int64\((\d+)\)", b)]
              for b in re.findall(r"sblock_alloc_buffer\(\((.*?\))\)", lrn[0].script())]
    assert [1, hw, hw, c + 4] in shapes and [1, c + 4, hw, hw] not in shapes, shapes
    x = RNG.standard_normal((1, 8, hw, hw)).astype(np.float32)
    np.testing.assert_allclose(*_kernels_and_outputs(tvm_tools, model, x)[1:], rtol=1e-4, atol=1e-4)


def test_batch_norm_as_mul_add_by_unsqueezed_constants_is_the_convs_epilogue(tvm_tools):
    """Inception v2's conv -> Mul(Unsqueeze(scale)) -> Add(Unsqueeze(shift)) -> ReLU, two branches, concat, max pool,
    conv: the Mul / Add fuse into each conv (NHWC) and nothing between the convs is transposed."""
    c = 16
    weights = {"w0": RNG.standard_normal((c, 8, 1, 1)) * 0.5, "w1": RNG.standard_normal((c, 8, 3, 3)) * 0.3,
               "w2": RNG.standard_normal((8, 2 * c, 1, 1)) * 0.3, "axes": np.array([1, 2])}
    nodes = []
    for k in range(2):
        weights.update({f"s{k}": RNG.standard_normal(c) * 0.5 + 1, f"b{k}": RNG.standard_normal(c) * 0.1})
        nodes += [helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"], pads=[k] * 4),
                  helper.make_node("Unsqueeze", [f"s{k}", "axes"], [f"su{k}"]),
                  helper.make_node("Unsqueeze", [f"b{k}", "axes"], [f"bu{k}"]),
                  helper.make_node("Mul", [f"c{k}", f"su{k}"], [f"m{k}"]),
                  helper.make_node("Add", [f"m{k}", f"bu{k}"], [f"a{k}"]),
                  helper.make_node("Relu", [f"a{k}"], [f"r{k}"])]
    weights["axes"] = weights["axes"].astype(np.int64)
    nodes += [helper.make_node("Concat", ["r0", "r1"], ["cat"], axis=1),
              helper.make_node("MaxPool", ["cat"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
              helper.make_node("Conv", ["p", "w2"], ["y"])]
    model = _model(nodes, {k: v for k, v in weights.items() if k != "axes"}, [1, 8, 8, 8], [1, 8, 4, 4])
    model.graph.initializer.append(numpy_helper.from_array(weights["axes"], "axes"))
    x = RNG.standard_normal((1, 8, 8, 8)).astype(np.float32)
    names, actual, expected = _kernels_and_outputs(tvm_tools, model, x)
    assert len([n for n in names if re.match("fused_conv2d.*_multiply.*_add.*relu", n)]) == 2, names
    assert len([n for n in names if "transpose" in n]) <= 2, names  # the model's input and output only
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pool", [dict(op_type="MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
                                  dict(op_type="AveragePool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
                                  dict(op_type="AveragePool", kernel_shape=[2, 2], strides=[2, 2])])
def test_a_pool_after_a_concatenation_pools_each_piece(tvm_tools, pool):
    """SqueezeNet's fire module before a downsampling: two convs (16 and 24 channels), their concatenation, a pool.
    Each conv's output is pooled on its own (no concatenation copied at the full resolution), the same values."""
    weights = {"w0": RNG.standard_normal((16, 8, 1, 1)) * 0.5, "w1": RNG.standard_normal((24, 8, 3, 3)) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]),
             helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
             helper.make_node("Concat", ["c0", "c1"], ["cat"], axis=1),
             helper.make_node(pool.pop("op_type"), ["cat"], ["p"], **pool),
             helper.make_node("Relu", ["p"], ["y"])]
    x = RNG.standard_normal((1, 8, 8, 8)).astype(np.float32)
    names, actual, expected = _kernels_and_outputs(tvm_tools, _model(nodes, weights, [1, 8, 8, 8], [1, 40, 4, 4]), x)
    pools = [n for n in names if "pool" in n]
    assert len(pools) == 2, names  # one per piece (16 and 24 channels: two kernels)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
