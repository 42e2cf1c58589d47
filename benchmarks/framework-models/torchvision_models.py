"""Every classifier in `torchvision.models`, as users save them, through `mlc compile` with no flags (issue #37).

Each model is built with `weights=None` after `torch.manual_seed(0)` (seeded random weights, never downloaded), put in
eval mode and saved with `torch.export.save(torch.export.export(m, (x,)), "model.pt2")`, x of shape [1, 3, H, W]
(H = W = the model's default input size: the crop size of its DEFAULT weights' transforms, unless the model built with
weights=None fixes its own `image_size`, as the ViTs do), compiled by `mlc compile model.pt2 --target x86 -o DIR --json`
in a child process with a timeout, checked by mlc against torch eager, and, when it passes, timed against torch eager
(the rebuilt nn.Module, `torch.set_num_threads(1)`, inference_mode) with the artifact (`mlc.runtime.Runner`, 1 thread)
on the artifact's reference inputs, call by call, interleaved, in one child process.

    .venv-suites/bin/python benchmarks/framework-models/torchvision_models.py --list    # writes the list
    .venv-suites/bin/python benchmarks/framework-models/torchvision_models.py           # runs it, smallest first
    .venv-suites/bin/python benchmarks/framework-models/torchvision_models.py --resume  # skips models recorded
    .venv-suites/bin/python benchmarks/framework-models/torchvision_models.py --only resnet18,vgg11
    .venv-suites/bin/python benchmarks/framework-models/torchvision_models.py --via factory --only resnet18 \
        -o results/torchvision-factory.json     # through a file.py:factory instead of a .pt2
    .venv-suites/bin/python benchmarks/framework-models/torchvision_models.py --set detseg --list   # detection +
    .venv-suites/bin/python benchmarks/framework-models/torchvision_models.py --set detseg          # segmentation

`--set detseg`: torchvision.models.detection and .segmentation (weights=None, weights_backbone=None), each wrapped in a
module that takes one [1, 3, H, W] tensor and returns its outputs flattened to a tuple of tensors (torch's pytree
order); an export that torch itself refuses is recorded with torch's error (stage "export").

Each step (save, compile, time) runs in a child process of its own, under `nice -n 5` and a timeout; the results
file is rewritten after each model.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fm_common import HERE, PY, child, compile_step, interleaved, one_line, only, run_list, stats, table, timing_step

RESULTS_DIR = Path(os.environ.get("MLC_TV_RESULTS", HERE / "results"))
SETS = {
    "classification": ("torchvision-list.json", "torchvision.json"),
    "detseg": ("torchvision-detseg-list.json", "torchvision-detseg.json"),
}
HEAVY_GMACS = 10.0  # models over this many GMACs (torchvision's "GFLOPS") are timed in fewer rounds


def _quiet_torch():
    import warnings

    warnings.simplefilter("ignore")
    import torch

    return torch


def _names(which: str) -> list[tuple[str, str]]:
    """(family, name) of every model in the set, as torchvision lists them."""
    import torchvision.models as models

    if which == "classification":
        return [("classification", n) for n in models.list_models(module=models)]
    return ([("detection", n) for n in models.list_models(module=models.detection)]
            + [("segmentation", n) for n in models.list_models(module=models.segmentation)])


def _flat_wrapper(inner, family: str):
    """A module taking one [N, 3, H, W] tensor and returning the model's outputs as a tuple of tensors."""
    import torch
    from torch.utils import _pytree

    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            out = self.inner(list(x.unbind(0))) if family == "detection" else self.inner(x)
            return tuple(leaf for leaf in _pytree.tree_leaves(out) if isinstance(leaf, torch.Tensor))

    return Flat()


def build(family: str, name: str, device: str = "cpu"):
    """(module in eval mode, input size, where the size came from), seeded, never downloading."""
    torch = _quiet_torch()
    import torchvision.models as models

    torch.manual_seed(0)
    if device != "cpu":
        with torch.device(device):
            return build(family, name)
    if family == "classification":
        model = models.get_model(name, weights=None).eval()
        own = getattr(model, "image_size", None)  # the ViTs fix theirs
        if isinstance(own, int):
            return model, own, "model.image_size"
        crop = models.get_model_weights(name).DEFAULT.transforms().crop_size
        return model, int(crop[0]), "DEFAULT weights' transforms crop_size"
    model = models.get_model(name, weights=None, weights_backbone=None).eval()
    if family == "detection":
        size = model.transform.min_size[0]  # the size its own transform resizes to
        return _flat_wrapper(model, family).eval(), int(size), "model.transform.min_size"
    resize = models.get_model_weights(name).DEFAULT.transforms().resize_size
    return _flat_wrapper(model, family).eval(), int(resize[0]), "DEFAULT weights' transforms resize_size"


