"""mlc: compile PyTorch, TensorFlow, PaddlePaddle and ONNX models with Apache TVM into verified,
self-contained artifacts.

    import mlc
    result = mlc.compile("model.onnx", target="x86")   # -> artifacts/model-x86/
    assert result.check                                 # compared with the reference outputs
    mlc.run(result.path, {"x": x}).outputs
"""

import os

__version__ = "0.1.0"

# ONNX Runtime >= 1.31 starts a telemetry client on Linux (a session file in $TMPDIR, a database
# in ~/.cache/Microsoft, uploads). mlc runs offline; opt out unless the user decided otherwise.
# Read when onnxruntime loads, so it must be set before any import of it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

_API = ("compile", "export", "run", "check", "debug", "tune", "CompileResult", "RunResult")


def __getattr__(name: str):
    # Lazy so that `import mlc` (and `mlc --help`) stays fast; onnx and numpy load on first use.
    if name in _API:
        from mlc import api

        return getattr(api, name)
    raise AttributeError(f"module 'mlc' has no attribute {name!r}")


__all__ = list(_API) + ["__version__"]
