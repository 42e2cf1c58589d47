"""A Caffe2 zoo graph (batch 1, the batch written into its Reshape shapes) at batch N, checked against the batch-1
graph sample by sample with ONNX Runtime.

    .venv/bin/python benchmarks/throughput/rebatch.py shufflenet 8 OUT.onnx

Re-batching: the data input's first dim becomes N, every Reshape of an activation whose constant shape starts with 1
starts with N instead (Caffe2's channel shuffles and flattens), and the shapes inferred for batch 1 are dropped.
A weight's reshape (inception_v1's [1000, 1024]) is left alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent


def rebatch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    shapes = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Reshape" and node.input[0] not in weights and node.input[1] in shapes:
            shape = numpy_helper.to_array(shapes[node.input[1]]).copy()
            if shape[0] == 1:
                shape[0] = batch
                shapes[node.input[1]].CopyFrom(numpy_helper.from_array(shape, node.input[1]))
    for value in graph.input:
        if value.name not in weights:
            value.type.tensor_type.shape.dim[0].dim_value = batch
    for value in graph.output:
        value.type.tensor_type.shape.dim[0].dim_value = batch
    del graph.value_info[:]
    onnx.checker.check_model(model)
    return model


def check(single: onnx.ModelProto, batched: onnx.ModelProto, batch: int) -> None:
    """Raises unless the batched graph's outputs are the batch-1 graph's, sample by sample."""
    import onnxruntime as ort

    one, many = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                 for m in (single, batched))
    name = one.get_inputs()[0].name
    data = np.random.default_rng(0).normal(size=(batch, *one.get_inputs()[0].shape[1:])).astype(np.float32)
    together = many.run(None, {name: data})
    for i in range(batch):
        for alone, joint in zip(one.run(None, {name: data[i:i + 1]}), together):
            np.testing.assert_allclose(joint[i:i + 1], alone, rtol=1e-4, atol=1e-5)


def main() -> None:
    name, batch, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    sys.path.insert(0, str(HERE.parent / "inception"))
    from build_models import seeded

    single = seeded(name)
    batched = rebatch(single, batch)
    check(single, batched, batch)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(batched, str(out))


if __name__ == "__main__":
    main()
