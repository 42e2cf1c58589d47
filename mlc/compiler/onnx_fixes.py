"""The float8 forms, and the run-time optionals, mlc cannot compile, checked before import. The converter overrides
for node forms TVM 0.27 builds wrongly (#19) are in mlc.compiler.tvm_patches."""

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


def empty_optional_branch(model: onnx.ModelProto) -> bool:
    """An If (left to run time) with a branch that returns an empty Optional: TVM's importer has no value for "none"
    to return from a Relax If (it fails on the branch). Known conditions are inlined by static_control_flow first."""
    for node in model.graph.node:
        if node.op_type != "If":
            continue
        for branch in (a.g for a in node.attribute if a.name in ("then_branch", "else_branch")):
            empty = {n.output[0] for n in branch.node if n.op_type == "Optional" and not any(n.input)}
            if any(o.name in empty for o in branch.output):
                return True
    return False
