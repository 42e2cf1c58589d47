"""PyTorch frontend: torch.export programs (.pt2), TorchScript files, and `file.py:factory`.

Exports with the dynamo ONNX exporter and falls back to the TorchScript exporter when it fails
(the manifest records which one ran). Imported only inside the frontend worker process."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from mlc.frontends.base import FrameworkModel, InputDecl, dim_axes
from mlc.errors import InputError, UnsupportedModelError

EXPORTED_PROGRAM = (".pt2",)
TORCHSCRIPT = (".pt", ".pth", ".ts", ".torchscript")
OPSET = 18  # the dynamo exporter's native opset (17 goes through the version converter)
TORCHSCRIPT_OPSET = 17
# The worker handles one request per process and sets this from --exporter (zoo builders take no options).
default_exporter = "auto"


def _factory_spec(source: str) -> Optional[tuple[Path, str]]:
    path, sep, name = source.rpartition(":")
    if sep and path.endswith(".py") and name.isidentifier():
        return Path(path), name
    return None


def detect(source: str) -> bool:
    return _factory_spec(source) is not None or Path(source).suffix.lower() in EXPORTED_PROGRAM + TORCHSCRIPT


def _first_line(e: BaseException) -> str:
    """The line that says what went wrong: the exporter wraps the cause in a page of advice whose
    'Exception summary' holds "<class 'Name'>: message"."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
    for line in text:
        cause = re.match(r"<class '(?:[\w]+\.)*(\w+)'>: (.*)", line)
        if cause:
            return f"{cause.group(1)}: {cause.group(2)}"[:300]
    return (text[0] if text else type(e).__name__)[:300]


