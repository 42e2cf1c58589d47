"""--precision bf16/fp16: the accuracy gate (figures, verdicts, exit 3 naming the output) and the target check."""

import json
import re

import numpy as np
import pytest
from helpers import assert_clean_error, break_tvm_builds_of, host_runs, reseal, run_mlc

from mlc import targets
from mlc.check import LIMITS, gate


def test_gate_passes_bf16_rounding_and_fails_a_wrong_output_by_name():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 100)).astype(np.float32) * 5
    hidden = rng.standard_normal((2, 16, 32)).astype(np.float32)
    # bf16 rounding of every value (8 mantissa bits): what a good bf16 build is off by, and more
    rounded = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in
               {"logits": logits, "hidden": hidden}.items()}
    result = gate({"logits": logits, "hidden": hidden}, rounded, "bf16")
    assert result.passed, result.to_json()
    by_name = {o.name: o for o in result.outputs}
    assert by_name["logits"].top1_agreement == 1.0 and by_name["logits"].top5_agreement == 1.0
    assert by_name["hidden"].top1_agreement is None  # 3-D and not named logits: no classes axis
    assert 0 < by_name["hidden"].rel_error < 0.01 and by_name["hidden"].cosine_similarity > 0.9999

    wrong = dict(rounded, hidden=rounded["hidden"] + 0.2 * np.abs(hidden).max())
    result = gate({"logits": logits, "hidden": hidden}, wrong, "bf16")
    assert not result.passed and result.failed() == ["hidden"]


def test_gate_top1_counts_near_ties_but_not_real_flips():
    ref = np.array([[1.0, 0.999, -3.0, 0.0, 0.5, 0.1, 0.2], [3.0, -2.0, 0.0, 0.1, 0.2, 0.3, 0.4]], np.float32)
    tie = ref.copy()
    tie[0, 1] = 1.001  # a near tie flips: either answer is right at bf16
    figures = gate({"logits": ref}, {"logits": tie}, "bf16").outputs[0]
    assert figures.passed and figures.top1_agreement == 0.5 and figures.top1_near_ties == 1
    flip = ref.copy()
    flip[1, 1] = 3.1  # row 1's pick moves to a class the reference puts far below
    figures = gate({"logits": ref}, {"logits": flip}, "bf16").outputs[0]
    assert not figures.passed and any("top-1" in p for p in figures.problems)
    assert LIMITS["fp16"].min_cosine > LIMITS["bf16"].min_cosine


