"""The compiler: ONNX -> Relax -> TVM build, default CPU schedules, MetaSchedule. The only package that imports
tvm, and only in its worker processes (worker.py, metaschedule.py) and the modules they import."""

from mlc.compiler.client import check_supported, compile_in_worker, format_unsupported
from mlc.compiler.tvm_install import TVM_PIN, tvm_package_dir

__all__ = ["TVM_PIN", "check_supported", "compile_in_worker", "format_unsupported", "tvm_package_dir"]
