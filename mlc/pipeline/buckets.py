"""`mlc compile --buckets`: which dim is bucketed, which input masks the padding, the graph each bucket
builds, and the lengths each bucket is checked at. The padding itself happens in the thin runtime
(pad_to_bucket)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


from mlc.artifacts.manifest import BucketCheck, BucketInfo
from mlc.compiler.contract import CompileResult
from mlc.compiler.weights import ALIGNMENT
from mlc.errors import InputError, UnsupportedModelError
from mlc.frontends import onnx as onnx_frontend
from mlc.passes import onnx as onnx_passes
from mlc.pipeline.options import Buckets
from mlc.pipeline.prepare import Prepared
from mlc.pipeline.steps import Timer
from mlc.runtime import runner as thin_runtime

DEFAULT_DIM = "seq"


@dataclass
class Plan:
    dim: str
    sizes: list[int]
    mask: str  # the input whose zeros mark padded positions

    def library(self, size: int) -> str:
        return f"model-{self.dim}{size}.so"

    def check_lengths(self) -> list[tuple[int, int]]:
        """(length, bucket) per bucket: the shortest length that lands in it, i.e. the most padding."""
        return [(prev + 1, size) for prev, size in zip([0] + self.sizes[:-1], self.sizes)]


def plan(requested: Buckets, specs) -> Plan:
    """Pick the bucketed dim (the one named, else `seq`, else the only symbolic non-batch dim) and
    the mask input; refuse models where padding would change the results."""
    dim, sizes = requested.dim, list(requested.sizes)
    names = list(dict.fromkeys(d for s in specs for axis, d in enumerate(s.shape) if isinstance(d, str) and axis > 0))
    if dim is None:
        if DEFAULT_DIM in names:
            dim = DEFAULT_DIM
        elif len(names) == 1:
            dim = names[0]
        else:
            which = f"it has {', '.join(names)}" if names else "it has none (its inputs have fixed sizes)"
            raise InputError(f"--buckets needs one symbolic non-batch input dim to bucket and {which}; "
                             "name it: --buckets DIM=8,16,32")
    elif dim not in names:
        raise InputError(f"--buckets names dim {dim!r}, which no model input has as a symbolic non-batch dim "
                         f"(symbolic dims: {', '.join(names) or 'none'})")
    carrying = [s.name for s in specs if dim in s.shape]
    mask = next((s.name for s in specs if "mask" in s.name.lower() and dim in s.shape), None)
    if mask is None:
        raise UnsupportedModelError(
            f"--buckets pads inputs along '{dim}' and the model has no mask input (an input named *mask* with that "
            f"dim; it has {', '.join(carrying)}) to hide the padding, so padded positions would change the results; "
            "compile it without --buckets")
    return Plan(dim, sizes, mask)


def output_axes(plan: Plan, shapes: dict[int, list[list[int]]], names: list[list[Optional[str]]]) -> list[list[int]]:
    """Per output, the axes that carry the bucketed dim: their size is the bucket in every bucket's
    build (with one bucket, the ONNX output must also name the axis after the dim)."""
    axes = []
    for i, onnx_names in enumerate(names):
        rank = len(shapes[plan.sizes[0]][i])
        found = [a for a in range(rank) if all(shapes[b][i][a] == b for b in plan.sizes)]
        if len(plan.sizes) == 1:
            found = [a for a in found if a < len(onnx_names) and onnx_names[a] == plan.dim]
        axes.append(found)
    return axes


@dataclass(frozen=True)
class Build:
    """One TVM build: the library it writes, the cleaned graph it compiles, a label for progress lines."""

    library: str
    onnx: Path
    label: str = ""  # "" or " seq=16"


def builds(plan: Plan, prepared: Prepared, steps: list, workdir: Path, timed: Timer) -> list[Build]:
    """Per bucket: the graph with that length fixed, cleaned by the ONNX passes again (shapes now static)."""
    concrete = onnx_frontend.concrete_shapes(prepared.specs, prepared.fixed)
    length = next(concrete[s.name][s.shape.index(plan.dim)] for s in prepared.specs if plan.dim in s.shape)
    if length > plan.sizes[-1]:
        raise InputError(f"the reference inputs have {plan.dim}={length}, longer than the largest bucket "
                         f"{plan.sizes[-1]}; add a bucket >= {length} or give shorter inputs with --input-shape")
    result = []
    for size in plan.sizes:
        shapes = {s.name: [size if d == plan.dim else n for d, n in zip(s.shape, concrete[s.name])]
                  for s in prepared.specs}
        with timed(f"onnx_passes_{plan.dim}{size}", f"Running ONNX graph passes for {plan.dim}={size}"):
            cleaned, _, _ = onnx_passes.run(onnx_frontend.fix_input_shapes(prepared.model, shapes), steps, None,
                                            workdir)
            path = workdir / f"cleaned-{plan.dim}{size}.onnx"
            onnx_passes.save(cleaned, path)
        result.append(Build(plan.library(size), path, f" {plan.dim}={size}"))
    return result


SHARED_WEIGHTS = "model.weights"


def share_weights(staged: Path, weights: dict[str, dict]) -> dict[str, dict]:
    """One weights file for every bucket's library, each distinct tensor in it once (byte-identical ones, which
    are most: the buckets build one model; what differs are constants folded at each length, such as position
    embeddings cut to it). `weights`: library -> its weights file and index, as the worker wrote them; returns them
    pointing into the shared file, and deletes the per-library files."""
    import hashlib
    import mmap

    offsets: dict[tuple, int] = {}
    shared: dict[str, dict] = {}
    temporary = staged / f".{SHARED_WEIGHTS}.tmp"
    with open(temporary, "wb") as out:
        for library, info in weights.items():
            path = staged / info["file"]
            tensors = []
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for spec in info["tensors"]:
                    raw = memoryview(data)[spec["offset"]:spec["offset"] + spec["nbytes"]]
                    key = (spec["dtype"], tuple(spec["shape"]), hashlib.sha256(raw).digest())
                    if key not in offsets:
                        out.write(bytes(-out.tell() % ALIGNMENT))
                        offsets[key] = out.tell()
                        out.write(raw)
                    raw.release()
                    tensors.append({**spec, "offset": offsets[key]})
            path.unlink()
            shared[library] = {"file": SHARED_WEIGHTS, "tensors": tensors}
    temporary.replace(staged / SHARED_WEIGHTS)
    return shared


def merge_results(results: list[CompileResult]) -> CompileResult:
    """One worker result for several builds (buckets): timings summed, kernel lists united."""
    first = results[0]
    schedules = first.schedules
    if schedules:
        schedules = {k: sorted({n for r in results for n in r.schedules.get(k, [])}) for k in schedules}
    return dataclasses.replace(
        first, timings={k: sum(r.timings.get(k, 0.0) for r in results) for k in first.timings},
        # reduced where any build is (a build TVM failed at bf16 is fp32): the gate judges the lowest precision
        precision=next((r.precision for r in results if r.precision != "fp32"), "fp32"), schedules=schedules)


def manifest_info(plan: Plan, prepared: Prepared, results: dict[str, CompileResult], staged: Path
                  ) -> tuple[BucketInfo, list[list[int]]]:
    """The manifest's buckets, with reference runs at the shortest length of each bucket (the most
    padding): ONNX Runtime on the model as given (for framework models: the export, whose
    conversion `mlc check` reports against the framework at the reference shapes). Also, per
    output, the axes that carry the bucketed dim. `results`: the worker's result per library."""
    shapes = {size: [o["shape"] for o in results[plan.library(size)].outputs] for size in plan.sizes}
    onnx_names = [[d.dim_param or None for d in o.type.tensor_type.shape.dim] for o in prepared.model.graph.output]
    axes = output_axes(plan, shapes, onnx_names)
    concrete = onnx_frontend.concrete_shapes(prepared.specs, prepared.fixed)
    checks = []
    for length, size in plan.check_lengths():
        shapes_l = {s.name: [length if d == plan.dim else n for d, n in zip(s.shape, concrete[s.name])]
                    for s in prepared.specs}
        ref = onnx_frontend.onnxruntime_reference(prepared.path, onnx_frontend.make_inputs(prepared.specs, shapes_l))
        stem = f"reference/{plan.dim}{length}"
        (staged / "reference").mkdir(exist_ok=True)
        thin_runtime.save_npz(staged / f"{stem}.inputs.npz", ref.inputs)
        thin_runtime.save_npz(staged / f"{stem}.outputs.npz", ref.outputs)
        checks.append(BucketCheck(length=length, bucket=size, inputs=f"{stem}.inputs.npz",
                                  outputs=f"{stem}.outputs.npz", producer=f"{ref.producer} on {prepared.path.name}"))
    return BucketInfo(dim=plan.dim, sizes=plan.sizes, libraries={str(b): plan.library(b) for b in plan.sizes},
                      mask=plan.mask, checks=checks), axes
