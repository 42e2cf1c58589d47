"""`mlc bench --lengths cola-like`: a tiny run (bert-tiny, 3 sentences) gives valid JSON and report rows."""

from __future__ import annotations

import json

import pytest

from mlc.bench import lengths, report
from helpers import assert_clean_error, run_mlc

pytest.importorskip("torch")


def test_cola_like_distribution():
    values = lengths.cola_like(2000)
    assert values == lengths.cola_like(2000)  # seeded
    stats = lengths.distribution_stats(values)
    assert 5 <= stats["min"] and stats["max"] <= 45 and 10 <= stats["mean"] <= 12.5
    assert lengths.padding_waste([5, 8, 9], [8, 16]) == round(100 * (3 + 0 + 7) / 32, 2)


def test_tiny_lengths_run(tmp_path):
    out = tmp_path / "lengths.json"
    proc = run_mlc("bench", "--models", "bert-tiny", "--lengths", "cola-like", "--sentences", "3", "--buckets", "16",
                   "--strategies", "dynamic,buckets,static,ort,openvino,torch", "-o", out)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    run = doc["lengths"]
    assert doc["machine"]["cpu"] and run["lengths"] == lengths.cola_like(3)
    rows = {r["strategy"]: r for r in run["strategies"]}
    assert list(rows) == ["dynamic", "buckets", "static", "ort", "openvino", "torch"]
    for row in rows.values():
        assert row["status"] == "ok", row
        assert row["accuracy"]["passed"] and len(row["run_ms"]) == 3 and row["run_total_s"] > 0
    distinct = sorted(set(run["lengths"]))
    assert rows["static"]["compiles"] == len(distinct)
    assert rows["buckets"]["compiles"] == rows["dynamic"]["compiles"] == 1
    assert rows["buckets"]["padding_waste_pct"] == lengths.padding_waste(run["lengths"], [16]) > 0
    assert rows["static"]["padding_waste_pct"] == rows["dynamic"]["padding_waste_pct"] == 0.0
    assert rows["buckets"]["artifact_bytes"] > 0 and rows["static"]["compile_s"] > 0
    page = tmp_path / "report.md"
    report.render([out], page)
    text = page.read_text()
    for name in rows:
        assert f"| {name} | ok |" in text
    assert "cola-like lengths, 3 sentences" in text
    assert list((tmp_path / report.PLOTS).glob("report-lengths-bert-tiny*.png"))  # plots/ beside the page
    # Two runs of one model on one machine (e.g. strategies split over two runs): a plot each.
    both = tmp_path / "both.md"
    report.render([out, out], both)
    links = {line.partition("](")[2] for line in both.read_text().splitlines() if line.startswith("![")}
    assert len(links) == 2 and len(list((tmp_path / report.PLOTS).glob("both-lengths-*.png"))) == 2


def test_lengths_errors(tmp_path):
    out = tmp_path / "x.json"
    assert_clean_error(run_mlc("bench", "--models", "bert-tiny", "--lengths", "zipf", "-o", out), 1,
                       "unknown --lengths")
    assert_clean_error(run_mlc("bench", "--models", "bert-tiny", "--lengths", "cola-like", "--buckets", "4",
                               "-o", out), 1, "largest bucket 4")
