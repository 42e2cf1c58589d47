"""The data path in order: source (model -> ONNX + eager reference), prepare (shapes, passes, reference),
compile (orchestration), package (files + manifest), buckets."""
