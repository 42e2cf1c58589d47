"""mlc: compile PyTorch, TensorFlow, PaddlePaddle and ONNX models with Apache TVM into verified,
self-contained artifacts.

    import mlc
    result = mlc.compile("model.onnx", target="x86")   # -> artifacts/model-x86/
    assert result.check                                 # compared with the reference outputs
    mlc.run(result.path, {"x": x}).outputs
"""

__version__ = "0.1.0"

_API = ("compile", "run", "check", "CompileResult", "RunResult")


def __getattr__(name: str):
    # Lazy so that `import mlc` (and `mlc --help`) stays fast; onnx and numpy load on first use.
    if name in _API:
        from mlc import api

        return getattr(api, name)
    raise AttributeError(f"module 'mlc' has no attribute {name!r}")


__all__ = list(_API) + ["__version__"]
