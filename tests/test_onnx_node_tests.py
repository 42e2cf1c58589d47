"""A fast subset of the ONNX backend node tests (benchmarks/onnx_node_tests/run.py runs them all): every
op mlc fixed for conformance, through mlc (compiled for x86 in this process, run on the shipped inputs)
and ONNX Runtime. mlc must pass each case ONNX Runtime passes; cases TVM cannot import exit 1, not 70."""

from __future__ import annotations


import numpy as np
import pytest



PASSING = [
    # Max/Min/Sum/Mean fold pairwise (TVM's stack-and-reduce failed to build)
    "test_max_example", "test_min_one_input", "test_sum_two_inputs", "test_mean_example", "test_max_int32",
    # NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss converters
    "test_nllloss_NCd1_weight_ii", "test_nllloss_NCd1d2_reduction_mean", "test_sce_mean_weight_ii_4d_log_prob",
    "test_sce_NCd1d2d3_none_no_weight_negative_ii_expanded",
    # LayerNormalization's Mean and InvStdDev outputs
    "test_layer_normalization_4d_axis1", "test_layer_normalization_2d_axis_negative_2",
    # Pow with mixed or integer types; reductions over an empty axis (reduce_empty_sets pass)
    "test_pow_types_int32_float32", "test_pow_types_int64_int64", "test_pow_types_float32_int32",
    "test_reduce_sum_empty_set", "test_reduce_min_empty_set", "test_reduce_log_sum_exp_empty_set_expanded",
    # CastLike's `like` input, read by no node, stays an input of the artifact
    "test_castlike_DOUBLE_to_FLOAT16_expanded",
    # QLinearMatMul, Celu, CenterCropPad; window functions and MelWeightMatrix evaluated at import
    "test_qlinearmatmul_2D_uint8_float32", "test_qlinearmatmul_3D_uint8_float16", "test_celu",
    "test_center_crop_pad_crop_and_pad", "test_center_crop_pad_crop_negative_axes_hwc", "test_hannwindow_symmetric",
    "test_melweightmatrix",
    # IsInf's sign attributes; ReduceMax/ReduceMin of booleans; If; index inputs of data inputs; RNN weights
    "test_isinf_negative", "test_reduce_max_bool_inputs", "test_if", "test_gathernd_example_int32_batch_dim1",
    "test_gru_defaults", "test_lstm_with_peepholes",
    # ConvertLayout skipped where its layout inference fails
    "test_squeeze_negative_axes",
    # the weight-packing split skipped where it fails
    "test_top_k_smallest", "test_scatter_elements_with_reduction_min", "test_cumsum_1d_exclusive",
    # parameter inputs compiled as constants
    "test_reduce_sum_do_not_keepdims_example", "test_slice_neg_steps",
    # integer divisors: no zero in the reference inputs
    "test_div_uint8", "test_mod_uint16",
    # read-only feeds
    "test_clip",
    # Resize as ONNX defines it (scale, not size ratio; axes; aspect policy; antialias; half_pixel_symmetric;
    # align_corners to one pixel), Upsample-9's scales input; Split with empty parts; NonMaxSuppression
    "test_resize_downsample_scales_linear_half_pixel_symmetric", "test_resize_downsample_scales_cubic",
    "test_resize_upsample_sizes_nearest_axes_3_2", "test_resize_downsample_sizes_nearest_not_larger",
    "test_resize_tf_crop_and_resize_axes_2_3", "test_resize_downsample_scales_linear_antialias",
    "test_upsample_nearest", "test_split_zero_size_splits_opset18", "test_nonmaxsuppression_two_classes",
    # Dropout's bool mask; BatchNormalization's training-mode statistics; ConvTranspose's output_shape
    "test_dropout_default_mask", "test_training_dropout_zero_ratio_mask", "test_batchnorm_example_training_mode",
    "test_convtranspose_output_shape", "test_quantizelinear_blocked_asymmetric", "test_dequantizelinear_blocked",
    # Cast to float8 e4m3fn, returned as its bits (saturated, and NaN past the range with saturate=0)
    "test_cast_FLOAT_to_FLOAT8E4M3FN", "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN",
    # plain ops, as a baseline
    "test_abs", "test_add_bcast", "test_conv_with_strides_padding", "test_softmax_axis_0", "test_matmul_2d",
    # a Shape output is an int64 tensor
    "test_shape_start_1_end_negative_1",
    # mlc/compiler/onnx_ops.py: OneHot with run-time values, EyeLike's dtype, MaxPool's Indices, OptionalHasElement
    # of nothing, ReverseSequence, Det, ConvInteger, QLinearConv, Col2Im, DeformConv, TfIdfVectorizer,
    # ConvTranspose's output_shape, Einsum as matmul
    "test_onehot_negative_indices", "test_eyelike_with_dtype", "test_maxpool_with_argmax_2d_precomputed_strides",
    "test_optional_has_element_empty_no_input_optional_input", "test_reversesequence_batch", "test_det_nd",
    "test_convinteger_with_padding", "test_qlinearconv", "test_col2im_pads", "test_deform_conv_with_mask_bias",
    "test_tfidfvectorizer_tf_batch_uniandbigrams_skip5", "test_convtranspose_output_shape", "test_einsum_batch_matmul",
    # ai.onnx.ml: ArrayFeatureExtractor, Binarizer, TreeEnsemble
    "test_ai_onnx_ml_array_feature_extractor", "test_ai_onnx_ml_binarizer",
    "test_ai_onnx_ml_tree_ensemble_set_membership",
    # expanded tests freeze their op's parameters; static_control_flow: If inlined, Loop and Scan unrolled
    "test_center_crop_pad_crop_axes_chw_expanded", "test_affine_grid_2d_expanded", "test_loop11", "test_scan9_sum",
    "test_range_int32_type_negative_delta_expanded",
    # reference inputs: a size-0 dim stays 0, Scatter's indices stay inside the data
    "test_reshape_allowzero_reordered", "test_scatter_without_axis",
    # a kernel with no "root" block (TVM's generic cumsum, reversed) is not written in place
    "test_cumsum_1d_reverse", "test_cumsum_1d_reverse_exclusive",
    # a 1x1 max pool with a stride over ceil-mode padding: its padding inlined (schedule_rules._feeds_elementwise)
    "test_maxpool_2d_ceil_output_size_reduce_by_one",
]


