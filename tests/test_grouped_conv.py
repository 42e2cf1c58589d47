"""Grouped convs (#39): the default CPU rule runs a grouped conv's register tile per group (the group an outer loop,
the tile over one group's output channels), so a tile's lanes read one group's input channels. Before, the tile
ran over all output channels and its lanes straddled groups (a resnext-style 3x3 conv of 4-channel groups: 7x the
time, benchmarks/grouped-conv). Tiny ONNX convs, compiled as `mlc compile` does, against ONNX Runtime."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from helpers import ZNVER4, host_runs
from onnx import TensorProto, helper, numpy_helper

# (channels in, channels out, size, kernel, groups): groups 2, 3 (ShuffleNet's 20 channels a group) and 4, and
# many groups of 4 and 8 channels (resnext)
CASES = [(32, 32, 6, 1, 2), (60, 60, 8, 1, 3), (48, 96, 5, 3, 4), (128, 128, 6, 3, 32), (64, 64, 5, 3, 8)]


def _model(cin: int, cout: int, size: int, kernel: int, groups: int, stride: int = 1,
           bias: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((cout, cin // groups, kernel, kernel)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
    nodes = [helper.make_node("Conv", ["x", "w", "b"][:1 + len(inits)], ["c"], group=groups,
                              kernel_shape=[kernel] * 2, pads=[kernel // 2] * 4, strides=[stride] * 2),
             helper.make_node("Relu", ["c"], ["y"])]
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1
    graph = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, out, out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def tools():
    tvm = pytest.importorskip("tvm")
    from mlc.compiler import importer, schedule_rules, schedules

    # the kernels' shapes as on AVX-512 (16 lanes) whatever the host: these tests read them, never run them
    return tvm, importer, schedule_rules, schedules, tvm.target.Target(ZNVER4)


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
    unit batch is normalized away), then one group's output channels (padded to whole vectors: below)."""
    tvm = tools[0]
    cin, cout, size, kernel, groups = case
    block = _conv_block(tvm, _conv_kernel(tools, _model(*case)))
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    assert extents[:4] == [groups, size, size, _padded(cout // groups)], (block.name_hint, extents)


def _padded(width: int) -> int:
    """A group's output channels as the conv computes them: more than half a 16-float vector and no multiple of
    it, padded to whole vectors (20 -> 32, 24 -> 32, 40 -> 48, 12 -> 16)."""
    return -(-width // 16) * 16 if width > 8 else width


# (channels in, channels out, size, kernel, groups, stride, bias): groups of 20 and 40 output channels (ShuffleNet
# v1's reduce convs), of 12 and 24 (3x3, stride 2), of 3 and 8 (left as they were: no padding)
ODD = [(60, 60, 8, 1, 3, 1, True), (120, 120, 6, 1, 3, 1, False), (48, 48, 7, 3, 4, 2, True),
       (48, 96, 9, 3, 4, 2, False), (24, 9, 6, 3, 3, 1, True), (32, 64, 5, 1, 8, 2, True)]


def _odd_id(case) -> str:
    cin, cout, size, kernel, groups, stride, bias = case
    return f"w{cout // groups}-g{groups}-k{kernel}-s{stride}" + ("-bias" if bias else "")


@pytest.mark.parametrize("case", ODD, ids=_odd_id)
def test_odd_group_widths_run_on_whole_vectors(tools, case):
    """A group of 20, 40, 12 or 24 output channels is zero-padded to whole 16-float vectors (32, 48, 16, 32): the
    conv kernel writes groups x padded channels, its tile per group spans the padded width and its vectorized
    loops are 16 lanes wide (before: 4- or 8-lane vectors, `narrow_lanes`). Groups of 3 and 8 stay unpadded."""
    tvm = tools[0]
    cin, cout, size, kernel, groups, stride, bias = case
    width = cout // groups
    padded = _padded(width)
    func = _conv_kernel(tools, _model(cin, cout, size, kernel, groups, stride, bias))
    out = [int(d) for d in func.params[-1].shape]  # the output buffer
    assert out[-1] == groups * padded, out
    if width >= 4:  # split per group (`_split_groups`): group, rows, columns, one group's channels
        extents = [int(iv.dom.extent) for iv in _conv_block(tvm, func).iter_vars]
        assert extents[0] == groups and extents[3] == padded, extents
    if padded % 16 == 0:
        lanes = re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", func.script())
        assert lanes and set(lanes) == {"16"}, lanes


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"g{c[4]}-{c[0]}to{c[1]}-k{c[3]}")
def test_grouped_conv_matches_onnx_runtime(case, tmp_path):
    _compile_and_compare(_model(*case), case[0], case[2], tmp_path)


@pytest.mark.parametrize("case", ODD, ids=_odd_id)
def test_odd_group_widths_match_onnx_runtime(case, tmp_path):
    """The padded convs (and the slices that drop the padding) compute ONNX Runtime's numbers, with and without a
    bias (the bias and ReLU run after the slice), at stride 1 and 2."""
    _compile_and_compare(_model(*case), case[0], case[2], tmp_path)


def _compile_and_compare(model, cin: int, size: int, tmp_path) -> None:
    import mlc.api as api

    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "grouped.onnx"
    onnx.save(model, path)
    result = api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False)
    assert result.check.passed and not result.manifest.compile.schedules["unscheduled"]
    from mlc.runtime.runner import Runner

    x = np.random.default_rng(1).standard_normal((1, cin, size, size)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Runner(tmp_path / "art").run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)


def test_which_group_widths_are_padded():
    """16-float vectors (AVX-512): a group wider than half a vector and no multiple of it is padded to whole
    vectors; groups of 1-8 (depthwise, resnext) and multiples of 16 are not. 4-float vectors (NEON): 20 and 40
    are whole vectors already, 3 and 6 get padded to 4 and 8."""
    from mlc.compiler.grouped_conv import padded_group_width

    assert [padded_group_width(w, 16) for w in (9, 12, 20, 24, 40, 72)] == [16, 16, 32, 32, 48, 80]
    assert [padded_group_width(w, 16) for w in (1, 3, 4, 8, 16, 80)] == [None] * 6
    assert [padded_group_width(w, 4) for w in (20, 40, 2, 3, 6)] == [None, None, None, 4, 8]


@pytest.mark.parametrize("case", [(32, 32, 6, 3, 1), (48, 48, 6, 3, 48), (128, 128, 6, 3, 32), (64, 64, 5, 3, 4)],
                         ids=["plain", "depthwise", "g32-of-4", "g4-of-16"])
def test_modules_without_a_conv_to_pad_come_back_untouched(tools, case):
    """No grouped conv to pad: the pass returns the very module it got (so such models build as before)."""
    tvm, importer, rules, schedules, target = tools
    from tvm import relax

    from mlc.compiler.grouped_conv import pad_group_channels

    with target:
        mod = relax.transform.ConvertLayout(schedules.CONV_LAYOUT)(importer.to_relax(_model(*case), None))
        assert pad_group_channels(mod, target) is mod


def test_padding_is_dropped_inside_the_next_kernel_over_a_symbolic_batch(tools):
    """Over a symbolic batch too, the conv computes 3 x 32 channels and one injective op drops the padding, fused
    with the bias and ReLU into the kernel after the conv (a reshape, strided slice and reshape stayed three
    kernels of their own there)."""
    tvm, importer, rules, schedules, target = tools
    model = _model(60, 60, 8, 1, 3)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    mod = schedules._legalize_and_fuse(importer.to_relax(model, None), target)
    kernels = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    (conv,) = [f for name, f in kernels.items() if "conv2d" in name]
    assert int(conv.params[-1].shape[-1]) == 96
    assert any("drop_group_padding" in name and "add" in name and "relu" in name for name in kernels), sorted(kernels)
    assert not any(name.startswith(("reshape", "strided_slice")) for name in kernels), sorted(kernels)


@pytest.mark.parametrize("batch", [1, "batch"])
def test_dropping_the_padding_reads_each_group_contiguously(tools, batch):
    """The kernel that drops 24-of-32 padded groups (regnety's) runs its channels a group at a time: a loop over the
    24 channels inside each group, vectorized within it, so each vector reads one group's contiguous channels.
    Split by the vector alone (8 lanes over 120 channels), each lane's address took a div/mod and LLVM gathered
    them (0.18 ms a call in regnety_016). The numbers are checked against ONNX Runtime in
    test_odd_group_widths_match_onnx_runtime (its 24-channel groups)."""
    tvm, importer, rules, schedules, target = tools
    model = _model(120, 120, 6, 1, 5)
    model.graph.node[-1].output[0] = "r"  # a 1x1 conv after it, as in a model: the drop stays channels last
    model.graph.node.append(helper.make_node("Conv", ["r", "w1"], ["y"], kernel_shape=[1, 1]))
    weight = np.random.default_rng(1).standard_normal((120, 120, 1, 1)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(weight, "w1"))
    if batch != 1:
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = batch
        model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = batch
    mod = rules.apply_default_schedules(schedules._legalize_and_fuse(importer.to_relax(model, None), target), target)
    (script,) = [f.script() for gv, f in mod.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc) and "drop_group_padding" in gv.name_hint]
    lanes = [int(n) for n in re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", script)]
    assert lanes and all(24 % n == 0 for n in lanes), lanes
    assert re.search(r"T\.axis\.spatial\(T\.int64\(120\), [^\n]*\* T\.int64\(24\) \+", script), script


@pytest.mark.parametrize("case", [(32, 32, 6, 3, 1), (48, 48, 6, 3, 48), (64, 64, 4, 1, 1)],
                         ids=["plain-3x3", "depthwise", "plain-1x1"])
def test_other_convs_keep_their_kernels(tools, case, monkeypatch):
    """Plain and depthwise convs get the same scheduled kernel with the group split and padding on and off."""
    from mlc.compiler import grouped_conv

    rules = tools[2]
    model = _model(*case)
    monkeypatch.setattr(rules, "SPLIT_GROUPS", False)
    monkeypatch.setattr(grouped_conv, "PAD_GROUPS", False)
    without = _conv_kernel(tools, model).script()
    monkeypatch.setattr(rules, "SPLIT_GROUPS", True)
    monkeypatch.setattr(grouped_conv, "PAD_GROUPS", True)
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


@pytest.mark.parametrize("cout", [336, 224], ids=["168-padded-to-11-vectors", "112-is-7-vectors"])
def test_a_group_of_an_odd_number_of_vectors_matches_onnx_runtime(cout, tmp_path):
    """Two groups whose register tiles come in blocks of 4 vectors with a partial last block: its write-back once
    overwrote the next group's first vector (torchvision's regnet_x_32gf failed its check)."""
    _compile_and_compare(_model(cout, cout, 8, 3, 2), cout, 8, tmp_path)


# (channels in, channels out, size, kernel, groups) of u8 x s8 grouped convs (--quantize int8): Caffe2 ShuffleNet's
# 1x1 convs (4 groups of 34 in and out: depth padded to 36, width to 48; its first, 6 in and 28 out a group), a 3x3
# of 12 in and 24 out a group, and one that needs no padding (64 a group)
INT8 = [(136, 136, 7, 1, 4), (24, 112, 8, 1, 4), (48, 96, 6, 3, 4), (256, 256, 5, 1, 4)]


@pytest.mark.parametrize("case", INT8, ids=lambda c: f"g{c[4]}-{c[0] // c[4]}to{c[1] // c[4]}-k{c[3]}")
def test_int8_grouped_conv_runs_per_group_on_vpdpbusd(case):
    """A u8 x s8 grouped conv has each group's depth padded to quads and its output channels to whole 16-lane
    vectors, so its per-group tile runs on vpdpbusd (before: int32 multiplies, 3-10x the fp32 conv's time, and
    --quantize left grouped convs fp32). Exact against numpy where the host has VNNI."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import schedules

    cin, cout, size, kernel, groups = case
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, size, size, cin)).astype(np.uint8)
    weight = rng.integers(-128, 128, (kernel, kernel, cin // groups, cout)).astype(np.int8)
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x.shape, "uint8"))
    with bb.function("main", [var]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(var, relax.const(weight, "int8"), padding=kernel // 2,
                                                    groups=groups, data_layout="NHWC", kernel_layout="HWIO",
                                                    out_dtype="int32"))
        bb.emit_func_output(out)
    executable, report = schedules.build(bb.get(), ZNVER4, None, True, [])
    assert not report["unscheduled"], report
    assert "vpdpbusd" in executable.mod.imports[0].inspect_source("asm")
    if not host_runs(ZNVER4):
        return
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    pad = kernel // 2
    windows = np.lib.stride_tricks.sliding_window_view(
        np.pad(x.astype(np.int64), ((0, 0), (pad, pad), (pad, pad), (0, 0))), (kernel, kernel), axis=(1, 2))
    per_group = np.split(windows, groups, axis=3)  # [n, h, w, c/g, i, j] each
    weights = np.split(weight.astype(np.int64), groups, axis=3)  # [i, j, c/g, o/g] each
    want = np.concatenate([np.einsum("nhwcij,ijco->nhwo", w, k) for w, k in zip(per_group, weights)], axis=3)
    np.testing.assert_array_equal(got, want)
