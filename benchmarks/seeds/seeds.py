"""Reproduce the seed documents' tables (../shared/seeds/) on this machine, with mlc's rows added.

Each seed is one `mlc bench` command line (printed with --print); this script runs it, writes the
results to benchmarks/seeds/results/seed-NNN.json, renders benchmarks/seeds/seed-NNN.md (+ plots) with
`mlc report`, and writes benchmarks/seeds/seeds.md: the seed's published table beside ours.

    .venv/bin/python benchmarks/seeds/seeds.py --print                 # the command lines only
    .venv/bin/python benchmarks/seeds/seeds.py 000 001 003 [--db tuning/] [--repeat 20]
    .venv/bin/python benchmarks/seeds/seeds.py --tables-only           # rebuild seeds.md from the JSON

The published numbers were measured on the seed authors' machines (and, for 000 and 001, in
other frameworks' builds of the models): compare shapes of the results (who beats whom, how the
gap grows with size), not absolute values. Only columns measured side by side in one run here
are comparable with each other."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


@dataclass(frozen=True)
class Seed:
    key: str
    title: str
    args: list[str]  # `mlc bench` arguments (without -o)
    published_header: list[str]
    published: list[list[str]]  # rows under published_header
    note: str


SEEDS = {
    "000": Seed(
        "000", "BERT-base inference, dynamic (eager) vs static graph, CPU 1 and 2 threads",
        ["--models", "bert-base", "--batch", "1,4", "--seq", "32,128,512", "--threads", "1,2",
         "--baselines", "torch,torchscript,torch-compile,ort,openvino,openvino-default,paddle,paddle-static",
         "--targets", "x86",
         "--warmup", "3", "--repeat", "10", "--cell-timeout", "1800"],
        ["threads", "batch", "seq", "Paddle dynamic ms", "Paddle static ms", "static speed-up"],
        [r.split() for r in (
            "1 1 32 146.47 141.89 3.1%", "1 1 128 504.29 436.91 13.4%", "1 1 512 2384.24 1772.91 25.6%",
            "1 4 32 437.25 419.09 4.2%", "1 4 128 1724.65 1526.03 11.5%", "1 4 512 9090.28 6879.77 24.3%",
            "2 1 32 162.81 109.33 32.9%", "2 1 128 556.30 269.69 51.5%", "2 1 512 2390.78 1258.76 47.3%",
            "2 4 32 436.09 420.18 3.6%", "2 4 128 1734.58 1095.62 36.8%", "2 4 512 9097.34 4045.13 55.5%")],
        "The seed ran PaddleNLP's bert-base-uncased (paddle.jit.to_static + Paddle Inference). The zoo's "
        "bert-base is transformers' BertModel in torch, which mlc compiles; the paddle and paddle-static "
        "columns run the zoo's Paddle bert-base, paddle.nn's encoder at the same shape (seeded weights)."),
    "001": Seed(
        "001", "Stacked LSTM language model, forward only, CPU (vocab 10001, emb 128, 3x256, seq 50, batch 128)",
        ["--models", "lstm-lm", "--batch", "128", "--threads", "1,2",
         "--baselines", "torch,torchscript,ort,openvino,openvino-default,tf,tf-graph", "--targets", "x86",
         "--warmup", "2", "--repeat", "10", "--cell-timeout", "1800"],
        ["batch", "TF eager ms", "TF graph ms", "TF graph whileop ms", "PyTorch ms", "PyTorch JIT ms"],
        [["128", "596.0", "218.1", "188.6", "348.3", "259.6"]],
        "Published: the seed's fine-grained-operator CPU table (threads not stated). The zoo's lstm-lm uses "
        "torch.nn.LSTM (PyTorch's fused CPU kernel) and, in TF, the Keras builder. TVM's ONNX importer has no "
        "LSTM converter; mlc's graph passes lower the LSTMs before TVM."),
    "003": Seed(
        "003", "torch.compile (inductor) vs eager, transformer encoders at two scales",
        ["--models", "bert-tiny,bert-base", "--batch", "1", "--seq", "256", "--threads", "2",
         "--precision", "fp32,bf16",
         "--baselines", "torch,torch-compile,openvino,openvino-default", "--targets", "x86",
         "--warmup", "3", "--repeat", "10", "--cell-timeout", "1800"],
        ["model (training, A100)", "eager ms", "cudagraphs ms", "inductor ms", "inductor speed-up"],
        [["shakespeare 10.65M", "16.03", "16.83", "12.19", "27.2%"],
         ["GPT2-small 127M", "3107.3", "3098.3", "2640.2", "16.3%"]],
        "The seed measured GPT training iterations on an A100 (10.65M-parameter 'shakespeare' and 127M GPT2-small); "
        "here: CPU inference of the zoo's bert-tiny (4.4M) and bert-base (110M) at seq 256, the closest models "
        "the zoo builds. cudagraphs is GPU-only and not measured."),
}


def command(seed: Seed, output: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "mlc", "bench", *seed.args, *extra, "-o", str(output)]


def _ours(seed: Seed, path: Path) -> list[str]:
    """Markdown lines: our p50 per cell and backend, with mlc's speed-up over eager."""
    from mlc.bench import report

    docs = report.load([path])
    cells = report.rows(docs)
    backends = report._backends(cells)
    eager = next((b for b in ("torch", "tf", "paddle") if b in backends), None)
    lines = ["| model | shape | threads | " + " | ".join(f"{b} ms" for b in backends)
             + (f" | mlc vs {eager} |" if eager else " |"),
             "|:---|:---|---:|" + "---:|" * (len(backends) + (1 if eager else 0))]
    for (_, model, shape, threads), by in report._grouped(cells).items():
        values = [report._status_text(by.get(b)) for b in backends]
        ratio = ""
        if eager:
            mlcs = [report.latency(c) for b, c in by.items() if b.startswith("mlc@") and report.latency(c)]
            base = report.latency(by.get(eager, {}))
            ratio = f"{base / min(mlcs):.2f}×" if mlcs and base else "–"
        lines.append(f"| {model} | {shape} | {threads} | " + " | ".join(values) + (f" | {ratio} |" if eager else " |"))
    machine = report.machine_label(docs[0]["machine"])
    return [f"Measured here ({machine}, {docs[0]['machine']['date']}; p50 ms). {report.run_line(docs[0])}", ""] + lines