def test_bf16_build_passes_the_gate_and_a_doctored_reference_exits_3(tmp_path):
    """zoo:mlp in bf16: gate figures in the manifest; `mlc check` on a reference made wrong fails (convs: below)."""
    emulated = [] if targets.has_bf16_dot(targets.resolve("x86")) else ["--emulated"]  # CI hosts without bf16
    out = tmp_path / "mlp-bf16"
    proc = run_mlc("compile", "zoo:mlp", "--precision", "bf16", *emulated, "-o", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bf16 accuracy gate" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "bf16" and manifest["gate"]["passed"]
    assert ("avx512_bf16" in manifest["target"]["required_cpu_features"]) is not emulated  # vdpbf16ps needs it
    assert "--precision bf16" in manifest["compile"]["recipe"]
    assert any(p["name"] == "bf16_matmul" and p["op_changes"].get("astype", 0) > 0
               for p in manifest["compile"]["passes"])
    figures = manifest["gate"]["outputs"][0]
    assert 0 < figures["max_abs_error"] and figures["cosine_similarity"] > 0.999  # bf16 moved it, a little

    outputs = out / manifest["reference"]["outputs"]
    with np.load(outputs) as data:
        reference = {k: data[k] for k in data.files}
    name = next(iter(reference))
    reference[name] = reference[name] * -1.0  # a reference the compiled model cannot match
    np.savez(outputs, **reference)
    reseal(out)
    proc = run_mlc("check", out)
    assert_clean_error(proc, 3, "bf16", "accuracy gate", name)


@pytest.mark.parametrize("fails", ["pass", "build"])
def test_bf16_that_tvm_fails_on_builds_a_checked_fp32_artifact_with_a_warning(monkeypatch, tmp_path, fails):
    """The precision is an optional step: where TVM fails on the bf16 pass, or on every build of its bf16 module,
    the model is built at fp32, checked as fp32 and recorded so, and a note names the step and TVM's reason (a
    valid model never ends in exit 70). Failures injected in-process (isolate=False)."""
    from mlc import api
    from mlc.compiler import relax_passes

    emulated = not targets.has_bf16_dot(targets.resolve("x86"))
    if fails == "pass":
        def broken(*args):
            raise RuntimeError("Check failed: bf16 blew up (injected)")
        monkeypatch.setattr(relax_passes, "bf16_matmul", broken)
    else:
        break_tvm_builds_of(monkeypatch, "bfloat16")
    result = api.compile("zoo:mlp", output=tmp_path / "art", precision="bf16", emulated=emulated, isolate=False)
    assert result.check.passed and result.check.gate is None  # judged at fp32 tolerances
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["precision"] == "fp32"
    assert [p["status"] for p in manifest["compile"]["passes"] if p["name"] == "bf16_matmul"] == ["skipped"]
    assert [n for n in result.notes if "--precision bf16 (the artifact is fp32)" in n and "blew up" in n]


def test_bf16_on_a_target_without_bf16_is_a_one_line_error():
    proc = run_mlc("compile", "zoo:mlp", "--target", "x86-avx2", "--precision", "bf16")
    assert_clean_error(proc, 1, "no bf16 dot-product instructions", "--emulated")
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_mlc("compile", "zoo:mlp", "--precision", "int8")
    assert_clean_error(proc, 1, "--precision int8")
    proc = run_mlc("compile", "zoo:mlp", "--target", "x86-avx2", "--precision", "fp16")
    assert_clean_error(proc, 1, "fp16")


@pytest.mark.parametrize("tvm, expected", [
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4"}, "avx512_bf16"),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512", "mattr": ["+avx512bf16"]},
     "avx512_bf16"),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "mattr": ["-avx512bf16"]}, None),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "cascadelake"}, None),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1"}, "bf16"),  # Graviton3
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v2", "mattr": ["-bf16"]}, None),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76"}, None),  # Raspberry Pi 5
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72", "mattr": ["+neon", "+bf16"]}, "bf16"),
])
def test_bf16_capability_from_the_target(tvm, expected):
    target = targets.Target("t", "", tvm, "x86_64")
    assert targets.bf16_dot_feature(target) == expected and targets.has_bf16_dot(target) is (expected is not None)


def _dense_and_conv(relu: bool = False):
    """A Relax module of a dense layer (then a ReLU, with `relu`) and a 3x3 conv, both on seeded constant weights;
    seeded inputs for it, and numpy's fp32 outputs for them."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    image = relax.Var("image", relax.TensorType((1, 16, 8, 8), "float32"))
    w = (rng.standard_normal((64, 32)) * 0.1).astype(np.float32)
    k = (rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32)
    with bb.function("main", [x, image]):
        with bb.dataflow():
            dense = relax.op.matmul(x, relax.const(w))
            dense = bb.emit(relax.op.nn.relu(dense) if relu else dense)
            conv = bb.emit(relax.op.nn.conv2d(image, relax.const(k), padding=1))
            out = bb.emit_output(relax.Tuple([dense, conv]))
        bb.emit_func_output(out)
    feeds = [rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal((1, 16, 8, 8)).astype(np.float32)]
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(feeds[1], ((0, 0), (0, 0), (1, 1), (1, 1))),
                                                       (3, 3), axis=(2, 3))  # [1, 16, 8, 8, 3, 3]
    dense = feeds[0] @ w
    expected = {"dense": np.maximum(dense, 0) if relu else dense,
                "conv": np.einsum("nchwij,ocij->nohw", windows, k)}
    return bb.get(), feeds, expected


def test_bf16_kernels_run_on_vdpbf16ps_and_match_fp32():
    """A dense layer and a 3x3 conv in bf16: vdpbf16ps in the code for a target with AVX512-BF16 (none for one
    without: the emulated build), results within bf16 rounding of fp32 (run only where the host has the
    instructions)."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes, schedules

    module, feeds, expected = _dense_and_conv()
    mod = relax_passes.bf16_matmul(module, {}, None)
    for mcpu, dot in (("znver4", True), ("skylake-avx512", False)):
        target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu, "num-cores": 1}
        executable, report = schedules.build(mod, target, None, True, [])
        assert not report["unscheduled"], report
        asm = executable.mod.imports[0].inspect_source("asm")
        assert ("vdpbf16ps" in asm) is dot, mcpu
        if not host_runs(target):
            continue
        vm = relax.VirtualMachine(executable, tvm.cpu())
        dense, conv = (t.numpy() for t in vm["main"](*(tvm.runtime.tensor(f) for f in feeds)))
        result = gate(expected, {"dense": dense, "conv": conv}, "bf16")
        assert result.passed, result.to_json()
        assert all(o.max_abs_error > 1e-5 for o in result.outputs)  # bf16 rounding shows: not an fp32 build


