"""The data path in order: options (ModelSpec, CompileOptions), source (model -> ONNX + eager reference), prepare
(shapes, passes, reference), compile (the steps), package (files + manifest), buckets; then run/check, export and
debug. Import the modules themselves (this package re-exports nothing, so importing one stays light)."""
