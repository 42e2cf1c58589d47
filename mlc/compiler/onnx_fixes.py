"""The float8 forms mlc cannot compile, checked before import. The converter overrides for node forms TVM 0.27
builds wrongly (#19) are in mlc.compiler.tvm_patches."""

from __future__ import annotations

from typing import Optional

import onnx

FLOAT8 = {onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
          onnx.TensorProto.FLOAT8E5M2FNUZ}


def float8_problem(model: onnx.ModelProto) -> Optional[str]:
    """Why mlc cannot compile the model's float8 casts, or None. TVM imports float8 values as float32; mlc
    computes a cast to float8 e4m3fn as the value's bits (uint8, what ONNX Runtime returns), right only for a
    value the graph returns and no node reads."""
    read = {name for node in model.graph.node for name in node.input}
    for node in model.graph.node:
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if to in FLOAT8 and node.output[0] in read:
            return "a float8 value that other nodes read: mlc computes float8 casts of graph outputs only"
    return None
