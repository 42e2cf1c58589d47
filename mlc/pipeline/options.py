"""Typed options: what model to read and how (ModelSpec), how to compile it (CompileOptions), run an artifact
(RunOptions) and tune a model's kernels (TuneOptions).

Each option is declared once, on its field (`option(...)`): its name is the API keyword, its metadata the CLI flags
and help, the parser that turns what a user gives (CLI text, or values from Python) into the field's value type,
and whether the artifact's rebuild recipe records it. `mlc compile`'s command line, `mlc.api.compile`'s keywords
and the manifest's recipe are generated from these declarations (tests/test_options.py checks that they are). An
option the compile worker implements (`worker=True`) reaches it as the CompileRequest field of the same name."""

from __future__ import annotations

import dataclasses
import inspect
import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence

import numpy as np

from mlc import frontends, passes
from mlc.errors import InputError


FIELD_DEFAULT = object()  # Option.omit, Option.cli_default: the field's own default


@dataclass(frozen=True)
class Option:
    """How one field is given and recorded (see `option`)."""

    flags: tuple[str, ...]  # the CLI's, long flag first; none: API only
    help: str
    parse: Optional[Callable[[Any], Any]] = None  # given value -> value type; on each item of a tuple field
    recorded: Optional[str] = None  # "always", "given" (when not the default) or None: not in the recipe
    key: Optional[str] = None  # the recipe's key, where not the field's name
    path: bool = False  # recorded resolved: the rebuild may run from another folder
    omit: Any = FIELD_DEFAULT  # the value the recipe's command line leaves out
    json: Optional[Callable[[Any], Any]] = None  # the recipe's value, where not the generic form
    cli_type: Any = None  # the typer annotation, where the field's type is not one typer takes
    cli_default: Any = FIELD_DEFAULT
    group: Optional[type] = None  # a dataclass of declared fields whose flags the CLI takes in this one's place
    worker: bool = False  # the compile worker implements it: a CompileRequest field of the same name carries it


def option(default: Any, *flags: str, help: str, **how: Any) -> Any:
    """A declared field: `default` as the API's and CLI's default, `flags` for the CLI (see Option)."""
    return dataclasses.field(default=default, metadata={"option": Option(tuple(flags), help, **how)})


def declared(owner: type) -> Iterator[tuple[dataclasses.Field, Option]]:
    """The declared fields of a ModelSpec, CompileOptions or group, in declaration order."""
    for f in dataclasses.fields(owner):
        if "option" in f.metadata:
            yield f, f.metadata["option"]


def worker_options(options: Any) -> dict[str, Any]:
    """The options the compile worker implements ({name: value}), for its CompileRequest."""
    return {f.name: getattr(options, f.name) for f, opt in declared(type(options)) if opt.worker}


def field_types(owner: type) -> dict[str, Any]:
    """The fields' types, resolved (this module's annotations are strings)."""
    return typing.get_type_hints(owner)


def _parse_fields(obj) -> None:
    """Run each declared field's parser once, where the value is given: the dataclass then holds value types.
    Parsers accept their own value types too (dataclasses.replace passes them back in)."""
    for f, opt in declared(type(obj)):
        value = getattr(obj, f.name)
        if isinstance(f.default, tuple):  # repeatable: callers pass lists; a tuple keeps the options immutable
            value = tuple(opt.parse(v) for v in value) if opt.parse else tuple(value)
        elif opt.parse is not None and value is not None:
            value = opt.parse(value)
        object.__setattr__(obj, f.name, value)


# ---- value types: what the CLI's text means, parsed once; str() gives the canonical text back ----

@dataclass(frozen=True)
class InputShape:
    """--input-shape NAME:1x128 (or 1x128 for a model with one input)."""

    name: Optional[str]
    dims: tuple[int, ...]

    @classmethod
    def parse(cls, value: InputShape | str) -> InputShape:
        if isinstance(value, InputShape):
            return value
        from mlc.frontends.onnx import parse_input_shape  # onnx is heavy: only when a shape is given

        name, dims = parse_input_shape(str(value))
        return cls(name, tuple(dims))

    def __str__(self) -> str:
        dims = "x".join(map(str, self.dims))
        return f"{self.name}:{dims}" if self.name else dims