def tables(keys: list[str]) -> str:
    out = ["# Seed reproductions", "",
           "Generated by `benchmarks/seeds/seeds.py` from `results/seed-NNN.json`; full reports in `seed-NNN.md`.", ""]
    for key in keys:
        seed = SEEDS[key]
        path = RESULTS / f"seed-{key}.json"
        out += [f"## Seed {key}: {seed.title}", "", seed.note, "",
                "`" + shlex.join(["mlc", "bench", *seed.args, "-o",
                                  f"benchmarks/seeds/results/seed-{key}.json"]) + "`", "",
                "Published (the seed author's machine):", "",
                "| " + " | ".join(seed.published_header) + " |", "|" + "---:|" * len(seed.published_header)]
        out += ["| " + " | ".join(row) + " |" for row in seed.published]
        out.append("")
        out += _ours(seed, path) if path.exists() else ["Not run on this machine yet."]
        out.append("")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seeds", nargs="*", default=list(SEEDS), help=f"which: {', '.join(SEEDS)} [default: all]")
    parser.add_argument("--print", action="store_true", help="print the command lines and stop")
    parser.add_argument("--tables-only", action="store_true", help="only rebuild seeds.md from recorded JSON")
    parser.add_argument("--db", help="tuning database for mlc's compiles")
    parser.add_argument("--repeat", type=int, help="timed runs per cell (overrides the seed's)")
    args = parser.parse_args()
    unknown = [s for s in args.seeds if s not in SEEDS]
    if unknown:
        parser.error(f"unknown seed(s) {', '.join(unknown)}; choose from {', '.join(SEEDS)}")
    extra = (["--db", args.db] if args.db else []) + (["--repeat", str(args.repeat)] if args.repeat else [])
    for key in args.seeds:
        seed = SEEDS[key]
        output = RESULTS / f"seed-{key}.json"
        cmd = command(seed, output, extra)
        if args.print:
            print(shlex.join(["mlc", *cmd[3:]]))
            continue
        if not args.tables_only:
            print(f"== seed {key}: {seed.title}", flush=True)
            subprocess.run(cmd, check=True)
        if output.exists():
            subprocess.run([sys.executable, "-m", "mlc", "report", str(output), "-o", str(HERE / f"seed-{key}.md"),
                            "--title", f"Seed {key}: {seed.title}"], check=True)
    if not args.print:
        (HERE / "seeds.md").write_text(tables(list(SEEDS)))
        print(f"wrote {HERE / 'seeds.md'}")


if __name__ == "__main__":
    main()
