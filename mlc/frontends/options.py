"""The options that choose how a framework model is exported: --dynamic dims and --exporter."""

from __future__ import annotations

import re
from typing import Optional, Sequence

from mlc.errors import InputError

MAX_DIM = (1 << 31) - 1  # TVM and ORT index tensors with int32 shapes
EXPORTERS = ("auto", "dynamo", "torchscript")  # --exporter: which of PyTorch's ONNX exporters
_DYNAMIC = re.compile(r"^([A-Za-z_][\w.]*)(?:=(\d+)\.\.(\d+))?$")


def parse_dynamic(values: Sequence[str]) -> Optional[dict[str, Optional[tuple[int, int]]]]:
    """`--dynamic batch,seq` / `--dynamic seq=1..512` (repeatable) -> {dim: range or None};
    None when not given (the model's own symbolic dims all stay dynamic)."""
    if not values:
        return None
    dims: dict[str, Optional[tuple[int, int]]] = {}
    for value in values:
        for item in filter(None, (part.strip() for part in value.split(","))):
            match = _DYNAMIC.match(item)
            if not match:
                raise InputError(f"--dynamic {item!r} is malformed; write a dim name (batch), "
                                 "or NAME=MIN..MAX (seq=1..512)")
            name, lo, hi = match.group(1), match.group(2), match.group(3)
            if lo is not None and not (1 <= int(lo) <= int(hi) <= MAX_DIM):
                raise InputError(f"--dynamic {item!r}: the range must satisfy 1 <= MIN <= MAX <= {MAX_DIM}")
            dims[name] = (int(lo), int(hi)) if lo is not None else None
    return dims


def check_exporter(framework: str, exporter: str) -> None:
    if exporter not in EXPORTERS:
        raise InputError(f"unknown exporter {exporter!r}; choose one of: {', '.join(EXPORTERS)}")
    if exporter != "auto" and framework != "torch":
        raise InputError(f"--exporter chooses between PyTorch's ONNX exporters; {framework} models have one")