@dataclass(frozen=True)
class DynamicDims:
    """One --dynamic value: dims kept symbolic, each with a range or none (batch,seq or seq=1..512)."""

    dims: tuple[tuple[str, Optional[tuple[int, int]]], ...]

    @classmethod
    def parse(cls, value: DynamicDims | str) -> DynamicDims:
        if isinstance(value, DynamicDims):
            return value
        return cls(tuple((frontends.parse_dynamic([str(value)]) or {}).items()))

    def __str__(self) -> str:
        return ",".join(name if r is None else f"{name}={r[0]}..{r[1]}" for name, r in self.dims)


_BUCKETS = re.compile(r"^(?:([A-Za-z_][\w.]*)=)?(\d+(?:,\d+)*)$")


@dataclass(frozen=True)
class Buckets:
    """--buckets 8,16,32 or seq=8,16,32 (repeatable, joined): the bucketed dim (None: picked from the model) and
    the sorted lengths."""

    dim: Optional[str]
    sizes: tuple[int, ...]

    @classmethod
    def parse(cls, value: Buckets | str | Sequence[str]) -> Optional[Buckets]:
        if isinstance(value, Buckets):
            return value
        values = [value] if isinstance(value, str) else list(value)
        if not values:
            return None
        text = ",".join(v.strip() for v in values).replace(" ", "")
        dim = None
        if "=" in text:
            dim, _, text = text.partition("=")
        if not _BUCKETS.match(f"{dim}={text}" if dim else text):
            raise InputError(f"--buckets {','.join(values)!r} is malformed; "
                             "write sizes (8,16,32) or DIM=sizes (seq=8,16,32)")
        sizes = sorted({int(s) for s in text.split(",")})
        if sizes[0] < 1:
            raise InputError("--buckets sizes must be >= 1")
        return cls(dim, tuple(sizes))

    def __str__(self) -> str:
        sizes = ",".join(map(str, self.sizes))
        return f"{self.dim}={sizes}" if self.dim else sizes


def check_precision(precision: str) -> str:
    from mlc.check import PRECISIONS  # mlc.check is heavy: read when a precision is given

    if precision not in PRECISIONS:
        raise InputError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")
    return precision


def _tolerance(flag: str) -> Callable[[float], float]:
    def parse(value: float) -> float:
        if not (value >= 0 and np.isfinite(value)):
            raise InputError(f"{flag} must be a finite number >= 0, got {value}")
        return value
    return parse


def check_tolerances(atol: Optional[float], rtol: Optional[float]) -> None:
    """For the commands that take the tolerances alone (run, check, debug, export)."""
    for flag, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None:
            _tolerance(flag)(value)


_DYNAMIC_HELP = ("Dims kept symbolic, so one artifact serves every size: batch,seq or seq=1..512 (the runtime refuses "
                 "sizes outside; repeatable) (default: framework models compile at the reference shapes; ONNX models "
                 "keep their symbolic dims).")
_INPUTS_HELP = ("Your sample inputs, an .npz keyed by input name (as `mlc run --inputs`): the reference the check "
                "runs on, and the compile size of every dim they fix but those --dynamic names.")


@dataclass(frozen=True)
class ModelSpec:
    """The model and the options that decide its inputs, shared by compile, export, debug and tune."""

    source: str  # a model file or folder, file.py:factory, or zoo:NAME
    framework: Optional[str] = option(
        None, "--framework", "-f", recorded="always", omit=frontends.ONNX,
        help="onnx, torch, tensorflow or paddle (default: detected; for zoo:NAME its first)")
    input_shapes: tuple[InputShape, ...] = option(
        (), "--input-shape", parse=InputShape.parse, recorded="always",
        help="Fix an input's shape, NAME:1x128 (repeatable).")
    dynamic: tuple[DynamicDims, ...] = option((), "--dynamic", parse=DynamicDims.parse, recorded="always",
                                              help=_DYNAMIC_HELP)
    exporter: str = option("auto", "--exporter", recorded="always",  # checked with the framework it applies to
                           help="PyTorch ONNX exporter: auto (dynamo, falling back to TorchScript), dynamo or "
                                "torchscript.")
    buckets: Optional[Buckets] = option(
        None, "--buckets", parse=Buckets.parse, recorded="given", json=lambda b: [str(b)], cli_type=List[str],
        cli_default=[], help="One static build per length, e.g. 8,16,32 or seq=8,16,32: inputs are padded to the next "
                             "bucket (the mask input marks the padding), outputs sliced back.")
    # the samples decide shapes and the reference: the rebuild needs the same file
    inputs: Optional[str] = option(None, "--inputs", "-i", parse=str, recorded="given", path=True,
                                   cli_type=Optional[Path], help=_INPUTS_HELP)
    freeze: tuple[str, ...] = option(
        (), "--freeze", recorded="given",
        help="Fold this input into the graph as a constant, at its value in --inputs (a shape or axes TVM needs "
             "constant); the artifact then refuses a feed of it (repeatable).")

    __post_init__ = _parse_fields

    def with_framework(self, framework: str) -> "ModelSpec":
        return dataclasses.replace(self, framework=framework)

    def dynamic_dims(self) -> Optional[dict[str, Optional[tuple[int, int]]]]:
        """--dynamic parsed: {dim: (min, max) or None}; None when not given."""
        return {name: r for d in self.dynamic for name, r in d.dims} if self.dynamic else None


