"""The suite's XLNetLMHeadModel at full width cut to 2 layers, exported to ONNX: export_xlnet.py OUT.onnx"""
import sys
from pathlib import Path

from mlc.bench import suites

suites.MAX_PARAMS = 0  # every model counts as too big: the config is cut to CUT_LAYERS layers, full width
fm = suites.framework_model("suite:huggingface/XLNetLMHeadModel")
out = Path(sys.argv[1])
out.parent.mkdir(parents=True, exist_ok=True)
print(fm.notes, fm.export(out, set()))
