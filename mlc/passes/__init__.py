"""Graph passes: the registry (registry.py), ONNX passes (onnx.py), RNN lowering (rnn.py), Relax passes (relax.py)."""

from mlc.passes.registry import (DEFAULT_OPT_LEVEL, GPU_DEVICES, LEVELS, OPT_LEVELS, REGISTRY, RNN_OPS, Option, Options,
                                 Pass, PassFailed, Step, describe_all, parse_config, plan)

__all__ = ["DEFAULT_OPT_LEVEL", "GPU_DEVICES", "LEVELS", "OPT_LEVELS", "REGISTRY", "RNN_OPS", "Option", "Options",
           "Pass", "PassFailed", "Step", "describe_all", "parse_config", "plan"]