@dataclass(frozen=True)
class PassFlags:
    """`mlc compile`'s pass flags, which the CLI takes in place of CompileOptions.pass_options."""

    opt_level: int = option(passes.DEFAULT_OPT_LEVEL, "-O",
                            help="Optimisation level 0-3: which graph passes run by default (see `mlc passes`).")
    passes: Optional[str] = option(None, "--passes",
                                   help="Run exactly these passes, comma-separated (replaces -O's list).")
    disable_pass: tuple[str, ...] = option((), "--disable-pass", help="Do not run this pass (repeatable).")
    enable_pass: tuple[str, ...] = option((), "--enable-pass",
                                          help="Also run this pass, e.g. an opt-in one (repeatable).")
    pass_config: tuple[str, ...] = option((), "--pass-config", help="Set a pass option, PASS.KEY=VALUE (repeatable).")
    dump_ir: Optional[Path] = option(None, "--dump-ir", help="Write the ONNX graph / Relax IR after each pass here.")

    __post_init__ = _parse_fields

    def options(self) -> passes.Options:
        return passes.Options(self.opt_level, tuple(self.passes.split(",")) if self.passes is not None else None,
                              self.disable_pass, self.enable_pass, self.pass_config,
                              str(self.dump_ir) if self.dump_ir else None)


def _pass_options(value: passes.Options | PassFlags) -> passes.Options:
    return value.options() if isinstance(value, PassFlags) else value


@dataclass(frozen=True)
class CompileOptions:
    """How to compile: target, output, schedules, passes, the check's tolerances, packaging."""

    target: str = option("x86", "--target", "-t", recorded="always", omit=None, cli_type=List[str],
                         cli_default=["x86"],
                         help="Target preset (see `mlc targets`) or TVM target JSON; repeat for several.")
    output: Optional[Path] = option(None, "--output", "-o", parse=Path,
                                    help="Artifact directory (default: artifacts/MODEL-TARGET); with several targets, "
                                         "the folder that receives MODEL-TARGET for each.")
    db: Optional[str | Path] = option(None, "--db", recorded="given", path=True, cli_type=Optional[Path],
                                      help="Tuning database written by `mlc tune` (CPU targets).")
    default_schedules: bool = option(True, help="False: TVM's unscheduled loops instead of mlc's default schedules "
                                                "for the kernels the db does not cover (for comparison).")
    pass_options: passes.Options = option(passes.Options(), parse=_pass_options, recorded="always", key="passes",
                                          json=passes.Options.to_json, group=PassFlags,
                                          help="-O level and pass choices (see `mlc passes`).")
    atol: Optional[float] = option(None, "--atol", parse=_tolerance("--atol"),
                                   help="Absolute tolerance for the check (default: by dtype).")
    rtol: Optional[float] = option(None, "--rtol", parse=_tolerance("--rtol"),
                                   help="Relative tolerance for the check (default: by dtype).")
    archive: bool = option(False, "--archive", help="Also write the artifact as DIR.tar.gz.")
    check: bool = option(True, "--check/--no-check",
                         help="Run the artifact on its reference inputs once built (--no-check leaves that to `mlc "
                              "check`, e.g. on the device rather than under slow qemu emulation here).")
    isolate: bool = option(True, help="Run TVM in a child process (False: faster for many small models; a TVM crash "
                                      "then takes the process down).")
    precision: str = option(
        "fp32", "--precision", parse=check_precision, recorded="given", worker=True,
        help="fp32, bf16 (CPUs with AVX512-BF16) or fp16 (CUDA): matmul/conv inputs and weights in that type, fp32 "
             "accumulation; judged by an accuracy gate against the fp32 reference (exit 3 when missed).")
    cuda_graphs: bool = option(False, "--cuda-graphs", recorded="given", worker=True,
                               help="CUDA: after the first call, replay the parts of the model whose shapes are static "
                                    "as CUDA graphs (one launch each instead of one per kernel); fix the input shapes "
                                    "(--input-shape) for the whole model.")
    emulated: bool = option(False, "--emulated", recorded="given",
                            help="Build a --precision the target has no instructions for (slow: converted in "
                                 "software).")
    quantize: Optional[str] = option(
        None, "--quantize", recorded="given",
        help="int8 (static, calibrated) or int8-dynamic (activation scales at run time, matmuls only): matmul/conv "
             "weights int8 per channel, activations uint8; CPUs with VNNI/dotprod (else --emulated); judged by an "
             "accuracy gate (exit 3 when missed).")
    calibration: tuple[str, ...] = option(
        (), "--calibration", parse=str, recorded="given", path=True, cli_type=List[Path],
        help="--quantize int8: an .npz of inputs keyed by input name (repeatable); default: seeded random inputs.")

    __post_init__ = _parse_fields