@pytest.mark.parametrize("name", PASSING)
def test_mlc_passes_where_onnxruntime_passes(node_tests, name):
    record = node_tests.run_case(name)
    assert record["ort"]["pass"], record["ort"]
    assert record["mlc"]["pass"], record["mlc"]


def test_a_slice_left_empty_by_seeded_starts_runs(node_tests):
    """As shipped (nothing frozen, no --inputs), mlc seeds starts past the ends: an empty slice, whose extent
    TVM's shape function made negative (std::bad_alloc, exit 70; tvm_patches._empty_dynamic_slices)."""
    record = node_tests.run_case("test_slice_default_axes", freeze_parameters=False)
    assert record["mlc"]["pass"], record["mlc"]


def test_unimportable_node_is_a_user_error(tmp_path):
    """A OneHot whose depth is a run-time input (its output shape depends on a value): exit 1 naming the op."""
    import onnx
    from onnx import TensorProto, helper

    from mlc import api
    from mlc.errors import MlcError

    graph = helper.make_graph([helper.make_node("OneHot", ["i", "depth", "v"], ["y"])], "g",
                              [helper.make_tensor_value_info("i", TensorProto.INT64, [3]),
                               helper.make_tensor_value_info("depth", TensorProto.INT64, []),
                               helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, None])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(tmp_path / "m.onnx"))
    with pytest.raises(MlcError) as error:
        api.compile(str(tmp_path / "m.onnx"), output=tmp_path / "art", isolate=False)
    assert int(error.value.exit_code) == 1
    assert "TVM's ONNX importer cannot convert a OneHot node" in str(error.value)


def test_out_of_scope_is_classified(node_tests):
    record = node_tests.run_case("test_adagrad")
    assert record["mlc"]["stage"] == "out_of_scope" and "training-only" in record["mlc"]["reason"]


SEQUENCES_AND_OPTIONALS = [
    # graph inputs and outputs that are sequences or optionals, given as tensors (mlc.frontends.onnx_values): x[0],
    # x[1], ... (an empty sequence as x[]), an optional as its value or left out
    "test_sequence_insert_at_back", "test_identity_opt", "test_optional_get_element_optional_sequence",
    "test_optional_has_element_empty_optional_input", "test_loop13_seq",
    # a one-element position given as a 1-D tensor (onnx_ops._scalar_position); SplitToSequence's split frozen
    "test_sequence_insert_at_front", "test_split_to_sequence_1",
    # SequenceMap unrolled over a sequence of known items; its expanded Loop over a folded SequenceLength; a map
    # whose unrolled copies fold to constants onnxslim's folding fails on
    "test_sequence_map_add_2_sequences", "test_sequence_map_identity_1_sequence_expanded",
    "test_sequence_map_extract_shapes",
    # a Loop whose body branches (an If) on whether its carried optional sequence holds a value: unrolled, the
    # branch inlined per copy under its own names, OptionalHasElement answered by what made the optional, and no
    # Identity left on a sequence (TVM's importer took its first item)
    "test_loop16_seq_none",
]


