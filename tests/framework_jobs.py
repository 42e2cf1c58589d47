"""Runs framework work for the frontend tests in a child process (tensorflow and paddle segfault when
imported together, and neither may enter the pytest process).

    python tests/framework_jobs.py OUT_DIR JOBS_JSON

JOBS_JSON is a list of jobs, each {"id", "kind", ...}:
  {"kind": "zoo", "framework": "tensorflow", "name": "cnn", "shapes": {...}}  build a zoo model
  {"kind": "save", "framework": ..., "name": "cnn", "format": "keras", "path": ...}  save it as a file
  {"kind": "open", "framework": ..., "path": ...}  open_model() on a file
zoo and open jobs export OUT_DIR/ID.onnx (every symbolic dim dynamic) and write ID.inputs.npz (seeded
feeds as mlc makes them) and ID.eager.npz (the framework's eager outputs). OUT_DIR/results.json maps
each id to {"ok", "exporter", "inputs", "outputs"} or {"ok": false, "error", "message"}."""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx

from mlc.compiler.frontends import onnx as onnx_frontend
from mlc.errors import MlcError

ZOO_MODULES = {"tensorflow": "mlc.models.keras_models", "paddle": "mlc.models.paddle_models"}
FRONTENDS = {"tensorflow": "mlc.compiler.frontends.tensorflow", "paddle": "mlc.compiler.frontends.paddle"}


def export_and_run(model, out: Path, job_id: str, shapes: dict) -> dict:
    onnx_path = out / f"{job_id}.onnx"
    exporter = model.export(onnx_path, set(model.symbolic_dims()))
    graph = onnx.load(str(onnx_path))
    specs = onnx_frontend.input_specs(graph)
    assert [s.name for s in specs] == [d.name for d in model.inputs], (specs, model.inputs)
    feeds = onnx_frontend.make_inputs(specs, onnx_frontend.concrete_shapes(specs, shapes))
    outputs = model.eager([feeds[s.name] for s in specs])
    names = [o.name for o in graph.graph.output]
    assert len(outputs) == len(names), (len(outputs), names)
    np.savez(out / f"{job_id}.inputs.npz", **feeds)
    np.savez(out / f"{job_id}.eager.npz", **dict(zip(names, outputs)))
    return {"ok": True, "exporter": exporter, "inputs": [s.name for s in specs], "outputs": names,
            "dims": [list(d.dims) for d in model.inputs], "notes": model.notes}


def run(job: dict, out: Path) -> dict:
    framework = job["framework"]
    if job["kind"] == "zoo":
        model = getattr(importlib.import_module(ZOO_MODULES[framework]), job["name"])()
        return export_and_run(model, out, job["id"], job.get("shapes", {}))
    if job["kind"] == "save":
        importlib.import_module(ZOO_MODULES[framework]).save(job["name"], job["format"], job["path"])
        return {"ok": True}
    if job["kind"] == "open":
        frontend = importlib.import_module(FRONTENDS[framework])
        return {"detect": frontend.detect(job["path"]),
                **export_and_run(frontend.open_model(job["path"]), out, job["id"], job.get("shapes", {}))}
    raise ValueError(job["kind"])


def main() -> None:
    out, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
    results = {}
    for job in jobs:
        try:
            results[job["id"]] = run(job, out)
        except MlcError as e:
            results[job["id"]] = {"ok": False, "error": type(e).__name__, "message": str(e)}
        except Exception as e:  # a framework exception escaping the frontend is a bug the test reports
            results[job["id"]] = {"ok": False, "error": "uncaught " + type(e).__name__,
                                  "message": traceback.format_exc()[-2000:]}
    (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
