"""ONNX-level clean-up before TVM import: constant folding and shape inference.

Raw torch exports of BERT-like models do not import into TVM 0.27 (broadcast_to / Reshape of a
computed shape); after folding shape arithmetic into constants they import and match ORT."""

from __future__ import annotations

import contextlib
import io
import warnings

import onnx


def clean(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Constant folding, dead-node removal and shape inference. Returns the model and warnings."""
    notes: list[str] = []
    try:
        import onnxslim

        # onnxslim prints a summary table to stdout; keep the CLI output ours.
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            slimmed = onnxslim.slim(model)
        if slimmed is not None:
            model = slimmed
    except Exception as e:  # onnxslim is best effort; TVM import may still succeed without it
        notes.append(f"constant folding (onnxslim) skipped: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}")
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:
        notes.append(f"shape inference failed: {str(e).splitlines()[0][:200]}")
    return model, notes