@pytest.mark.parametrize("name", SEQUENCES_AND_OPTIONALS)
def test_sequences_and_optionals_pass_with_the_shipped_inputs(node_tests, name):
    record = node_tests.run_case(name, shipped_inputs=True)
    assert record["ort"]["pass"], record["ort"]
    assert record["mlc"]["pass"], record["mlc"]


def test_a_sequence_output_with_a_frozen_input_is_checked_against_onnxruntime(node_tests, tmp_path):
    """The reference file made for a sequence output still takes the --freeze input it is fed (it was saved with the
    input folded in: ONNX Runtime refused the feed and the check fell back to onnx's reference evaluator)."""
    from mlc import api

    case = node_tests.node_test_dir() / "test_split_to_sequence_1"
    _, sets = node_tests.load_case(case)
    np.savez(tmp_path / "inputs.npz", **sets[0][0])
    result = api.compile(str(case / "model.onnx"), target="x86", output=tmp_path / "art", isolate=False,
                         inputs=str(tmp_path / "inputs.npz"), freeze=["split"])
    assert result.check.passed
    assert [i.name for i in result.manifest.inputs] == ["data"]
    assert result.manifest.reference.producer.startswith("onnxruntime"), result.manifest.reference.producer


def test_an_if_returning_an_empty_optional_at_run_time_is_a_user_error(node_tests, tmp_path):
    """TVM cannot return "none" from an If left to run time: exit 1 saying to freeze the condition, not 70; frozen
    (the harness freezes the condition of an If that returns an optional), the case passes."""
    import mlc.api as api
    from mlc.errors import UnsupportedModelError

    case = node_tests.node_test_dir() / "test_if_opt"
    np.savez(tmp_path / "cond.npz", cond=np.array(False))
    with pytest.raises(UnsupportedModelError, match="--freeze"):
        api.compile(str(case / "model.onnx"), output=tmp_path / "art", isolate=False, inputs=tmp_path / "cond.npz")
    record = node_tests.run_case("test_if_opt", shipped_inputs=True)
    assert record["frozen_inputs"] == ["cond"] and record["mlc"]["pass"], record


@pytest.mark.parametrize("op, keepdims", [("ReduceSum", 1), ("ReduceMax", 0), ("ReduceProd", 1),
                                          ("ReduceLogSumExp", 0)])
