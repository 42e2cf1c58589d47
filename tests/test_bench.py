"""`mlc bench` and `mlc report`: a tiny real matrix, the report parsed back, merging, bad inputs."""

from __future__ import annotations

import copy
import html.parser
import io
import json
from pathlib import Path

import pytest

from helpers import assert_clean_error, run_mlc
from mlc import bench, targets
from mlc.bench import contract, matrix, report
from mlc.errors import InputError


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """zoo:mlp, batch 1, 1 thread: torch and ONNX Runtime baselines and mlc for x86 (~1.5 min)."""
    path = tmp_path_factory.mktemp("bench") / "results.json"
    proc = run_mlc("bench", "--models", "mlp", "--batch", "1", "--seq", "32", "--threads", "1",
                   "--baselines", "torch,ort", "--targets", "x86", "--warmup", "1", "--repeat", "3", "-o", path)
    assert proc.returncode == 0, proc.stderr
    assert "mlc@x86" in proc.stdout
    return path


def test_bench_json_has_a_row_per_cell(results):
    doc = json.loads(results.read_text())
    assert doc["schema"] == bench.SCHEMA
    machine = doc["machine"]
    assert machine["cpu"] and machine["cores_usable"] >= 1 and machine["versions"]["apache-tvm"]
    assert machine["llvm_cpu"] == targets.resolve("x86").tvm["mcpu"]  # the ISA the model names often hide
    cells = {c["backend"]: c for c in doc["cells"]}
    assert set(cells) == {"torch", "ort", "mlc"} and len(doc["cells"]) == 3
    for cell in cells.values():
        assert cell["status"] == "ok", cell
        assert (cell["model"], cell["batch"], cell["threads"]) == ("mlp", 1, 1)
        assert cell["seq"] is None  # the mlp has no sequence dim: --seq does not multiply its cells
        lat = cell["latency_ms"]
        assert lat["runs"] == 3 and 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert cell["accuracy"]["passed"] and cell["accuracy"]["max_abs_error"] < 1e-4
        assert cell["reference"].startswith("torch") and cell["reference"].endswith("eager")
        assert cell["peak_rss_mb"] > 10
        assert cell["input_shapes"] == {"x": [1, 64]}
    # The error is measured, not assumed: torch's baseline reruns the reference's eager call bit for bit, while
    # ORT and TVM compute the same MLP with other kernels (other summation orders), so they differ from it a little.
    errors = {backend: cell["accuracy"]["max_abs_error"] for backend, cell in cells.items()}
    assert errors["torch"] == 0.0 and max(errors["ort"], errors["mlc"]) > 0, errors
    mlc = cells["mlc"]
    assert mlc["target"] == "x86" and mlc["framework"] == "torch"
    assert mlc["compile_s"] > 0 and mlc["compile_breakdown_s"]["tvm"] > 0 and mlc["artifact_bytes"] > 100_000
    assert mlc["kernels"]["default"] >= 1 and not mlc["kernels"].get("tuned")  # no --db: mlc's default schedules
    assert cells["ort"]["compile_s"] > 0


