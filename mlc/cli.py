"""The `mlc` command line: parses options, calls one API function, maps errors to exit codes.
Progress goes to stderr; results (and --json) to stdout."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mlc import __version__
from mlc.errors import ExitCode, MlcError
from mlc.pipeline import options as declared  # light: the declarations, not the pipeline

# typer shows a flag's type as <bool>, which reads as if `--archive true` were accepted (it is a usage error).
_option_type = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = lambda self, ctx: None if self.is_flag else _option_type(self, ctx)

app = typer.Typer(
    name="mlc",
    help="Compile PyTorch, TensorFlow/Keras, PaddlePaddle and ONNX models with Apache TVM into verified, "
         "self-contained artifacts.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Outside a terminal rich assumes 80 columns, which squeezes the tables; logs are wider.
_WIDTH = shutil.get_terminal_size((140, 24)).columns
out = Console(highlight=False, width=_WIDTH)
err = Console(stderr=True, highlight=False, width=_WIDTH)
_state = {"debug": bool(os.environ.get("MLC_DEBUG"))}


def _version(value: bool) -> None:
    if value:
        out.print(f"mlc {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and keep TVM's log on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    _state["debug"] = _state["debug"] or debug


def _step(description: str):
    """Spinner while a step runs, then a done line with its duration (stderr)."""

    @contextlib.contextmanager
    def run():
        start = time.perf_counter()
        with err.status(f"{description}..."):
            yield
        err.print(f"[green]✓[/] {description} [dim]({time.perf_counter() - start:.1f} s)[/]")

    return run()


def _fmt(value: float, spec: str = ".2e") -> str:
    return "nan" if math.isnan(value) else format(value, spec)


def _dims(shape) -> str:
    """1x128; a 0-d tensor as "scalar" (an empty field reads as a missing shape)."""
    return "x".join(map(str, shape)) or "scalar"


def _check_table(result, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("output", "shape", "dtype", "max abs err", "max rel err", "cosine", "mismatched", "atol/rtol",
                   "result"):
        table.add_column(column, justify="left" if column in ("output", "result") else "right")
    for o in result.outputs:
        problems = [o.problem] if o.problem else []
        if o.nonfinite_mismatch:
            problems.append(f"{o.nonfinite_mismatch} NaN/Inf differ")
        verdict = "[green]pass[/]" if o.passed else "[red]FAIL[/] " + escape("; ".join(problems))
        if not o.passed and getattr(result, "gate", None) is not None and o.dtype.startswith("float"):
            verdict = "[yellow]outside[/] " + escape("; ".join(problems))  # the gate decides
        table.add_row(
            escape(o.name), _dims(o.shape), o.dtype,
            _fmt(o.max_abs_error), _fmt(o.max_rel_error), _fmt(o.cosine_similarity, ".6f"),
            f"{o.mismatch_fraction:.2%}", f"{o.atol:.2g}/{o.rtol:.2g}", verdict.strip(),
        )
    return table


def _print_check(result, artifact: Optional[Path] = None) -> None:
    """The compiled model against the reference; for framework models, first the conversion step
    (ONNX Runtime on the export against the same eager outputs), so a user sees where accuracy went. The artifact
    is named on a line of its own: a table's title is cut to the table's width."""
    if artifact is not None:
        out.print(f"{escape(str(artifact))}:", soft_wrap=True)
    if result.conversion is not None:
        out.print(_check_table(result.conversion, f"conversion: ONNX Runtime on the export vs {result.reference}"))
    elif result.conversion_error:
        out.print(f"[yellow]conversion: ONNX Runtime could not run the export[/] ({escape(result.conversion_error)})")
    what = ("compilation: the artifact vs" if result.conversion is not None or result.conversion_error
            else "check against")
    if result.gate is not None:
        article = "an" if result.gate.precision.startswith("int8") else "a"
        what = (f"fp32 tolerances, for information ({article} {result.gate.precision} build is judged by its gate "
                "below):")
    out.print(_check_table(result, f"{what} {result.reference}"))
    if result.gate is not None:
        against = f"{result.reference} on {result.gate.inputs} inputs" if result.gate.inputs > 1 else result.reference
        if result.gate.calibration_inputs:  # their fp32 outputs are ONNX Runtime's on the (exported) ONNX
            against = f"fp32 (ONNX Runtime) on {result.gate.inputs} of your --calibration inputs"
        out.print(_gate_table(result.gate, f"{result.gate.precision} accuracy gate vs {against}"))


def _gate_table(gate, title: str) -> Table:
    limits = gate.limits
    table = Table(title=title, title_justify="left")
    for column in ("output", "shape", "cosine", "max abs err", "% of peak", "top-1", "top-5", "result"):
        table.add_column(column, justify="left" if column in ("output", "result") else "right")
    for o in gate.outputs:
        top1 = "-" if o.top1_agreement is None else (
            f"{o.top1_agreement:.0%}" + (f" (+{o.top1_near_ties} near tie)" if o.top1_near_ties else ""))
        top5 = "-" if o.top5_agreement is None else f"{o.top5_agreement:.0%}"
        verdict = "[green]pass[/]" if o.passed else "[red]FAIL[/] " + escape("; ".join(o.problems))
        table.add_row(escape(o.name), _dims(o.shape), _fmt(o.cosine_similarity, ".6f"),
                      _fmt(o.max_abs_error), _fmt(100 * o.rel_error, ".2f"), top1, top5, verdict.strip())
    table.caption = (f"gate: cosine >= {limits.min_cosine}, max abs error <= {limits.max_rel_error:.0%} of the "
                     f"peak |ref|, top-1 >= {limits.min_top1:.0%} of rows (near ties agree), top-5 >= "
                     f"{limits.min_top5:.0%}")
    table.caption_justify = "left"
    return table


def _latency_line(stats: dict) -> str:
    return (
        f"latency over {stats['runs']} runs: mean {stats['mean_ms']:.3f} ms, p50 {stats['p50_ms']:.3f} ms, "
        f"p90 {stats['p90_ms']:.3f} ms, p99 {stats['p99_ms']:.3f} ms; "
        f"throughput {stats['throughput_per_s']:.1f} runs/s "
        f"({stats['samples_per_s']:.1f} samples/s)"
    )


_MODEL_HELP = ("A model: .onnx; PyTorch .pt2 (torch.export), TorchScript .pt or file.py:factory; TensorFlow SavedModel "
               "folder, .keras or .h5; Paddle jit.save prefix; or zoo:NAME (see `mlc models`).")


def _declared_options(*owners: type, only: Optional[Sequence[str]] = None):
    """Give a command the options declared on `owners`' fields (mlc.pipeline.options; `only`: these), after its own
    parameters, as typer options made from each declaration; the command receives them as keyword arguments named
    as the API's (a group's flags gathered into the group's value)."""
    params, groups = [], []
    for owner in owners:
        types = declared.field_types(owner)
        for field, opt in declared.declared(owner):
            if only is not None and field.name not in only:
                continue
            if opt.group is not None:
                groups.append((field.name, opt.group))
                params += _typer_params(opt.group, declared.field_types(opt.group))
            elif opt.flags:
                params += _typer_params(owner, types, [field.name])

    def wrap(func):
        @functools.wraps(func)
        def command(*args, **kwargs):
            for name, group in groups:
                kwargs[name] = group(**{n: kwargs.pop(n) for n in declared.names(group)})
            return func(*args, **kwargs)

        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        command.__signature__ = signature.replace(parameters=own + params)
        return command
    return wrap