def list_models(which: str) -> None:
    """The list, ordered by parameter count, smallest first; GMACs counted by torch's FlopCounterMode at batch 1
    (the models built and run on the meta device where they build there: no weights, no arithmetic)."""
    torch = _quiet_torch()
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    rows = []
    for family, name in _names(which):
        try:
            model, size, source = build(family, name, "meta")
            device = "meta"
        except Exception:  # noqa: BLE001 - regnet's builder computes widths with tensors: build it for real
            model, size, source = build(family, name)
            device = "cpu"
        params = int(sum(p.numel() for p in model.parameters()))
        gmacs = None
        try:
            counter = FlopCounterMode(display=False)
            with counter, torch.inference_mode():
                model(torch.randn(1, 3, size, size, device=device))
            gmacs = round(counter.get_total_flops() / 2e9, 3)
        except Exception as e:  # noqa: BLE001 - the list still names the model
            print(f"{name}: flop count failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
        rows.append({"name": name, "family": family, "params": params, "size": size, "size_source": source,
                     "gmacs": gmacs})
        print(name, params, size, gmacs, flush=True)
        del model
    rows.sort(key=lambda r: (r["params"], r["name"]))
    list_file = RESULTS_DIR / SETS[which][0]
    list_file.write_text(json.dumps({
        "torch": torch.__version__, "torchvision": torchvision.__version__,
        "module": "torchvision.models" if which == "classification" else "torchvision.models.detection, .segmentation",
        "listed_with": "torchvision.models.list_models(module=...)",
        "order": "parameters, smallest first",
        "gmacs": "torch.utils.flop_counter.FlopCounterMode at batch 1 (on the meta device where the model builds "
                 "there), / 2",
        "models": rows}, indent=1) + "\n")


def save_model(family: str, name: str, path: str) -> None:
    """Child process: build `name` and torch.export.save it at [1, 3, H, W]."""
    torch = _quiet_torch()

    model, size, _ = build(family, name)
    x = torch.randn(1, 3, size, size)
    try:
        program = torch.export.export(model, (x,))
    except Exception as e:  # torch's own limit: say it in one line (the message runs to pages)
        import re
        import traceback

        traceback.print_exc()
        text = [line.strip() for line in str(e).splitlines() if line.strip()]
        cause = next((line for line in text if line.startswith("Caused by:")), "")
        first = re.sub(r"\s+", " ", text[0] if text else "")[:200]
        print(f"torch.export.export failed: {type(e).__name__}: {first}" + (f" ({cause})" if cause else ""),
              file=sys.stderr)
        raise SystemExit(1) from None
    torch.export.save(program, path)


# What a user writes: `mlc compile factory.py:make` builds the module and its example input itself.
FACTORY = '''"""mlc factory for torchvision's {name} (written by torchvision_models.py)."""
import torch
import torchvision


def make():
    torch.manual_seed(0)
    model = torchvision.models.get_model({name!r}, weights=None).eval()
    return model, (torch.randn(1, 3, {size}, {size}),)
'''
# Detection and segmentation models need the wrapper that flattens their outputs.
FACTORY_WRAPPED = '''"""mlc factory for torchvision's {name} (written by torchvision_models.py)."""
import sys

sys.path.insert(0, {here!r})


def make():
    import torch
    from torchvision_models import build

    model, size, _ = build({family!r}, {name!r})
    return model, (torch.randn(1, 3, size, size),)
'''


def time_model(family: str, name: str, artifact: str, rounds: int, warmup: int, out: str) -> None:
    """Child process: the artifact (Runner, 1 thread) and torch eager (the rebuilt module, 1 thread) on the
    artifact's reference inputs, one call of each in turn, `rounds` rounds after `warmup`."""
    import numpy as np

    torch = _quiet_torch()
    torch.set_num_threads(1)
    from mlc.runtime.runner import Runner, load_npz

    runner = Runner(artifact, threads=1)
    feeds = load_npz(Path(artifact) / runner.manifest["reference"]["inputs"])
    model, _, _ = build(family, name)
    args = [torch.from_numpy(np.ascontiguousarray(a)) for a in feeds.values()]
    from torch.utils import _pytree

    def torch_run():
        with torch.inference_mode():
            out = model(*args)
        return [t.numpy() for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]

    def mlc_run():
        return list(runner.run(feeds).values())

    ours, theirs = mlc_run(), torch_run()  # the first warm-up round
    agreement = max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
                    for a, b in zip(ours, theirs)) if ours and theirs else None
    times = interleaved({"mlc": mlc_run, "torch": torch_run}, rounds, warmup=max(0, warmup - 1))
    Path(out).write_text(json.dumps({
        "threads": 1, "rounds": rounds, "warmup": warmup,
        "torch_runtime": f"torch {torch.__version__} eager nn.Module, torch.set_num_threads(1), inference_mode "
                         f"(torch.get_num_threads() = {torch.get_num_threads()})",
        "mlc_vs_torch_eager_max_abs": agreement,
        "mlc": stats(times["mlc"]), "torch": stats(times["torch"]),
        "ratio_mlc_over_torch": stats(times["mlc"])["p50_ms"] / stats(times["torch"])["p50_ms"]}))