class _Page(html.parser.HTMLParser):
    """Tables (header + rows of cell text) and embedded images of an HTML page."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.images: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    page.close()
    return page


def _table(page: _Page, first_header: str, column: str) -> list[dict[str, str]]:
    for table in page.tables:
        if table and table[0][0] == first_header and column in table[0]:
            return [dict(zip(table[0], row)) for row in table[1:]]
    raise AssertionError(f"no table with column {column!r}")


def _png_ok(data: bytes) -> None:
    import matplotlib.image

    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert matplotlib.image.imread(io.BytesIO(data), format="png").shape[0] > 100


def test_report_html_tables_and_images(results, tmp_path):
    import base64

    out = tmp_path / "report.html"
    proc = run_mlc("report", results, "-o", out)
    assert proc.returncode == 0, proc.stderr
    page = _parse(out)
    doc = json.loads(results.read_text())
    cells = {c["backend"]: c for c in doc["cells"]}
    (row,) = _table(page, "machine", "mlc@x86")
    assert row["model"] == "mlp" and row["shape"] == "b1" and row["threads"] == "1"
    for backend in ("torch", "ort"):
        assert float(row[backend]) == pytest.approx(cells[backend]["latency_ms"]["p50"], rel=0.01)
    (speed,) = _table(page, "machine", "mlc@x86 vs ort")
    expected = cells["ort"]["latency_ms"]["p50"] / cells["mlc"]["latency_ms"]["p50"]
    assert float(speed["mlc@x86 vs ort"].rstrip("×")) == pytest.approx(expected, rel=0.01)
    accuracy = _table(page, "machine", "max abs err")
    assert {r["backend"]: r["result"] for r in accuracy} == {"torch": "pass", "ort": "pass", "mlc@x86": "pass"}
    compiled = _table(page, "machine", "compile s")
    assert {r["backend"] for r in compiled} == {"ort", "mlc@x86"}
    # latency, speed-up and compile-time plots
    assert len(page.images) == 3
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        _png_ok(base64.b64decode(src.partition(",")[2]))


def test_report_markdown_writes_plots_beside_it(results, tmp_path):
    out = tmp_path / "md" / "report.md"
    proc = run_mlc("report", results, "-o", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "| machine | model | shape | threads | torch | ort | mlc@x86 |" in text
    links = [line.partition("](")[2].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert len(links) == 3
    for link in links:
        _png_ok((out.parent / link).read_bytes())


def test_report_merges_machines_and_marks_emulation(results, tmp_path):
    """A second file from an ARM machine's view (qemu): accuracy counts, latency is not compared."""
    doc = json.loads(results.read_text())
    arm = copy.deepcopy(doc)
    arm["machine"].update(cpu="Neoverse-V1 (emulated)", cores_usable=4)
    for cell in arm["cells"]:
        if cell["backend"] == "mlc":
            cell.update(target="graviton3", emulated=True)
    other = tmp_path / "arm.json"
    other.write_text(json.dumps(arm))
    out = tmp_path / "merged.html"
    proc = run_mlc("report", results, other, "-o", out)
    assert proc.returncode == 0, proc.stderr
    page = _parse(out)
    latency = _table(page, "machine", "mlc@x86")
    assert len(latency) == 2
    by_machine = {r["machine"]: r for r in latency}
    arm_label = report.machine_label(arm["machine"])  # carries OMP_WAIT_POLICY when the run had it set
    assert arm_label.startswith("Neoverse-V1 (emulated), 4 cores")
    arm_row = by_machine[arm_label]
    assert arm_row["mlc@graviton3"] == "emulated" and arm_row["mlc@x86"] == ""
    assert float(by_machine[report.machine_label(doc["machine"])]["mlc@x86"]) > 0
    speed = {r["machine"]: r for r in _table(page, "machine", "mlc@graviton3 vs ort")}
    assert speed[arm_label]["mlc@graviton3 vs ort"] == "–"  # never from emulated latency
    accuracy = _table(page, "machine", "max abs err")
    emulated = [r for r in accuracy if r["backend"] == "mlc@graviton3"]
    assert emulated and emulated[0]["result"] == "pass" and emulated[0]["p90 ms"] == "emulated"


def test_matrix_records_failures_and_goes_on(monkeypatch, tmp_path):
    """Without child processes: a failing compile fails only its cells, a model without a seq dim
    is measured once per batch, and the JSON is written as cells finish."""
    calls = []

    def fake_child(job, workdir, tag, what, timeout=None):
        calls.append(job)
        if isinstance(job, contract.PrepareRequest):
            seq = job.seq if job.source == "zoo:bert-tiny" else [None]
            return contract.PrepareResult(
                exporter="torch.onnx", reference="torch eager", params=1, inputs=["x"], outputs=["y"],
                symbolic=["batch", "seq"] if seq[0] else ["batch"],
                shapes=[contract.PreparedShape(b, s, f"b{b}" + (f"-s{s}" if s else ""), shapes={"x": [b]})
                        for b in job.batch for s in seq])
        if job.backend == "torch" and job.threads == 2:
            raise bench.CellError("torch crashed")
        return contract.MeasureResult(latency_ms={"p50": 1.0}, accuracy={"passed": True}, peak_rss_mb=1.0)

    def fake_compile(source, framework, target, precision, shapes, dest, db):
        if source == "zoo:bert-tiny":
            raise RuntimeError("TVM exploded")
        return {"artifact": str(dest), "compile_s": 1.0, "compile_breakdown_s": {}, "tuning_s": None,
                "artifact_bytes": 1, "kernels": {"default": 1}, "precision": precision}

    monkeypatch.setattr(matrix, "run_child", fake_child)
    monkeypatch.setattr(matrix, "_compile_mlc", fake_compile)
    config = bench.BenchConfig(models=["mlp", "bert-tiny"], batch=[1, 4], seq=[32, 128], threads=[1, 2],
                               baselines=["torch"], targets=["x86"])
    seen = []
    doc = bench.run(config, output=tmp_path / "r.json", progress=lambda done, total, what: seen.append((done, total)))
    cells = doc["cells"]
    assert len(cells) == 2 * 2 * 2 + 2 * 2 * 2 * 2  # mlp: batch x threads x backends; bert-tiny also x seq
    assert seen[-1] == (len(cells), len(cells))
    failed = [c for c in cells if c["status"] == "failed"]
    assert {c["error"] for c in failed} == {"torch crashed", "mlc compile failed: RuntimeError: TVM exploded"}
    assert all(c["status"] == "ok" for c in cells if c["backend"] == "mlc" and c["model"] == "mlp")
    assert json.loads((tmp_path / "r.json").read_text())["cells"] == json.loads(json.dumps(cells, default=str))
    assert sum(isinstance(job, contract.PrepareRequest) for job in calls) == 2


