"""Paddle transformer models built in code from `paddle.nn`'s own layers, through `mlc compile` with no flags (#37).

`paddle.vision.models` has no transformer, and PaddleNLP does not install beside this paddle (2.8.1, the newest
release on PyPI, fails to import with today's huggingface_hub). So the list is the four shapes users build from
`paddle.nn.TransformerEncoderLayer`, `TransformerEncoder` and `Transformer` at their published sizes: a BERT-base
encoder, a GPT-2-small decoder (pre-norm, causal mask), a ViT-B/16, and `paddle.nn.Transformer` at "Attention is all
you need" base size. Each is built after paddle.seed(0), saved with `paddle.jit.save` at the static shapes in
`MODELS`, compiled by `mlc compile PREFIX --target x86 -o DIR --json`, checked by mlc against Paddle eager, and timed
against the Paddle Inference predictor by `paddle_vision.py --time` (the same timing child as the vision models).

    .venv/bin/python benchmarks/framework-models/paddle_transformers.py            # all, smallest first
    .venv/bin/python benchmarks/framework-models/paddle_transformers.py --table    # the README table
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from fm_common import HERE, PY, compile_step, now, only, run_list, save_step, table, timing_step
from paddle_vision import quiet_paddle

RESULTS = HERE / "results" / "paddle-transformers.json"

# name: (builder arguments, the saved input specs as (name, shape, dtype))
MODELS = {
    "bert_base_encoder": ({"vocab": 30522, "width": 768, "layers": 12, "heads": 12, "ffn": 3072},
                          [("input_ids", [1, 128], "int64")]),
    "gpt2_small_decoder": ({"vocab": 50257, "width": 768, "layers": 12, "heads": 12, "ffn": 3072},
                           [("input_ids", [1, 128], "int64")]),
    "vit_base_16": ({"width": 768, "layers": 12, "heads": 12, "ffn": 3072},
                    [("pixels", [1, 3, 224, 224], "float32")]),
    "transformer_base": ({"vocab": 32000, "width": 512, "layers": 6, "heads": 8, "ffn": 2048},
                         [("source_ids", [1, 64], "int64"), ("target_ids", [1, 64], "int64")]),
}


def build(name: str):
    """The layer `name`, in eval mode, with seeded random weights."""
    paddle = quiet_paddle()
    nn = paddle.nn
    paddle.seed(0)
    size, specs = MODELS[name]
    width, heads, ffn, layers = size["width"], size["heads"], size["ffn"], size["layers"]
    positions = max(shape[1] for _, shape, _ in specs) if name != "vit_base_16" else 0

    def encoder(pre_norm: bool):
        block = nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.1, activation="gelu",
                                           normalize_before=pre_norm)
        return nn.TransformerEncoder(block, layers, nn.LayerNorm(width) if pre_norm else None)

    class Bert(nn.Layer):  # post-norm encoder, [CLS] pooler
        def __init__(self):
            super().__init__()
            self.words, self.positions = nn.Embedding(size["vocab"], width), nn.Embedding(positions, width)
            self.norm, self.encoder, self.pooler = nn.LayerNorm(width), encoder(False), nn.Linear(width, width)

        def forward(self, input_ids):
            x = self.norm(self.words(input_ids) + self.positions(paddle.arange(input_ids.shape[1])))
            x = self.encoder(x)
            return x, paddle.tanh(self.pooler(x[:, 0]))

    class Gpt(nn.Layer):  # pre-norm decoder-only, causal mask, tied head
        def __init__(self):
            super().__init__()
            self.words, self.positions = nn.Embedding(size["vocab"], width), nn.Embedding(positions, width)
            self.decoder = encoder(True)

        def forward(self, input_ids):
            n = input_ids.shape[1]
            causal = paddle.triu(paddle.full([n, n], float("-inf")), 1)
            x = self.decoder(self.words(input_ids) + self.positions(paddle.arange(n)), src_mask=causal)
            return paddle.matmul(x, self.words.weight, transpose_y=True)

    class Vit(nn.Layer):  # 16x16 patches, class token, pre-norm encoder
        def __init__(self):
            super().__init__()
            self.patches = nn.Conv2D(3, width, 16, 16)
            self.cls = self.create_parameter([1, 1, width])
            self.positions = self.create_parameter([1, (224 // 16) ** 2 + 1, width])
            self.encoder, self.head = encoder(True), nn.Linear(width, 1000)

        def forward(self, pixels):
            x = self.patches(pixels).flatten(2).transpose([0, 2, 1])
            x = paddle.concat([self.cls.expand([x.shape[0], -1, -1]), x], 1) + self.positions
            return self.head(self.encoder(x)[:, 0])

    class Seq2Seq(nn.Layer):  # paddle.nn.Transformer, shared embedding, causal target mask
        def __init__(self):
            super().__init__()
            self.words, self.positions = nn.Embedding(size["vocab"], width), nn.Embedding(positions, width)
            self.transformer = nn.Transformer(width, heads, layers, layers, ffn, dropout=0.1)

        def forward(self, source_ids, target_ids):
            def embed(ids):
                return self.words(ids) + self.positions(paddle.arange(ids.shape[1]))

            causal = self.transformer.generate_square_subsequent_mask(target_ids.shape[1])
            x = self.transformer(embed(source_ids), embed(target_ids), tgt_mask=causal)
            return paddle.matmul(x, self.words.weight, transpose_y=True)

    layer = {"bert_base_encoder": Bert, "gpt2_small_decoder": Gpt, "vit_base_16": Vit,
             "transformer_base": Seq2Seq}[name]()
    layer.eval()
    return layer


def save_model(name: str, prefix: str) -> None:
    """Child process: build `name` and jit.save it at its static input shapes, as a user would."""
    paddle = quiet_paddle()
    from paddle.static import InputSpec

    layer = build(name)
    paddle.jit.save(layer, prefix, input_spec=[InputSpec(shape, dtype, n) for n, shape, dtype in MODELS[name][1]])


def run_one(row: dict, work: Path, compile_timeout: int, rounds: int) -> dict:
    name = row["name"]
    record = {"model": name, "params": row["params"], "input": [shape for _, shape, _ in MODELS[name][1]],
              "started": now(), "load_before": os.getloadavg()[0]}
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    prefix = str(folder / "model")
    artifact = folder / "artifact"
    if save_step(record, [PY, __file__, "--save", name, prefix], 600) \
            and compile_step(record, prefix, artifact, compile_timeout):
        timing_step(record, [PY, str(HERE / "paddle_vision.py"), "--time", prefix, str(artifact), "--rounds",
                             str(rounds)], folder / "timing.json", 900)
    return record


def listing() -> list[dict]:
    """The list, smallest first, with each model's parameter count (built once here)."""
    rows = []
    for name in MODELS:
        layer = build(name)
        rows.append({"name": name, "params": int(sum(int(p.size) for p in layer.parameters()))})
        del layer
    return sorted(rows, key=lambda r: r["params"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated model names (default: all)")
    parser.add_argument("--resume", action="store_true", help="skip models already in the results file")
    parser.add_argument("-o", "--output", default=str(RESULTS))
    parser.add_argument("--compile-timeout", type=int, default=900)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--note", help="recorded with this run (e.g. where the script came from)")
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed per model)")
    parser.add_argument("--keep", action="store_true", help="keep each model's saved program and artifact")
    parser.add_argument("--table", action="store_true", help="print the README table from the results file")
    parser.add_argument("--save", nargs=2, metavar=("NAME", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.save:
        return save_model(*args.save)
    if args.table:
        return print(table(Path(args.output), "paddle", "Paddle Inference", "ratio_mlc_over_paddle", "Paddle",
                           lambda m: " + ".join("x".join(map(str, shape)) for shape in m["input"])))

    paddle = quiet_paddle()
    models = listing()
    rows = only(models, args.only, parser)
    output = Path(args.output)

    def new_record():
        return {"study": "Paddle transformers built from paddle.nn through mlc compile --target x86 (no flags), #37",
                "paddle": paddle.__version__, "list": [r["name"] for r in models], "runs": [], "models": []}

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mlc-paddle-transformers-"))
    run_list(rows, models, output, new_record,
             lambda row, work: run_one(row, work, args.compile_timeout, args.rounds), work, args.keep,
             args.resume, bool(args.only), args.note, "paddle")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
