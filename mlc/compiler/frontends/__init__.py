"""Frontends turn a user's model into ONNX plus a Reference (the source framework's outputs)."""
