"""`mlc report`: benchmark JSON files (one or several machines and targets) to an HTML or Markdown page.

The page is built once as sections of text, tables and matplotlib figures, then written as HTML
(figures embedded as base64 PNG) or Markdown (figures as PNG files in a `plots/` folder beside it, which .gitignore
keeps out of the repository: they are rendered again from the JSON records). Latency measured
under emulation (ARM targets run with qemu on x86) is shown as such and never compared."""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from mlc.bench.cells import SCHEMA
from mlc.errors import InputError

EMULATED = "emulated"
PLOTS = "plots"  # the Markdown page's figures go to PLOTS/ beside it (git-ignored)


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    bold: set[tuple[int, int]] = field(default_factory=set)  # (row, column) to emphasise


@dataclass
class Figure:
    name: str  # file-name slug
    caption: str
    png: bytes


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)
    parts: list[Table | Figure] = field(default_factory=list)


# Loading and merging -----------------------------------------------------------------------------

def load(paths: Sequence[Path]) -> list[dict]:
    docs = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"results file not found: {path}")
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{path} is not JSON ({e}); give files written by `mlc bench -o`") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("cells"), list):
            raise InputError(f"{path} is not an `mlc bench` result (expected schema {SCHEMA})")
        doc["file"] = path.name
        docs.append(doc)
    return docs


def commit(doc: dict) -> Optional[str]:
    """The commit a record ran at (`machine.commit`, or a study script's top-level `commit`); None if not recorded."""
    return (doc.get("machine") or {}).get("commit") or doc.get("commit")


def check_one_commit(docs: Sequence[dict]) -> None:
    """One table holds the records of one commit: refuse files from different commits, or whose commit is not
    recorded (nothing shows they ran the same code)."""
    if len(docs) < 2:
        return
    commits = [commit(d) for d in docs]
    if None in commits or len(set(commits)) > 1:
        listed = ", ".join(f"{d.get('file', '?')} at {c or 'an unrecorded commit'}" for d, c in zip(docs, commits))
        raise InputError(f"refusing to put records of different (or unrecorded) commits in one table: {listed}; "
                         "render each run on its own")


def run_line(doc: dict) -> str:
    """Where a table's numbers come from: file, commit, machine, date and load."""
    m = doc.get("machine") or {}
    return (f"Run `{doc.get('file', '?')}`: commit {commit(doc) or 'not recorded'}, {machine_label(m)}, "
            f"{m.get('date', 'date not recorded')}, load average {_load(m)}.")


def machine_label(machine: dict) -> str:
    cpu = " ".join(machine.get("cpu", "?").replace("(R)", "").replace("(TM)", "").replace(" CPU", "").split())
    env = "".join(f", {k}={v}" for k, v in sorted(machine.get("environment", {}).items()))
    return f"{cpu}, {machine.get('cores_usable', '?')} cores{env}"


def backend_label(cell: dict) -> str:
    """mlc@TARGET, with its precision where it is not fp32 (`mlc bench --precision`); a baseline's name."""
    if cell["backend"] != "mlc":
        return cell["backend"]
    precision = cell.get("precision", "fp32")
    return f"mlc@{cell['target']}" + ("" if precision == "fp32" else f" {precision}")


def shape_label(cell: dict) -> str:
    return f"b{cell['batch']}" + (f" s{cell['seq']}" if cell.get("seq") is not None else "")


def rows(docs: list[dict]) -> list[dict]:
    """Every cell of every file with its machine; a later file replaces the same cell of an earlier one."""
    merged: dict[tuple, dict] = {}
    for doc in docs:
        label = machine_label(doc["machine"])
        for cell in doc["cells"]:
            row = {**cell, "machine": label, "file": doc["file"]}
            key = (label, cell["model"], cell["batch"], cell.get("seq"), cell["threads"], backend_label(cell))
            merged[key] = row
    return list(merged.values())


def latency(cell: dict) -> Optional[float]:
    if cell.get("status") != "ok" or cell.get("emulated"):
        return None
    return (cell.get("latency_ms") or {}).get("p50")