def flatten_outputs(value: Any) -> list[np.ndarray]:
    """Model outputs (tensor, tuple, dict, transformers ModelOutput...) as numpy, in pytree order:
    the order both ONNX exporters give the graph outputs."""
    import torch
    from torch.utils import _pytree

    return [to_numpy(leaf) for leaf in _pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def to_numpy(tensor) -> np.ndarray:
    """A tensor as numpy; bfloat16 as ml_dtypes.bfloat16 (torch's .numpy() has none)."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype != torch.bfloat16:
        return tensor.numpy()
    import ml_dtypes

    return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def to_torch(array: np.ndarray):
    """numpy (ml_dtypes.bfloat16 too) as a tensor."""
    import torch

    array = np.ascontiguousarray(array)
    if array.dtype.kind == "V" and array.dtype.itemsize == 2:  # bf16: torch.from_numpy knows no such dtype
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _output_names(value: Any) -> list[str]:
    """Names for the tensor leaves of a model's output, in flatten_outputs's order: dict keys and dataclass fields
    (transformers' ModelOutput) by their keys, e.g. `score`, `hidden_states_0`; otherwise `output`,
    `output_0`, `output_1`..."""
    import torch
    from torch.utils import _pytree

    paths = [path for path, leaf in _pytree.tree_flatten_with_path(value)[0] if isinstance(leaf, torch.Tensor)]
    if any(isinstance(k, (_pytree.MappingKey, _pytree.GetAttrKey)) for path in paths for k in path):
        names = ["_".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path) or "output"
                 for path in paths]
        if len(set(names)) == len(names):
            return names
    return ["output"] if len(paths) == 1 else [f"output_{i}" for i in range(len(paths))]


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _default_dims(name: str, tensor) -> list[int | str]:
    """Axis 0 is the batch; axis 1 of an integer matrix (token ids, masks) is the sequence."""
    dims: list[int | str] = list(tensor.shape)
    if dims:
        dims[0] = "batch"
    if len(dims) == 2 and not tensor.dtype.is_floating_point:
        dims[1] = "seq"
    return dims


def from_module(module, example_inputs: Sequence, input_names: Sequence[str],
                output_names: Optional[Sequence[str]] = None,
                dims: Optional[dict[str, list[int | str]]] = None, exporter: Optional[str] = None) -> FrameworkModel:
    """A FrameworkModel for an nn.Module (or ScriptModule) called as module(*example_inputs)."""
    import torch

    module = module.eval()
    exporter = exporter or default_exporter
    examples = tuple(example_inputs)
    if len(examples) != len(input_names):
        raise InputError(f"the model takes {len(input_names)} input(s) ({', '.join(input_names)}) "
                         f"but {len(examples)} example input(s) were given")
    decls = []
    sizes: dict[str, int] = {}
    for name, tensor in zip(input_names, examples):
        if not isinstance(tensor, torch.Tensor):
            raise InputError(f"example input {name!r} is a {type(tensor).__name__}; mlc needs tensors")
        shape = (dims or {}).get(name) or _default_dims(name, tensor)
        for dim, size in zip(shape, tensor.shape):
            if isinstance(dim, str):
                sizes.setdefault(dim, int(size))
        decls.append(InputDecl(name, _dtype_name(tensor), shape))

    if output_names is None:  # name them, or the exporters number them
        with torch.no_grad():
            output_names = _output_names(module(*examples))

    def export(path: Path, dynamic: set[str]) -> str:
        axes = {name: {a: d for a, d in per.items() if d in dynamic} for name, per in dim_axes(decls).items()}
        return _export(module, examples, list(input_names), output_names, axes, path, exporter)

    def eager(inputs: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            return flatten_outputs(module(*[to_torch(x) for x in inputs]))

    return FrameworkModel("torch", decls, sizes, export, eager, native=module)


def _export(module, examples: tuple, input_names: list[str], output_names, axes: dict[str, dict[int, str]],
            path: Path, exporter: str) -> str:
    import torch

    failure = None
    if exporter in ("auto", "dynamo") and not isinstance(module, torch.jit.ScriptModule):
        try:
            shared = {dim: torch.export.Dim(dim) for per in axes.values() for dim in per.values()}
            # Positional: dict keys would have to be forward()'s parameter names.
            dynamic_shapes = tuple({a: shared[d] for a, d in axes[name].items()} or None for name in input_names)
            if not any(dynamic_shapes):
                dynamic_shapes = None
            elif getattr(module, "mlc_varargs", False):  # forward(*args): one entry, a tuple
                dynamic_shapes = (dynamic_shapes,)
            # torch.export fixes any dim whose example size is 1: give dynamic dims at least 2.
            widened = tuple(_at_least_two(x, axes.get(name, {})) for x, name in zip(examples, input_names))
            program = torch.onnx.export(module, widened, dynamo=True, input_names=input_names,
                                        output_names=output_names, dynamic_shapes=dynamic_shapes,
                                        opset_version=OPSET, verbose=False)
            program.save(str(path))
            # A dim the model computes with (int(x.shape[1])) is fixed, silently: say so. Such an
            # export is right at that size, where a TorchScript trace would be wrong at others.
            fixed = _specialised_dims(path, axes)
            note = f"; it fixed the dynamic dim(s) {', '.join(fixed)} to the example's size" if fixed else ""
            return f"torch.onnx dynamo exporter (torch {torch.__version__}, opset {OPSET}{note})"
        except Exception as e:  # the exporter raises many kinds; the TorchScript exporter may still work
            failure = _first_line(e)
            if exporter == "dynamo":
                raise UnsupportedModelError(f"torch's dynamo ONNX exporter failed: {failure}; "
                                            "try --exporter torchscript") from None
    try:
        torch.onnx.export(module, examples, str(path), dynamo=False, input_names=input_names,
                          output_names=output_names, dynamic_axes={n: a for n, a in axes.items() if a},
                          opset_version=TORCHSCRIPT_OPSET)
    except Exception as e:
        before = f"the dynamo exporter failed ({failure}), then " if failure else ""
        hint = ""
        if "prim::DictConstruct" in str(e):  # a ScriptModule returning a dict
            hint = ("; a TorchScript model that returns a dict cannot be exported: return a tuple of tensors, or "
                    "pass the module as a file.py:factory or a torch.export program (.pt2)")
        raise UnsupportedModelError(f"{before}torch's TorchScript ONNX exporter failed: {_first_line(e)}{hint}"
                                    ) from None
    _restore_dropped_inputs(path, input_names, examples, axes)
    why = f"; the dynamo exporter failed: {failure}" if failure else ""
    return f"torch.onnx TorchScript exporter (torch {torch.__version__}, opset {TORCHSCRIPT_OPSET}{why})"


def _at_least_two(example, axes: dict[int, str]):
    import torch

    if not isinstance(example, torch.Tensor):
        return example
    for axis in axes:
        if example.shape[axis] == 1:
            example = torch.cat([example, example], dim=axis)
    return example


def _restore_dropped_inputs(path: Path, input_names: list[str], examples: tuple, axes: dict[str, dict[int, str]]):
    """The TorchScript exporter drops inputs the model ignores; callers still pass them (onnx_export)."""
    import onnx

    from mlc.frontends.onnx_export import add_dropped_inputs

    model = onnx.load(str(path))
    decls = [InputDecl(name, _dtype_name(x), [axes.get(name, {}).get(a, int(n)) for a, n in enumerate(x.shape)])
             for name, x in zip(input_names, examples)]
    if add_dropped_inputs(model, decls, {d for per in axes.values() for d in per.values()}, {}):
        onnx.save(model, str(path))


def _specialised_dims(path: Path, axes: dict[str, dict[int, str]]) -> list[str]:
    """The requested dynamic dims the export wrote as fixed sizes."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {i.name: i.type.tensor_type.shape.dim for i in graph.input}
    return sorted({dim for name, per in axes.items() for axis, dim in per.items()
                   if name in shapes and axis < len(shapes[name]) and not shapes[name][axis].dim_param})


def _load_factory(path: Path, name: str, exporter: Optional[str]) -> FrameworkModel:
    if not path.is_file():
        raise InputError(f"factory file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"mlc_user_factory_{path.stem}", path)
    user = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(user)
    except Exception as e:
        raise InputError(f"{path} failed to import: {type(e).__name__}: {_first_line(e)}") from None
    factory = getattr(user, name, None)
    if not callable(factory):
        raise InputError(f"{path} has no function {name!r}; write `def {name}(): return module, example_inputs`")
    try:
        made = factory()
    except Exception as e:
        raise InputError(f"{path}:{name}() raised {type(e).__name__}: {_first_line(e)}") from None
    if not (isinstance(made, tuple) and len(made) in (2, 3)):
        raise InputError(f"{path}:{name}() must return (module, example_inputs) or (module, example_inputs, dims)")
    module, examples, dims = made if len(made) == 3 else (*made, None)
    import torch

    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{path}:{name}() returned a {type(module).__name__} where a torch.nn.Module was expected")
    if isinstance(examples, torch.Tensor):
        examples = (examples,)
    positional, keywords = _forward_parameters(module)
    if isinstance(examples, dict):
        module, names, examples = _bind_by_name(module, examples, positional, keywords, f"{path}:{name}()")
    else:
        names = positional[:len(examples)]
        names += [f"input_{i}" for i in range(len(names), len(examples))]
    return dataclasses.replace(from_module(module, examples, names, dims=dims, exporter=exporter), user_examples=True)


def _forward_parameters(module) -> tuple[list[str], bool]:
    """forward()'s parameters that can be passed by position, and whether it takes **kwargs."""
    import torch

    if isinstance(module, torch.jit.ScriptModule):  # inspect cannot read a ScriptMethod
        return [a.name for a in module.forward.schema.arguments[1:]], False
    params = inspect.signature(module.forward).parameters.values()
    return ([p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
            any(p.kind == p.VAR_KEYWORD for p in params))


def _bind_by_name(module, examples: dict, positional: list[str], keywords: bool, where: str):
    """(module, names, examples) for a dict of example inputs, bound by name (the exporters and the eager
    reference pass inputs by position): in forward()'s order, and where the dict skips a parameter (one with a
    default) or names a **kwargs one, through a module that passes them by keyword."""
    unknown = [k for k in examples if k not in positional]
    if len(examples) == 1 and unknown and positional:  # one input, named as the user likes: forward()'s first
        return module, unknown, list(examples.values())
    if unknown and not keywords:
        raise InputError(f"{where} gives example input(s) {', '.join(map(repr, unknown))}, which forward() does not "
                         f"take; its parameters: {', '.join(positional) or 'none'}")
    names = [p for p in positional if p in examples] + unknown
    values = [examples[n] for n in names]
    if names == positional[:len(names)]:
        return module, names, values
    return _by_keyword(module, names), names, values


def _by_keyword(inner, names: list[str]):
    """A module whose forward(*args) calls `inner` with args passed by keyword, as `names`."""
    import torch

    class ByKeyword(torch.nn.Module):
        mlc_varargs = True  # _export nests the dynamic shapes of forward(*args)

        def __init__(self):
            super().__init__()
            self.inner, self.names = inner, list(names)

        def forward(self, *args):
            return self.inner(**dict(zip(self.names, args)))

    return ByKeyword()


def _load_exported_program(path: Path) -> FrameworkModel:
    import torch
    from torch.utils import _pytree

    try:
        program = torch.export.load(str(path))
    except Exception as e:
        raise InputError(f"{path} is not a torch.export program (torch.export.load: {_first_line(e)}); "
                         "save one with torch.export.save(torch.export.export(model, args), 'model.pt2')") from None
    args, kwargs = program.example_inputs or ((), {})
    if kwargs:
        raise UnsupportedModelError(f"{path}: keyword inputs are not supported; "
                                    "export the program with positional inputs")
    names = [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"]
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    decls, sizes, symbols = [], {}, {}  # symbols: torch's symbol (s31) -> the dim's name
    for name, example in zip(names, args):
        shape = placeholders[name].meta["val"].shape
        dims = []
        for axis, (dim, size) in enumerate(zip(shape, example.shape)):
            if isinstance(dim, torch.SymInt):
                symbol = str(dim)
                if symbol not in symbols:  # torch.export.save keeps no Dim names: name them as a factory's are
                    default = _default_dims(name, example)[axis]
                    taken = isinstance(default, str) and default in symbols.values()
                    symbols[symbol] = default if isinstance(default, str) and not taken else f"{name}_dim{axis}"
                sizes.setdefault(symbols[symbol], int(size))
                dims.append(symbols[symbol])
            else:
                dims.append(int(dim))
        decls.append(InputDecl(name, _dtype_name(example), dims))
    declared = _declared_ranges(program, symbols)
    module = program.module()
    # Named from the output's structure as a factory's are (torch.export would name them after graph nodes: linear)
    out_spec = program.call_spec.out_spec
    output_names = _output_names(_pytree.tree_unflatten([torch.empty(0)] * out_spec.num_leaves, out_spec))

    def export(out: Path, dynamic: set[str]) -> str:
        # The program carries its own dynamic shapes; the dynamo exporter keeps them, under torch's symbols.
        try:
            onnx_program = torch.onnx.export(program, dynamo=True, input_names=names, output_names=output_names,
                                             opset_version=OPSET)
            onnx_program.save(str(out))
        except Exception as e:
            raise UnsupportedModelError(f"torch's dynamo ONNX exporter failed on {path.name}: "
                                        f"{_first_line(e)}") from None
        _rename_dims(out, symbols)
        return f"torch.onnx dynamo exporter on an ExportedProgram (torch {torch.__version__}, opset {OPSET})"

    def eager(inputs: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            return flatten_outputs(module(*[to_torch(x) for x in inputs]))

    return FrameworkModel("torch", decls, sizes, export, eager, user_examples=True, declared_dynamic=declared)


def _declared_ranges(program, symbols: dict[str, str]) -> dict[str, Optional[tuple[int, int]]]:
    """{dim: (min, max)} of the program's dynamic dims; None where it set no finite bound."""
    declared: dict[str, Optional[tuple[int, int]]] = {}
    for symbol, bounds in program.range_constraints.items():
        if str(symbol) in symbols:
            try:
                declared[symbols[str(symbol)]] = (max(1, int(bounds.lower)), int(bounds.upper))
            except (TypeError, ValueError, OverflowError, AttributeError):  # an unbounded dim (int_oo)
                declared[symbols[str(symbol)]] = None
    return declared


def _rename_dims(path: Path, symbols: dict[str, str]) -> None:
    """The export's dims named as the frontend declares them (s31 -> batch), in expressions too (2*s31)."""
    import onnx

    if not symbols:
        return
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, symbols)) + r")\b")
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = pattern.sub(lambda m: symbols[m.group(1)], dim.dim_param)
    onnx.save(model, str(path))


def _is_export_archive(path: Path) -> bool:
    """torch.export.save writes a zip with an `archive_format` entry; TorchScript zips have none."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.rsplit("/", 1)[-1] == "archive_format" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _is_checkpoint(path: Path) -> bool:
    """torch.save writes a zip of data.pkl and storages (a state_dict or a pickled module), with no program: no
    code/ and no constants.pkl, which TorchScript zips have."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = {name.split("/", 1)[-1] for name in archive.namelist()}
    except (OSError, zipfile.BadZipFile):
        return False
    return "data.pkl" in names and "constants.pkl" not in names and not any(n.startswith("code/") for n in names)


def _load_torchscript(path: Path, input_shapes: Sequence[str], exporter: Optional[str]) -> FrameworkModel:
    import torch

    from mlc.frontends.onnx import parse_input_shape

    if _is_export_archive(path):
        raise InputError(f"{path} is a torch.export archive (torch.export.save), not TorchScript: name it .pt2")
    if _is_checkpoint(path):
        raise InputError(f"{path} is a torch.save checkpoint (a state_dict or a pickled module): weights without a "
                         "program, and mlc does not unpickle; write a file.py:factory that builds the module and "
                         "loads them, or save the model with torch.jit.save or torch.export.save")
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as e:
        raise InputError(f"{path} is not a TorchScript file (torch.jit.load: {_first_line(e)}); "
                         "save one with torch.jit.save(torch.jit.trace(model, args), 'model.pt'), "
                         "or pass a torch.export program (.pt2) or file.py:factory") from None
    names = [a.name for a in module.forward.schema.arguments[1:]]
    shapes = dict(parse_input_shape(text) for text in input_shapes)
    if None in shapes and len(names) == 1:
        shapes[names[0]] = shapes.pop(None)
    unknown = [n for n in shapes if n is not None and n not in names]
    if unknown:  # not "give --input-shape for x" when the user gave one, for a name the model lacks
        raise InputError(f"--input-shape names unknown input {unknown[0]!r}; the model's inputs are: "
                         f"{', '.join(names)}")
    missing = [n for n in names if n not in shapes]
    if missing:
        raise InputError(f"a TorchScript file does not record input shapes: give --input-shape for "
                         f"{', '.join(missing)} (e.g. --input-shape {missing[0]}:1x3x224x224); inputs are float32 "
                         "(for integer inputs use a file.py:factory)")
    examples = tuple(torch.randn(*shapes[n]) for n in names)
    return from_module(module, examples, names, exporter=exporter)


def open_model(source: str, input_shapes: Sequence[str] = (), exporter: Optional[str] = None) -> FrameworkModel:
    factory = _factory_spec(source)
    if factory:
        return _load_factory(*factory, exporter=exporter)
    path = Path(source)
    if not path.is_file():
        raise InputError(f"model file not found: {path}")
    if path.suffix.lower() in EXPORTED_PROGRAM:
        return _load_exported_program(path)
    return _load_torchscript(path, input_shapes, exporter)
