"""Models for the grouped-conv study (#39), built offline with seeded weights.

    .venv/bin/python benchmarks/grouped-conv/models.py OUT_DIR

writes OUT_DIR/shufflenet-v1.onnx (`mlc export zoo:shufflenet-v1`, static batch 1) and one single-conv ONNX model
per layer in LAYERS: ShuffleNet v1's 1x1 group-3 convs, the issue's square 240/480/960 ones, a resnext-style
32-group 3x3, and a plain and a depthwise conv as controls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

# name -> (channels in, channels out, height = width, kernel, groups)
LAYERS = {
    "g3-240-28": (240, 240, 28, 1, 3),
    "g3-480-14": (480, 480, 14, 1, 3),
    "g3-960-7": (960, 960, 7, 1, 3),
    "g3-240to60-28": (240, 60, 28, 1, 3),   # shufflenet stage 2's reduce and expand
    "g3-60to240-28": (60, 240, 28, 1, 3),
    "g3-480to120-14": (480, 120, 14, 1, 3),
    "g3-120to480-14": (120, 480, 14, 1, 3),
    "g3-960to240-7": (960, 240, 7, 1, 3),
    "g3-240to960-7": (240, 960, 7, 1, 3),
    "g2-256-28": (256, 256, 28, 1, 2),
    "g4-256-28": (256, 256, 28, 1, 4),
    "g32-3x3-128-56": (128, 128, 56, 3, 32),  # resnext26ts stage 1's grouped 3x3 (4 channels a group)
    "g32-3x3-256-28": (256, 256, 28, 3, 32),
    "g3-240to120-28": (240, 120, 28, 1, 3),   # shufflenet stage 3's first reduce (40 a group, at 28x28)
    "g10-3x3-240-14": (240, 240, 14, 3, 10),  # regnetx-600mf-style 3x3 (24 channels a group)
    "g4-3x3-48-28": (48, 48, 28, 3, 4),       # 12 channels a group
    "g1-256-28": (256, 256, 28, 1, 1),        # controls: a plain conv, a depthwise one
    "dw-3x3-240-28": (240, 240, 28, 3, 240),
}


def conv_model(cin: int, cout: int, size: int, kernel: int, groups: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    fan_in = cin // groups * kernel ** 2
    weight = (rng.standard_normal((cout, cin // groups, kernel, kernel)) / np.sqrt(fan_in)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["conv"], group=groups, kernel_shape=[kernel, kernel],
                            pads=[kernel // 2] * 4)
    relu = helper.make_node("Relu", ["conv"], ["y"])
    graph = helper.make_graph([node, relu], "grouped_conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    import onnx

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, shape in LAYERS.items():
        onnx.save(conv_model(*shape), out / f"{name}.onnx")
    subprocess.run([sys.executable, "-m", "mlc", "export", "zoo:shufflenet-v1", "--input-shape", "images:1x3x224x224",
                    "-o", str(out / "shufflenet-v1.onnx")], check=True)


if __name__ == "__main__":
    main()
