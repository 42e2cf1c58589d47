"""Compile options are declared once (mlc.pipeline.options): these tests fail when a declared option does not reach
the CLI, the API or the recipe, or when the CLI grows an option that is not declared."""

from __future__ import annotations

import inspect
import shlex

import pytest
import typer
from typer.testing import CliRunner

from mlc import api, cli, passes
from mlc.errors import InputError
from mlc.pipeline import options as declared

OWNERS = (declared.ModelSpec, declared.CompileOptions)

# A value other than the default for each option whose default cannot simply be flipped (the parsers check them).
GIVEN = {"framework": "torch", "input_shapes": ("x:1x16",), "dynamic": ("batch,seq=1..512",), "exporter": "dynamo",
         "buckets": ("seq=8,16",), "inputs": "in.npz", "freeze": ("mask",), "target": "graviton2", "db": "db",
         "output": "out", "atol": 0.5, "rtol": 0.25, "precision": "bf16", "quantize": "int8",
         "calibration": ("c.npz",),
         "pass_options": passes.Options(opt_level=1, disable=("constant_folding",), config=("fuse_ops.x=1",))}


def _given(field) -> object:
    if field.name in GIVEN:
        return GIVEN[field.name]
    if isinstance(field.default, bool):
        return not field.default
    raise AssertionError(f"add a non-default value for the new option {field.name!r} to GIVEN")


def _every_option_given() -> tuple[declared.ModelSpec, declared.CompileOptions]:
    values = {f.name: _given(f) for owner in OWNERS for f, _ in declared.declared(owner)}
    return declared.split("zoo:mlp", values)


def _cli_flags(name: str) -> set[str]:
    command = typer.main.get_command(cli.app).commands[name]
    return {flag for p in command.params if p.param_type_name == "option" for flag in p.opts + p.secondary_opts}


def _declared_flags(owner: type) -> set[str]:
    flags = set()
    for _, opt in declared.declared(owner):
        flags |= _declared_flags(opt.group) if opt.group else {f for flag in opt.flags for f in flag.split("/")}
    return flags


def test_every_declared_option_is_a_compile_flag_and_every_flag_is_declared():
    declared_flags = set().union(*map(_declared_flags, OWNERS))
    assert _cli_flags("compile") == declared_flags | {"--json"}


def test_every_declared_option_is_an_api_keyword():
    keywords = set(inspect.signature(api.compile).parameters)
    for owner in OWNERS:
        assert set(declared.names(owner)) <= keywords
        for name in declared.names(owner):
            assert f"`{name}`" in api.compile.__doc__
    assert set(declared.EXPORT_OPTIONS) <= set(inspect.signature(api.export).parameters)
    with pytest.raises(TypeError, match="no_such_option"):
        api.compile("zoo:mlp", no_such_option=1)


def test_every_recorded_option_is_in_the_recipe():
    model, options = _every_option_given()
    recipe = declared.recipe(model, options)
    for owner in OWNERS:
        for field, opt in declared.declared(owner):
            if opt.recorded:
                assert (opt.key or field.name) in recipe.options, field.name
    assert recipe.options["input_shapes"] == ["x:1x16"] and recipe.options["buckets"] == ["seq=8,16"]


def test_the_recipe_command_gives_the_cli_the_same_options(monkeypatch):
    """The recipe's command line, read back by `mlc compile`, makes the options that wrote it."""
    model, options = _every_option_given()
    first = declared.recipe(model, options)
    seen = {}

    def compile_targets(source, target_list, *, step, on_target, **given):
        seen.update(given, source=source, target=target_list[0])
        return iter(())

    monkeypatch.setattr(api, "compile_targets", compile_targets)
    result = CliRunner().invoke(cli.app, shlex.split(first.command)[1:])
    assert result.exit_code == 0, result.output
    again = declared.recipe(*declared.split(seen.pop("source"), seen))
    assert again == first


def test_cli_text_is_parsed_once_into_value_types():
    model = declared.ModelSpec("m.onnx", input_shapes=["ids:1x128"], dynamic=["seq=1..512"], buckets=["8,16", "32"])
    assert model.input_shapes == (declared.InputShape("ids", (1, 128)),)
    assert model.dynamic_dims() == {"seq": (1, 512)}
    assert model.buckets == declared.Buckets(None, (8, 16, 32))
    assert declared.ModelSpec("m.onnx", input_shapes=model.input_shapes) == declared.ModelSpec(
        "m.onnx", input_shapes=["ids:1x128"])  # value types pass through
    with pytest.raises(InputError, match="--atol must be a finite number"):
        declared.CompileOptions(atol=-1.0)
    with pytest.raises(InputError, match="--precision int4: choose one of"):
        declared.CompileOptions(precision="int4")


