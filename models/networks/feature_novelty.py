"""Novelty of an image: how far its backbone vector lies from the training images' vectors.

The score is the cosine distance, 1 - cos, from the L2-normalised vector to its nearest
neighbour in a bank of training vectors (the deep nearest-neighbour detector of Sun et al.,
ICML 2022). A frozen pretrained backbone tells pictures of the training kind from others far
better than the heads' log-det: on clip art, every noise image and 1/f texture lies beyond the
99th percentile of the held-out drawings' novelty, and 11 of 12 photographs (docs/pretrained.md).

The bank is a seeded sample of at most ModelConfig.novelty_bank training vectors, a buffer of
the image heads, so the exported graph computes the score beside mu and logvar (models.onnx.
export_pretrained). It is not trained: it stays out of the checkpoints (21 MB that training
would write every epoch) and is saved once, as NOVELTY_BANK_FILE in the model dir.
Calibration turns the score into the familiarity gate of image queries (indexer.calibration).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

NOVELTY_BANK_FILE = "novelty_bank.npy"


class FeatureNovelty(nn.Module):
    """features (N, F) -> novelty (N,) in [0, 2]: 1 - the largest cosine similarity to a row
    of the bank (rows, F)."""

    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("bank", torch.zeros(rows, dim), persistent=False)

    def fit(self, features: torch.Tensor, seed: int) -> None:
        """Fill the bank with a seeded sample of `features` (M, F), M >= the bank's rows."""
        rows = self.bank.shape[0]
        if features.shape[0] < rows:
            raise ValueError(f"the novelty bank holds {rows} vectors; {features.shape[0]} given")
        generator = torch.Generator().manual_seed(seed)
        picked = torch.randperm(features.shape[0], generator=generator)[:rows]
        self.bank.copy_(F.normalize(features[picked].float(), dim=1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        similarity = F.normalize(features, dim=1) @ self.bank.T  # (N, rows)
        return 1.0 - similarity.amax(dim=1)


def save_bank(novelty: FeatureNovelty, model_dir: Path) -> None:
    """Write the bank into the model dir (atomically: a crash leaves the old file or none)."""
    partial = model_dir / f".{NOVELTY_BANK_FILE}.tmp"
    with open(partial, "wb") as f:
        np.save(f, novelty.bank.cpu().numpy())
    partial.replace(model_dir / NOVELTY_BANK_FILE)


def load_bank(novelty: FeatureNovelty, model_dir: Path) -> None:
    """Fill the bank from the model dir; ValueError when the file is missing or of another
    shape than the model's config says."""
    path = model_dir / NOVELTY_BANK_FILE
    if not path.is_file():
        raise ValueError(f"{path} not found: the model's novelty bank was not saved")
    bank = np.load(path, allow_pickle=False)
    if bank.shape != tuple(novelty.bank.shape):
        raise ValueError(f"{path} holds {bank.shape}, the model needs {tuple(novelty.bank.shape)}")
    novelty.bank.copy_(torch.from_numpy(bank))
