"""Graph passes. ONNX-level passes run in the mlc process; Relax-level passes run in the TVM worker."""
