"""Target presets as data, host CPU / GPU detection, raw JSON targets."""

from mlc.runtime.runner import HOST_ARCH
from mlc.targets.presets import (PRESETS, Target, bf16_dot_feature, cuda_arch_number, describe_all, from_json,
                                 has_amx, has_bf16_dot, has_int8_dot, host_cpu_name, int8_dot_feature, local_cuda_arch,
                                 resolve, usable_cores)

__all__ = ["HOST_ARCH", "PRESETS", "Target", "bf16_dot_feature", "cuda_arch_number", "describe_all", "from_json",
           "has_amx", "has_bf16_dot", "has_int8_dot", "host_cpu_name", "int8_dot_feature", "local_cuda_arch", "resolve",
           "usable_cores"]
