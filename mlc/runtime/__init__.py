"""The thin runtime (numpy + apache-tvm-ffi only). `runner.py` is copied verbatim into artifacts."""

from mlc.runtime.runner import ArtifactError, FeedError, Runner, RunnerClosed, load_npz

__all__ = ["ArtifactError", "FeedError", "Runner", "RunnerClosed", "load_npz"]
