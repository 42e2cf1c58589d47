"""Every model in `tf.keras.applications` through `mlc compile` with no flags (issue #37).

Each model is built in code with weights=None after `keras.utils.set_random_seed(0)` (seeded random weights, never
downloaded) at the application's default input size, batch left as Keras builds it (None, H, W, 3), saved as
`NAME.keras` with `model.save`, compiled by `mlc compile NAME.keras --target x86 -o DIR --json` in a child process
with a timeout, and, when it compiles and passes mlc's check against Keras eager outputs, timed against TensorFlow's
own CPU inference (the loaded model's call traced once by `tf.function`, 1 intra-op and 1 inter-op thread) on the
artifact's reference inputs, call by call, interleaved, in one child process.

    .venv/bin/python benchmarks/framework-models/keras_apps.py --list    # writes the list
    .venv/bin/python benchmarks/framework-models/keras_apps.py           # runs the list, smallest first
    .venv/bin/python benchmarks/framework-models/keras_apps.py --resume  # skips models already recorded
    .venv/bin/python benchmarks/framework-models/keras_apps.py --only MobileNet,ResNet50

Each step (save, compile, time) runs in a child process of its own, under `nice -n 5` and a timeout; the results
file is rewritten after each model. TensorFlow is never imported in the same process as Paddle.
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

LIST = HERE / "results" / "keras-apps-list.json"
RESULTS = HERE / "results" / "keras-apps.json"


def _quiet_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import warnings

    warnings.simplefilter("ignore")
    import tensorflow as tf

    return tf


def applications() -> list[str]:
    """The public functions of tf.keras.applications (each returns a model; checked by building it)."""
    import inspect

    tf = _quiet_tf()
    apps = tf.keras.applications
    return [n for n in sorted(dir(apps)) if not n.startswith("_") and inspect.isfunction(getattr(apps, n))]


def build(name: str, normalised: bool = False):
    tf = _quiet_tf()
    import keras

    keras.utils.set_random_seed(0)
    model = getattr(tf.keras.applications, name)(weights=None)
    if normalised:
        _normalise_batch_norms(model)
    return model


def _normalise_batch_norms(model) -> None:
    """`--normalised`: every BatchNormalization's moving statistics set from one seeded batch (2 images, as mlc
    seeds its reference inputs), so each normalises its input as a trained model's would
    (`benchmarks/precision/cnn_models.normalised` does this for torch models). With weights=None EfficientNetV2M/L's
    activations grow through the network (logits ~3e5 and ~2e9), where fp32 rounding order decides the output."""
    import keras
    import numpy as np

    def walk(layer):
        yield layer
        for sub in getattr(layer, "layers", None) or []:
            yield from walk(sub)

    layers = list(walk(model))
    norms = [(layer, layer.momentum) for layer in layers if isinstance(layer, keras.layers.BatchNormalization)]
    drops = [(layer, layer.rate) for layer in layers if isinstance(layer, keras.layers.Dropout)]
    for layer, _ in norms:
        layer.momentum = 0.0  # moving = momentum * moving + (1 - momentum) * the batch's
    for layer, _ in drops:
        layer.rate = 0.0
    # Open spatial dims (MobileNetV3 without weights) at 224, the size mlc's reference runs them at.
    shape = [dim or 224 for dim in model.input_shape[1:]]
    batch = np.random.default_rng(0).standard_normal((2, *shape)).astype(np.float32)
    model(batch, training=True)
    for layer, momentum in norms:
        layer.momentum = momentum
    for layer, rate in drops:
        layer.rate = rate


def list_models() -> None:
    tf = _quiet_tf()
    import keras

    rows = []
    for name in applications():
        model = build(name)
        if not isinstance(model, keras.Model):
            continue
        shape = list(model.input_shape)
        rows.append({"name": name, "params": int(model.count_params()), "size": shape[1], "input_shape": shape})
        print(name, rows[-1]["params"], shape, flush=True)
        del model
        keras.backend.clear_session()
    rows.sort(key=lambda r: (r["params"], r["name"]))
    LIST.write_text(json.dumps({"tensorflow": tf.__version__, "keras": keras.__version__,
                                "module": "tf.keras.applications", "weights": None, "seed": 0,
                                "order": "parameters, smallest first", "models": rows}, indent=1) + "\n")


def save_model(name: str, path: str, normalised: bool = False) -> None:
    """Child process: build `name` with seeded random weights and save it as a .keras file, as a user would."""
    model = build(name, normalised)
    model.save(path)


def time_model(path: str, artifact: str, rounds: int, out: str) -> None:
    """Child process: the artifact (mlc.runtime Runner, 1 thread) and TensorFlow (1 intra-op, 1 inter-op thread) on
    the artifact's reference inputs, one call of each in turn, `rounds` rounds after warm-up."""
    import numpy as np

    tf = _quiet_tf()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    from mlc.runtime.runner import Runner, load_npz

    runner = Runner(artifact, threads=1)
    feeds = load_npz(Path(artifact) / runner.manifest["reference"]["inputs"])
    model = keras.models.load_model(path, compile=False)
    values = [tf.constant(np.ascontiguousarray(a)) for a in feeds.values()]
    graph = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False))

    def flat(y):
        return [np.asarray(v) for v in (y if isinstance(y, (list, tuple)) else
                                        [y[k] for k in sorted(y)] if isinstance(y, dict) else [y])]

    def tf_run():
        return flat(graph(*values))

    def mlc_run():
        return list(runner.run(feeds).values())

    ours, theirs = mlc_run(), tf_run()
    agreement = max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
                    for a, b in zip(ours, theirs))
    times = interleaved({"mlc": mlc_run, "tf": tf_run}, rounds, warmup=2)
    Path(out).write_text(json.dumps({
        "threads": 1, "rounds": rounds, "warmup": 3,
        "tf_runtime": (f"tf.function(lambda x: model(x, training=False)) on the loaded .keras model, TensorFlow "
                       f"{tf.__version__}, intra_op 1, inter_op 1, TF_ENABLE_ONEDNN_OPTS "
                       f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset (oneDNN on, the x86 default)')}"),
        "input_shapes": [list(np.shape(a)) for a in feeds.values()],
        "mlc_vs_tf_max_abs": agreement,
        # With weights=None many applications' activations fade to ~1e-11 and the softmax is 1/1000 everywhere: a
        # check on such an output says little. The outputs' range and spread across the batch say when.
        "tf_output_min": min(float(np.min(t)) for t in theirs), "tf_output_max": max(float(np.max(t)) for t in theirs),
        "tf_output_std": max(float(np.std(np.asarray(t, np.float64))) for t in theirs),
        "mlc": stats(times["mlc"]), "tf": stats(times["tf"]),
        "ratio_mlc_over_tf": statistics.median(times["mlc"]) / statistics.median(times["tf"])}))


def run_one(row: dict, work: Path, compile_timeout: int, rounds: int, time_timeout: int,
            normalised: bool = False) -> dict:
    name = row["name"]
    record = {"model": name, "params": row["params"], "input": row["input_shape"], "started": now(),
              "load_before": os.getloadavg()[0], **({"batch_norm_statistics": "normalised"} if normalised else {})}
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = str(folder / f"{name}.keras")
    artifact = folder / "artifact"
    if save_step(record, [PY, __file__, "--save", name, path, *(["--normalised"] if normalised else [])], 900) \
            and compile_step(record, path, artifact, compile_timeout):
        timing_step(record, [PY, __file__, "--time", path, str(artifact), "--rounds", str(rounds)],
                    folder / "timing.json", time_timeout)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="introspect tf.keras.applications, write the list")
    parser.add_argument("--only", help="comma-separated model names (default: the whole list)")
    parser.add_argument("--resume", action="store_true", help="skip models already in the results file")
    parser.add_argument("-o", "--output", default=str(RESULTS))
    parser.add_argument("--list-file", default=str(LIST), help="the committed list (default: results/%(default)s)")
    parser.add_argument("--compile-timeout", type=int, default=900)
    parser.add_argument("--time-timeout", type=int, default=900)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--descending", action="store_true", help="largest first (a second process's order)")
    parser.add_argument("--skip-recorded-in", action="append", default=[], metavar="RESULTS",
                        help="skip models another process has recorded in RESULTS (checked before each model); with "
                        "--table, its rows fill the table's missing ones")
    parser.add_argument("--note", help="recorded with this run (e.g. where the script came from)")
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed per model)")
    parser.add_argument("--keep", action="store_true", help="keep each model's .keras file and artifact")
    parser.add_argument("--normalised", action="store_true",
                        help="set each batch norm's statistics from one seeded batch before saving (a trained "
                             "model's conditioning; the default recipe keeps weights=None's)")
    parser.add_argument("--table", action="store_true", help="print the README table from the results file")
    parser.add_argument("--save", nargs=2, metavar=("NAME", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--time", nargs=2, metavar=("PATH", "ARTIFACT"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.save:
        return save_model(*args.save, normalised=args.normalised)
    if args.time:
        return time_model(args.time[0], args.time[1], args.rounds, args.out)
    if args.list:
        return list_models()
    if args.table:
        return print(table(Path(args.output), "tf", "TF (tf.function)", "ratio_mlc_over_tf", "TF",
                           lambda m: m["input"][1] or "open", [Path(p) for p in args.skip_recorded_in]))

    listing = json.loads(Path(args.list_file).read_text())
    rows = listing["models"]
    rows = only(rows, args.only, parser)
    if args.descending:
        rows = rows[::-1]
    output = Path(args.output)

    def new_record():
        return {"study": "tf.keras.applications through mlc compile --target x86 (no flags), issue #37",
                "tensorflow": listing["tensorflow"], "keras": listing["keras"],
                "list": [r["name"] for r in listing["models"]], "runs": [], "models": []}

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mlc-keras-apps-"))
    run_list(rows, listing["models"], output, new_record,
             lambda row, work: run_one(row, work, args.compile_timeout, args.rounds, args.time_timeout,
                                       args.normalised), work,
             args.keep, args.resume, bool(args.only), args.note, "tf", [Path(p) for p in args.skip_recorded_in])
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
