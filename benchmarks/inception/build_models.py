"""The Caffe2 zoo's Inception v1 and v2 (ONNX model zoo, opset 9) with seeded weights.

The `onnx` package ships both graphs as "light" models (onnx/backend/test/data/light/light_inception_v{1,2}.onnx):
the real graph with every weight replaced by a ConstantOfShape of 0.02. Here each ConstantOfShape becomes an
initializer of seeded normal values (He scale for conv and Gemm weights, N(0, 0.1) for biases, batch-norm
variances |N(1, 0.1)|), so activations stay in range through ~60 layers. Input data_0: 1x3x224x224.

    .venv/bin/python benchmarks/inception/build_models.py OUT_DIR     # writes inception_v1.onnx, inception_v2.onnx
    .venv/bin/python benchmarks/inception/build_models.py OUT_DIR densenet121 bvlc_alexnet   # other light models
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

SEED = 0


def _light(name: str) -> onnx.ModelProto:
    return onnx.load(str(Path(onnx.__file__).parent / "backend/test/data/light" / f"light_{name}.onnx"))


def _value(out: str, shape: tuple, rng: np.random.Generator, role: str = "") -> np.ndarray:
    if out.endswith("_w_0") and len(shape) >= 2:  # conv / fc weight
        fan_in = int(np.prod(shape[1:]))
        return rng.normal(0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
    if "var" in out or role == "var":
        return np.abs(rng.normal(1, 0.1, shape)).astype(np.float32) + 0.5
    if "scale" in out or role == "scale":
        return rng.normal(1, 0.1, shape).astype(np.float32)
    return rng.normal(0, 0.1, shape).astype(np.float32)


def seeded(name: str) -> onnx.ModelProto:
    model = _light(name)
    rng = np.random.default_rng(SEED)
    shapes = {t.name: tuple(numpy_helper.to_array(t)) for t in model.graph.initializer}
    # BatchNormalization's scale and variance by position: resnet50's and shufflenet's are `_bn_s_0`, `_bn_riv_0`
    # (a normal draw made variances negative, and every output NaN)
    roles = {name: role for node in model.graph.node if node.op_type == "BatchNormalization"
             for name, role in zip(node.input[1:5:3], ("scale", "var"))}
    inits, nodes = [], []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            inits.append(numpy_helper.from_array(_value(node.output[0], shapes[node.input[0]], rng,
                                                      roles.get(node.output[0], "")), node.output[0]))
        else:
            nodes.append(node)
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(nodes, name, [i for i in model.graph.input if i.name not in shapes and i.name not in
                                            {t.name for t in inits}],
                              list(model.graph.output), inits + [t for t in model.graph.initializer if t.name in used])
    # IR 4 on: initializers need not be graph inputs
    out = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=max(model.ir_version, 4))
    onnx.checker.check_model(out)
    return out


if __name__ == "__main__":
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    for n in sys.argv[2:] or ("inception_v1", "inception_v2"):  # other light models by name: bvlc_alexnet, ...
        onnx.save(seeded(n), str(out_dir / f"{n}.onnx"))
        print(out_dir / f"{n}.onnx")