def test_bf16_stores_round_with_vcvtneps2bf16_to_nearest_even():
    """A kernel storing bf16 rounds on AVX512-BF16's instruction where the target has it (TVM's own rounding takes
    six integer instructions a vector), with the same bits as round-half-to-even, ties included."""
    tvm = pytest.importorskip("tvm")
    import ml_dtypes
    from tvm import relax

    from mlc.compiler import schedules

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.astype(relax.op.nn.relu(x), "bfloat16"))
        bb.emit_func_output(out)
    feed = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    feed[0, :4] = [1 + 2**-8, 1 + 3 * 2**-8, 2 - 2**-9, 3.0000002]  # two ties (to even: down, up), carries
    for mcpu, native in (("znver4", True), ("skylake-avx512", False)):
        target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu, "num-cores": 1}
        executable, _ = schedules.build(bb.get(), target, None, True, [])
        assert ("vcvtneps2bf16" in executable.mod.imports[0].inspect_source("asm")) is native, mcpu
        if not host_runs(target):
            continue
        vm = relax.VirtualMachine(executable, tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(feed)).numpy()
        expected = np.maximum(feed, 0).astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16), err_msg=mcpu)


def test_bf16_an_activation_a_conv_and_a_skip_add_read_is_stored_once_in_bf16():
    """A resnet block's input feeds its first conv (as bf16) and its skip add: the kernel that makes it writes
    bf16 only, and the add reads that widened (OpenVINO's bf16 stores activations so too); the block's values stay
    within bf16 rounding of numpy's."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes, schedules

    rng = np.random.default_rng(0)
    k1, k2 = ((rng.standard_normal((32, 32, 1, 1)) * 0.2).astype(np.float32) for _ in range(2))
    bb = relax.BlockBuilder()
    image = relax.Var("image", relax.TensorType((1, 32, 8, 8), "float32"))
    with bb.function("main", [image]):
        with bb.dataflow():
            x = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(image, relax.const(k1))))
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(k2)))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(y, x)))
        bb.emit_func_output(out)
    mod = relax_passes.bf16_matmul(bb.get(), {}, None)
    values = {b.var: b.value for b in mod["main"].body.blocks[0].bindings}
    add = next(v for v in values.values() if isinstance(v, relax.Call) and v.op.name == "relax.add")
    skip = values[add.args[1]]
    assert skip.op.name == "relax.astype" and str(skip.attrs.dtype) == "float32"
    assert str(skip.args[0].ty.dtype) == "bfloat16"
    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 1}
    executable, report = schedules.build(mod, target, None, True, [])
    assert not report["unscheduled"], report
    if not targets.has_bf16_dot(targets.resolve("x86")):
        return
    feed = rng.standard_normal((1, 32, 8, 8)).astype(np.float32)
    result = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(feed)).numpy()
    first = np.maximum(np.einsum("nchw,oc->nohw", feed, k1[:, :, 0, 0]), 0)
    expected = np.maximum(np.einsum("nchw,oc->nohw", first, k2[:, :, 0, 0]) + first, 0)
    gated = gate({"block": expected}, {"block": result}, "bf16")
    assert gated.passed, gated.to_json()


@pytest.mark.parametrize("channels,size,kernel,stride,padding,rows,out_channels", [
    (32, 17, (1, 7), 1, (0, 3), 18, 32),  # inception_v3's 1x7 convs: 17 rows and one more (a 9-row tile)
    (32, 73, (3, 3), 1, (0, 0), 72, 32),  # its 80 -> 192 3x3: 71 rows and one more, computed on zero padding
    (32, 29, (3, 3), 2, (1, 1), 16, 32),  # 15 rows at stride 2, and one more
    (32, 147, (3, 3), 2, (0, 0), 77, 32),  # 73 rows at stride 2: four more
    (32, 14, (1, 1), 1, (0, 0), 14, 32),  # 14 rows: a 7-row tile, none more
    (64, 13, (1, 1), 1, (0, 0), 14, 1000),  # squeezenet's classifier: 1000 -> 1024 channels (two vectors)
    (3, 223, (7, 7), 2, (0, 0), 110, 32),  # squeezenet's RGB stem: a zero fourth channel, 109 rows and one more
    (3, 224, (7, 7), 2, (3, 3), 112, 32)])  # resnet50's: its padding in the input's pad (with the fourth channel)
def test_bf16_conv_the_tile_does_not_fit_runs_on_vdpbf16ps(channels, size, kernel, stride, padding, rows,
                                                           out_channels):
    """The bf16 register tile takes no predicated tail (tensorize), and a conv cannot be padded in the kernel (not
    an einsum): output rows (its width) that the two-vector tile does not divide, and channels no multiple of two
    vectors, get extra ones computed on zero padding and sliced off. An odd depth (vdpbf16ps takes pairs) gets a
    zero channel, and a shallow input its spatial padding in the same pad. vdpbf16ps is in the code (before, such
    kernels fell back to fp32 arithmetic on bf16 values) and the values are within bf16 rounding of numpy's."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes, schedules

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    image = relax.Var("image", relax.TensorType((1, channels, size, size), "float32"))
    k = (rng.standard_normal((out_channels, channels, *kernel)) * 0.1).astype(np.float32)
    with bb.function("main", [image]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(image, relax.const(k), strides=stride, padding=padding))
        bb.emit_func_output(out)
    mod = relax_passes.convert_layout(relax_passes.bf16_matmul(bb.get(), {}, None), {}, None)
    convs = [b.value for b in mod["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.conv2d"]
    assert [(int(c.ty.shape[2]), int(c.ty.shape[3])) for c in convs] == [(rows, -(-out_channels // 32) * 32)]  # NHWC
    if channels < 16:  # the conv's own padding loop would run over vectors straddling pixels
        assert [int(p) for p in convs[0].attrs.padding] == [0, 0, 0, 0]
    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 1}
    executable, report = schedules.build(mod, target, None, True, [])
    assert not report["unscheduled"], report
    assert "vdpbf16ps" in executable.mod.imports[0].inspect_source("asm")
    if not targets.has_bf16_dot(targets.resolve("x86")):
        return
    feed = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    conv = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(feed)).numpy()
    padded = np.pad(feed, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=(2, 3))[:, :, ::stride, ::stride]
    expected = np.einsum("nchwij,ocij->nohw", windows, k)
    assert conv.shape == expected.shape
    result = gate({"conv": expected}, {"conv": conv}, "bf16")
    assert result.passed, result.to_json()


@pytest.mark.parametrize("channels,out_channels,groups,kernel,dot", [
    (64, 64, 2, 3, "zmm"),  # alexnet's group-2 3x3 convs: 32 channels a group
    (32, 64, 2, 5, "zmm"),  # its 5x5 (16 in a group, 32 out)
    (60, 60, 3, 1, "zmm"),  # ShuffleNet's 20 a group: padded to 32 per group (grouped_conv)
    (64, 64, 8, 3, "ymm"),  # resnext's 8 a group: the narrow tile on 8 lanes
    (128, 128, 32, 3, "xmm"),  # and its 4 a group, on 4
    (32, 32, 16, 3, None)])  # 2 a group: depthwise-like, float32
def test_bf16_grouped_conv_runs_per_group_on_vdpbf16ps(channels, out_channels, groups, kernel, dot):
    """A grouped conv of whole vectors a group (or a group padded to them, or of 8 or 4 channels, on vdpbf16ps's
    ymm and xmm forms) runs its bf16 per-group tile on vdpbf16ps (before, grouped convs stayed fp32 in a bf16
    build: alexnet's at 2x OpenVINO's bf16, and resnext's narrow groups until the ymm/xmm forms); its padding is a
    copy, not a select in the tile's loads, which tensorize cannot match. The values are within bf16 rounding of
    numpy's."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes, schedules

    rng = np.random.default_rng(0)
    size, pad = 9, kernel // 2
    bb = relax.BlockBuilder()
    image = relax.Var("image", relax.TensorType((1, channels, size, size), "float32"))
    k = (rng.standard_normal((out_channels, channels // groups, kernel, kernel)) * 0.1).astype(np.float32)
    with bb.function("main", [image]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(image, relax.const(k), padding=pad, groups=groups))
        bb.emit_func_output(out)
    mod = relax_passes.bf16_matmul(bb.get(), {}, None)
    (conv,) = [b.value for b in mod["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.conv2d"]
    assert str(conv.args[1].ty.dtype) == ("bfloat16" if dot else "float32")
    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 1}
    executable, report = schedules.build(relax_passes.convert_layout(mod, {}, None), target, None, True, [])
    assert not report["unscheduled"], report
    registers = set(re.findall(r"vdpbf16ps\s+[^,]*%([xyz]mm)", executable.mod.imports[0].inspect_source("asm")))
    assert registers == ({dot} if dot else set())
    if not targets.has_bf16_dot(targets.resolve("x86")):
        return
    feed = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    result = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(feed)).numpy()
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(feed, ((0, 0), (0, 0), (pad, pad), (pad, pad))),
                                                       (kernel, kernel), axis=(2, 3))
    per_group = [np.einsum("nchwij,ocij->nohw", w, g) for w, g in
                 zip(np.split(windows, groups, axis=1), np.split(k, groups, axis=0))]
    expected = np.concatenate(per_group, axis=1)
    assert result.shape == expected.shape
    gated = gate({"conv": expected}, {"conv": result}, "bf16")
    assert gated.passed, gated.to_json()


@pytest.mark.parametrize("size,batch,prefetched", [(7, 1, True), (7, "batch", True), (14, 1, False)])
def test_bf16_conv_read_by_few_row_tiles_prefetches_its_next_weight_panel(size, batch, prefetched):
    """resnet50's last 3x3 convs in bf16: at 7 x 7 each 288 KB weight panel (3 x 3 x 512 x 32 bf16) is read by 7
    row tiles, and each of them prefetches the next panel (in the model: 0.53 -> 0.45-0.48 ms); a symbolic batch
    counts one image's. At 14 x 14 (28 row tiles) the redundant prefetches cost more than they hid: none. The
    prefetched build computes the conv (64 channels: the second panel is a prefetched one)."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes, schedules

    rng = np.random.default_rng(0)
    dim = tvm.tirx.Var("batch", "int64") if batch == "batch" else batch
    bb = relax.BlockBuilder()
    image = relax.Var("image", relax.TensorType((dim, 512, size, size), "float32"))
    k = (rng.standard_normal((64, 512, 3, 3)) * 0.02).astype(np.float32)
    with bb.function("main", [image]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(image, relax.const(k), padding=1))
        bb.emit_func_output(out)
    mod = relax_passes.convert_layout(relax_passes.bf16_matmul(bb.get(), {}, None), {}, None)
    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 1}
    executable, report = schedules.build(mod, target, None, True, [])
    assert not report["unscheduled"], report
    asm = executable.mod.imports[0].inspect_source("asm")
    assert "vdpbf16ps" in asm and ("prefetcht1" in asm) is prefetched
    if not targets.has_bf16_dot(targets.resolve("x86")):
        return
    feed = rng.standard_normal((1, 512, size, size)).astype(np.float32)
    conv = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(feed)).numpy()
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(feed, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3),
                                                       axis=(2, 3))
    result = gate({"conv": np.einsum("nchwij,ocij->nohw", windows, k)}, {"conv": conv}, "bf16")
    assert result.passed, result.to_json()