def _at_least(least: int, flag: str):
    def parse(value: Optional[int]) -> Optional[int]:
        if value is not None and int(value) < least:
            raise InputError(f"{flag} must be at least {least}, not {value}")
        return None if value is None else int(value)
    return parse


@dataclass(frozen=True)
class RunOptions:
    """How an artifact runs (`mlc run`, `mlc.api.run`; `device` also `mlc check`)."""

    warmup: int = option(3, "--warmup", parse=_at_least(0, "--warmup"), help="Untimed runs first.")
    repeat: int = option(50, "--repeat", parse=_at_least(0, "--repeat"), help="Timed runs (0: run once, no timing).")
    profile: bool = option(False, "--profile", help="Also time every kernel call (3 runs) and list the slowest "
                                                    "kernels: where the time goes.")
    threads: Optional[int] = option(None, "--threads", parse=_at_least(1, "--threads"),
                                    help="CPU threads to run with (default: TVM_NUM_THREADS where set, else one per "
                                         "physical core).")
    device: Optional[str] = option(None, "--device", help="GPU artifacts: the GPU to run on, e.g. cuda:1 (default: "
                                                          "the first).")

    __post_init__ = _parse_fields


@dataclass(frozen=True)
class TuneOptions:
    """How `mlc tune` (`mlc.api.tune`) searches a model's kernels; mlc.tuning checks how they go together."""

    target: str = option("x86", "--target", "-t", help="CPU target preset (see `mlc targets`) or TVM target JSON.")
    db: Path = option(Path("tuning"), "--db", parse=Path, cli_type=Path, cli_default=...,
                      help="Tuning database folder (created; a rerun continues it).")
    trials: Optional[int] = option(None, "--trials", help="Trials per kernel the database should hold (default: 64).")
    budget: Optional[str] = option(None, "--budget", help="Wall-time limit for this run, e.g. 90s, 20m, 1h30m.")
    rpc_tracker: Optional[str] = option(None, "--rpc-tracker",
                                        help="HOST:PORT of a TVM RPC tracker: measure on its devices.")
    rpc_key: Optional[str] = option(None, "--rpc-key", help="Device key registered with the tracker.")
    threads: Optional[int] = option(None, "--threads", help="Threads to measure with: the count the model will run "
                                                            "with (default: TVM's own choice, as at run time).")

    __post_init__ = _parse_fields