def _typer_params(owner: type, types: dict, only: Optional[Sequence[str]] = None) -> list[inspect.Parameter]:
    params = []
    for field, opt in declared.declared(owner):
        if only is not None and field.name not in only:
            continue
        repeatable = isinstance(field.default, tuple)
        default = opt.cli_default if opt.cli_default is not declared.FIELD_DEFAULT else (
            [] if repeatable else field.default)
        annotation = opt.cli_type or (List[str] if repeatable else types[field.name])
        params.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                        default=typer.Option(default, *opt.flags, help=opt.help)))
    return params


@app.command("export")
@_declared_options(declared.ModelSpec, only=declared.EXPORT_OPTIONS)
@_declared_options(declared.CompileOptions, only=("atol", "rtol"))
def export_cmd(
    model: str = typer.Argument(..., help=_MODEL_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="The ONNX file to write."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    **options,
) -> None:
    """Convert a framework model to ONNX (stop before TVM) and compare ONNX Runtime with the framework."""
    from mlc import api

    result = api.export(model, output, step=_step if not as_json else api.quiet_step, **options)
    conversion = result.conversion
    if as_json:
        out.print_json(json.dumps({"onnx": str(result.path), "source": result.source.model_dump(),
                                   "conversion": conversion.to_json() if conversion else None,
                                   "conversion_error": result.conversion_error or None}))
    else:
        if result.source.exporter:
            out.print(f"exported with {escape(result.source.exporter)}")
        if conversion is not None:
            out.print(_check_table(conversion, f"ONNX Runtime on the export vs {conversion.reference}"))
        elif result.conversion_error:
            out.print(f"[yellow]ONNX Runtime could not run the export:[/] {escape(result.conversion_error)}")
        out.print(f"wrote {result.path}")
    if conversion is not None:
        api.require_pass(conversion)
    elif result.conversion_error:
        from mlc.errors import AccuracyError

        raise AccuracyError("the exported ONNX model does not run in ONNX Runtime")


@app.command("compile")
@_declared_options(declared.CompileOptions, declared.ModelSpec)
def compile_cmd(
    model: str = typer.Argument(..., help=_MODEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    **options,
) -> None:
    """Compile a model into a verified artifact: compiled library, thin runtime, reference data.

    Models from PyTorch, TensorFlow and Paddle are exported to ONNX and checked against the
    framework's own eager outputs."""
    from mlc import api

    target_list = options.pop("target")

    def announce(name: str) -> None:
        if len(set(target_list)) > 1 and not as_json:
            err.print(f"[bold]== {name}[/]")

    results = []
    for result in api.compile_targets(model, target_list, step=_step if not as_json else api.quiet_step,
                                      on_target=announce, **options):
        _report_compile(result, as_json)
        results.append(result)
    for result in results:
        if result.check is not None:
            api.require_pass(result.check)


def _report_compile(result, as_json: bool) -> None:
    for note in result.notes:
        err.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)
    check = result.check
    if as_json:
        out.print_json(json.dumps({"artifact": str(result.path),
                                   "archive": str(result.archive) if result.archive else None,
                                   "target": result.manifest.target.name,
                                   "check": check.to_json() if check is not None else None,
                                   "timings_s": result.manifest.compile.timings_s,
                                   "passes": [p.model_dump() for p in result.manifest.compile.passes]}))
        return
    m = result.manifest
    if m.source.exporter:
        out.print(f"exported with {escape(m.source.exporter)}")
    if m.compile.passes:
        out.print(_passes_table(m.compile.passes))
    if check is not None:
        _print_check(check)
    shapes = ", ".join(f"{i.name} {_dims(i.shape)} {i.dtype}" for i in m.inputs)
    size = sum(p.stat().st_size for p in result.path.rglob("*") if p.is_file())
    out.print(f"artifact: {result.path}  ({size / 2**20:.1f} MiB; inputs: {shapes or 'none'})")
    opened = {d: n for i in m.inputs for d, n in zip(i.model_shape or (), i.shape) if isinstance(d, str)
              and isinstance(n, int)}
    if opened:  # the sizes the model did not fix: mlc's (or --input-shape's), not the user's model's
        fixed = ", ".join(f"{d}={n}" for d, n in opened.items())
        out.print(f"dims the model leaves open, fixed at the reference size: {fixed} (--dynamic {','.join(opened)} "
                  f"keeps {'it' if len(opened) == 1 else 'them'} symbolic); the other dims are the model's own")
    if result.archive:
        out.print(f"archive:  {result.archive}")
    kernels = ", ".join(f"{len(v)} {k}" for k, v in (m.compile.schedules or {}).items() if v and k != "tuned_at")
    if kernels:  # a model whose outputs are its inputs or weights has none
        out.print(f"kernels: {kernels}")


@app.command("tune")
@_declared_options(declared.ModelSpec, declared.TuneOptions,
                   only=(*declared.TUNE_MODEL_OPTIONS, *declared.names(declared.TuneOptions)))
def tune_cmd(
    model: str = typer.Argument(..., help=_MODEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    **options,
) -> None:
    """Autotune the model's kernels with MetaSchedule into a resumable database (Ctrl-C keeps every record). With
    --dynamic, each kernel is tuned at one length of each dim (the reference's or --input-shape's), which the database
    records, so that the --dynamic build finds its kernels' static twins."""
    from mlc import api, tuning
    from mlc.tuning.progress import TuneProgress

    trials, budget = options["trials"], options["budget"]
    per_task = trials if trials is not None else (None if budget else tuning.DEFAULT_TRIALS_PER_TASK)
    budget_s = tuning.parse_budget(budget) if budget is not None else None
    display = contextlib.nullcontext() if as_json else TuneProgress(err, per_task, budget_s)
    with display as progress:
        result = api.tune(model, on_event=progress.update if progress else (lambda e, t: None), **options)
    for note in result.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    summary = {"db": str(result.db), "tasks": len(result.tasks), "trials": result.trials,
               "failed_trials": result.errors,
               "records": result.records, "seconds": round(result.seconds, 1), "stopped_by": result.reason,
               "threads": result.threads,
               "kernels": [{"name": t.name, "weight": t.weight, "trials": t.trials, "best_us": t.best_us}
                           for t in result.tasks],
               "left_to_default": result.left_to_default}
    if as_json:
        out.print_json(json.dumps(summary))
        return
    measured = f", measured with {result.threads} thread(s)" if result.threads else ""
    out.print(f"tuned {len(result.tasks)} kernels: {result.trials} trials this run ({result.errors} failed) in "
              f"{result.seconds:.0f} s{measured}, stopped by {result.reason}; {result.records} records in {result.db}")
    framework, dynamic = options["framework"], options["dynamic"]
    out.print(f"use them: mlc compile {model} --target {options['target']} --db {options['db']}"
              + (f" -f {framework}" if framework else "") + (f" --dynamic {','.join(dynamic)}" if dynamic else ""))


@app.command("rpc-server")
def rpc_server_cmd(
    tracker: Optional[str] = typer.Option(None, "--tracker", help="HOST:PORT of the TVM RPC tracker to register with."),
    key: str = typer.Option("", "--key", help="Device key to register under (what `mlc tune --rpc-key` asks for)."),
    host: str = typer.Option("127.0.0.1", "--host",
                             help="Address to listen on; 0.0.0.0 for every interface (anyone who reaches the port "
                                  "runs code on this device)."),
    port: int = typer.Option(9090, "--port", help="First port to try (up to +100)."),
) -> None:
    """Serve this device to `mlc tune --rpc-tracker` (TVM RPC; needs apache-tvm on the device). Ctrl-C stops it."""
    from mlc.compiler import rpc

    def ready(server) -> None:
        warning = rpc.exposure_warning(host, server.port)
        if warning:
            err.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
        where = f", registered with {tracker} as '{key}'" if tracker else ""
        err.print(f"RPC server listening on {host}:{server.port}{where}; Ctrl-C stops it", soft_wrap=True)

    rpc.serve(host, port, tracker, key, on_ready=ready)


def _passes_table(records) -> Table:
    table = Table(title="Graph passes (ops: ONNX nodes / Relax operator calls)", title_justify="left")
    for column in ("pass", "level", "ops before", "ops after", "time", "changes"):
        table.add_column(column, justify="right" if column.startswith(("ops", "time")) else "left")
    for r in records:
        if r.status == "applied":
            what = escape(", ".join(f"{op} {n:+d}"
                                    for op, n in sorted(r.op_changes.items(), key=lambda kv: -abs(kv[1]))[:6]) or "-")
        else:
            what = f"[yellow]skipped:[/] {escape(r.reason or '')}"
        table.add_row(r.name, r.level, str(r.ops_before), str(r.ops_after), f"{r.time_s:.2f} s", what)
    return table


@app.command("passes")
def passes_cmd(as_json: bool = typer.Option(False, "--json", help="Print the registry as JSON.")) -> None:
    """List the graph passes: level, what each does, the -O level that enables it, targets, settings."""
    from mlc import passes as graph_passes

    rows = graph_passes.describe_all()
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table(title=f"Graph passes, in the order they run (default -O{graph_passes.DEFAULT_OPT_LEVEL})")
    for column in ("name", "level", "from", "targets", "settings (--pass-config)", "what it does"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], r["level"], r["opt_level"], r["targets"], r["config"] or "-", r["description"])
    out.print(table)


@app.command("run")
@_declared_options(declared.RunOptions)
def run_cmd(
    artifact: Path = typer.Argument(..., help="Artifact directory written by `mlc compile`."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", "-i",
                                          help=".npz with one array per input, or a .npy for a one-input model "
                                               "(default: reference inputs)."),
    outputs: Optional[Path] = typer.Option(None, "--outputs", "-o", help="Write the outputs to this .npz."),
    as_json: bool = typer.Option(False, "--json", help="Print latency and output shapes as JSON."),
    **options,
) -> None:
    """Run an artifact and report latency (mean, p50, p90, p99, throughput)."""
    from mlc import api

    result = api.run(artifact, inputs, **options)
    for warning in result.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    if outputs:
        api.save_outputs(outputs, result.outputs, artifact)
    if as_json:
        out.print_json(json.dumps({
            "artifact": str(artifact),
            "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in result.outputs.items()},
            "latency": result.latency,
            "threads": result.threads,
            **({"profile": result.profile} if options["profile"] else {}),
        }))
        return
    for name, value in result.outputs.items():
        out.print(f"{name}: shape {_dims(value.shape)} {value.dtype}")
    if outputs:
        out.print(f"outputs written to {outputs}")
    if result.latency:
        out.print(_latency_line(result.latency) + (f"; {result.threads} thread(s)" if result.threads else ""))
    if result.profile:
        _print_profile(result.profile)


def _print_profile(rows: list[dict], shown: int = 15) -> None:
    table = Table(title="time per run, by kernel (each call timed alone)", title_justify="left")
    for column in ("kernel", "calls", "ms", "share"):
        table.add_column(column, justify="left" if column == "kernel" else "right", overflow="fold")
    for row in rows[:shown]:
        name = row["name"] if len(row["name"]) <= 80 else row["name"][:77] + "..."
        table.add_row(escape(name), str(row["calls"]), f"{row['ms']:.3f}", f"{row['share']:.1%}")
    out.print(table)
    if len(rows) > shown:
        rest = rows[shown:]
        out.print(f"... {len(rest)} more, {sum(r['ms'] for r in rest):.3f} ms together (--json lists all)")


@app.command("check")
@_declared_options(declared.CompileOptions, only=("atol", "rtol"))
@_declared_options(declared.RunOptions, only=("device",))
def check_cmd(
    artifact: Path = typer.Argument(..., help="Artifact directory written by `mlc compile`."),
    as_json: bool = typer.Option(False, "--json", help="Print per-output statistics as JSON."),
    **options,
) -> None:
    """Run the artifact on its reference inputs and compare with the reference outputs (exit 3 on mismatch)."""
    from mlc import api

    result = api.check(artifact, **options)
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        _print_check(result, artifact)
        out.print("[green]check passed[/]" if result.passed else "[red]check FAILED[/]")
    api.require_pass(result)


def _value_rows(table: Table, report, style: str = "") -> None:
    s = report.stats
    verdict = "[green]ok[/]" if s.passed else "[red]DIFFERS[/]"
    table.add_row(f"#{report.position}", escape(report.node_name), report.op_type, escape(report.value),
                  _dims(s.shape), _fmt(s.max_abs_error), _fmt(s.max_rel_error),
                  _fmt(s.cosine_similarity, ".6f"), f"{s.mismatch_fraction:.2%}", verdict, style=style)


def _print_debug(report) -> None:
    d = report.divergence
    cleanup_worst = max((o.max_abs_error for o in report.cleanup.outputs), default=0.0)
    final_worst = max((o.max_abs_error for o in report.final.outputs), default=0.0)
    out.print("graph clean-up (constant folding, shape inference): "
              + ("[green]outputs unchanged[/]" if report.cleanup.passed
                 else f"[red]CHANGED the outputs[/] (max abs err {_fmt(cleanup_worst)})"))
    out.print(f"compiled for {report.target} vs ONNX Runtime: "
              + ("[green]outputs match[/]" if report.final.passed
                 else f"[red]outputs differ[/] (max abs err {_fmt(final_worst)})"))
    how = {"final-only": "the outputs of one build", "exposed": "one build with every intermediate value exposed",
           "bisect": "bisection over prefix models"}[report.method]
    out.print(f"compared {report.values_compared} values by {how} ({report.builds} TVM builds)")
    if d.first is None:
        if report.cleanup.passed and report.final.passed:
            out.print("[green]no divergence: every compared value is within tolerance[/]")
        elif not report.cleanup.passed:
            out.print("[red]accuracy is lost in the ONNX clean-up, before TVM[/]")
        return
    f = d.first
    out.print(f"\n[bold red]first diverging node:[/] {escape(f.node_name)} ({f.op_type}) -> {escape(f.value)}")
    for i in f.inputs:
        if i["constant"]:
            state = "constant"
        elif "passed" in i:
            state = f"max abs err {_fmt(i['max_abs_error'])} ({'matches' if i['passed'] else 'already differs'})"
        else:
            state = "graph input"
        shape = "x".join(map(str, i["shape"])) if i["shape"] else "?"
        out.print(f"  input {escape(i['name'])}: {shape} {i['dtype'] or ''}  {state}")
    table = Table(title="values compared up to the first divergence", title_justify="left")
    for column in ("pos", "node", "op", "value", "shape", "max abs err", "max rel err", "cosine", "mismatched",
                   "result"):
        table.add_column(column, justify="left" if column in ("node", "op", "value", "result") else "right")
    for r in d.preceding:
        _value_rows(table, r)
    _value_rows(table, f, style="bold")
    out.print(table)
    if d.first_nonfinite:
        n = d.first_nonfinite
        out.print(f"first NaN/Inf: {escape(n.node_name)} ({n.op_type}) -> {escape(n.value)}")
    if report.extracted:
        out.print(f"extracted the node with its inputs and outputs to {report.extracted}/ "
                  "(model.onnx, inputs.npz, expected.npz, actual.npz, report.json)")


@app.command("debug")
@_declared_options(declared.ModelSpec, only=("input_shapes", "framework"))
def debug_cmd(
    model: str = typer.Argument(...,
                                help="A model (as for compile) or an artifact directory "
                                     "(reuses its model, target, shapes, inputs)."),
    target: Optional[str] = typer.Option(None, "--target", "-t",
                                         help="Target preset (default: the artifact's, else x86)."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", "-i",
                                          help=".npz of model inputs (default: seeded reference inputs)."),
    atol: Optional[float] = typer.Option(None, help="Absolute tolerance (default: by dtype)."),
    rtol: Optional[float] = typer.Option(None, help="Relative tolerance (default: by dtype)."),
    extract: Optional[Path] = typer.Option(None, "--extract",
                                           help="Write the first diverging node as a small ONNX model "
                                                "with its data here."),
    method: str = typer.Option("auto",
                               help="auto | exposed (one build, every value an output) | bisect (prefix builds)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    **options,
) -> None:
    """Localise the first node whose compiled output differs from ONNX Runtime (exit 3 if any).
    Framework models are exported to ONNX first; the search runs on the export."""
    from mlc import api

    report = api.debug(model, target=target, inputs=inputs, atol=atol, rtol=rtol, extract=extract, method=method,
                       step=_step if not as_json else api.quiet_step, **options)
    if as_json:
        out.print_json(json.dumps(report.to_json()))
    else:
        _print_debug(report)
    if report.diverged:
        raise typer.Exit(int(ExitCode.ACCURACY))


@app.command("unpack")
def unpack_cmd(
    archive: Path = typer.Argument(..., help="An artifact .tar.gz written by `mlc compile --archive`."),
    dest: Path = typer.Option(Path("artifacts"), "--dest", "-d", help="Folder to unpack into."),
) -> None:
    """Unpack an artifact archive safely and verify every file."""
    from mlc import artifacts

    out.print(f"unpacked and verified: {artifacts.unpack(archive, dest)}")


@app.command("targets")
def targets_cmd() -> None:
    """List the target presets."""
    from mlc import targets

    table = Table(title="Targets")
    for column in ("name", "description", "TVM target"):
        table.add_column(column)
    for row in targets.describe_all():
        table.add_row(row["name"], row["description"], row["tvm"])
    out.print(table)


@app.command("bench")
@_declared_options(declared.BenchOptions)
def bench_cmd(
    output: Path = typer.Option(..., "--output", "-o", help="The results JSON to write (rewritten after every cell)."),
    **options,
) -> None:
    """Benchmark zoo models: mlc per target side by side with framework baselines, per shape and thread count.

    Each cell runs in a process of its own; p50/p90/p99/mean latency, compile (and tuning) time,
    artifact size, peak memory and accuracy against the framework's eager outputs go to the JSON."""
    from mlc import bench

    config = bench.config_from(declared.BenchOptions(**options), command=bench.command_line())
    doc = _with_progress(lambda progress: bench.run(config, output=output, progress=progress))
    _print_bench_summary(doc, output, lengths_mode=bool(options["lengths"]))


def _with_progress(measure: Callable[[Callable[[int, int, str], None]], dict]) -> dict:
    """`measure(progress)`, its progress shown on stderr: a bar, or one line per step in a log file."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not err.is_terminal:  # a log file: one line per step instead of a redrawn bar
        def log_line(done: int, total: int, what: str) -> None:
            if what:
                err.print(f"[{done}/{total}] {escape(what)}", soft_wrap=True)

        return measure(log_line)
    with Progress(TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err, transient=False) as bar:
        task = bar.add_task("starting", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, **({"description": escape(what)} if what else {}))

        doc = measure(progress)
        bar.update(task, description="done")
    return doc


def _print_bench_summary(doc: dict, output: Path, lengths_mode: bool) -> None:
    """Print the results table and where the JSON went."""
    from mlc.bench import report

    if lengths_mode:
        out.print(report.lengths_console_table(doc))
        out.print(f"wrote {output}; render it with: mlc report {output} -o report.html")
        return
    out.print(report.suite_console_table(doc) if doc.get("suite") else report.console_table(doc))
    failed = sum(c["status"] == "failed" for c in doc["cells"])
    out.print(f"wrote {output} ({len(doc['cells'])} cells{f', {failed} failed' if failed else ''}); "
              f"render it with: mlc report {output} -o report.html")


@app.command("report")
def report_cmd(
    results: List[Path] = typer.Argument(...,
                                         help="Result JSON files written by `mlc bench` "
                                              "(several machines/targets merge)."),
    output: Path = typer.Option(..., "--output", "-o",
                                help="report.html (plots embedded) or report.md (plots beside it)."),
    title: str = typer.Option("mlc benchmark report", help="The page title."),
) -> None:
    """Render benchmark results as an HTML or Markdown page: latency, speed-up, accuracy, compile time, plots."""
    from mlc.bench import report

    written = report.render(results, output, title=title)
    out.print(f"wrote {output}" + (f" and {len(written) - 1} plot(s) beside it" if len(written) > 1 else ""))


@app.command("models")
def models_cmd() -> None:
    """List the built-in models (compile them as zoo:NAME)."""
    from mlc.models import ZOO

    table = Table(title="Built-in models (seeded random weights, built in code); --framework picks one")
    for column in ("name", "frameworks", "description"):
        table.add_column(column)
    for m in ZOO.values():
        table.add_row(f"zoo:{m.name}", ", ".join(m.frameworks), m.description)
    out.print(table)


class _Interrupted(BaseException):
    """Raised from SIGINT/SIGTERM handlers. Not a KeyboardInterrupt, which click would swallow
    into 'Aborted!' with exit 1; unwinding runs every cleanup (staging directories, temp files)."""

    def __init__(self, signum: int):
        self.signum = signum


def _raise_interrupted(signum, _frame) -> None:
    raise _Interrupted(signum)


def main() -> None:
    """Entry point: runs the app and turns every failure into a one-line message and exit code."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupted)
    # Every error says "rerun with --debug": accept it after the command too (`mlc compile m.onnx --debug`).
    args = sys.argv[1:]
    if "--debug" in args[1:] and "--" not in args[:args.index("--debug")]:
        _state["debug"] = True
        args = [a for a in args if a != "--debug"]
    try:
        app(args=args, prog_name="mlc")  # typer handles usage errors itself (exit 2)
    except _Interrupted as e:
        err.print("interrupted; no partial output was left behind")
        sys.exit(128 + e.signum)
    except MlcError as e:
        if _state["debug"]:
            traceback.print_exc()
        err.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)  # one line, never wrapped
        sys.exit(int(e.exit_code))
    except Exception as e:  # a bug: say so plainly, keep the traceback behind --debug
        if _state["debug"]:
            traceback.print_exc()
        err.print(f"[red]internal error:[/] {type(e).__name__}: {escape(str(e).splitlines()[0]) if str(e) else ''} "
                  "(rerun with --debug for the traceback and report it)", soft_wrap=True)
        sys.exit(int(ExitCode.INTERNAL))