@pytest.mark.parametrize("args, fragment", [
    (["--models", "nosuch"], "unknown zoo model 'nosuch'"),
    (["--models", "mlp", "--baselines", "torch,tvm-magic"], "unknown baseline 'tvm-magic'"),
    (["--models", "mlp", "--batch", "1,x"], "--batch '1,x': 'x' is not a whole number"),
    (["--models", "mlp", "--threads", "0"], "--threads '0': '0' is not a whole number >= 1"),
    (["--models", "mlp", "--targets", "z80"], "z80"),
    (["--models", "mlp", "--repeat", "0"], "--repeat >= 1"),
    (["--models", "mlp", "--precision", "fp32,int4"], "--precision int4: choose one of fp32, bf16"),
    (["--models", "mlp", "--cell-timeout", "0"], "--cell-timeout must be a number of seconds > 0"),
    (["--models", "mlp", "--db", "no-such-tuning-db/"], "does not exist; run `mlc tune"),
])
def test_bench_bad_inputs_are_clean_errors(args, fragment, tmp_path):
    proc = run_mlc("bench", *args, "-o", tmp_path / "r.json")
    assert_clean_error(proc, 1, fragment)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


def test_report_bad_inputs_are_clean_errors(tmp_path, results):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_clean_error(run_mlc("report", bad, "-o", tmp_path / "r.html"), 1, "is not JSON")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    assert_clean_error(run_mlc("report", other, "-o", tmp_path / "r.html"), 1, "is not an `mlc bench` result")
    assert_clean_error(run_mlc("report", tmp_path / "missing.json", "-o", tmp_path / "r.html"), 1, "not found")
    assert_clean_error(run_mlc("report", results, "-o", tmp_path / "r.pdf"), 1, ".html or .md")


_FRAMEWORK_BASELINES = r'''
import json, sys, tempfile
from pathlib import Path
import numpy as np
from mlc.bench import baselines, worker
from mlc.bench.contract import PrepareRequest
from mlc.frontends.base import FrameworkModel, InputDecl

framework = sys.argv[1]
baselines.limit_threads(framework, 1)
x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
if framework == "tensorflow":
    import tensorflow as tf
    inp = tf.keras.Input((8,), name="x")
    model = tf.keras.Model(inp, tf.keras.layers.Dense(4)(inp))
    native = lambda *a: model(a[0], training=False)
    names = ["tf", "tf-graph"]
else:
    import paddle

    class Layer(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(x)

    native = Layer()
    native.eval()
    names = ["paddle", "paddle-static"]
expected = x @ np.asarray(native.fc.weight if framework == "paddle" else model.layers[-1].kernel) + \
    np.asarray(native.fc.bias if framework == "paddle" else model.layers[-1].bias)
fm = FrameworkModel(framework, [InputDecl("x", "float32", ["batch", 8])], {"batch": 2}, None, None, native=native)
for name in names:
    with tempfile.TemporaryDirectory() as scratch:
        run = baselines.get(name).setup(baselines.Context(fm, None, ["x"], [x], 1, Path(scratch)))
        (out,) = run()
        print(name, float(np.abs(out - expected).max()))
with tempfile.TemporaryDirectory() as scratch:  # the bench's prepare step on the framework's zoo model
    prepared = worker.prepare(PrepareRequest(out_dir=scratch, source="zoo:cnn", framework=framework, batch=[1],
                                             seq=[8]))
    print("prepared", json.dumps(prepared.params))
'''


