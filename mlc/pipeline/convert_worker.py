"""The frontend worker: loads a model in its own framework, exports it to ONNX and records the
framework's eager outputs on seeded inputs. Run as

    python -m mlc.pipeline.convert_worker REQUEST.json

One framework per process (tensorflow and paddle crash when imported together), and a framework
crash cannot take mlc down. Writes its result beside the request for the parent (mlc.child_process)."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Sequence

from mlc.pipeline.convert_contract import ConvertRequest, ConvertResult

MODEL = "model.onnx"
FEEDS = "feeds.npz"
EAGER = "eager.npz"


def framework_model(source: str, framework: str, *, input_shapes: Sequence[str] = (), exporter: str = "auto"):
    """The framework's model of `source` (a file, or zoo:NAME built in the framework); the options go to the
    frontend's open_model where it takes them."""
    from mlc import models
    from mlc.frontends.base import FRAMEWORKS

    if framework == "torch":
        from mlc.frontends import torch as torch_frontend

        torch_frontend.default_exporter = exporter
    if models.is_zoo(source):
        return models.get(source).builder(framework)()
    open_model = FRAMEWORKS[framework].frontend().open_model
    accepted = inspect.signature(open_model).parameters
    given = {"input_shapes": list(input_shapes), "exporter": exporter}
    return open_model(source, **{k: v for k, v in given.items() if k in accepted})


def framework_version(framework: str) -> str:
    from mlc.frontends.base import FRAMEWORKS

    package = importlib.import_module(FRAMEWORKS[framework].package)
    return getattr(package, "__version__", "unknown")


def check_no_gained_inputs(fm, specs: list) -> None:
    """The export takes no input the framework model does not: a constant or variable the exporter left as a graph
    input would be an input users must feed (seeded noise in the reference). UnsupportedModelError naming them."""
    from mlc.errors import UnsupportedModelError
    from mlc.frontends.base import FRAMEWORKS

    declared = {d.name for d in fm.inputs}
    gained = [s.name for s in specs if s.name not in declared]
    if len(specs) > len(fm.inputs) and gained:
        display = FRAMEWORKS[fm.framework].display
        raise UnsupportedModelError(f"the ONNX export has input(s) the {display} model does not take: "
                                    f"{', '.join(gained)} (values the exporter did not fold into the graph); "
                                    f"the model's inputs are: {', '.join(d.name for d in fm.inputs) or 'none'}")


def convert(request: ConvertRequest) -> ConvertResult:
    import numpy as np
    import onnx

    from mlc.compiler.contract import Note, NoteKind
    from mlc.frontends import onnx as onnx_frontend
    from mlc.frontends.onnx_export import cast_outputs, image_sizes
    from mlc.errors import InputError
    from mlc.runtime.runner import save_npz

    out = Path(request.out_dir)
    fm = framework_model(request.source, request.framework, input_shapes=request.input_shapes,
                         exporter=request.exporter)
    symbolic = fm.symbolic_dims()
    dynamic = set(symbolic) if request.dynamic is None else set(request.dynamic)
    unknown = sorted(dynamic - set(symbolic))
    if unknown:
        raise InputError(f"--dynamic names {', '.join(unknown)}, which the model does not have; its dims that can be "
                         f"dynamic are: {', '.join(symbolic) or 'none'}")
    exporter = fm.export(out / MODEL, dynamic)
    model = onnx_frontend.load_graph(out / MODEL)
    specs = onnx_frontend.input_specs(model)
    check_no_gained_inputs(fm, specs)
    fixed = onnx_frontend.resolve_input_shapes(specs, request.input_shapes)
    # The user's example sizes are the compile sizes, but for dims --dynamic keeps symbolic: those are checked at
    # other sizes (batch 2 / 16), where an export that baked in a traced size shows it.
    kept = set(request.dynamic or ())
    sizes = ({d: n for d, n in fm.example_sizes.items() if d not in kept} if fm.user_examples
             else image_sizes(specs))
    if request.inputs:  # --inputs: the user's samples are what the framework runs on
        from mlc.runtime.runner import FeedError, load_npz

        try:
            data = load_npz(request.inputs, [s.name for s in specs])
        except FeedError as e:
            raise InputError(f"--inputs: {e}") from None
        feeds = onnx_frontend.check_samples(specs, data, f"--inputs {request.inputs}")
    else:
        feeds = onnx_frontend.make_inputs(specs, onnx_frontend.concrete_shapes(specs, fixed, sizes))
    # eager takes fm.inputs' order: bind by name where the export kept the names (it may reorder inputs).
    order = [d.name for d in fm.inputs] if {d.name for d in fm.inputs} == set(feeds) else [s.name for s in specs]
    outputs = fm.eager([feeds[n] for n in order])
    names = [o.name for o in model.graph.output]
    if len(outputs) != len(names):
        raise InputError(f"the {fm.framework} model returns {len(outputs)} tensors but its ONNX export has "
                         f"{len(names)} outputs; return a flat tuple of tensors from the model")
    # An output the exporter left in another float type than the framework's (fp16 summed in fp32) is cast back.
    cast_outputs(out / MODEL, {n: np.asarray(v).dtype for n, v in zip(names, outputs)})
    save_npz(out / FEEDS, feeds)
    save_npz(out / EAGER, {n: np.asarray(v) for n, v in zip(names, outputs)})
    return ConvertResult(
        framework=fm.framework, framework_version=framework_version(fm.framework), exporter=exporter,
        dynamic=sorted(dynamic), notes=[Note(NoteKind.FRONTEND, text) for text in fm.notes],
        declared_dynamic={d: list(r) if r else None for d, r in fm.declared_dynamic.items()},
        onnx_opset=next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        onnx_nodes=len(model.graph.node), onnx_ir=onnx.IR_VERSION)


def serve_request(data: dict):
    """The handler mlc.child_process.serve calls: the JSON request parsed strictly, the result as the worker's
    payload."""
    from mlc import child_process

    return child_process.WorkerResult.success(convert(ConvertRequest.from_json(data)).to_json())


def main(argv: list[str]) -> int:
    from mlc import child_process

    return child_process.serve(argv, serve_request)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
