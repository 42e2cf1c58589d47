"""Merge suite re-runs into a suite run: each re-run model's cells and table row replace the first run's; the merged
document lists the re-runs (their commands and load) under "reruns".

    python benchmarks/suites/merge.py results/timm-1t.json results/timm-1t-rerun.json -o results/timm-1t-merged.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def merge(first: dict, reruns: list[dict]) -> dict:
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
    args = parser.parse_args()
    doc = merge(json.loads(args.first.read_text()), [json.loads(p.read_text()) for p in args.reruns])
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