def test_fp16_on_cuda_computes_in_half(tmp_path):
    """--precision fp16 (ToMixedPrecision) runs before the GPU build fuses, so the kernels compute in half; the gate
    runs where a GPU is present (`mlc check`)."""
    out = tmp_path / "mlp-fp16"
    proc = run_mlc("compile", "zoo:mlp", "--target", "cuda-t4", "--precision", "fp16", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "half" in (out / "kernels" / "cuda.cu").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "fp16" and manifest["outputs"][0]["dtype"] == "float32"
    assert any(p["name"] == "mixed_precision" for p in manifest["compile"]["passes"])


def test_gpu_bf16_computes_what_fp16_would_in_bfloat16():
    """The GPU's bf16 step is ToMixedPrecision with bfloat16 for float16: no float16 is left, matmuls and convs read
    bfloat16 and accumulate in float32, and the module (built here for the CPU: the same Relax a CUDA build
    compiles) is within bf16 rounding of fp32, where an fp32 build would be exact."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes, schedules

    module, feeds, expected = _dense_and_conv(relu=True)
    mod = relax_passes.gpu_bf16(module)
    script = mod.script()
    assert "float16" not in script.replace("bfloat16", "") and 'R.astype(x, dtype="bfloat16")' in script
    assert script.count('out_dtype="float32"') == 2
    executable, _ = schedules.build(mod, {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64",
                                          "num-cores": 1}, None, True, [])
    vm = relax.VirtualMachine(executable, tvm.cpu())
    dense, conv = (t.numpy().astype(np.float32) for t in vm["main"](*(tvm.runtime.tensor(f) for f in feeds)))
    result = gate(expected, {"dense": dense, "conv": conv}, "bf16")
    assert result.passed, result.to_json()
    assert all(o.max_abs_error > 3e-3 for o in result.outputs)  # bf16 rounding: fp16 stays under 2e-3 here


def test_bf16_attention_matmuls_of_two_activations_run_on_vdpbf16ps():
    """Attention's Q x K^T and P x V multiply two activations (no weight to pack at compile time): with whole vectors
    of columns and an even depth they run in bf16 on vdpbf16ps, the right operand's pairs packed in the kernel at
    run time, a symbolic batch included; a column count no vector fits (197 keys) stays fp32. Values within bf16
    rounding of numpy's."""
    tvm = pytest.importorskip("tvm")
    from tvm import relax

    from mlc.compiler import relax_passes, schedules

    batch = tvm.tirx.Var("batch", "int64")
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((batch, 3, 197, 64), "float32"))
    keys = relax.Var("keys", relax.TensorType((batch, 3, 64, 208), "float32"))
    odd = relax.Var("odd", relax.TensorType((batch, 3, 64, 197), "float32"))
    with bb.function("main", [q, keys, odd]):
        with bb.dataflow():
            scores = bb.emit(relax.op.matmul(q, keys))
            unpadded = bb.emit(relax.op.matmul(q, odd))
            out = bb.emit_output(relax.Tuple([scores, unpadded]))
        bb.emit_func_output(out)
    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 1}
    with tvm.target.Target(target):
        mod = relax_passes.bf16_matmul(bb.get(), {}, None)
    matmuls = [b.value for b in mod["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.op.name == "relax.matmul"]
    assert [[str(a.ty.dtype) for a in m.args] for m in matmuls] == [["bfloat16"] * 2, ["float32"] * 2]
    executable, report = schedules.build(mod, target, None, True, [])
    assert not report["unscheduled"], report
    assert "vdpbf16ps" in executable.mod.imports[0].inspect_source("asm")
    if not targets.has_bf16_dot(targets.resolve("x86")):
        return
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((2, 3, 197, 64)), rng.standard_normal((2, 3, 64, 208)),
             rng.standard_normal((2, 3, 64, 197))]
    feeds = [f.astype(np.float32) for f in feeds]
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](*(tvm.runtime.tensor(f) for f in feeds))
    result = gate({"scores": feeds[0] @ feeds[1]}, {"scores": got[0].numpy()}, "bf16")
    assert result.passed, result.to_json()
    np.testing.assert_allclose(got[1].numpy(), feeds[0] @ feeds[2], rtol=1e-4, atol=1e-4)
