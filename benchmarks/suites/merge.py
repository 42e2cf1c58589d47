"""Merge suite re-runs into a suite run: each re-run model's cells and table row replace the first run's; the merged
document lists the re-runs (their commands and load) under "reruns".

Only records of one commit merge (`machine.commit`, recorded by `mlc bench` since #38): files from different commits,
or from before commits were recorded, are refused with a one-line error, since one table would then mix code. Render
such runs one by one (`mlc report FILE -o FILE.md`).

    python benchmarks/suites/merge.py results/timm-1t.json results/timm-1t-rerun.json -o results/timm-1t-merged.json

With --parts, the files are parts of one run (a suite split across processes): the merged document's command is
theirs in turn, and its models are in the suite's order.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class MixedCommits(ValueError):
    """The files did not all run at one recorded commit."""


def check_one_commit(docs: list[dict], names: list[str]) -> str:
    """The one commit all the records ran at; MixedCommits otherwise (a missing commit counts as different)."""
    commits = [(d.get("machine") or {}).get("commit") for d in docs]
    if None in commits or len(set(commits)) > 1:
        listed = ", ".join(f"{n} at {c or 'an unrecorded commit'}" for n, c in zip(names, commits))
        raise MixedCommits(f"refusing to merge records of different (or unrecorded) commits into one table: {listed}")
    return commits[0]


def merge(first: dict, reruns: list[dict]) -> dict:
    check_one_commit([first, *reruns], [f"file {i + 1}" for i in range(1 + len(reruns))])
    doc = json.loads(json.dumps(first))
    for again in reruns:
        names = list(again["suite"]["models"])
        doc["cells"] = [c for c in doc["cells"] if c["model"] not in names] + again["cells"]
        doc["suite"]["models"].update(again["suite"]["models"])
        doc.setdefault("reruns", []).append({"models": names, "command": again["config"]["command"],
                                             "machine": again["machine"]})
    order = list(first["suite"]["models"]) + [n for n in doc["suite"]["models"] if n not in first["suite"]["models"]]
    doc["suite"]["models"] = {n: doc["suite"]["models"][n] for n in order}
    doc["cells"].sort(key=lambda c: order.index(c["model"]))
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("reruns", type=Path, nargs="+")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--parts", action="store_true", help="the files are parts of one run")
    args = parser.parse_args()
    parts = [json.loads(args.first.read_text())] + [json.loads(p.read_text()) for p in args.reruns]
    try:
        check_one_commit(parts, [str(p) for p in [args.first, *args.reruns]])
    except MixedCommits as e:
        sys.exit(f"merge.py: error: {e}")
    doc = merge(parts[0], parts[1:])
    if args.parts:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
        from mlc.bench import suites

        listed = suites.names(doc["config"]["suite"] if isinstance(doc["config"].get("suite"), str) else "timm")
        order = [n for n in listed if n in doc["suite"]["models"]]
        order += [n for n in doc["suite"]["models"] if n not in order]
        doc["suite"]["models"] = {n: doc["suite"]["models"][n] for n in order}
        doc["cells"].sort(key=lambda c: order.index(c["model"]))
        doc["config"]["command"] = " ; then ".join(p["config"]["command"] for p in parts)
        doc["config"]["models"] = order
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
