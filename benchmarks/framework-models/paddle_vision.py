"""Every classifier in `paddle.vision.models` through `mlc compile` with no flags (issue #37).

Each model is built with pretrained=False after paddle.seed(0), saved with
`paddle.jit.save(m, prefix, input_spec=[InputSpec([1, 3, H, W], "float32", "x")])` (H = W = 224, 299 for
inception_v3), compiled by `mlc compile PREFIX --target x86 -o DIR --json` in a child process with a timeout, and,
when it compiles and passes its check against Paddle's eager outputs, timed against Paddle's own CPU inference
(the Paddle Inference predictor on the same saved program, IR optimisation on, 1 math thread) on the artifact's
reference inputs, call by call, interleaved, in one child process.

    .venv/bin/python benchmarks/framework-models/paddle_vision.py --list  # writes the list
    .venv/bin/python benchmarks/framework-models/paddle_vision.py             # runs the list, smallest first
    .venv/bin/python benchmarks/framework-models/paddle_vision.py --resume    # skips models already recorded
    .venv/bin/python benchmarks/framework-models/paddle_vision.py --only resnet18,vgg11

Each step (save, compile, time) runs in a child process of its own, under `nice -n 5` and a timeout; the results
file is rewritten after each model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from fm_common import HERE, PY, compile_step, interleaved, now, only, run_list, save_step, stats, table, timing_step

LIST = HERE / "results" / "paddle-vision-list.json"
RESULTS = HERE / "results" / "paddle-vision.json"
SIZES = {"inception_v3": 299}  # the model's own input size; 224 otherwise


def quiet_paddle():
    os.environ.setdefault("GLOG_minloglevel", "2")
    import warnings

    warnings.simplefilter("ignore")
    import paddle

    return paddle


def classifiers() -> list[str]:
    """The public functions of paddle.vision.models that return a Layer (checked by building each one)."""
    import inspect

    quiet_paddle()
    import paddle.vision.models as models

    names = []
    for name in sorted(dir(models)):
        fn = getattr(models, name)
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        names.append(name)
    return names


def list_models() -> None:
    paddle = quiet_paddle()
    import paddle.vision.models as models

    rows = []
    for name in classifiers():
        paddle.seed(0)
        layer = getattr(models, name)(pretrained=False)
        if not isinstance(layer, paddle.nn.Layer):
            continue
        params = int(sum(int(p.size) for p in layer.parameters()))
        rows.append({"name": name, "params": params, "size": SIZES.get(name, 224)})
        print(name, params, flush=True)
        del layer
    rows.sort(key=lambda r: (r["params"], r["name"]))
    LIST.write_text(json.dumps({"paddle": paddle.__version__, "module": "paddle.vision.models",
                                "order": "parameters, smallest first", "models": rows}, indent=1) + "\n")


def save_model(name: str, prefix: str) -> None:
    """Child process: build `name` with seeded random weights and jit.save it at a fixed [1, 3, H, W]."""
    paddle = quiet_paddle()
    import paddle.vision.models as models
    from paddle.static import InputSpec

    paddle.seed(0)
    layer = getattr(models, name)(pretrained=False)
    layer.eval()
    size = SIZES.get(name, 224)
    paddle.jit.save(layer, prefix, input_spec=[InputSpec([1, 3, size, size], "float32", "x")])


def time_model(prefix: str, artifact: str, rounds: int, out: str) -> None:
    """Child process: the artifact (mlc.runtime Runner, 1 thread) and the Paddle Inference predictor (1 math thread)
    on the artifact's reference inputs, one call of each in turn, `rounds` rounds after warm-up."""
    import numpy as np

    quiet_paddle()
    import paddle.inference as inference

    from mlc.runtime.runner import Runner, load_npz

    runner = Runner(artifact, threads=1)
    feeds = load_npz(Path(artifact) / runner.manifest["reference"]["inputs"])
    program = next(p for p in (Path(prefix + ".json"), Path(prefix + ".pdmodel")) if p.exists())
    config = inference.Config(str(program), prefix + ".pdiparams")
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(1)
    config.switch_ir_optim(True)
    predictor = inference.create_predictor(config)
    for name, array in zip(predictor.get_input_names(), feeds.values()):
        predictor.get_input_handle(name).copy_from_cpu(np.ascontiguousarray(array))
    handles = [predictor.get_output_handle(n) for n in predictor.get_output_names()]

    def paddle_run():
        predictor.run()
        return [h.copy_to_cpu() for h in handles]

    def mlc_run():
        return list(runner.run(feeds).values())

    ours, theirs = mlc_run(), paddle_run()
    agreement = max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
                    for a, b in zip(ours, theirs))
    times = interleaved({"mlc": mlc_run, "paddle": paddle_run}, rounds, warmup=2)

    mkldnn = bool(getattr(config, "mkldnn_enabled", lambda: None)())
    Path(out).write_text(json.dumps({
        "threads": 1, "rounds": rounds, "warmup": 3,
        "paddle_runtime": f"paddle.inference predictor (switch_ir_optim(True), 1 math thread, mkldnn {mkldnn})",
        "mlc_vs_paddle_inference_max_abs": agreement,
        "mlc": stats(times["mlc"]), "paddle": stats(times["paddle"]),
        "ratio_mlc_over_paddle": statistics.median(times["mlc"]) / statistics.median(times["paddle"])}))


def run_one(row: dict, work: Path, compile_timeout: int, rounds: int) -> dict:
    name = row["name"]
    record = {"model": name, "params": row["params"], "input": [1, 3, row["size"], row["size"]],
              "started": now(),
              "load_before": os.getloadavg()[0]}
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    prefix = str(folder / "model")
    artifact = folder / "artifact"
    if save_step(record, [PY, __file__, "--save", name, prefix], 600) \
            and compile_step(record, prefix, artifact, compile_timeout):
        timing_step(record, [PY, __file__, "--time", prefix, str(artifact), "--rounds", str(rounds)],
                    folder / "timing.json", 900)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="introspect paddle.vision.models, write the list")
    parser.add_argument("--only", help="comma-separated model names (default: the whole list)")
    parser.add_argument("--resume", action="store_true", help="skip models already in the results file")
    parser.add_argument("-o", "--output", default=str(RESULTS))
    parser.add_argument("--compile-timeout", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed per model)")
    parser.add_argument("--keep", action="store_true", help="keep each model's saved program and artifact")
    parser.add_argument("--table", action="store_true", help="print the README table from the results file")
    parser.add_argument("--save", nargs=2, metavar=("NAME", "PREFIX"), help=argparse.SUPPRESS)
    parser.add_argument("--time", nargs=2, metavar=("PREFIX", "ARTIFACT"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.save:
        return save_model(*args.save)
    if args.time:
        return time_model(args.time[0], args.time[1], args.rounds, args.out)
    if args.list:
        return list_models()
    if args.table:
        return print(table(Path(args.output), "paddle", "Paddle Inference", "ratio_mlc_over_paddle", "Paddle",
                           lambda m: m["input"][2]))

    listing = json.loads(LIST.read_text())
    rows = listing["models"]
    rows = only(rows, args.only, parser)
    output = Path(args.output)

    def new_record():
        return {"study": "paddle.vision.models through mlc compile --target x86 (no flags), issue #37",
                "paddle": listing["paddle"], "list": [r["name"] for r in listing["models"]], "runs": [],
                "models": []}

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mlc-paddle-vision-"))
    run_list(rows, listing["models"], output, new_record,
             lambda row, work: run_one(row, work, args.compile_timeout, args.rounds), work, args.keep,
             args.resume, bool(args.only), None, "paddle")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
