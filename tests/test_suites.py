"""`mlc bench --suite`: PyTorch's benchmark suite models built in code, run end to end with tiny configs; a failing
model records its stage and the run goes on; the suite table; the TIMM suite without torchvision."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from helpers import assert_clean_error, run_mlc
from mlc.bench import matrix, report, suites
from mlc.errors import CompilerError, InputError, MissingDependencyError


FAILING, PASSING = "DistilBertForQuestionAnswering", "GoogleFnet"


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory) -> Path:
    """Two tiny-config models against ONNX Runtime at 1 thread (~3 min): DistilBertForQuestionAnswering, whose mlc
    compile is made to fail at import here (every suite model converts now), then GoogleFnet (its FFT exports as
    ONNX DFT, which mlc converts to matmuls)."""
    path = tmp_path_factory.mktemp("suite") / "hf.json"
    real = matrix._compile_mlc

    def compile_or_fail(source, framework, target, precision, shapes, dest, db):
        if FAILING in str(dest):
            raise CompilerError("TVM's ONNX importer cannot convert a Frobnicate node", stage="import")
        return real(source, framework, target, precision, shapes, dest, db)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(suites.TINY_ENV, "1")  # the cells' child processes inherit it
        patch.setattr(matrix, "_compile_mlc", compile_or_fail)
        matrix.run(matrix.BenchConfig(models=[FAILING, PASSING], suite="huggingface", baselines=["ort"],
                                      threads=[1], warmup=1, repeat=3), path)
    return path


def test_suite_records_pass_and_failing_stage_per_model(suite_run):
    doc = json.loads(suite_run.read_text())
    assert doc["machine"]["cpu"] and doc["config"]["suite"] == "huggingface"
    models = doc["suite"]["models"]
    assert doc["suite"]["tiny"] and list(models) == [FAILING, PASSING]
    failed = models[FAILING]
    assert (failed["status"], failed["stage"]) == ("failed", "import") and "Frobnicate" in failed["reason"], failed
    # The run went on after the failure: the next model was built, compiled, run and checked.
    fnet = models[PASSING]
    assert fnet["status"] == "passed" and fnet["compile_s"] > 0, fnet
    assert 1e6 < fnet["params"] < 5e6 and "tiny config" in fnet["notes"][0]
    assert fnet["shapes"][0]["shapes"] == {"input_ids": [1, suites.SEQ]}
    cells = {(c["model"], c["backend"]): c for c in doc["cells"]}
    mine = cells[(PASSING, "mlc")]
    assert mine["status"] == "ok" and mine["accuracy"]["passed"] and mine["seq"] == suites.SEQ
    assert cells[(FAILING, "ort")]["status"] == "ok"  # the baselines still ran where mlc failed
    assert cells[(FAILING, "mlc")]["status"] == "failed"


def test_suite_report_table(suite_run, tmp_path):
    out = tmp_path / "report.md"
    proc = run_mlc("report", suite_run, "-o", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "## Suite huggingface" in text and "Pass rate: 1/2 models pass (50%); failures by stage: 1 at import" in text
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines()
            if line.startswith(f"| {FAILING}") or line.startswith(f"| {PASSING}")}
    assert rows[PASSING][2] == "pass" and rows[PASSING][-1].rstrip(" |").endswith("×")
    assert rows[FAILING][2].startswith("import: ") and rows[FAILING][-1].strip(" |") == "–"
    summary = report.suite_summary(json.loads(suite_run.read_text()))
    assert summary["passed"] == 1 and summary["geomean"][1]["ort"][1] == 1


def test_big_models_are_cut_to_two_layers(monkeypatch):
    """Over MAX_PARAMS the config is rebuilt with CUT_LAYERS layers (BERT-base against a 50 M threshold)."""
    pytest.importorskip("transformers")
    monkeypatch.delenv(suites.TINY_ENV, raising=False)
    monkeypatch.setattr(suites, "MAX_PARAMS", 50e6)
    fm = suites.framework_model(suites.source("huggingface", "BertForQuestionAnswering"))
    assert fm.native.model.config.num_hidden_layers == suites.CUT_LAYERS
    assert any("cut to 2 layers" in n and "0.11 B" in n for n in fm.notes), fm.notes
    assert [(d.name, d.dims) for d in fm.inputs] == [("input_ids", [1, suites.SEQ])]


def test_suite_options_are_checked():
    assert matrix.pick_models(None, "huggingface", None) == []
    from mlc import targets
    from mlc.pipeline.options import BenchOptions

    assert BenchOptions(threads="1,all").threads == (1, targets.usable_cores())
    assert BenchOptions(threads=[2, 1], targets="none", baselines="ort").targets == ()
    assert suites.select("huggingface", ["bertformaskedlm"]) == ["BertForMaskedLM"]
    assert len(suites.select("huggingface", [])) == len(suites.HUGGINGFACE) == 55
    assert len(suites.select("timm", [])) == 18
    with pytest.raises(InputError, match="not in the huggingface suite"):
        suites.select("huggingface", ["NoSuchModel"])
    with pytest.raises(InputError, match="not both"):
        matrix.pick_models("mlp", "huggingface", None)
    with pytest.raises(InputError, match="unknown suite"):
        matrix.validate(matrix.BenchConfig(models=[], suite="glue"))
    with pytest.raises(InputError, match="batch 1"):
        matrix.validate(matrix.BenchConfig(models=[], suite="huggingface", batch=[4]))


def test_timm_suite_without_a_working_timm_is_exit_4(tmp_path):
    if importlib.util.find_spec("timm") is None:
        with pytest.raises(MissingDependencyError, match="needs timm, which is not installed"):
            suites.require("timm")
    proc = run_mlc("bench", "--suite", "timm", "-o", tmp_path / "timm.json")
    if proc.returncode == 0:
        pytest.skip("timm imports here")
    assert_clean_error(proc, 4, "timm")
    assert not (tmp_path / "timm.json").exists()


def test_convert_layout_skipped_without_conv2d():
    """TVM's ConvertLayout dies (std::bad_alloc) on squeeze(-1), which QA heads have: mlc's build leaves it out
    where there is no conv2d to lay out."""
    import tvm
    from tvm import relax

    from mlc.compiler import schedules

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 128, 2), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            start = bb.emit(relax.op.strided_slice(x, [2], [0], [1]))
            out = bb.emit_output(relax.op.squeeze(start, axis=[-1]))
        bb.emit_func_output(out)
    fused = schedules._legalize_and_fuse(bb.get(), tvm.target.Target({"kind": "llvm"}))
    assert "squeeze" in fused.script()


def test_fp64_rule_passes_fp32_reordering_noise_and_fails_a_real_error():
    """torch's benchmark rule (visformer_small's random-init logits reach ~300, where fp32 sums differ by 1e-3 with
    the thread count): within 2x eager fp32's own RMSE against fp64 passes, beyond it fails."""
    rng = np.random.default_rng(0)
    wide = {"y": rng.standard_normal(1000) * 300}
    eager = {"y": wide["y"] + rng.standard_normal(1000) * 1e-3}
    noisy = {"y": wide["y"] + rng.standard_normal(1000) * 1.5e-3}
    assert suites.fp64_check(eager, wide, noisy)["passed"]
    broken = {"y": wide["y"] + rng.standard_normal(1000) * 3e-3}
    result = suites.fp64_check(eager, wide, broken)
    assert not result["passed"] and result["rmse_vs_fp64"] > 2 * result["eager_rmse_vs_fp64"]


