"""A HuggingFace suite model exported to ONNX as `mlc bench --suite huggingface` builds it:
export_suite_model.py NAME OUT.onnx [--cut] (--cut: its config cut to 2 layers at full width)."""
import sys
from pathlib import Path

from mlc.bench import suites

name, out = sys.argv[1], Path(sys.argv[2])
if "--cut" in sys.argv:
    suites.MAX_PARAMS = 0  # every model counts as too big: the config is cut to CUT_LAYERS layers, full width
fm = suites.framework_model(f"suite:huggingface/{name}")
out.parent.mkdir(parents=True, exist_ok=True)
print(fm.notes, fm.export(out, set()))
