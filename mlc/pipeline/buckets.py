"""`mlc compile --buckets`: which dim is bucketed, which input masks the padding, and the lengths
each bucket is checked at. The padding itself happens in the thin runtime (pad_to_bucket)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from mlc.errors import InputError, UnsupportedModelError

DEFAULT_DIM = "seq"
_BUCKETS = re.compile(r"^(?:([A-Za-z_][\w.]*)=)?(\d+(?:,\d+)*)$")


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


def parse(values: Sequence[str]) -> Optional[tuple[Optional[str], list[int]]]:
    """`--buckets 8,16,32` or `--buckets seq=8,16,32` -> (dim or None, sorted sizes); None if not given."""
    if not values:
        return None
    text = ",".join(v.strip() for v in values).replace(" ", "")
    dim = None
    if "=" in text:
        dim, _, text = text.partition("=")
    match = _BUCKETS.match(f"{dim}={text}" if dim else text)
    if not match:
        raise InputError(f"--buckets {','.join(values)!r} is malformed; write sizes (8,16,32) or DIM=sizes (seq=8,16,32)")
    sizes = sorted({int(s) for s in text.split(",")})
    if sizes[0] < 1:
        raise InputError("--buckets sizes must be >= 1")
    return dim, sizes


def plan(requested: tuple[Optional[str], list[int]], specs) -> Plan:
    """Pick the bucketed dim (the one named, else `seq`, else the only symbolic non-batch dim) and
    the mask input; refuse models where padding would change the results."""
    dim, sizes = requested
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