@pytest.mark.parametrize("framework, package", [("tensorflow", "tensorflow"), ("paddle", "paddle")])
def test_framework_baselines_run_a_native_model(framework, package, tmp_path):
    """tf/tf-graph and paddle/paddle-static on a small model given as FrameworkModel.native (~15 s each)."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec(package) is None:  # not importorskip: tensorflow and paddle in one process crash
        pytest.skip(f"{package} is not installed")
    script = tmp_path / "job.py"
    script.write_text(_FRAMEWORK_BASELINES)
    proc = subprocess.run([sys.executable, str(script), framework], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = dict(line.split() for line in proc.stdout.splitlines() if line.split()[0] in baselines_of(framework))
    assert set(results) == set(baselines_of(framework))
    assert all(float(err) < 1e-5 for err in results.values()), results
    (params,) = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("prepared ")]
    assert int(params) > 1000  # the CNN's parameter count, as a plain integer


def baselines_of(framework: str) -> list[str]:
    from mlc.bench import baselines

    return [b.name for b in baselines.BASELINES.values() if b.framework == framework]


def test_baseline_registry_names_known_frameworks():
    from mlc.bench import baselines
    from mlc.frontends.base import FRAMEWORKS

    assert {"torch", "torch-compile", "torchscript", "ort", "tf", "tf-graph", "paddle",
            "paddle-static"} <= set(baselines.BASELINES)
    for b in baselines.BASELINES.values():
        assert b.framework in FRAMEWORKS or b.framework == baselines.ONNX_EXPORT, b


def test_worker_timeout_stops_the_worker_and_its_children(tmp_path, monkeypatch):
    """`--cell-timeout`: mlc.child_process.run kills the worker's whole process group (compiler pools included)."""
    import os
    import time

    from mlc.child_process import run
    from mlc.errors import CompilerError

    (tmp_path / "sleeper.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '120'])\n"
        "open(sys.argv[1] + '.pid', 'w').write(str(child.pid))\n"
        "time.sleep(120)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    start = time.monotonic()
    with pytest.raises(CompilerError, match="ran longer than 3 s and was stopped"):
        run("sleeper", {}, tmp_path / "job.json", "the sleeper", timeout=3)
    assert time.monotonic() - start < 30
    pid = int((tmp_path / "job.json.pid").read_text())
    for _ in range(50):  # reaped by init a moment after the kill
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"grandchild {pid} survived the timeout")


@pytest.mark.skipif(not (targets.has_bf16_dot(targets.resolve("x86")) and targets.has_int8_dot(targets.resolve("x86"))),
                    reason="the host has no bf16 or int8 dot-product instructions")
def test_bench_precision_builds_are_judged_by_the_gate(tmp_path):
    """`--precision fp32,bf16,int8`: one mlc build per precision, the reduced-precision cells judged by the accuracy
    gate, and the report labels their backend and precision."""
    path = tmp_path / "r.json"
    proc = run_mlc("bench", "--models", "mlp", "--batch", "1", "--threads", "1", "--baselines", "none",
                   "--precision", "fp32,bf16,int8", "--warmup", "1", "--repeat", "3", "-o", path)
    assert proc.returncode == 0, proc.stderr
    cells = {c["precision"]: c for c in json.loads(path.read_text())["cells"]}
    assert set(cells) == {"fp32", "bf16", "int8"} and all(c["status"] == "ok" for c in cells.values())
    assert "gate" not in cells["fp32"]["accuracy"] and cells["fp32"]["accuracy"]["max_abs_error"] < 1e-4
    for precision in ("bf16", "int8"):
        gate = cells[precision]["accuracy"]["gate"]
        assert cells[precision]["accuracy"]["passed"] and gate["precision"] == precision
        assert 0 < gate["outputs"][0]["max_abs_error"]  # the outputs moved, within the gate
    out = tmp_path / "report.html"
    assert run_mlc("report", path, "-o", out).returncode == 0
    rows = {r["backend"]: r for r in _table(_parse(out), "machine", "max abs err")}
    for precision in ("bf16", "int8"):
        row = rows[f"mlc@x86 {precision}"]
        assert row["precision"] == precision and row["result"] == "pass (gate)"
    assert rows["mlc@x86"]["result"] == "pass"


