"""The string ops an artifact runs on the host, in numpy, before or after its compiled part: TVM compiles numbers
only. Copied into every artifact as runtime/mlc_host_ops.py beside the thin runtime, so it imports numpy and the
standard library only.

A program is JSON: nodes {"op", "inputs", "outputs", "attrs"} in order, and constants {name: tensor}, a tensor
being {"dtype", "shape", "values"}. Strings are numpy unicode arrays ("<U"), never object arrays (an .npz would
need pickle for those).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

import numpy as np


def as_strings(array: Any) -> np.ndarray:
    """An array of str (a numpy unicode array); bytes are read as UTF-8, as ONNX stores strings."""
    array = np.asarray(array)
    if array.dtype.kind == "U":
        return array
    flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.ravel().tolist()]
    return np.array(flat, dtype=str).reshape(array.shape) if flat else np.zeros(array.shape, dtype="<U1")


def is_strings(array: Any) -> bool:
    return np.asarray(array).dtype.kind in "UOS"


def tensor(record: Mapping[str, Any]) -> np.ndarray:
    """A constant or attribute tensor from its JSON record."""
    if record["dtype"] == "string":
        return as_strings(np.array(record["values"], dtype=object).reshape(record["shape"]))
    return np.array(record["values"], dtype=record["dtype"]).reshape(record["shape"])


def _string_concat(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    return [np.char.add(as_strings(x), as_strings(y))]


def _string_split(x: np.ndarray, delimiter: str = "", maxsplit: int | None = None) -> list[np.ndarray]:
    """An empty or absent delimiter splits on runs of whitespace (Python's str.split()); `maxsplit` caps the splits.
    The substrings are padded with "" to the longest split."""
    x = as_strings(x)
    parts = [s.split(delimiter or None, -1 if maxsplit is None else maxsplit) for s in x.ravel().tolist()]
    width = max((len(p) for p in parts), default=0)
    padded = [p + [""] * (width - len(p)) for p in parts]
    substrings = np.array(padded, dtype=str) if width else np.zeros((len(parts), 0), dtype="<U1")
    lengths = np.array([len(p) for p in parts], dtype=np.int64)
    return [substrings.reshape(x.shape + (width,)), lengths.reshape(x.shape)]


def _string_normalizer(x: np.ndarray, case_change_action: str = "NONE", is_case_sensitive: int = 0,
                       locale: str = "", stopwords: tuple = ()) -> list[np.ndarray]:
    """Stop words removed (matched with or without case), then the case changed; [C] or [1, C] in, the same rank
    out, [""] where every word was removed."""
    x = as_strings(x)
    folded = {w if is_case_sensitive else w.lower() for w in stopwords}
    words = [w for w in x.ravel().tolist() if (w if is_case_sensitive else w.lower()) not in folded]
    change = {"LOWER": str.lower, "UPPER": str.upper}.get(case_change_action, lambda w: w)
    words = [change(w) for w in words] or [""]
    out = np.array(words, dtype=str)
    return [out.reshape(1, -1) if x.ndim == 2 else out]


def _regex_full_match(x: np.ndarray, pattern: str = "") -> list[np.ndarray]:
    """ONNX names RE2's syntax; Python's re agrees on what RE2 accepts but for a few escapes."""
    compiled = re.compile(pattern)
    x = as_strings(x)
    return [np.array([compiled.fullmatch(s) is not None for s in x.ravel().tolist()], dtype=bool).reshape(x.shape)]


_LABEL_DEFAULTS = {"strings": "_Unused", "int64s": -1, "floats": -0.0}


def _label_encoder(x: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """ai.onnx.ml LabelEncoder: each element looked up in keys_*, the value at the same position, else the default
    (default_tensor, or default_<values' type>, else ONNX's default for that type). NaN keys match NaN."""
    kind = next(k for k in ("strings", "int64s", "floats") if f"values_{k}" in attrs) \
        if "values_tensor" not in attrs else None
    keys = tensor(attrs["keys_tensor"]) if "keys_tensor" in attrs else \
        np.asarray(next(attrs[f"keys_{k}"] for k in ("strings", "int64s", "floats") if f"keys_{k}" in attrs))
    if kind is None:
        values = tensor(attrs["values_tensor"])
        default = tensor(attrs["default_tensor"]).ravel()[0] if "default_tensor" in attrs else \
            _LABEL_DEFAULTS["strings" if values.dtype.kind == "U" else "floats" if values.dtype.kind == "f"
                            else "int64s"]
        dtype = values.dtype
    else:
        values = np.asarray(attrs[f"values_{kind}"], dtype={"strings": str, "int64s": np.int64,
                                                               "floats": np.float32}[kind])
        default = attrs.get(f"default_{kind[:-1]}", _LABEL_DEFAULTS[kind])
        dtype = values.dtype if kind != "strings" else np.dtype(str)

    def key(v: Any) -> Any:
        return "nan" if isinstance(v, float) and v != v else v

    table = {key(k): v for k, v in zip(keys.ravel().tolist(), values.ravel().tolist())}
    x = as_strings(x) if is_strings(x) else np.asarray(x)
    out = [table.get(key(v), default) for v in x.ravel().tolist()]
    return [np.array(out, dtype=dtype).reshape(x.shape) if out else np.zeros(x.shape, dtype=dtype)]


def _cast(x: np.ndarray, to: str, **_: Any) -> list[np.ndarray]:
    """To and from strings. A string reads as a number as Python reads it ("1e-3", "NaN", "-INF"); a number
    writes as numpy writes it."""
    if to == "string":
        return [as_strings(np.asarray(x).astype(str))]
    if is_strings(x):
        x = as_strings(x)
        numbers = [float(s) if np.dtype(to).kind == "f" else int(s) for s in x.ravel().tolist()]
        return [np.array(numbers, dtype=np.float64 if np.dtype(to).kind == "f" else object)
                .astype(to).reshape(x.shape)]
    return [np.asarray(x).astype(to)]


def _cast_like(x: np.ndarray, like: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    return _cast(x, "string" if is_strings(like) else str(np.asarray(like).dtype), **attrs)


def _equal(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    if is_strings(x):
        return [np.asarray(np.char.equal(as_strings(x), as_strings(y)))]
    return [np.equal(x, y)]


def _constant(value: Mapping[str, Any]) -> list[np.ndarray]:
    return [tensor(value)]


def _identity(x: np.ndarray) -> list[np.ndarray]:
    return [x]


OPS: dict[str, Callable[..., list[np.ndarray]]] = {
    "StringConcat": _string_concat, "StringSplit": _string_split, "StringNormalizer": _string_normalizer,
    "RegexFullMatch": _regex_full_match, "LabelEncoder": _label_encoder, "Cast": _cast, "CastLike": _cast_like,
    "Equal": _equal, "Constant": _constant, "Identity": _identity,
}


def run(program: Mapping[str, Any], stage: str, values: dict[str, np.ndarray]) -> None:
    """Run the program's `stage` ("before" or "after" the compiled part) on `values` (name -> array), adding what
    each node computes."""
    for name, record in program.get("constants", {}).items():
        values.setdefault(name, tensor(record))
    for node in program[stage]:
        args = [values[name] for name in node["inputs"] if name]
        results = OPS[node["op"]](*args, **node.get("attrs", {}))
        values.update(zip(node["outputs"], results))