def run_one(row: dict, work: Path, compile_timeout: int, rounds: int, via: str) -> dict:
    """Export (or write the factory), compile with no flags, time: each in a child process."""
    name, family = row["name"], row.get("family", "classification")
    heavy = (row.get("gmacs") or 0) > HEAVY_GMACS
    record = {"model": name, "family": family, "params": row["params"], "gmacs": row.get("gmacs"),
              "input": [1, 3, row["size"], row["size"]], "via": via,
              "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "load_before": os.getloadavg()[0]}
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if via == "pt2":
        source = str(folder / "model.pt2")
        rc, out, err, secs = child([PY, __file__, "--save", family, name, source], 900)
        record["save_s"] = round(secs, 1)
        if rc != 0:  # torch.export itself (or building the model) failed: torch's limitation, before mlc
            record.update(stage="export", exit_code=rc, passed=False, error=one_line(err),
                          stderr_tail=err[-2000:])
            return record
    else:
        factory = folder / "factory.py"
        template = FACTORY if family == "classification" else FACTORY_WRAPPED
        factory.write_text(template.format(here=str(HERE), family=family, name=name, size=row["size"]))
        source = f"{factory}:make"
    artifact = folder / "artifact"
    timeout = compile_timeout * (2 if heavy or row["params"] > 200e6 else 1)
    record["compile_timeout_s"] = timeout
    if not compile_step(record, source, artifact, timeout):
        return record
    n, warm = (max(3, rounds // 3), 1) if heavy else (rounds, 3)
    timing_step(record, [PY, __file__, "--time", family, name, str(artifact), "--rounds", str(n), "--warmup",
                         str(warm)], folder / "timing.json", 1800 if heavy else 900)
    return record


def _size(m: dict) -> str:
    """The table's input cell: the resolution, and the model's GMACs there (over 10: timed in fewer rounds)."""
    gmacs = m.get("gmacs")
    return f"{m['input'][2]}" + (f" ({gmacs:.1f} GMACs)" if gmacs is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), default="classification")
    parser.add_argument("--list", action="store_true", help="introspect torchvision.models, write the list")
    parser.add_argument("--only", help="comma-separated model names (default: the whole list)")
    parser.add_argument("--start-at", metavar="NAME", help="begin the list (in its order) at this model")
    parser.add_argument("--resume", action="store_true", help="skip models already in the results file")
    parser.add_argument("-o", "--output", help="results file (default: results/torchvision.json for the set)")
    parser.add_argument("--via", choices=("pt2", "factory"), default="pt2",
                        help="what mlc compiles: the torch.export .pt2 (default) or a file.py:factory")
    parser.add_argument("--compile-timeout", type=int, default=600, help="seconds; doubled for heavy models")
    parser.add_argument("--rounds", type=int, default=10, help="timing rounds (a third, at least 3, when heavy)")
    parser.add_argument("--skip-recorded-in", action="append", default=[], metavar="RESULTS",
                        help="skip models another process has recorded in RESULTS (checked before each model); with "
                        "--table, its rows fill the table's missing ones")
    parser.add_argument("--note", help="recorded with this run (e.g. where the script came from)")
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed per model)")
    parser.add_argument("--keep", action="store_true", help="keep each model's .pt2 and artifact")
    parser.add_argument("--table", action="store_true", help="print the README table from the results file")
    parser.add_argument("--save", nargs=3, metavar=("FAMILY", "NAME", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--time", nargs=3, metavar=("FAMILY", "NAME", "ARTIFACT"), help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.save:
        return save_model(*args.save)
    if args.time:
        return time_model(*args.time, args.rounds, args.warmup, args.out)
    if args.list:
        return list_models(args.set)
    list_file, default_results = (RESULTS_DIR / f for f in SETS[args.set])
    output = Path(args.output) if args.output else default_results
    if args.table:
        return print(table(output, "torch", "torch eager (1 thread)", "ratio_mlc_over_torch", "torch", _size,
                           [Path(p) for p in args.skip_recorded_in]))

    listing = json.loads(list_file.read_text())
    rows = listing["models"]
    rows = only(rows, args.only, parser)
    if args.start_at:
        names = [r["name"] for r in rows]
        if args.start_at not in names:
            parser.error(f"not in the list: {args.start_at}")
        rows = rows[names.index(args.start_at):]

    def new_record():
        return {"study": f"torchvision.models ({args.set}) through mlc compile --target x86 (no flags), issue #37",
                "torch": listing["torch"], "torchvision": listing["torchvision"], "via": args.via,
                "list": [r["name"] for r in listing["models"]], "runs": [], "models": []}

    import mlc

    note = f"via {args.via}; mlc imported from {mlc.__file__}; script {Path(__file__).resolve()}"
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mlc-torchvision-"))
    run_list(rows, listing["models"], output, new_record,
             lambda row, w: run_one(row, w, args.compile_timeout, args.rounds, args.via), work,
             args.keep, args.resume, bool(args.only), "; ".join(filter(None, [args.note, note])), "torch",
             [Path(p) for p in args.skip_recorded_in])
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
