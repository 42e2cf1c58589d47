"""Graph passes: one registry for the ONNX level (run in the mlc process) and the Relax level (run
in the TVM worker). `mlc passes` lists it; `plan()` turns -O level, --passes, --disable-pass,
--enable-pass and --pass-config into the passes to run. Importing this module imports neither
onnx nor tvm: pass bodies are named as "module:function" and loaded when they run."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from mlc.errors import InputError

LEVELS = ("onnx", "relax")
OPT_LEVELS = (0, 1, 2, 3)
DEFAULT_OPT_LEVEL = 2
GPU_DEVICES = ("cuda", "metal")
RNN_OPS = ("LSTM", "GRU", "RNN")  # lowered by the lower_rnn pass (TVM has no converter for them)
QUANTIZE_MODES = ("int8", "int8-dynamic")


@dataclass(frozen=True)
class Option:
    """One typed setting of a pass, set with --pass-config PASS.KEY=VALUE."""

    type: type
    default: Any
    help: str
    choices: tuple = ()

    def parse(self, text: str) -> Any:
        if self.type is bool:
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError("expected true or false")
            return lowered in ("1", "true", "yes", "on")
        value = self.type(text)
        if self.choices and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(map(str, self.choices))}")
        return value


@dataclass(frozen=True)
class Pass:
    name: str
    level: str  # "onnx" or "relax"
    description: str
    opt_level: Optional[int]  # on by default from this -O level up (on the devices below); None: only on request
    run: str  # "module:function", loaded when the pass runs; "": a step the pipeline runs itself (quantize)
    devices: tuple[str, ...] = ()  # on by default only for these target devices; () = every device
    config: Mapping[str, Option] = field(default_factory=dict)
    requested_by: str = ""  # the compile option that also runs it (its value is the step's config)

    def default_on(self, opt_level: int, device: str) -> bool:
        return (self.opt_level is not None and opt_level >= self.opt_level
                and (not self.devices or device in self.devices))

    @property
    def targets(self) -> str:
        if not self.devices:
            return "all"
        return ", ".join(self.devices) + (" (opt-in elsewhere)" if self.opt_level is not None else "")

    def load(self) -> Callable:
        module, function = self.run.split(":")
        return getattr(importlib.import_module(module), function)


_ONNX = "mlc.passes.onnx"
_RNN = "mlc.passes.rnn"
_RELAX = "mlc.compiler.relax_passes"  # imports tvm: loaded only in the compiler worker
_REWRITES = "mlc.passes.onnx_rewrites"

# Declaration order is execution order within each level.
PASSES: tuple[Pass, ...] = (
    Pass("lower_rnn", "onnx",
         "LSTM, GRU and RNN nodes (TVM's importer has none) -> MatMul/Add/Sigmoid/Tanh/Gather/Concat, "
         "unrolled over the sequence (its length must be static; batch stays dynamic). All directions, "
         "layouts, given or absent initial states, peepholes, clip, activations, sequence_lens.",
         0, f"{_RNN}:lower_rnn"),
    Pass("eliminate_dead_nodes", "onnx",
         "drop Identity, inference Dropout, Casts to the same type and nodes no output depends on",
         1, f"{_ONNX}:eliminate_dead_nodes"),
    Pass("fold_small_constants", "onnx",
         "Constant nodes -> initializers; nodes whose inputs are known small values (initializers, folded values, "
         "the Shape of a tensor of static shape) and whose outputs are small integer or boolean tensors (shapes, "
         "indices, masks) -> initializers, computed by onnx's reference evaluator. Cheap per node, where onnxslim "
         "(constant_folding) is not: it leaves onnxslim a smaller graph",
         1, f"{_ONNX}:fold_small_constants"),
    Pass("keep_symbolic_dims", "onnx",
         "exporters' shape subgraphs (tf2onnx, paddle2onnx) onto paths TVM's importer follows symbolically: "
         "whole-axis Slices dropped, Slice+Squeeze of one index -> Gather, Gather from Shape -> Shape(start, end), "
         "Range over a dim reads it from Shape, shapes computed through Casts rebuilt from Shape slices, "
         "identity Reshapes removed, ReduceProd of dims -> Mul",
         1, f"{_ONNX}:keep_symbolic_dims"),
    Pass("fold_batchnorm", "onnx",
         "fold an inference BatchNormalization into the Conv or Gemm before it (scaled weights and bias)",
         2, f"{_ONNX}:fold_batchnorm"),
    Pass("constant_folding", "onnx",
         "onnxslim: fold constant subgraphs (static shape arithmetic included), remove dead nodes, "
         "its pattern fusions except MatMul+Add -> Gemm (which adds Reshapes around N-D inputs), shape inference",
         1, f"{_ONNX}:constant_folding"),
    Pass("batchnorm_as_affine", "onnx",
         "an inference BatchNormalization not folded into a Conv (DenseNet's, after a concatenation) and the Mul/Add "
         "by per-channel constants after it -> one Mul and one Add per channel",
         2, f"{_ONNX}:batchnorm_as_affine"),
    Pass("flatten_concats", "onnx",
         "a Concat of a Concat's output along the same axis reads that Concat's inputs (DenseNet's block: no "
         "growing copy per layer; the inner Concat, read only by its layer's elementwise kernel, fuses into it)",
         2, f"{_ONNX}:flatten_concats"),
    Pass("static_control_flow", "onnx",
         "an If whose condition is known before run time -> the branch it takes (TVM imports both branches, and the "
         "other may not import); a Loop with a constant trip count, a Scan over static lengths and a SequenceMap over "
         "sequences of known length -> unrolled (TVM has no Loop, Scan or SequenceMap converter); then constant "
         "folding",
         0, "mlc.passes.control_flow:static_control_flow"),
    Pass("canonicalize_shapes", "onnx",
         "Reshape targets computed from Shape->Gather/Squeeze/Unsqueeze->Mul->Concat chains become constants "
         "with 0 (keep dim) and -1 (infer dim), so dynamic dims survive TVM import",
         1, f"{_ONNX}:canonicalize_shapes"),
    Pass("reduce_empty_sets", "onnx",
         "a reduction over an axis of size 0 -> a constant of its identity (0, 1, -inf, +inf); TVM reduces the "
         "empty axis into uninitialised memory",
         0, f"{_REWRITES}:reduce_empty_sets"),
    Pass("shape_inference", "onnx",
         "ONNX shape inference with data propagation (types and shapes for the importer)",
         0, f"{_ONNX}:shape_inference"),
    Pass("quantize", "onnx",
         "matmul/conv -> int8 (u8 activations x s8 per-channel weights, QDQ), calibrated on --calibration's inputs or "
         "seeded ones (int8), or scaled at run time (int8-dynamic); the graph before it is built where TVM fails on "
         "it. Run by mlc.pipeline.prepare after the other ONNX passes: it calibrates on the model's inputs",
         None, "", devices=("cpu",), requested_by="--quantize",
         config={"mode": Option(str, "int8", "int8 (calibrated) or int8-dynamic", QUANTIZE_MODES),
                 "attention": Option(bool, True, "int8 also quantises matmuls of two activations (attention's QK^T "
                                                 "and PV: uint8 x int8, calibrated per tensor)")}),
    Pass("mixed_precision", "relax",
         "matmul/conv compute in float16 (or bfloat16), accumulate and return float32 (relax.transform."
         "ToMixedPrecision); runs before the other Relax passes (it needs unfused ops)",
         3, f"{_RELAX}:mixed_precision", devices=GPU_DEVICES, requested_by="--precision fp16/bf16 (GPU)",
         config={"out_dtype": Option(str, "float32", "accumulation dtype", ("float32", "float16")),
                 "dtype": Option(str, "float16", "compute dtype", ("float16", "bfloat16"))}),
    Pass("combine_parallel_matmul", "relax",
         "matmuls sharing an input (e.g. Q/K/V projections, A.B and A.C) -> one matmul with concatenated "
         "weights, then split (relax.transform.CombineParallelMatmul)",
         2, f"{_RELAX}:combine_parallel_matmul",
         config={"min_branches": Option(int, 2, "combine only groups of at least this many matmuls")}),
    Pass("convert_layout", "relax",
         "conv2d data/weight layout for targets that prefer another (relax.transform.ConvertLayout)",
         3, f"{_RELAX}:convert_layout", devices=GPU_DEVICES,
         config={"layout": Option(str, "NHWC", "conv2d data layout", ("NHWC", "NCHW"))}),
    Pass("pad_attention", "relax",
         "softmax(Q @ K^T) @ V over a static key count that is no multiple of the vector width (a ViT's 197 tokens): "
         "keys zero-padded to the next multiple and their scores masked with -inf (exactly 0 after softmax), so every "
         "attention kernel runs whole vectors",
         2, f"{_RELAX}:pad_attention", devices=("cpu",)),
    Pass("pad_depthwise_channels", "relax",
         "a separable conv (depthwise, then a conv) over a channel count no vector fits (NASNet's 11, 22, 42) -> "
         "both on channels zero-padded to whole vectors (zero filters, zero input channels: the same result); the "
         "schedule cannot pad a conv in the kernel, and it ran scalar code",
         2, f"{_RELAX}:pad_depthwise_channels", devices=("cpu",)),
    Pass("fast_math", "relax",
         "erf (GELU), tanh, sigmoid, exp and softmax -> polynomials that vectorize (topi.fast_*), x**2 and x**3 -> "
         "products: libm's are scalar calls (17-50x slower per element); max abs error 3.9e-7, exp relative 4e-6",
         2, f"{_RELAX}:fast_math", devices=("cpu",)),
    Pass("fold_constant", "relax",
         "evaluate Relax expressions whose inputs are all constants (relax.transform.FoldConstant)",
         1, f"{_RELAX}:fold_constant"),
    Pass("dead_code_elimination", "relax", "remove unused bindings and functions (relax.transform.DeadCodeElimination)",
         1, f"{_RELAX}:dead_code_elimination"),
    Pass("bf16_matmul", "relax",
         "matmul and conv with a constant weight (and attention's activation matmuls whose tiles fit) -> bf16 "
         "operands and float32 results, for AVX512-BF16's vdpbf16ps and ARM's bfdot; everything else stays float32",
         None, f"{_RELAX}:bf16_matmul", devices=("cpu",), requested_by="--precision bf16 (CPU)"),
    Pass("fuse_ops", "relax",
         "LegalizeOps -> AnnotateTIROpPattern -> FoldConstant -> FuseOps -> FuseTIR, as TVM's CPU/GPU pipelines "
         "do (tvm.compile's generic CPU pipeline does not fuse; its GPU pipeline fuses again, harmlessly)",
         1, f"{_RELAX}:fuse_ops",
         config={"fuse_opt_level": Option(int, -1, "FuseOps opt level (-1: from the pass context)")}),
)
REGISTRY: dict[str, Pass] = {p.name: p for p in PASSES}


@dataclass
class Step:
    """A pass to run, its resolved settings, and whether the user named it (then failure is an error)."""

    name: str
    level: str
    config: dict[str, Any]
    explicit: bool
    requested: str = ""  # the option that asked for it ("--precision bf16"): an optional step of the build

    def to_json(self) -> dict:
        return {"name": self.name, "level": self.level, "config": self.config, "explicit": self.explicit,
                "requested": self.requested}


def _known(name: str) -> Pass:
    if name in REGISTRY:
        return REGISTRY[name]
    near = difflib.get_close_matches(name, REGISTRY, n=1)
    hint = f"did you mean '{near[0]}'? " if near else ""
    raise InputError(f"unknown pass '{name}'; {hint}see `mlc passes` for the list")


def _split_names(values: Sequence[str]) -> list[str]:
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def parse_config(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """["fuse_ops.fuse_opt_level=2", ...] -> {"fuse_ops": {"fuse_opt_level": 2}}, typed and checked."""
    result: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, text = item.partition("=")
        name, dot, option = key.strip().partition(".")
        if not eq or not dot or not name or not option:
            raise InputError(f"--pass-config '{item}': expected PASS.KEY=VALUE, e.g. fuse_ops.fuse_opt_level=2")
        spec = _known(name)
        if option not in spec.config:
            keys = ", ".join(spec.config) or "none"
            raise InputError(f"--pass-config '{item}': pass {name} has no setting '{option}' (settings: {keys})")
        try:
            result.setdefault(name, {})[option] = spec.config[option].parse(text)
        except ValueError as e:
            raise InputError(f"--pass-config '{item}': bad value for {name}.{option} "
                             f"({spec.config[option].type.__name__}): {e}") from None
    return result


def requested_steps(precision: str = "fp32", quantize: Optional[str] = None, device: str = "cpu"
                    ) -> dict[str, tuple[str, dict[str, Any]]]:
    """The steps --precision and --quantize run: {pass: (the option as given, its settings)}."""
    steps = {}
    if quantize:
        steps["quantize"] = (f"--quantize {quantize}", {"mode": quantize})
    if precision == "bf16" and device == "cpu":
        steps["bf16_matmul"] = ("--precision bf16", {})
    elif precision in ("fp16", "bf16"):
        steps["mixed_precision"] = (f"--precision {precision}",
                                    {"dtype": "float16" if precision == "fp16" else "bfloat16"})
    return steps


def plan(opt_level: int = DEFAULT_OPT_LEVEL, passes: Optional[Sequence[str]] = None, disable: Sequence[str] = (),
         enable: Sequence[str] = (), config: Sequence[str] = (), device: str = "cpu", precision: str = "fp32",
         quantize: Optional[str] = None) -> list[Step]:
    """The passes to run, in registry order. `passes` is an exact list (replaces the -O level's);
    `enable` adds passes to the level's (opt-in ones such as mixed_precision on CPU); `disable` removes.
    `precision` and `quantize` add their steps (requested_steps) whatever the rest says."""
    if opt_level not in OPT_LEVELS:
        raise InputError(f"-O{opt_level}: the optimisation level must be 0, 1, 2 or 3")
    exact = _split_names(passes) if passes is not None else None
    disabled, enabled = _split_names(disable), _split_names(enable)
    for name in (exact or []) + disabled + enabled:
        _known(name)
    for name in (exact or []) + enabled:
        if REGISTRY[name].opt_level is None:
            raise InputError(f"pass {name} runs when {REGISTRY[name].requested_by} asks for it; give that option")
    settings = parse_config(config)
    requested = requested_steps(precision, quantize, device)
    explicit = set(exact or []) | set(enabled)
    chosen = (set(exact) if exact is not None
              else {p.name for p in PASSES if p.default_on(opt_level, device)} | set(enabled))
    chosen = (chosen - set(disabled)) | set(requested)
    steps = []
    for p in PASSES:
        if p.name in chosen:
            given, values = requested.get(p.name, ("", {}))
            values = {**{k: o.default for k, o in p.config.items()}, **settings.get(p.name, {}), **values}
            steps.append(Step(p.name, p.level, values, p.name in explicit and not given, given))
    unused = sorted(set(settings) - chosen)
    if unused:
        hints = [f"{name} runs when {REGISTRY[name].requested_by} asks for it" for name in unused
                 if REGISTRY[name].opt_level is None]
        if len(hints) < len(unused):  # the others are off at this level
            hints.append(f"enable {'the others' if hints else 'it'} with --enable-pass")
        raise InputError(f"--pass-config for {', '.join(unused)}, which will not run; {'; '.join(hints)}")
    return steps


class PassFailed(Exception):
    """A pass cannot handle this model (raised by pass bodies with the reason)."""


def describe_all() -> list[dict[str, str]]:
    """Rows for `mlc passes`."""
    def turned_on_by(p: Pass) -> str:
        return " or ".join(([f"-O{p.opt_level}"] if p.opt_level is not None else []) +
                           ([p.requested_by] if p.requested_by else []))

    return [{"name": p.name, "level": p.level, "opt_level": turned_on_by(p), "targets": p.targets,
             "description": p.description,
             "config": ", ".join(f"{k}={o.default}" for k, o in p.config.items())} for p in PASSES]


@dataclass(frozen=True)
class Options:
    """The user's pass choices, as `mlc compile` takes them."""

    opt_level: int = DEFAULT_OPT_LEVEL
    passes: Optional[tuple[str, ...]] = None  # exact list (--passes), replaces the level's
    disable: tuple[str, ...] = ()
    enable: tuple[str, ...] = ()
    config: tuple[str, ...] = ()  # PASS.KEY=VALUE
    dump_ir: Optional[str] = None  # folder for the graph after each pass

    def plan(self, device: str, precision: str = "fp32", quantize: Optional[str] = None) -> list[Step]:
        return plan(self.opt_level, self.passes, self.disable, self.enable, self.config, device, precision, quantize)

    def to_json(self) -> dict:
        return {"opt_level": self.opt_level, "passes": list(self.passes) if self.passes is not None else None,
                "disable": list(self.disable), "enable": list(self.enable), "config": list(self.config)}

    def cli_args(self) -> list[str]:
        """The options as `mlc compile` flags, for the artifact's rebuild recipe."""
        args = [f"-O{self.opt_level}"] if self.opt_level != DEFAULT_OPT_LEVEL else []
        if self.passes is not None:
            args += ["--passes", ",".join(self.passes)]
        args += [a for name in self.disable for a in ("--disable-pass", name)]
        args += [a for name in self.enable for a in ("--enable-pass", name)]
        return args + [a for item in self.config for a in ("--pass-config", item)]
