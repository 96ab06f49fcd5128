"""pvse-k2 against vse on the pretrained backbones, on the val split only: each trained per
seed with the vse row's recipe of docs/results-clipart-backbones.md (embed_dim 256, batch 128,
lr 1e-3, patience 10, at most 60 epochs), then `probsearch eval`'s figures on val (pvse by
max_pair, vse by w2), and the mean cosine of pvse's K = 2 vectors per item on val. Writes
benchmarks/results/pvse_backbones_val.md; trained models and per-seed figures are kept in
--work-dir and reused.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/pvse_backbones_val.py \
        --data runs/clipart/data --work-dir runs/pvse-backbones
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.evaluation.evaluate import EvalConfig, evaluate_model
from models.networks.model_config import ModelConfig, TrainConfig
from models.onnx.encoder_runtime import OnnxEncoder
from models.training.train import train

ROOT = Path(__file__).resolve().parents[1]
BACKBONES = {"image_backbone": "efficientnet-lite0", "text_backbone": "all-minilm-l6-v2",
             "embed_dim": 256}  # fmt: skip
MODELS = {
    "vse": ({"model_type": "vse", **BACKBONES}, "w2"),
    "pvse-k2": ({"model_type": "pvse", "num_embeds": 2, **BACKBONES}, "max_pair"),
}
FIGURES = ("i2t_P@1", "i2t_R-P", "t2i_P@1", "t2i_R-P")


def run_seed(data: Path, out: Path, name: str, seed: int) -> dict:
    """Train one model and read its val figures (cached in out/val_figures.json)."""
    cached = out / "val_figures.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    model, metric = MODELS[name]
    training = TrainConfig(epochs=60, patience=10, batch_size=128, lr=1e-3, seed=seed)
    start = time.time()
    result = train(data, out, ModelConfig(**model), training, progress=False, log=lambda _: None)
    trained = time.time() - start
    report = evaluate_model(out, data, "val", EvalConfig(metrics=(metric,), mc_samples=0))
    figures = {"run": name, "seed": seed, "metric": metric, "best_epoch": result.best_epoch,
               "epochs": len(result.history), "train_s": round(trained),
               "onnx_max_difference": max(result.onnx_max_difference.values())}  # fmt: skip
    for direction in ("i2t", "t2i"):
        retrieval = report["metrics"][metric][direction]["retrieval"]
        figures[f"{direction}_P@1"] = retrieval["P@1"]
        figures[f"{direction}_R-P"] = retrieval["r_precision"]
    cached.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def pair_cosine(data: Path, model_dir: Path) -> dict[str, float]:
    """Mean cosine of the two vectors of each val drawing and caption (the heads alone on the
    cached backbone vectors)."""
    config = ModelConfig.load(model_dir)
    cosines = {}
    for modality in ("image", "text"):
        backbone = getattr(config, f"{modality}_backbone")  # the cache: <backbone>-<sha256>/
        (path,) = (data / "features").glob(f"{backbone}-*/val-{modality}.npz")
        with np.load(path) as stored:
            vectors = stored["features"]
        heads = OnnxEncoder(model_dir, modality, device="cpu", heads_only=True)
        pairs = heads.encode_features(vectors).embeddings  # (N, 2, D)
        cosines[modality] = float((pairs[:, 0] * pairs[:, 1]).sum(-1).mean())
    return cosines


def stat(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the clip-art dataset")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--doc", type=Path, default=ROOT / "benchmarks/results/pvse_backbones_val.md"
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = {name: [run_seed(args.data, args.work_dir / name / f"seed{s}", name, s)
                   for s in seeds] for name in MODELS}  # fmt: skip
    cosines = [pair_cosine(args.data, args.work_dir / "pvse-k2" / f"seed{s}") for s in seeds]
    lines = [
        "# pvse-k2 against vse on the pretrained backbones (clip art, val only)",
        "",
        f"Written by `benchmarks/pvse_backbones_val.py`. Seeds {args.seeds}; each model trained "
        "with the vse row's recipe of docs/results-clipart-backbones.md (embed_dim 256, batch "
        "128, lr 1e-3, patience 10, at most 60 epochs), then `probsearch eval` on the val split "
        "(pvse ranked by max_pair, vse by w2). The test split is not read. Mean ± sd over the "
        "seeds; a gap no larger than the larger sd is no difference.",
        "",
        "| model | " + " | ".join(FIGURES) + " | best epoch | train s |",
        "| --- " * (len(FIGURES) + 3) + "|",
    ]
    for name, results in rows.items():
        cells = [stat([r[f] for r in results]) for f in FIGURES]
        cells += [stat([r["best_epoch"] for r in results]), stat([r["train_s"] for r in results])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Per seed:", "", "| model | seed | " + " | ".join(FIGURES) + " |",
              "| --- " * (len(FIGURES) + 2) + "|"]  # fmt: skip
    for name, results in rows.items():
        for r in results:
            cells = " | ".join(f"{r[f]:.1f}" for f in FIGURES)
            lines.append(f"| {name} | {r['seed']} | {cells} |")
    image = [c["image"] for c in cosines]
    text = [c["text"] for c in cosines]
    lines += ["", f"Mean cosine of pvse's two vectors per item on val: drawings "
              f"{statistics.mean(image):.2f}, captions {statistics.mean(text):.2f}."]  # fmt: skip
    args.doc.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