def test_suite_rule_is_torchs_allclose_first_then_fp64():
    """torch._dynamo.utils.same, as its HF/TIMM runners call it for inference: allclose at atol = rtol = 1e-3 passes
    (GPTNeo's 1.3 B-parameter logits: 2.5e-4 off eager, no fp64 copy affordable); beyond it, the fp64 rule decides
    where there is an fp64 run, and without one the model fails."""
    rng = np.random.default_rng(0)
    eager = {"y": rng.standard_normal(1000) * 3}
    near = {"y": eager["y"] + 2.5e-4}
    result = suites.suite_check(eager, None, near)
    assert result["passed"] and "allclose" in result["rule"]
    far = {"y": eager["y"] + 5e-2}
    result = suites.suite_check(eager, None, far)
    assert not result["passed"] and "no fp64 run" in result["rule"]
    wide = {"y": eager["y"] + 5e-2}  # the fp64 run agrees with `far`: eager fp32 is what is off
    assert suites.suite_check(eager, wide, far)["rule"].startswith("fp64 RMSE")
    assert not suites.suite_check(eager, None, {"y": eager["y"][:10]})["passed"]  # a wrong shape fails


def test_a_model_passed_by_either_rule_says_which_in_the_table():
    from mlc.bench import matrix

    prepared = {"params": 10, "notes": [], "shapes": [{"key": "b1"}]}
    artifacts = {"x86": {"compile_s": 1.0}}
    for accuracy, figures in (({"rule": "allclose atol=rtol=0.001 (torch benchmarks' same())"}, ""),
                              ({"rule": "fp64 RMSE <= 2 x eager fp32's", "rmse_vs_fp64": 1e-3,
                                "eager_rmse_vs_fp64": 9e-4}, ": 0.001 vs eager 0.0009")):
        cell = {"backend": matrix.MLC, "status": "ok", "threads": 1,
                "accuracy": {"max_abs_error": 5e-4, "passed": True, **accuracy}}
        outcome = matrix._suite_outcome(prepared, artifacts, [cell])
        assert outcome["status"] == "passed"
        assert outcome["notes"] == [f"max abs error 0.0005; passed by {accuracy['rule']}{figures}"]


