"""ONNX frontend helpers: input descriptions, --input-shape parsing, reference inputs."""

import numpy as np
import pytest

from mlc.frontends import onnx as frontend
from mlc.errors import InputError
from mlc.models import ZOO


def test_input_specs_keep_symbolic_dims_and_find_index_ranges():
    specs = {s.name: s for s in frontend.input_specs(ZOO["transformer"].build())}
    assert specs["input_ids"].shape == ["batch", 32] and specs["input_ids"].dtype == "int64"
    assert specs["input_ids"].value_range == (0, 999)  # vocab 1000 embedding table
    assert specs["attention_mask"].value_range is None


def test_parse_input_shape():
    assert frontend.parse_input_shape("input_ids:1x128") == ("input_ids", [1, 128])
    assert frontend.parse_input_shape("serving_default:0:1x3") == ("serving_default:0", [1, 3])
    assert frontend.parse_input_shape("4x16") == (None, [4, 16])
    for bad in ("x:", "x:1x", "x:-1x3", "x:1.5", "x:0x3"):
        with pytest.raises(InputError):
            frontend.parse_input_shape(bad)


def test_reference_inputs_are_seeded_and_in_range():
    specs = frontend.input_specs(ZOO["transformer"].build())
    shapes = frontend.concrete_shapes(specs, {})
    assert shapes == {"input_ids": [2, 32], "attention_mask": [2, 32]}  # one size per symbolic name
    a, b = frontend.make_inputs(specs, shapes), frontend.make_inputs(specs, shapes)
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert a["input_ids"].max() <= 999 and a["input_ids"].min() >= 0
    assert (a["attention_mask"] == 1).all()
