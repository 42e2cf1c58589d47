"""Grouped convs in bf16 builds (#39), and the kernel that drops a padded group's extra channels: mlc "before" and
"after" at fp32 and bf16, beside OpenVINO fp32 and its default (bf16), interleaved call by call in one process,
1 thread.

"before" is this tree with three functions put back as they were (built in the same process):
- `relax_passes._bf16_groups` says no: grouped convs stay fp32 in a bf16 build;
- `schedule_rules._feeds_depthwise` inlines every grouped conv's padding into its loads (a select that tensorize
  cannot match, so a bf16 grouped tile could not use vdpbf16ps);
- `schedule_rules._split_at_index_period` leaves the loops alone (the padding-dropping kernel gathered lane by lane).

    .venv/bin/python benchmarks/grouped-conv/bf16_groups.py --work /tmp/bf16-groups \\
        --broad /tmp/broad-COMMIT -o benchmarks/grouped-conv/results/bf16-groups.json

Layers are built here (`models.conv_model`); `--broad DIR` adds the list's grouped models from model_set.py's
--work folder (`benchmarks/precision/broad_models.py`), compiled with the list's flags. A row: each build's check
and vdpbf16ps count, p50 ms, and the median (p10-p90) of per-round ratios of mlc to OpenVINO at the same precision
(below 1: mlc faster) and of after to before."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repo root
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "precision"))

# name -> (channels in, channels out, height = width, kernel, groups)
LAYERS = {"alexnet-conv2": (96, 256, 27, 5, 2), "alexnet-conv4": (384, 384, 13, 3, 2),
          "g3-240-28": (240, 240, 28, 1, 3), "g3-240to60-28": (240, 60, 28, 1, 3),
          "g10-3x3-240-14": (240, 240, 14, 3, 10), "g8-3x3-192-28": (192, 192, 28, 3, 8),
          "g32-3x3-256-28": (256, 256, 28, 3, 32)}
MODELS = ("caffe2 bvlc_alexnet", "caffe2 shufflenet", "regnety_016", "resnext50_32x4d")
BUILDS = ("before fp32", "after fp32", "before bf16", "after bf16")


def build(source: Path, flags: list[str], folder: Path) -> dict:
    """The four builds of `source` into `folder`; each one's check and vdpbf16ps count."""
    import mlc.api as api
    from mlc.compiler import relax_passes, schedule_rules
    from mlc.errors import MlcError

    current = (relax_passes._bf16_groups, schedule_rules._feeds_depthwise, schedule_rules._split_at_index_period)
    shapes = [f.split("=", 1)[1] for f in flags]
    checks = {}
    for name in BUILDS:
        side, precision = name.split()
        old = side == "before"
        relax_passes._bf16_groups = (lambda call: False) if old else current[0]
        # Before, every grouped conv's padding was inlined: the current rule's bound (groups of at most half a
        # vector) with a vector too wide for any group (a grouped conv's group width is always known)
        schedule_rules._feeds_depthwise = (lambda sch, pad, lanes: current[1](sch, pad, 1 << 30)) if old else current[1]
        schedule_rules._split_at_index_period = (lambda sch, block, loops: loops) if old else current[2]
        out = folder / name.replace(" ", "-")
        try:
            result = api.compile(str(source), target="x86", output=out, isolate=False, precision=precision,
                                 input_shapes=shapes)
            check = bool(result.check.passed)
        except MlcError as e:  # the bf16 gate (exit 3): built again unchecked, its speed still counts
            check = f"gate: {str(e).splitlines()[0][:120]}"
            api.compile(str(source), target="x86", output=out, isolate=False, precision=precision,
                        input_shapes=shapes, check=False)
        asm = subprocess.run(["objdump", "-d", str(out / "model.so")], capture_output=True, text=True).stdout
        checks[name] = {"check": check, "vdpbf16ps": asm.count("vdpbf16ps")}
    relax_passes._bf16_groups, schedule_rules._feeds_depthwise, schedule_rules._split_at_index_period = current
    return checks


def measure(source: Path, folder: Path, rounds: int) -> dict:
    from beside_openvino import before_after, timed_beside_openvino

    from mlc.runtime.runner import Runner

    runners = {name: Runner(folder / name.replace(" ", "-")) for name in BUILDS}
    return before_after(timed_beside_openvino(source, runners, "after fp32", 1, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--broad", type=Path, help="model_set.py's --work folder of the broad list")
    parser.add_argument("--names", help="comma-separated layers and list labels (default: all)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    for variable in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[variable] = "1"
    import onnx

    from broad_models import MODELS as BROAD
    from models import conv_model

    from mlc.bench.machine import load_average, machine_info

    names = args.names.split(",") if args.names else [*LAYERS, *(MODELS if args.broad else ())]
    doc = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "bf16-groups", "rows": []}
    for name in names:
        folder = args.work / name.replace(" ", "-")
        folder.mkdir(parents=True, exist_ok=True)
        if name in LAYERS:
            source, flags = folder / "model.onnx", []
            onnx.save(conv_model(*LAYERS[name]), source)
        else:
            source, flags = args.broad / name.replace(" ", "-") / "model.onnx", BROAD[name][2]
        checks = build(source, flags, folder)
        load_start = load_average()
        row = {"label": name, "builds": checks, "rounds": args.rounds, "threads": 1,
               **measure(source, folder, args.rounds), "load_average": [load_start, load_average()]}
        doc["rows"] = [r for r in doc["rows"] if r["label"] != name] + [row]
        doc["machine"] = machine_info()
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