def test_eager_fp64_runs_a_copy_in_double():
    torch = pytest.importorskip("torch")
    from mlc.frontends.torch import from_module

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).eval()
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    fm = from_module(module, (torch.from_numpy(x),), ["x"], ["y"])
    wide = suites.eager_fp64(fm, [x])
    assert wide[0].dtype == np.float64 and module[0].weight.dtype == torch.float32  # the model itself stays fp32
    expected = module.double()(torch.from_numpy(x).double()).detach().numpy()
    np.testing.assert_allclose(wide[0], expected, rtol=0, atol=1e-12)


def test_a_pass_with_unscheduled_kernels_is_no_plain_pass():
    """#39: ghostnet built with 96 unscheduled kernels (14x slower than ORT) and its row said "pass"."""
    prepared = {"params": 10, "notes": [], "shapes": [{"key": "b1"}]}
    artifacts = {"x86": {"compile_s": 1.0, "kernels": {"default": 5, "unscheduled": 3}}}
    cell = {"machine": "m", "model": "ghost", "backend": matrix.MLC, "target": "x86", "status": "ok", "threads": 1,
            "batch": 1, "latency_ms": {"p50": 2.0}, "kernels": artifacts["x86"]["kernels"],
            "accuracy": {"max_abs_error": 0.0, "passed": True}}
    outcome = matrix._suite_outcome(prepared, artifacts, [cell])
    assert outcome["status"] == "passed" and outcome["unscheduled"] == 3
    older = {k: v for k, v in outcome.items() if k != "unscheduled"}  # a record from before: its cell has the count
    for info in (outcome, older):
        doc = {"suite": {"name": "timm", "models": {"ghost": info}}, "machine": {"cpu": "x"}, "file": "-",
               "cells": [cell]}
        section = report.suite_sections([doc])[0]
        assert section.parts[0].rows[0][2] == "pass (3 unscheduled)"
        assert "1 of the passes with unscheduled kernels" in section.text[0]
    assert report._status_text(cell) == "2 (3 unscheduled)"  # the latency table's cell


def _suite_record(path: Path, commit: str | None, model: str, p50: float) -> Path:
    machine = {"cpu": "x", "date": "2026-11-26T20:00:00+00:00", "load_average": [1.0, 1.0, 1.0]}
    if commit:
        machine["commit"] = commit
    cell = {"model": model, "backend": "mlc", "target": "x86", "status": "ok", "threads": 1, "batch": 1,
            "latency_ms": {"p50": p50}}
    path.write_text(json.dumps({"machine": machine, "config": {"command": f"mlc bench ... {path.name}"},
                                "cells": [cell], "suite": {"name": "timm", "models": {model: {"status": "passed"}}}}))
    return path


def test_merge_refuses_records_of_different_commits(tmp_path):
    """#38: benchmarks/suites/merge.py put a model's latest run into one table with the others, whatever code each
    ran; now it merges one commit's records only, and says which file ran where in one line."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "suites" / "merge.py"
    first = _suite_record(tmp_path / "a.json", "1111111", "ghost", 2.0)
    later = _suite_record(tmp_path / "b.json", "2222222", "ghost", 1.0)
    unrecorded = _suite_record(tmp_path / "c.json", None, "deit", 1.0)
    out = tmp_path / "merged.json"
    for files in ([first, later], [later, unrecorded]):
        proc = subprocess.run([sys.executable, script, *map(str, files), "-o", str(out)], capture_output=True,
                              text=True)
        assert_clean_error(proc, 1, "refusing to merge records of different (or unrecorded) commits")
        assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
    assert "b.json at 2222222" in proc.stderr and "c.json at an unrecorded commit" in proc.stderr
    same = _suite_record(tmp_path / "d.json", "2222222", "deit", 3.0)
    proc = subprocess.run([sys.executable, script, str(later), str(same), "-o", str(out)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    merged = json.loads(out.read_text())
    assert merged["machine"]["commit"] == "2222222" and list(merged["suite"]["models"]) == ["ghost", "deit"]