def samples_per_s(cell: dict) -> Optional[float]:
    """Samples a second: a throughput baseline's (requests in flight), else the batch over the mean call time."""
    if cell.get("status") != "ok" or cell.get("emulated"):
        return None
    return (cell.get("throughput") or cell.get("latency_ms") or {}).get("samples_per_s")


def _ms(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def unscheduled(cell: Optional[dict]) -> int:
    """Kernels an mlc cell's artifact runs unscheduled (TVM's serial scalar loops): a slow path a table must show."""
    return int(((cell or {}).get("kernels") or {}).get("unscheduled") or 0)


def _unscheduled_tag(count: int) -> str:
    return f" ({count} unscheduled)" if count else ""


def _status_text(cell: Optional[dict]) -> str:
    if cell is None:
        return ""
    if cell["status"] != "ok":
        return cell["status"]
    if cell.get("emulated"):
        return EMULATED
    if cell.get("throughput"):  # no latency: samples/s with requests in flight
        return f"{samples_per_s(cell):.0f}/s"
    return _ms(latency(cell)) + _unscheduled_tag(unscheduled(cell))


# Building the page -------------------------------------------------------------------------------

def _grouped(cells: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(machine, model, shape, threads) -> {backend: cell}, in first-seen order."""
    groups: dict[tuple, dict[str, dict]] = {}
    for c in cells:
        groups.setdefault((c["machine"], c["model"], shape_label(c), c["threads"]), {})[backend_label(c)] = c
    return groups


def _backends(cells: list[dict]) -> list[str]:
    names = list(dict.fromkeys(backend_label(c) for c in cells))
    return [n for n in names if not n.startswith("mlc@")] + [n for n in names if n.startswith("mlc@")]


def _load(machine: dict) -> str:
    start, end = machine.get("load_average"), machine.get("load_average_end")
    return f"{start[0]:.1f} → {end[0]:.1f}" if start and end else "?"


def _machines_section(docs: list[dict]) -> Section:
    table = Table(["machine", "CPU", "cores (usable/all)", "memory GiB", "date", "load avg start → end", "commit",
                   "versions", "file"], [])
    for doc in docs:
        m = doc["machine"]
        versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items()
                             if k in ("mlc", "apache-tvm", "torch", "onnxruntime", "tensorflow", "tensorflow-cpu",
                                      "paddlepaddle"))
        cpu = m.get("cpu", "?") + (f" ({m['llvm_cpu']})" if m.get("llvm_cpu") else "")
        table.rows.append([machine_label(m), cpu, f"{m.get('cores_usable')}/{m.get('cpu_count')}",
                           str(m.get("memory_gib", "?")), m.get("date", "?"), _load(m), commit(doc) or "not recorded",
                           versions, doc["file"]])
    config = docs[0]["config"]
    text = [f"Warm-up {config.get('warmup')} runs, then {config.get('repeat')} timed runs per cell; each cell runs in "
            "a process of its own with its thread count set. Latency is the median (p50) in milliseconds unless "
            "said otherwise; speed-up is the baseline's p50 over mlc's (above 1: mlc is faster). The load average "
            "(1 min) shows whether other work shared the machine: with a load above the core count, multi-thread "
            "timings suffer most (a descheduled thread stalls its team at every barrier)."]
    if not any(d["cells"] for d in docs):  # --lengths runs only: their sections say how they ran
        text = []
    commands = list(dict.fromkeys(d["config"].get("command") for d in docs if d["config"].get("command")))
    text += [f"Command: `{c}`" for c in commands]
    return Section("Machines", text, [table])


def _latency_section(cells: list[dict]) -> Section:
    backends = _backends(cells)
    section = Section("Latency (p50 ms; p90/p99 in the accuracy table)", [
        "Lowest per row in bold. 'emulated': an ARM artifact run under qemu — its accuracy counts, its "
        "latency is not a measurement of the device and is left out."])
    table = Table(["machine", "model", "shape", "threads", *backends], [])
    for (machine, model, shape, threads), by in _grouped(cells).items():
        row = [machine, model, shape, str(threads)] + [_status_text(by.get(b)) for b in backends]
        values = {i: latency(by[b]) for i, b in enumerate(backends) if b in by and latency(by[b]) is not None}
        if values:
            table.bold.add((len(table.rows), 4 + min(values, key=values.get)))
        table.rows.append(row)
    section.parts.append(table)
    return section


def _throughput_section(cells: list[dict]) -> Optional[Section]:
    """Samples/s per backend where a cell is batched or a throughput baseline ran (e.g. --batch 8,32 --threads all
    --baselines ort,openvino-throughput: mlc runs one batched call at a time)."""
    if not any(c["batch"] > 1 or c.get("throughput") for c in cells):
        return None
    backends = _backends(cells)
    table = Table(["machine", "model", "shape", "threads", *backends], [])
    for (machine, model, shape, threads), by in _grouped(cells).items():
        values = {b: samples_per_s(by[b]) for b in backends if b in by}
        table.rows.append([machine, model, shape, str(threads)]
                          + [f"{values[b]:.0f}" if values.get(b) else _status_text(by.get(b)) for b in backends])
        best = [i for i, b in enumerate(backends) if values.get(b)]
        if best:
            table.bold.add((len(table.rows) - 1, 4 + max(best, key=lambda i: values[backends[i]])))
    return Section("Throughput (samples/s)", [
        "Highest per row in bold. Batch over the mean call time, one call at a time; a throughput baseline "
        "(openvino-throughput) keeps its optimal number of infer requests in flight and counts them all."], [table])


def _speedups(cells: list[dict]) -> tuple[list[str], list[str], list[tuple[tuple, dict[tuple[str, str], float]]]]:
    backends = _backends(cells)
    mlcs = [b for b in backends if b.startswith("mlc@")]
    others = [b for b in backends if not b.startswith("mlc@")]
    out = []
    for key, by in _grouped(cells).items():
        ratios = {}
        for m in mlcs:
            for b in others:
                mine, theirs = latency(by.get(m, {})), latency(by.get(b, {}))
                if mine and theirs:
                    ratios[(m, b)] = theirs / mine
        out.append((key, ratios))
    return mlcs, others, out


def _speedup_section(cells: list[dict]) -> Optional[Section]:
    mlcs, others, speedups = _speedups(cells)
    if not mlcs or not others:
        return None
    pairs = [(m, b) for m in mlcs for b in others]
    table = Table(["machine", "model", "shape", "threads", *[f"{m} vs {b}" for m, b in pairs]], [])
    for (machine, model, shape, threads), ratios in speedups:
        row = [machine, model, shape, str(threads)]
        for i, pair in enumerate(pairs):
            ratio = ratios.get(pair)
            row.append(f"{ratio:.2f}×" if ratio else "–")
            if ratio and ratio >= 1:
                table.bold.add((len(table.rows), 4 + i))
        table.rows.append(row)
    return Section("Speed-up of mlc over each baseline", [
        "Baseline p50 / mlc p50 on the same machine, shape and thread count; bold where mlc is at least as fast."],
        [table])


def _accuracy_section(cells: list[dict]) -> Section:
    table = Table(["machine", "model", "shape", "threads", "backend", "precision", "reference", "max abs err",
                   "result", "p90 ms", "p99 ms", "mean ms", "load"], [])
    for c in cells:
        if c["status"] != "ok":
            continue
        acc = c.get("accuracy") or {}
        lat = c.get("latency_ms") or {}
        emulated = bool(c.get("emulated"))
        err = acc.get("max_abs_error")
        gated = "gate" in acc
        table.rows.append([c["machine"], c["model"], shape_label(c), str(c["threads"]), backend_label(c),
                           c.get("precision", "fp32"), c.get("reference", ""), "–" if err is None else f"{err:.2e}",
                           ("pass" if acc.get("passed") else "FAIL") + (" (gate)" if gated else "")
                           + _unscheduled_tag(unscheduled(c)),
                           *([EMULATED] * 3 if emulated
                             else [_ms(lat.get("p90")), _ms(lat.get("p99")), _ms(lat.get("mean"))]),
                           f"{c['load_average']:.1f}" if c.get("load_average") is not None else "–"])
        if not acc.get("passed"):
            table.bold.add((len(table.rows) - 1, 8))
    return Section("Accuracy against the framework's eager outputs", [
        "Each backend's outputs on the same seeded inputs, against the eager outputs of the framework the model "
        "was built in (fp32 tolerance atol 1e-4, rtol 1e-3). A cell that ran at a reduced precision (bf16, fp16: "
        "mlc's `--precision` builds, OpenVINO's default on CPUs with bf16) is judged by mlc's accuracy gate instead: "
        "'(gate)'. 'load': the machine's 1-minute load average when the cell finished."], [table])


def _compile_section(cells: list[dict]) -> Optional[Section]:
    seen, table = set(), Table(["machine", "model", "shape", "backend", "compile s", "tuning s", "artifact MiB",
                                "peak RSS MiB (threads)"], [])
    for c in cells:
        if c["status"] != "ok" or c.get("compile_s") is None:
            continue
        key = (c["machine"], c["model"], shape_label(c), backend_label(c))
        rss = ", ".join(f"{o['peak_rss_mb']:.0f} ({o['threads']})" for o in cells
                        if (o["machine"], o["model"], shape_label(o), backend_label(o)) == key and o.get("peak_rss_mb"))
        if key in seen:
            continue
        seen.add(key)
        size = c.get("artifact_bytes")
        table.rows.append([*key, f"{c['compile_s']:.1f}", f"{c['tuning_s']:.0f}" if c.get("tuning_s") else "–",
                           f"{size / 2**20:.1f}" if size else "–", rss])
    if not table.rows:
        return None
    return Section("Compile time, artifact size, peak memory", [
        "mlc: the whole `mlc compile` (export, ONNX clean-up, TVM build, packaging, check), once per shape and "
        "target. Baselines: setup until the first result (torch.compile compiles with an empty inductor cache; "
        "ONNX Runtime builds its session). Peak RSS is the measuring process's, framework included."], [table])


def _problems_section(cells: list[dict]) -> Optional[Section]:
    bad = [c for c in cells if c["status"] != "ok"]
    if not bad:
        return None
    table = Table(["machine", "model", "shape", "threads", "backend", "status", "why"],
                  [[c["machine"], c["model"], shape_label(c), str(c["threads"]), backend_label(c), c["status"],
                    c.get("error", "")] for c in bad])
    return Section("Cells that did not run", [], [table])


# Plots -------------------------------------------------------------------------------------------

def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _bars(title: str, groups: list[str], series: dict[str, list[Optional[float]]], ylabel: str,
          log: bool = False, line: Optional[float] = None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) * max(1, len(series)) ** 0.5 + 2), 3.8))
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for i, (name, values) in enumerate(series.items()):
        offset = x + (i - (len(series) - 1) / 2) * width
        if line is None:
            ax.bar(offset, [v or 0 for v in values], width, label=name)
        else:  # bars grow from the reference line, up where better, down where worse
            ax.bar(offset, [(v - line) if v else 0 for v in values], width, bottom=line, label=name)
    ax.set_xticks(x, groups, rotation=30 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        from matplotlib.ticker import FuncFormatter, LogLocator

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    if line is not None:
        ax.axhline(line, color="black", linewidth=0.8, linestyle="--")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")[:60]


def _figures(cells: list[dict]) -> tuple[list[Figure], list[Figure], list[Figure]]:
    latency_figs, speedup_figs, compile_figs = [], [], []
    machines = list(dict.fromkeys(c["machine"] for c in cells))
    models = list(dict.fromkeys(c["model"] for c in cells))
    for machine in machines:
        # File names name the machine only where a report merges several (the captions always do).
        tag = f"-{_slug(machine)}" if len(machines) > 1 else ""
        for model in models:
            mine = [c for c in cells if c["machine"] == machine and c["model"] == model]
            groups = _grouped(mine)
            labels = [f"{shape} t{threads}" for (_, _, shape, threads) in groups]
            series = {b: [latency(by.get(b, {})) if b in by else None for by in groups.values()]
                      for b in _backends(mine)}
            series = {b: v for b, v in series.items() if any(x is not None for x in v)}
            if series:
                latency_figs.append(Figure(f"latency{tag}-{_slug(model)}",
                                           f"{model} on {machine}: p50 latency (ms, log scale; lower is better)",
                                           _png(_bars(f"{model} — {machine}", labels, series, "p50 ms", log=True))))
        mcells = [c for c in cells if c["machine"] == machine]
        mlcs, others, speedups = _speedups(mcells)
        if mlcs and others:
            labels = [f"{model} {shape} t{threads}" for (_, model, shape, threads), _ in speedups]
            series = {f"{m} vs {b}": [r.get((m, b)) for _, r in speedups] for m in mlcs for b in others}
            series = {k: v for k, v in series.items() if any(x is not None for x in v)}
            if series:
                speedup_figs.append(Figure(f"speedup{tag}", f"mlc speed-up over each baseline on {machine} "
                                                                        "(above the dashed line: mlc is faster)",
                                           _png(_bars(f"speed-up of mlc — {machine}", labels, series,
                                                      "baseline p50 / mlc p50", log=True, line=1.0))))
        compiled = {}
        for c in mcells:
            if c["status"] == "ok" and c.get("compile_s") is not None:
                compiled.setdefault((f"{c['model']} {shape_label(c)}", backend_label(c)), c["compile_s"])
        if compiled:
            groups = list(dict.fromkeys(g for g, _ in compiled))
            names = list(dict.fromkeys(b for _, b in compiled))
            series = {b: [compiled.get((g, b)) for g in groups] for b in names}
            compile_figs.append(Figure(f"compile{tag}", f"compile/setup time on {machine} (s, log scale)",
                                       _png(_bars(f"compile time — {machine}", groups, series, "seconds", log=True))))
    return latency_figs, speedup_figs, compile_figs


def _lengths_rows(run: dict) -> list[list[str]]:
    out = []
    for r in run["strategies"]:
        acc = r.get("accuracy") or {}
        ok = r["status"] == "ok"
        out.append([r["strategy"], r["status"] if not ok else "ok", str(r.get("compiles", "")),
                    _s(r.get("compile_s")), _s(r.get("run_total_s")),
                    _ms(1e3 * r["run_total_s"] / len(run["lengths"])) if ok else "–",
                    f"{r['padding_waste_pct']:.1f}%" if ok and r.get("padding_waste_pct") is not None else "–",
                    f"{r['artifact_bytes'] / 2**20:.1f}" if r.get("artifact_bytes") else "–",
                    (f"{acc['max_abs_error']:.2g} {'pass' if acc.get('passed') else 'FAIL'}" if acc else "–"),
                    r.get("error", "")])
    return out


def _s(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


_LENGTHS_HEADER = ["strategy", "status", "compiles", "compile s", "run total s", "mean ms/sentence", "padding waste",
                   "artifact MiB", "max abs err vs eager", "note"]


def _lengths_sections(docs: list[dict]) -> list[Section]:
    """`mlc bench --lengths`: strategies over a sentence-length distribution (seed 002)."""
    sections = []
    for doc in docs:
        run = doc.get("lengths")
        if not run:
            continue
        st = run["stats"]
        title = f"{run['model']}: {run['distribution']} lengths, {st['n']} sentences ({machine_label(doc['machine'])})"
        text = [f"Token lengths (seed {run['seed']}): mean {st['mean']}, median {st['median']:g}, "
                f"{st['min']}–{st['max']}, "
                f"p90 {st['p90']:g}, {st['distinct']} distinct. Batch 1, one sentence at a time, {run['threads']} "
                f"thread(s), target {run['target']}; each distinct length runs once untimed first (checked against "
                f"eager), then every sentence once, timed. Buckets: {', '.join(map(str, run['buckets']))}. Compile "
                f"times exclude the one ONNX export all strategies share ({_s(run.get('export_s'))} s); ORT's and "
                "OpenVINO's are their session creation and model compile. Padding waste: padded tokens / tokens run. "
                "Artifact MiB: the artifact directories, each with its own copy of the TVM runtime."]
        table = Table(_LENGTHS_HEADER, _lengths_rows(run))
        parts: list = [table]
        ok = [r for r in run["strategies"] if r["status"] == "ok"]
        if ok:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
            names = [r["strategy"] for r in ok]
            axes[0].bar(names, [r.get("compile_s") or 0 for r in ok])
            axes[0].set_title("total compile time (s)")
            axes[1].bar(names, [r["run_total_s"] for r in ok])
            axes[1].set_title("total run time over the set (s)")
            lengths = sorted(st["histogram"], key=int)
            axes[2].bar([int(k) for k in lengths], [st["histogram"][k] for k in lengths])
            for b in run["buckets"]:
                axes[2].axvline(b + 0.5, color="black", linestyle="--", linewidth=0.8)
            axes[2].set_title("sentence lengths (dashed: buckets)")
            axes[2].set_xlabel("tokens")
            for ax in axes[:2]:
                ax.tick_params(axis="x", rotation=30)
                ax.grid(axis="y", alpha=0.3)
            parts.append(Figure(f"lengths-{_slug(run['model'])}",
                                f"{run['model']}: compile and run time per strategy, and the length distribution",
                                _png(fig)))
        sections.append(Section(title, text, parts))
    return sections


def lengths_console_table(doc: dict):
    from rich.table import Table as RichTable

    table = RichTable(title=f"{doc['lengths']['model']}, {doc['lengths']['stats']['n']} sentences",
                      title_justify="left")
    for column in _LENGTHS_HEADER:
        table.add_column(column, justify="left" if column in ("strategy", "status", "note") else "right")
    for row in _lengths_rows(doc["lengths"]):
        table.add_row(*row)
    return table


def build(docs: list[dict]) -> list[Section]:
    check_one_commit(docs)
    cells = rows(docs)
    lengths = _lengths_sections(docs)
    if not cells and not lengths:
        raise InputError("the results hold no cells; run `mlc bench` first")
    if not cells:
        return [_machines_section(docs)] + lengths
    latency_figs, speedup_figs, compile_figs = _figures(cells)
    sections = [_machines_section(docs)] + lengths + suite_sections(docs)
    lat = _latency_section(cells)
    lat.text += [run_line(d) for d in docs]
    lat.parts += latency_figs
    sections.append(lat)
    speed = _speedup_section(cells)
    if speed:
        speed.text += [run_line(d) for d in docs]
        speed.parts += speedup_figs
        sections.append(speed)
    throughput = _throughput_section(cells)
    if throughput:
        throughput.text += [run_line(d) for d in docs]
        sections.append(throughput)
    sections.append(_accuracy_section(cells))
    comp = _compile_section(cells)
    if comp:
        comp.parts += compile_figs
        sections.append(comp)
    problems = _problems_section(cells)
    if problems:
        sections.append(problems)
    return sections


# Suites (mlc bench --suite) ----------------------------------------------------------------------------

SUITE_STAGES = ("export", "import", "compile", "run", "check")


def _suite_params(value: Optional[int]) -> str:
    if not value:
        return "?"
    return f"{value / 1e9:.2f} B" if value >= 1e9 else f"{value / 1e6:.1f} M"


def _suite_geomean(values: list[float]) -> Optional[float]:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _suite_status(info: dict, cells: Sequence[dict] = ()) -> str:
    """"pass", "pass (N unscheduled)" (from the outcome, or for older records its mlc cells), or the failed stage."""
    if info.get("status") == "passed":
        return "pass" + _unscheduled_tag(info.get("unscheduled") or max(map(unscheduled, cells), default=0))
    if info.get("stage"):
        return f"{info['stage']}: {info.get('reason', '')}"
    return info.get("status", "?")


def suite_summary(doc: dict) -> dict:
    """Pass counts, failures by stage and geomean speed-ups {threads: {baseline: (geomean, models)}}."""
    models = doc["suite"]["models"]
    passed = [n for n, m in models.items() if m.get("status") == "passed"]
    stages = {s: sum(m.get("stage") == s for m in models.values()) for s in SUITE_STAGES}
    by: dict[tuple[str, int], dict[str, dict]] = {}
    for c in doc["cells"]:
        by.setdefault((c["model"], c["threads"]), {})[backend_label(c)] = c
    speedups: dict[int, dict[str, list[float]]] = {}
    for (model, threads), cells in by.items():
        mine = next((c for b, c in cells.items() if b.startswith("mlc@")), None)
        if model not in passed or mine is None or latency(mine) is None:
            continue
        for b, c in cells.items():
            if not b.startswith("mlc@") and latency(c) is not None:
                speedups.setdefault(threads, {}).setdefault(b, []).append(latency(c) / latency(mine))
    geo = {t: {b: (_suite_geomean(v), len(v)) for b, v in per.items()} for t, per in speedups.items()}
    return {"total": len(models), "passed": len(passed), "stages": stages, "geomean": geo}


def suite_sections(docs: list[dict]) -> list[Section]:
    out = []
    for doc in docs:
        if not doc.get("suite"):
            continue
        suite, machine = doc["suite"], machine_label(doc["machine"])
        s = suite_summary(doc)
        rate = f"{s['passed']}/{s['total']} models pass ({100 * s['passed'] / s['total']:.0f}%)" if s["total"] else \
            "no model ran"
        failed = ", ".join(f"{n} at {stage}" for stage, n in s["stages"].items() if n)
        slow = sum(1 for n, m in suite["models"].items() if m.get("status") == "passed" and _suite_status(
            m, [c for c in doc["cells"] if c["model"] == n and c["backend"] == "mlc"]) != "pass")
        text = [f"Pass rate: {rate}" + (f"; failures by stage: {failed}" if failed else "")
                + (f"; {slow} of the passes with unscheduled kernels (TVM's serial loops)." if slow else ".")
                + (" Tiny configs (MLC_SUITE_TINY): not the published sizes." if suite.get("tiny") else ""),
                run_line(doc),
                "A model passes when mlc exports, imports, compiles and runs it and its outputs match torch eager's. "
                "Speed-up: the baseline's p50 over mlc's (above 1: mlc is faster), over the models where both ran."]
        for threads, per in sorted(s["geomean"].items()):
            text.append(f"Geomean speed-up at {threads} thread(s): " + ", ".join(
                f"{g:.2f}× vs {b} ({n} models)" for b, (g, n) in per.items()))
        section = Section(f"Suite {suite['name']} ({machine}, {doc['file']})", text)
        cells = doc["cells"]
        baselines = list(dict.fromkeys(backend_label(c) for c in cells if c["backend"] != "mlc"))
        mlcs = list(dict.fromkeys(backend_label(c) for c in cells if c["backend"] == "mlc"))
        for threads in sorted({c["threads"] for c in cells}):
            header = ["model", "parameters", "status", "compile s"] + [f"{b} p50 ms" for b in baselines + mlcs] + \
                [f"{m} vs {b}" for m in mlcs for b in baselines]
            table = Table(header, [])
            for name, info in suite["models"].items():
                by = {backend_label(c): c for c in cells if c["model"] == name and c["threads"] == threads}
                notes = "; ".join(n for n in info.get("notes", []) if "cut to" in n or "passed by" in n)
                ours = [c for b, c in by.items() if b.startswith("mlc@")]
                row = [name + (f" ({notes})" if notes else ""), _suite_params(info.get("params")),
                       _suite_status(info, ours),
                       f"{info['compile_s']:.0f}" if info.get("compile_s") is not None else "–"]
                row += [_ms(latency(by[b])) if b in by else "–" for b in baselines + mlcs]
                for m in mlcs:
                    mine = latency(by[m]) if m in by and info.get("status") == "passed" else None
                    for b in baselines:
                        base = latency(by[b]) if b in by else None
                        row.append(f"{base / mine:.2f}×" if mine and base else "–")
                table.rows.append(row)
            section.parts.append(Table(table.header, table.rows))
            if len({c["threads"] for c in cells}) > 1:
                section.text.append(f"Table {len(section.parts)}: {threads} thread(s).")
        out.append(section)
    return out


def suite_console_table(doc: dict):
    """The terminal summary of a suite run (rich Table)."""
    from rich.table import Table as RichTable

    section = suite_sections([{**doc, "file": "-"}])[0]
    table = RichTable(title="\n".join(section.text), title_justify="left")
    first = section.parts[0]
    for i, column in enumerate(first.header):
        table.add_column(column, justify="left" if i in (0, 2) else "right", overflow="fold")
    for part in section.parts:
        for row in part.rows:
            table.add_row(*row)
    return table


# Writing -----------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222}h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}th,td{border:1px solid #ddd;padding:.3em .6em;
text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}tr:nth-child(even){background:#fafafa}
figure{margin:1.5em 0}figcaption{font-size:.9em;color:#555}img{max-width:100%}code{background:#f4f4f4;padding:0 .2em}"""


def _inline(text: str) -> str:
    """`code` spans in escaped HTML."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(sections: list[Section], title: str) -> str:
    out = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
           f"<style>{_CSS}</style></head><body>\n<h1>{html.escape(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{html.escape(s.title)}</h2>")
        out += [f"<p>{_inline(t)}</p>" for t in s.text]
        for part in s.parts:
            if isinstance(part, Table):
                out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in part.header)
                           + "</tr></thead><tbody>")
                for r, row in enumerate(part.rows):
                    cells = [f"<td><b>{html.escape(v)}</b></td>" if (r, c) in part.bold
                             else f"<td>{html.escape(v)}</td>"
                             for c, v in enumerate(row)]
                    out.append("<tr>" + "".join(cells) + "</tr>")
                out.append("</tbody></table>")
            else:
                data = base64.b64encode(part.png).decode()
                out.append(f"<figure><img alt=\"{html.escape(part.caption)}\" src=\"data:image/png;base64,{data}\">"
                           f"<figcaption>{html.escape(part.caption)}</figcaption></figure>")
    out.append("</body></html>\n")
    return "\n".join(out)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(sections: list[Section], title: str, image_prefix: str) -> tuple[str, dict[str, bytes]]:
    """The page, and the PNG files it links to (names relative to the page)."""
    out, images = [f"# {title}", ""], {}
    for s in sections:
        out += [f"## {s.title}", ""]
        for t in s.text:
            out += [t, ""]
        for part in s.parts:
            if isinstance(part, Table):
                out.append("| " + " | ".join(_md_cell(h) for h in part.header) + " |")
                out.append("|" + "|".join(":---" if i == 0 else "---:" for i in range(len(part.header))) + "|")
                for r, row in enumerate(part.rows):
                    out.append("| " + " | ".join(f"**{_md_cell(v)}**" if (r, c) in part.bold and v else _md_cell(v)
                                                 for c, v in enumerate(row)) + " |")
                out.append("")
            else:
                name = f"{image_prefix}{part.name}.png"
                copy = 2
                while name in images:  # two runs of one model on one machine: one file each
                    name = f"{image_prefix}{part.name}-{copy}.png"
                    copy += 1
                images[name] = part.png
                out += [f"![{part.caption}]({name})", "", f"*{part.caption}*", ""]
    return "\n".join(out) + "\n", images


def render(paths: Sequence[Path], output: Path, title: str = "mlc benchmark report") -> list[Path]:
    """Write the report; returns the files written (the page first)."""
    output = Path(output)
    if output.suffix.lower() not in (".html", ".htm", ".md"):
        raise InputError(f"-o {output}: the report is written as .html or .md")
    sections = build(load(paths))
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix.lower() == ".md":
        text, images = to_markdown(sections, title, f"{PLOTS}/{output.stem}-")
        written = [output]
        if images:
            (output.parent / PLOTS).mkdir(exist_ok=True)
        for name, data in images.items():
            (output.parent / name).write_bytes(data)
            written.append(output.parent / name)
        output.write_text(text)
        return written
    output.write_text(to_html(sections, title))
    return [output]


def console_table(doc: dict):
    """A terminal summary of one run (rich Table): p50 per cell and backend."""
    from rich.table import Table as RichTable

    cells = rows([{**doc, "file": ""}])
    backends = _backends(cells)
    table = RichTable(title="p50 latency, ms (accuracy vs eager: ✓ pass, ✗ fail)\n" + run_line({**doc, "file": "-"}),
                      title_justify="left")
    for column in ("model", "shape", "threads", *backends):
        table.add_column(column, justify="left" if column in ("model", "shape") else "right")
    for (_, model, shape, threads), by in _grouped(cells).items():
        values = []
        for b in backends:
            c = by.get(b)
            text = _status_text(c)
            if c is not None and c["status"] == "ok":
                text += " ✓" if (c.get("accuracy") or {}).get("passed") else " ✗"
            values.append(text)
        table.add_row(model, shape, str(threads), *values)
    return table