def parse_list(flag: str, text: str) -> list[str]:
    """A comma-separated list, duplicates dropped in order."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError(f"{flag} is empty; give a comma-separated list")
    return list(dict.fromkeys(items))


def parse_ints(flag: str, text: str) -> list[int]:
    """Comma-separated whole numbers >= 1 (--threads also takes `all`: every usable core)."""
    from mlc import targets

    values = []
    for item in parse_list(flag, text):
        if flag == "--threads" and item == "all":
            item = str(targets.usable_cores())
        if not re.fullmatch(r"\d+", item) or int(item) < 1:
            raise InputError(f"{flag} {text!r}: {item!r} is not a whole number >= 1; write e.g. {flag} 1,4")
        values.append(int(item))
    return list(dict.fromkeys(values))


def _listed(flag: str, items: Callable[[str, str], list] = parse_list, none: bool = False) -> Callable[[Any], tuple]:
    """A comma-separated text (or a sequence, from Python) as a tuple of `items(flag, text)`; `none`: "none" is the
    empty list."""
    def parse(value: str | Sequence[Any]) -> tuple:
        text = value if isinstance(value, str) else ",".join(map(str, value))
        if none and text.strip().lower() in ("none", ""):
            return ()
        return tuple(items(flag, text))
    return parse


@dataclass(frozen=True)
class BenchOptions:
    """What `mlc bench` measures: its models, builds, shapes and baselines, and how each cell runs; the matrix they
    make is mlc.bench.config_from(options), which mlc.bench.validate checks."""

    models: Optional[str] = option(None, "--models", "-m", help="Zoo models, comma-separated (see `mlc models`).")
    suite: Optional[str] = option(None, "--suite", help="Instead of --models: PyTorch's benchmark suite huggingface or "
                                                       "timm (models built from their configs, batch 1, 128 tokens).")
    suite_models: Optional[str] = option(None, "--suite-models", help="With --suite: these of its models only.")
    targets: tuple = option("x86", "--targets", "-t", parse=_listed("--targets", none=True), cli_type=str,
                            help="mlc targets, comma-separated; 'none' for baselines only.")
    precision: tuple = option("fp32", "--precision", parse=_listed("--precision"), cli_type=str,
                              help="mlc builds per target, comma-separated: fp32, bf16 (CPUs with AVX512-BF16), "
                                   "fp16 (CUDA), int8 or int8-dynamic (`--quantize`, calibrated on seeded inputs); "
                                   "all but fp32 are judged by the accuracy gate.")
    batch: tuple = option("1", "--batch", parse=_listed("--batch", parse_ints), cli_type=str,
                          help="Batch sizes, comma-separated.")
    seq: tuple = option("128", "--seq", parse=_listed("--seq", parse_ints), cli_type=str,
                        help="Sequence lengths, comma-separated (models without one ignore it).")
    threads: tuple = option("1", "--threads", parse=_listed("--threads", parse_ints), cli_type=str,
                            help="CPU thread counts, comma-separated; all: every usable core.")
    baselines: tuple = option("torch,ort", "--baselines", "-b", parse=_listed("--baselines", none=True),
                              cli_type=str,
                              help="Baselines, comma-separated: torch, torch-compile, torchscript, ort, ort-int8, "
                                   "openvino, openvino-default, openvino-int8, openvino-throughput, tf, tf-graph, "
                                   "paddle, paddle-static; 'none' for mlc only.")
    warmup: int = option(3, "--warmup", help="Untimed runs per cell.")
    repeat: int = option(20, "--repeat", help="Timed runs per cell.")
    framework: Optional[str] = option(None, "--framework", "-f", help="Framework mlc and ort take the model from "
                                                                       "(default: torch where the model has it).")
    db: Optional[str] = option(None, "--db", help="Tuning database for mlc's compiles (needs `mlc tune`).")
    cell_timeout: Optional[float] = option(None, "--cell-timeout", help="Seconds a cell may run; a slower one is "
                                                                        "stopped and recorded as failed.")
    lengths: Optional[str] = option(None, "--lengths", help="Instead of the matrix: run one model over a "
                                    "sentence-length distribution (cola-like), batch 1, comparing dynamic, buckets, "
                                    "static, ort, openvino and torch (seed 002).")
    sentences: int = option(200, "--sentences", help="With --lengths: how many sentences.")
    buckets: tuple = option("8,16,32,64", "--buckets", parse=_listed("--buckets", parse_ints), cli_type=str,
                            help="With --lengths: the buckets strategy's sizes.")
    strategies: tuple = option("", "--strategies", parse=_listed("--strategies", none=True), cli_type=str,
                               cli_default=None, help="With --lengths: which of dynamic, buckets, static, ort, "
                                                      "openvino, torch (default: all).")

    __post_init__ = _parse_fields


# The ModelSpec options `mlc tune` takes: with `dynamic`, each kernel is tuned at one length of each symbolic dim
# (the reference's or --input-shape's), and the database records it for the --dynamic build.
TUNE_MODEL_OPTIONS = ("framework", "input_shapes", "dynamic")
# The ModelSpec options `mlc export` takes (the rest shape a compiled artifact).
EXPORT_OPTIONS = ("framework", "input_shapes", "dynamic", "exporter", "inputs")


def names(owner: type) -> list[str]:
    return [f.name for f, _ in declared(owner)]


def accept(given: dict[str, Any], known: Sequence[str], command: str) -> None:
    """An API function's **options: an unknown keyword is a TypeError, as for a declared signature."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"{command}() got unexpected keyword argument(s): {', '.join(unknown)}")