def test_reduce_empty_sets_pass_keeps_values(op, keepdims):
    """The pass turns a reduction over a size-0 axis into its identity constant; ONNX Runtime agrees."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from mlc.passes.onnx_rewrites import reduce_empty_sets

    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph([helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rewritten = reduce_empty_sets(model, {})
    assert [n.op_type for n in rewritten.graph.node] == ["Constant"]
    feeds = {"x": np.zeros((2, 0, 4), np.float32)}
    before, after = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                     .run(None, feeds)[0] for m in (model, rewritten))
    assert before.shape == after.shape == ((2, 1, 4) if keepdims else (2, 4))
    np.testing.assert_array_equal(before, after)


def _resize_model(opset: int, op: str, scales: list[float], mode: str, shape: list[int]):
    """One Resize/Upsample with constant scales (Resize-10 and Upsample-9 read them from input 1, Resize-11+
    from input 2, Upsample-7 from an attribute)."""
    from onnx import TensorProto, helper, numpy_helper

    values = numpy_helper.from_array(np.array(scales, np.float32), "scales")
    inputs, initializers, attrs = ["x", "scales"], [values], {"mode": mode}
    if op == "Resize" and opset >= 11:
        inputs = ["x", "", "scales"]
    if op == "Upsample" and opset < 9:
        inputs, initializers, attrs = ["x"], [], {"mode": mode, "scales": scales}
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", "d"])],
                              initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset, op, scales, mode", [
    (13, "Resize", [1, 1.5, 2, 1], "linear"),  # NHWC (TF exports): TVM's converter resizes the last two axes
    (10, "Resize", [1, 1, 0.5, 0.75], "nearest"),  # Resize-10: TVM read the scales as roi
    (9, "Upsample", [1, 1, 2, 1.5], "linear"),  # Upsample-9: TVM read the scales from an attribute
])
def test_resize_forms_match_onnxruntime(tmp_path, opset, op, scales, mode):
    import onnx
    import onnxruntime as ort

    import mlc.api as api

    path = tmp_path / "resize.onnx"
    onnx.save(_resize_model(opset, op, scales, mode, ["batch", 4, 6, 8]), str(path))  # the batch stays symbolic
    x = np.random.default_rng(0).standard_normal((3, 4, 6, 8)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    api.compile(str(path), target="x86", output=tmp_path / "art", isolate=False)
    got = api.open_runner(tmp_path / "art").run({"x": x})["y"]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_float8_value_read_by_a_node_is_refused(tmp_path):
    """mlc carries a cast to float8 as its bits, right for a graph output only: a node reading one is refused
    (exit 1 naming the op), not computed on the bits."""
    import onnx
    from onnx import TensorProto, helper

    import mlc.api as api
    from mlc.errors import UnsupportedModelError

    nodes = [helper.make_node("Cast", ["x"], ["f8"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Cast", ["f8"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), str(tmp_path / "f8.onnx"))
    with pytest.raises(UnsupportedModelError, match="cannot convert a Cast node .*float8") as caught:
        api.compile(str(tmp_path / "f8.onnx"), output=tmp_path / "art", isolate=False)
    assert caught.value.exit_code == 1


def test_summary_counts_frozen_cases_and_training_ops_apart(node_tests):
    """The record's figures: in-scope cases ONNX Runtime passes split into frozen and not frozen, and the figure
    with only the training-only ops left out (a string or sequence case counts as an mlc failure there)."""
    def case(name, ort, mlc, stage=None, reason="", frozen=None):
        record = {"name": name, "ort": {"pass": ort}, "mlc": {"pass": mlc, "stage": stage, "reason": reason}}
        return {**record, "frozen_inputs": frozen} if frozen else record

    s = node_tests.summarise([
        case("a", True, True), case("b", True, False, "compare"), case("c", True, True, frozen=["shape"]),
        case("d", True, False, "run", frozen=["axes"]), case("e", True, False, "out_of_scope", "string tensor 'x'"),
        case("f", False, False, "out_of_scope", "training-only op Adam")])
    assert (s["ort_pass_in_scope"], s["mlc_pass_where_ort_passes"]) == (4, 2)
    assert (s["frozen_where_ort_passes"], s["mlc_pass_frozen_where_ort_passes"]) == (2, 1)
    assert (s["not_frozen_where_ort_passes"], s["mlc_pass_not_frozen_where_ort_passes"]) == (2, 1)
    assert (s["training_only"], s["ort_pass_not_training"], s["mlc_pass_where_ort_passes_not_training"]) == (1, 5, 2)


def test_a_sequence_input_without_its_items_is_a_one_line_error(node_tests, tmp_path):
    """A sequence compiles for a fixed item count: without --inputs, or with a gap in its items, mlc says how to give
    them (exit 1)."""
    import mlc.api as api
    from mlc.errors import UnsupportedModelError

    model = str(node_tests.node_test_dir() / "test_identity_sequence" / "model.onnx")
    with pytest.raises(UnsupportedModelError, match=r"give its items with --inputs FILE.npz as 'x\[0\]', 'x\[1\]'"):
        api.compile(model, output=tmp_path / "a", isolate=False)
    np.savez(tmp_path / "gap.npz", **{"x[0]": np.zeros(2, np.float32), "x[2]": np.zeros(2, np.float32)})
    with pytest.raises(UnsupportedModelError, match=r"holds items \[0, 2\] of it"):
        api.compile(model, output=tmp_path / "b", isolate=False, inputs=tmp_path / "gap.npz")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("name", ["test_equal_string", "test_string_concat"])
def test_a_string_model_compiles_on_seeded_words(node_tests, tmp_path, name):
    """TVM has no string type (its import failed on dtype `object`, exit 70, then exit 1): the string ops run on
    the host (mlc.pipeline.strings), checked against ONNX Runtime on seeded words."""
    import mlc.api as api

    result = api.compile(str(node_tests.node_test_dir() / name / "model.onnx"), output=tmp_path / "a", isolate=False)
    assert result.check.passed and result.manifest.inputs[0].dtype == "string"


def test_tuning_a_string_model_is_a_one_line_error(node_tests, tmp_path):
    from helpers import assert_clean_error, run_mlc

    proc = run_mlc("tune", node_tests.node_test_dir() / "test_string_concat" / "model.onnx", "--target", "x86",
                   "--db", tmp_path / "db", "--budget", "1m")
    assert_clean_error(proc, 1, "holds strings", "`mlc compile MODEL.onnx` runs an ONNX model's string ops")


def test_sequence_outputs_with_seeded_inputs_pass_or_ask_for_inputs(node_tests):
    """Without --inputs, a sequence output's count comes from ONNX Runtime on seeded inputs: a scalar condition
    (test_if_seq) passes, and split sizes no seeded value fits are exit 1 asking for --inputs (both were exit 70)."""
    assert node_tests.run_case("test_if_seq", freeze_parameters=False)["mlc"]["pass"]
    record = node_tests.run_case("test_split_to_sequence_2", freeze_parameters=False)["mlc"]
    assert record["exit_code"] == 1 and "cannot run model.onnx on the reference inputs" in record["reason"], record