def test_no_check_builds_a_complete_artifact_without_running_it(tmp_path):
    """--no-check (the option added through one declaration): no check result, a warning that says where to check,
    and an artifact that `mlc check` then passes."""
    import json

    from helpers import run_mlc

    proc = run_mlc("compile", "zoo:mlp", "--target", "x86", "--no-check", "--json", "-o", tmp_path / "art", check=True)
    assert json.loads(proc.stdout)["check"] is None
    assert "not verified (--no-check)" in proc.stderr and f"mlc check {tmp_path / 'art'}" in proc.stderr
    checked = run_mlc("check", tmp_path / "art", check=True)
    assert "pass" in checked.stdout


def test_options_the_worker_implements_reach_its_request_by_name():
    """`worker=True` options are CompileRequest fields of the same name, and the request takes their values."""
    import dataclasses

    from mlc.compiler.contract import CompileRequest

    options = declared.CompileOptions(target="cuda-h100", precision="fp16", cuda_graphs=True)
    passed_on = declared.worker_options(options)
    assert passed_on == {"precision": "fp16", "cuda_graphs": True}
    assert set(passed_on) <= {f.name for f in dataclasses.fields(CompileRequest)}
    request = CompileRequest(onnx="m.onnx", target={"kind": "cuda"}, **passed_on)
    assert (request.precision, request.cuda_graphs) == ("fp16", True)


def test_run_and_check_options_are_declared_once():
    """`mlc run`'s and `mlc check`'s options come from the declarations (RunOptions; the check's tolerances from
    CompileOptions), and the API takes the same names."""
    own = {"--inputs", "-i", "--outputs", "-o", "--json"}
    assert _cli_flags("run") == _declared_flags(declared.RunOptions) | own
    assert set(declared.names(declared.RunOptions)) <= set(inspect.signature(api.run).parameters)
    assert _cli_flags("check") == {"--atol", "--rtol", "--device", "--json"}
    assert {"atol", "rtol", "device"} <= set(inspect.signature(api.check).parameters)
    with pytest.raises(TypeError, match="repeats"):
        api.run("art", repeats=1)


def test_tune_options_are_declared_once():
    """`mlc tune`'s options come from the declarations (TuneOptions, and the ModelSpec options a tune reads), and
    `mlc.api.tune` takes the same names."""
    model = {f for field, opt in declared.declared(declared.ModelSpec) if field.name in declared.TUNE_MODEL_OPTIONS
             for f in opt.flags}
    assert _cli_flags("tune") == _declared_flags(declared.TuneOptions) | model | {"--json"}
    names = set(declared.names(declared.TuneOptions)) | set(declared.TUNE_MODEL_OPTIONS)
    assert names <= set(inspect.signature(api.tune).parameters)
    with pytest.raises(TypeError, match="trails"):
        api.tune("m.onnx", trails=3)


def test_bench_options_are_declared_once():
    """`mlc bench`'s options come from BenchOptions, a list option takes the CLI's comma-separated text or a sequence
    alike, and the matrix config is made from them."""
    from mlc import bench

    assert _cli_flags("bench") == _declared_flags(declared.BenchOptions) | {"--output", "-o"}
    given = declared.BenchOptions(targets="none", threads=[2, "1"], batch="1,4,1", baselines="ort,openvino")
    assert (given.targets, given.threads, given.batch, given.baselines) == ((), (2, 1), (1, 4), ("ort", "openvino"))
    with pytest.raises(InputError, match="--seq '0': '0' is not a whole number >= 1"):
        declared.BenchOptions(seq="0")
    config = bench.config_from(declared.BenchOptions(models="mlp,mlp", precision="fp32,bf16"), "mlc bench")
    assert (config.models, config.precisions, config.targets, config.strategies) == (["mlp"], ["fp32", "bf16"],
                                                                                     ["x86"], [])


@pytest.mark.parametrize("flags, message", [(["--warmup", "-1"], "--warmup must be at least 0, not -1"),
                                            (["--threads", "0"], "--threads must be at least 1, not 0")])
def test_run_option_values_are_checked_before_the_artifact_is_opened(tmp_path, flags, message):
    from helpers import run_mlc

    proc = run_mlc("run", str(tmp_path / "missing"), *flags)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == f"error: {message}", proc.stderr
