"""PCME's first epochs on shapes, epoch by epoch: the match logit's a and b, the mean cosine of
the image and caption means (within and across the modalities), how many distinct captions are
some val image's first answer and the most images one caption answers first, and val P@1.
Each epoch is trained by resuming the run before (`train(resume=True)` is bit-identical to an
uninterrupted run), so the figures after epoch e are those of the model an uninterrupted run
holds then. Writes benchmarks/results/pcme_geometry.md (issue 40: why a seed stopped at epoch 2).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/pcme_geometry.py \\
        --data runs/shapes_val/data --seed 1 --epochs 12 --match-lr 0.05,0.002
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.networks.model_config import ModelConfig, TrainConfig
from models.networks.probabilistic_model import build_model
from models.networks.tokenizer import Tokenizer
from models.objectives.hinge import similarity_matrix
from models.training.train import LAST_STATE_FILE, VOCAB_FILE, encode_split, train, validate
from models.training.training_data import load_splits

ROOT = Path(__file__).resolve().parents[1]
PCME = ModelConfig(model_type="gcie", metric="match_prob", logvar_init=-7.0)
COLUMNS = ("epoch", "a", "b", "cos img-cap", "cos img", "cos cap", "first answers", "largest hub")
COLUMNS += ("i2t P@1", "t2i P@1", "lr")


def mean_cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((F.normalize(x, dim=1) @ F.normalize(y, dim=1).T).mean())


def epoch_row(out: Path, data: Path, epoch: int) -> dict[str, float]:
    """The figures of the model saved in out/last.pt after `epoch`."""
    state = torch.load(out / LAST_STATE_FILE, map_location="cpu", weights_only=False)
    model = build_model(ModelConfig.from_dict(state["model_config"]))
    model.load_state_dict(state["model"])
    _, val, _ = load_splits(data, model.config, Tokenizer.load(out / VOCAB_FILE))
    image_mu, image_logvar, caption_mu, caption_logvar = encode_split(model, val, "cpu")
    similarity = similarity_matrix(
        "gcie", "w2", image_mu, image_logvar, caption_mu, caption_logvar
    )  # (N_img, N_cap), the order the evaluation's w2 ranks in
    first = similarity.argmax(dim=1)
    recalls = validate(model, val, torch.device("cpu"))[0]
    return {
        "epoch": epoch,
        "a": float(model.match_scale.detach()),
        "b": float(model.match_shift.detach()),
        "cos img-cap": mean_cosine(image_mu, caption_mu),
        "cos img": mean_cosine(image_mu, image_mu),
        "cos cap": mean_cosine(caption_mu, caption_mu),
        "first answers": len(set(first.tolist())),
        "largest hub": int(torch.bincount(first).max()),
        "i2t P@1": recalls["i2t_P@1"],
        "t2i P@1": recalls["t2i_P@1"],
        "lr": state["history"][-1]["lr"],
    }


def run(data: Path, work: Path, seed: int, epochs: int, match_lr: float) -> list[dict]:
    out = work / f"seed{seed}-match-lr{match_lr}"
    rows = []
    for epoch in range(1, epochs + 1):
        training = TrainConfig(
            objective="pcme", vib_beta=1e-4, epochs=epoch, patience=0, seed=seed,
            match_lr=match_lr,
        )  # fmt: skip
        train(data, out, PCME, training, resume=epoch > 1, progress=False, export=False,
              log=lambda _: None)  # fmt: skip
        rows.append(epoch_row(out, data, epoch))
    return rows


FORMATS = {"epoch": "d", "first answers": "d", "largest hub": "d", "i2t P@1": ".1f"}
FORMATS |= {"t2i P@1": ".1f", "lr": ".0e"}


def cell(row: dict, column: str) -> str:
    return format(row[column], FORMATS.get(column, ".2f"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a shapes dataset dir")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--match-lr", default="0.05,0.002", help="comma list of a, b rates")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "pcme_geometry")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/pcme_geometry.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    command = " ".join([".venv/bin/python benchmarks/pcme_geometry.py", *sys.argv[1:]])
    load = os.getloadavg()[0]
    lines = [
        "# PCME's first epochs on shapes: where the two modalities go",
        "",
        f"Command: `{command}`; machine: {platform.machine()}, {os.cpu_count()} CPUs, load (1 min)"
        f" {load:.1f} at the start; PCME as in docs/results-pcme.md (ln var -7, VIB 1e-4, a = 5"
        f" and b = 7 at the start), training seed {args.seed}, figures on the val split; first"
        " answers: distinct captions that are some image's first answer by w2; largest hub: the"
        " most images one caption answers first.",
    ]
    for match_lr in (float(v) for v in args.match_lr.split(",")):
        rows = run(args.data, args.work_dir, args.seed, args.epochs, match_lr)
        lines += ["", f"## a and b learnt at Adam lr {match_lr:g}", ""]
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
        lines += ["| " + " | ".join(cell(row, c) for c in COLUMNS) + " |" for row in rows]
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