def split(source: str, given: dict[str, Any]) -> tuple[ModelSpec, CompileOptions]:
    """`mlc.api.compile`'s keyword arguments as the two option sets, each value parsed into its type."""
    model_names = names(ModelSpec)
    accept(given, model_names + names(CompileOptions), "compile")
    model = ModelSpec(source, **{k: v for k, v in given.items() if k in model_names})
    return model, CompileOptions(**{k: v for k, v in given.items() if k not in model_names})


def keyword_parameters(owners: Sequence[type], only: Optional[Sequence[str]] = None) -> list[inspect.Parameter]:
    """The declared options as keyword-only parameters, for the API functions' signatures (help(), IDEs)."""
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                              annotation=field_types(owner)[f.name])
            for owner in owners for f, _ in declared(owner) if only is None or f.name in only]


def describe(owners: Sequence[type], only: Optional[Sequence[str]] = None) -> str:
    """The declared options' help, for the API functions' docstrings."""
    return "\n".join(f"    `{f.name}` (default {f.default!r}): {opt.help}" for owner in owners
                     for f, opt in declared(owner) if only is None or f.name in only)


@dataclass(frozen=True)
class Recipe:
    options: dict  # the manifest's compile.options
    command: str  # the `mlc compile` command line that passes them


# Artifacts written before the options were declared record these keys in this order; it stays. Options added
# since follow, in declaration order (nothing to add here for a new option).
_RECORDED_ORDER = ("target", "framework", "input_shapes", "dynamic", "exporter", "pass_options", "inputs", "freeze",
                   "db", "buckets", "precision", "quantize", "calibration", "emulated")


def _recorded(opt: Option, value: Any) -> Any:
    if opt.json is not None:
        return opt.json(value)
    if opt.path:
        return [str(Path(v).resolve()) for v in value] if isinstance(value, tuple) else str(Path(value).resolve())
    if isinstance(value, tuple):
        return [str(v) for v in value]
    return str(value) if isinstance(value, (InputShape, DynamicDims, Buckets, Path)) else value


def _flags(opt: Option, value: Any) -> list[str]:
    """`value` as command-line flags."""
    if isinstance(value, passes.Options):
        return value.cli_args()
    if isinstance(value, bool):  # --x, or --x/--no-x for an option on by default
        on, _, off = opt.flags[0].partition("/")
        flag = on if value else off
        return [flag] if flag else []
    items = value if isinstance(value, tuple) else (value,)
    return [a for v in items for a in (opt.flags[0], str(v))]


def recipe(model: ModelSpec, options: CompileOptions) -> Recipe:
    """The options that rebuild an artifact, and the command line; `model.framework` is the resolved one."""
    fields = [(f, opt, getattr(owner, f.name)) for owner in (model, options) for f, opt in declared(type(owner))
              if opt.recorded]
    fields.sort(key=lambda x: _RECORDED_ORDER.index(x[0].name) if x[0].name in _RECORDED_ORDER else
                len(_RECORDED_ORDER))
    recorded, argv = {}, ["mlc", "compile", model.source]
    for f, opt, value in fields:
        if opt.recorded == "given" and (value == f.default or value is None):
            continue
        recorded[opt.key or f.name] = _recorded(opt, value)
        if value != (f.default if opt.omit is FIELD_DEFAULT else opt.omit):
            argv += _flags(opt, value)
    return Recipe(recorded, shlex.join(argv))
