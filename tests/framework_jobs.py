"""Runs framework work for the frontend tests in a child process (tensorflow and paddle segfault when
imported together, and neither may enter the pytest process).

    python tests/framework_jobs.py OUT_DIR JOBS_JSON

JOBS_JSON is a list of jobs, each {"id", "kind", ...}:
  {"kind": "zoo", "framework": "tensorflow", "name": "cnn", "shapes": {...}, "dynamic": [...],
      "vocab": {...}, "sizes": [[B, S], ...]}  build a zoo model (the export keeps the dims in "dynamic"
      symbolic, by default all; fixed input shapes with "shapes"; token inputs drawn from 0..vocab-1;
      "sizes" also runs it eagerly with every input BxS, the last row's mask half zeros: "ID BxS")
  {"kind": "save", "framework": ..., "name": "cnn", "path": ...}  save it as a file (see models' save())
  {"kind": "open", "framework": ..., "path": ...}  open_model() on a file
  {"kind": "truncate", "src": PATH, "path": PATH, "keep": 0.5}  copy the first part of a file saved earlier
  {"kind": "legacy_paddle", "path": PREFIX}  a static-graph MLP saved as PREFIX.pdmodel (needs
      FLAGS_enable_pir_api=0 in the environment: Paddle 3 picks its IR at import)
  {"kind": "static_batch_paddle", "path": PREFIX}  a channel shuffle saved with a static InputSpec of batch 1
  {"kind": "keras_normalization", "path": FILE}  a Keras model with an adapted Normalization and a Rescaling
zoo and open jobs export OUT_DIR/ID.onnx (every symbolic dim dynamic) and write ID.inputs.npz (seeded
feeds as mlc makes them) and ID.eager.npz (the framework's eager outputs). OUT_DIR/results.json maps
each id to {"ok", "exporter", "inputs", "outputs"} or {"ok": false, "error", "message"}."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx

from mlc.frontends import onnx as onnx_frontend
from mlc.errors import MlcError

ZOO_MODULES = {"tensorflow": "mlc.models.keras_models", "paddle": "mlc.models.paddle_models"}
FRONTENDS = {"tensorflow": "mlc.frontends.tensorflow", "paddle": "mlc.frontends.paddle"}


def export_and_run(model, out: Path, job_id: str, shapes: dict, dynamic: list | None = None,
                   vocab: dict | None = None, sizes: list | None = None) -> dict:
    onnx_path = out / f"{job_id}.onnx"
    exporter = model.export(onnx_path, set(model.symbolic_dims() if dynamic is None else dynamic))
    graph = onnx.load(str(onnx_path))
    specs = onnx_frontend.input_specs(graph)
    assert [s.name for s in specs] == [d.name for d in model.inputs], (specs, model.inputs)
    for spec in specs:  # mlc cannot always see which inputs index an embedding (see the report)
        if spec.name in (vocab or {}):
            spec.value_range = (0, vocab[spec.name] - 1)
    feeds = onnx_frontend.make_inputs(specs, onnx_frontend.concrete_shapes(specs, shapes))
    outputs = model.eager([feeds[s.name] for s in specs])
    names = [o.name for o in graph.graph.output]
    assert len(outputs) == len(names), (len(outputs), names)
    np.savez(out / f"{job_id}.inputs.npz", **feeds)
    np.savez(out / f"{job_id}.eager.npz", **dict(zip(names, outputs)))
    for batch, length in sizes or []:  # the same model at other sizes, for one artifact with dynamic dims
        more = onnx_frontend.make_inputs(specs, {s.name: [batch, length] for s in specs}, seed=length)
        for name, value in more.items():
            if "mask" in name:
                value[-1, length // 2 + 1:] = 0  # the last sentence padded, as users batch them
        np.savez(out / f"{job_id} {batch}x{length}.inputs.npz", **more)
        np.savez(out / f"{job_id} {batch}x{length}.eager.npz",
                 **dict(zip(names, model.eager([more[s.name] for s in specs]))))
    return {"ok": True, "exporter": exporter, "inputs": [s.name for s in specs], "outputs": names,
            "dims": [list(d.dims) for d in model.inputs], "notes": model.notes}


def run(job: dict, out: Path) -> dict:
    framework = job.get("framework")
    if job["kind"] == "zoo":
        model = getattr(importlib.import_module(ZOO_MODULES[framework]), job["name"])()
        return export_and_run(model, out, job["id"], job.get("shapes", {}), job.get("dynamic"), job.get("vocab"),
                              job.get("sizes"))
    if job["kind"] == "save":
        importlib.import_module(ZOO_MODULES[framework]).save(job["name"], job["path"])
        return {"ok": True}
    if job["kind"] == "open":
        frontend = importlib.import_module(FRONTENDS[framework])
        if "weights_as_inputs_bytes" in job:  # the TensorFlow frontend's threshold, for this job only
            frontend.WEIGHTS_AS_INPUTS_BYTES, job["weights_as_inputs_bytes"] = (job["weights_as_inputs_bytes"],
                                                                                frontend.WEIGHTS_AS_INPUTS_BYTES)
        try:
            return {"detect": frontend.detect(job["path"]),
                    **export_and_run(frontend.open_model(job["path"]), out, job["id"], job.get("shapes", {}),
                                     vocab=job.get("vocab"))}
        finally:
            if "weights_as_inputs_bytes" in job:
                frontend.WEIGHTS_AS_INPUTS_BYTES = job["weights_as_inputs_bytes"]
    if job["kind"] == "truncate":
        data = Path(job["src"]).read_bytes()
        Path(job["path"]).write_bytes(data[: int(len(data) * job.get("keep", 0.5))])
        return {"ok": True}
    if job["kind"] == "legacy_paddle":
        save_legacy_paddle_mlp(job["path"])
        return {"ok": True}
    if job["kind"] == "static_batch_paddle":
        save_static_batch_paddle(job["path"])
        return {"ok": True}
    if job["kind"] == "keras_normalization":
        save_keras_normalization(job["path"])
        return {"ok": True}
    if job["kind"] == "keras_grouped_gelu":
        save_keras_grouped_gelu(job["path"])
        return {"ok": True}
    if job["kind"] == "keras_mixed_layers":
        save_keras_mixed_layers(job["path"])
        return {"ok": True}
    if job["kind"] == "keras_open_image":
        save_keras_open_image(job["path"])
        return {"ok": True}
    raise ValueError(job["kind"])


def save_legacy_paddle_mlp(prefix: str) -> None:
    import paddle

    paddle.enable_static()
    paddle.seed(0)
    main_program, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_program, startup):
        x = paddle.static.data("x", [None, 16], "float32")
        y = paddle.static.nn.fc(paddle.static.nn.fc(x, 32, activation="relu"), 4)
    executor = paddle.static.Executor(paddle.CPUPlace())
    executor.run(startup)
    paddle.static.save_inference_model(prefix, [x], [y], executor, program=main_program)


def save_static_batch_paddle(prefix: str) -> None:
    """As shufflenet saves: the channel-shuffle reshape takes the batch from x.shape, 1 in the static InputSpec."""
    import paddle

    class Shuffle(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = paddle.nn.Conv2D(4, 4, 1)

        def forward(self, x):
            y = self.conv(x)
            b, c, h, w = y.shape
            y = paddle.transpose(paddle.reshape(y, [b, 2, c // 2, h, w]), [0, 2, 1, 3, 4])
            return paddle.reshape(y, [b, c, h, w])

    paddle.seed(0)
    spec = [paddle.static.InputSpec([1, 4, 8, 8], "float32", "x")]
    paddle.jit.save(Shuffle(), prefix, input_spec=spec)


def save_keras_normalization(path: str) -> None:
    """Normalization's mean and variance and Rescaling's scale are constants the traced function captures."""
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((6,), name="features")
    norm = keras.layers.Normalization()
    norm.adapt(np.random.default_rng(0).normal(3, 2, (64, 6)).astype("float32"))
    y = keras.layers.Dense(3)(keras.layers.Rescaling(0.5, offset=0.1)(norm(x)))
    keras.Model(x, y).save(path)


def save_keras_grouped_gelu(path: str) -> None:
    """ConvNeXt's block in small: a grouped (depthwise) Conv2D, which Keras 3 runs as a jit_compile tf.function, and
    exact GELU, which TF lowers to Erfc."""
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 4), name="image")
    y = keras.layers.Conv2D(4, 3, padding="same", groups=4)(x)
    y = keras.layers.Conv2D(6, 1)(keras.layers.Activation("gelu")(y))
    keras.Model(x, y).save(path)


def save_keras_mixed_layers(path: str) -> None:
    """The layers whose weights tf2onnx rewrites when they are constants (conv kernels transposed, depthwise and
    grouped ones reshaped, batch-norm statistics), a Normalization's captured constants and a Dropout's seed state."""
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((16, 16, 3), name="image")
    y = keras.layers.Normalization(mean=[0.5, 0.4, 0.3], variance=[0.2, 0.3, 0.4])(x)
    y = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Conv2D(8, 3, padding="same")(y)))
    y = keras.layers.Conv2D(16, 3, strides=2, groups=4)(keras.layers.DepthwiseConv2D(3, padding="same")(y))
    y = keras.layers.Dropout(0.3)(keras.layers.SeparableConv2D(8, 3)(y))
    model = keras.Model(x, keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(y)))
    rng = np.random.default_rng(0)
    for layer in model.layers:  # statistics that are not the identity
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(rng.normal(0, 1, 8).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 2, 8).astype("float32"))
    model.save(path)


def save_keras_open_image(path: str) -> None:
    """An image model that leaves its input size open, (None, None, None, 3), as Keras applications built without
    one save (MobileNetV3 with weights=None); its 17x17 convolution needs an input of at least 17x17."""
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((None, None, 3), name="image")
    y = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 17, strides=2, activation="relu")(x))
    keras.Model(x, y).save(path)


def main() -> None:
    out, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
    results = {}
    for job in jobs:
        try:
            results[job["id"]] = run(job, out)
        except MlcError as e:
            results[job["id"]] = {"ok": False, "error": type(e).__name__, "message": str(e)}
        except Exception as e:  # a framework exception escaping the frontend is a bug the test reports
            results[job["id"]] = {"ok": False, "error": "uncaught " + type(e).__name__,
                                  "message": traceback.format_exc()[-2000:]}
    results["_env"] = {"POLYGRAPHY_AUTOINSTALL_DEPS": os.environ.get("POLYGRAPHY_AUTOINSTALL_DEPS")}
    (out / "results.json").write_text(json.dumps(results, indent=1))


# ---- used by the tests, in the pytest process (no framework imports) ----

def run_jobs(out: Path, jobs: list[dict], env: dict | None = None) -> dict:
    """Run `jobs` in a child process; returns results.json."""
    repo = str(Path(__file__).resolve().parent.parent)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]), **(env or {})}
    proc = subprocess.run([sys.executable, __file__, str(out), json.dumps(jobs)], capture_output=True, text=True,
                          env=environment, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def load_case(out: Path, job_id: str) -> tuple[onnx.ModelProto, dict, dict]:
    """(the exported ONNX, the seeded inputs, the eager outputs) of a zoo or open job."""
    return (onnx.load(str(out / f"{job_id}.onnx")), dict(np.load(out / f"{job_id}.inputs.npz")),
            dict(np.load(out / f"{job_id}.eager.npz")))


def max_errors(actual: dict, expected: dict) -> dict[str, float]:
    assert list(actual) == list(expected), (list(actual), list(expected))
    for name in expected:
        assert actual[name].shape == expected[name].shape, (name, actual[name].shape, expected[name].shape)
    return {name: float(np.max(np.abs(actual[name].astype(np.float64) - expected[name]))) for name in expected}


def assert_matches(actual: dict, expected: dict, rel: float = 1e-4) -> None:
    """Max abs error within `rel` of each output's largest magnitude: seeded random models can have
    tiny outputs (the Keras LSTM LM's logits stay under 0.002), where a fixed atol would pass anything."""
    errors = max_errors(actual, expected)
    limits = {name: rel * float(np.max(np.abs(value))) + 1e-7 for name, value in expected.items()}
    assert all(errors[name] <= limits[name] for name in errors), (errors, limits)


def ort_outputs(out: Path, job_id: str) -> dict:
    import onnxruntime as ort

    _, inputs, _ = load_case(out, job_id)
    session = ort.InferenceSession(str(out / f"{job_id}.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def compiled_outputs(out: Path, job_id: str, artifact: Path, dynamic: tuple = (), cases: tuple = ()) -> list[dict]:
    """Compile the exported ONNX (its dims symbolic; ranges for them in `dynamic`, e.g. "seq=1..64") for
    x86, then run the one artifact on the seeded inputs and on each of `cases` (ids of saved inputs)."""
    import mlc.api as api

    result = api.compile(str(out / f"{job_id}.onnx"), target="x86", output=artifact, dynamic=list(dynamic))
    assert result.check is not None and result.check.passed, result.check
    return [api.run(result.path, inputs=dict(np.load(out / f"{case}.inputs.npz")), warmup=0, repeat=0).outputs
            for case in (job_id, *cases)]


if __name__ == "__main__":
    main()


# Checks both framework test files make on their jobs' results (jobs = (out dir, results by job id)).
LSTM_OPS = {"lstm": 1, "lstm_lm": 3}  # one ONNX LSTM per LSTM layer: what the LSTM lowering expects


def check_zoo_export(jobs, name: str, exporter: str) -> None:
    """The exported zoo model: the exporter named, ORT-readable IR, opset 17, LSTMs as LSTM ops
    (never Loop/Scan), and ONNX Runtime agreeing with the framework's eager outputs."""
    out, results = jobs
    assert results[name]["ok"], results[name]
    assert results[name]["exporter"].startswith(exporter)
    model, _, eager = load_case(out, name)
    assert model.ir_version <= 8
    assert any(o.domain in ("", "ai.onnx") and o.version == 17 for o in model.opset_import)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("LSTM") == LSTM_OPS.get(name, 0), sorted(set(ops))
    assert not {"Loop", "Scan"} & set(ops)
    assert_matches(ort_outputs(out, name), eager)


# bert_tiny beyond the seeded batch 2 x seq 16: the lengths one artifact with dynamic dims must serve.
BERT_SIZES = [[1, 5], [3, 33], [2, 64], [1, 1]]
BERT_DYNAMIC = ("batch=1..4", "seq=1..64")


def check_compiled(jobs, artifact: Path, name: str) -> None:
    """The compiled zoo model matches the framework's eager outputs; bert_tiny, compiled once with batch
    and seq dynamic (the keep_symbolic_dims pass), at every size in BERT_SIZES."""
    out, _ = jobs
    cases = tuple(f"{name} {b}x{s}" for b, s in BERT_SIZES) if name == "bert_tiny" else ()
    outputs = compiled_outputs(out, name, artifact, BERT_DYNAMIC if cases else (), cases)
    for case, actual in zip((name, *cases), outputs, strict=True):
        assert_matches(actual, dict(np.load(out / f"{case}.eager.npz")))  # shapes too


def check_fixed_seq(jobs) -> None:
    """The 'bert_tiny seq fixed' job: seq left out of --dynamic is fixed at its example size (8)."""
    out, results = jobs
    job = "bert_tiny seq fixed"
    assert results[job]["ok"], results[job]
    model, inputs, eager = load_case(out, job)
    assert [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input] \
        == [["batch", 8], ["batch", 8]]
    assert inputs["input_ids"].shape == (2, 8)
    assert_matches(ort_outputs(out, job), eager)