def _record(path: Path, commit: str | None, p50: float, load: float = 0.5) -> Path:
    """A small `mlc bench` record written by hand (no run): ORT and mlc on zoo:mlp, one thread."""
    from mlc.bench.cells import SCHEMA

    machine = {"cpu": "Testium 9", "cores_usable": 2, "cpu_count": 2, "date": "2026-11-26T20:00:00+00:00",
               "load_average": [load, load, load], "load_average_end": [load, load, load]}
    if commit:
        machine["commit"] = commit
    cells = [{"model": "mlp", "batch": 1, "seq": None, "threads": 1, "backend": backend, "target": "x86",
              "status": "ok", "latency_ms": {"p50": ms}, "accuracy": {"passed": True, "max_abs_error": 0.0}}
             for backend, ms in (("ort", 2.0), ("mlc", p50))]
    path.write_text(json.dumps({"schema": SCHEMA, "machine": machine, "config": {"command": "mlc bench ..."},
                                "cells": cells}))
    return path


def test_report_refuses_records_of_different_commits(tmp_path):
    """#38: one table, one commit. Before, the later file's cells silently replaced the earlier one's."""
    old = _record(tmp_path / "old.json", "1111111", p50=4.0)
    new = _record(tmp_path / "new.json", "2222222", p50=1.0)
    unrecorded = _record(tmp_path / "unrecorded.json", None, p50=1.0)
    proc = run_mlc("report", old, new, "-o", tmp_path / "r.md")
    assert_clean_error(proc, 1, "different (or unrecorded) commits", "old.json at 1111111", "new.json at 2222222")
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.md").exists()
    with pytest.raises(InputError, match="unrecorded.json at an unrecorded commit"):
        report.render([new, unrecorded], tmp_path / "r.md")
    # One commit (a machine's runs, parts of one run) still renders; so does one file that predates the field.
    same = _record(tmp_path / "same.json", "2222222", p50=1.1, load=3.0)
    assert report.render([new, same], tmp_path / "ok.md")[0].is_file()
    assert report.render([unrecorded], tmp_path / "alone.md")[0].is_file()
    assert "commit not recorded" in (tmp_path / "alone.md").read_text()


def test_report_tables_state_commit_machine_load_and_date(tmp_path):
    path = _record(tmp_path / "run.json", "abc1234", p50=1.0, load=1.5)
    written = report.render([path], tmp_path / "page.md")
    text = written[0].read_text()
    line = "Run `run.json`: commit abc1234, Testium 9, 2 cores, 2026-11-26T20:00:00+00:00, load average 1.5 → 1.5."
    latency = text.partition("## Latency")[2].partition("\n## ")[0]
    speedup = text.partition("## Speed-up")[2].partition("\n## ")[0]
    assert line in latency and line in speedup
    assert "| abc1234 |" in text.partition("## Machines")[2].partition("\n## ")[0]
    # The plots go to plots/ beside the page, a folder .gitignore keeps out of the repository.
    plots = written[1:]
    assert plots and all(p.parent == tmp_path / report.PLOTS for p in plots)
    assert all(f"]({report.PLOTS}/page-" in line for line in text.splitlines() if line.startswith("!["))


def test_machine_records_the_commit(monkeypatch):
    """Every record's machine block carries the checkout's commit, which the report and merge.py compare."""
    import subprocess

    from mlc.bench import machine

    expected = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                              text=True, cwd=Path(machine.__file__).resolve().parents[2]).stdout.strip()
    assert machine.source_commit() == expected and expected
    monkeypatch.setattr(machine, "source_commit", lambda: "abc1234")
    monkeypatch.setattr(machine, "_llvm_cpu", lambda: None)  # no target resolution in this test
    assert machine.machine_info()["commit"] == "abc1234"


def test_benchmark_records_and_plots_are_where_readers_look():
    """#38: every JSON record of a study lies in its results/ folder; a plot in git is one a README in its folder
    shows (rendered plots go to a git-ignored plots/ folder)."""
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    studies = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith("work")]
    stray = [str(p.relative_to(root)) for d in studies for p in d.rglob("*.json")
             if "results" not in p.relative_to(d).parts[:-1]]
    assert not stray, stray
    for png in (p for d in studies for p in d.rglob("*.png") if "plots" not in p.relative_to(d).parts):
        readme = png.parent / "README.md"
        assert readme.is_file() and f"]({png.name})" in readme.read_text(), f"{png} is not shown by {readme}"
