"""The PVSE pieces of the training loop: one batch's loss and the validation similarities."""

from __future__ import annotations

import torch

from models.networks.model_config import TrainConfig
from models.pvse.losses import pvse_loss
from models.pvse.max_pair import max_pair_similarity
from models.pvse.model import AnyPvseModel
from models.training.training_data import SplitTensors, caption_batch, image_batch


def pvse_batch_loss(
    model: AnyPvseModel,
    images: torch.Tensor,
    captions: tuple[torch.Tensor, torch.Tensor],
    caption_image: torch.Tensor,
    matches: torch.Tensor | None,
    config: TrainConfig,
    negatives: str,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """PVSE loss of a batch: images (B, 3, H, W), captions (ids (M, T), lengths (M,)),
    each with one MC-dropout draw (training)."""
    image = model.embed_images(images, generator, stochastic=True)
    caption = model.embed_texts(*captions, generator, stochastic=True)
    return pvse_loss(
        image, caption, caption_image, matches, config.margin, negatives,  # type: ignore[arg-type]
        config.div_weight, config.mmd_weight, config.positives != "plausible_images",
    )  # fmt: skip


@torch.no_grad()
def split_embeddings(
    model: AnyPvseModel, split: SplitTensors, device: torch.device, batch_size: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic K embeddings of a split: images (N_img, K, D), captions (N_cap, K, D)."""
    model.eval()
    images, captions = [], []
    for start in range(0, split.num_images, batch_size):
        rows = torch.arange(start, min(start + batch_size, split.num_images))
        pixels = image_batch(split, rows, model.config).to(device)
        images.append(model.embed_images(pixels).embeddings)
    for start in range(0, split.num_captions, batch_size):
        rows = torch.arange(start, min(start + batch_size, split.num_captions))
        ids, lengths = caption_batch(split, rows)
        out = model.embed_texts(ids.to(device), lengths.to(device))
        captions.append(out.embeddings)
    return torch.cat(images), torch.cat(captions)


def pvse_similarity(model: AnyPvseModel, split: SplitTensors, device: torch.device) -> torch.Tensor:
    """Best-pair cosine of every image to every caption of a split, (N_img, N_cap)."""
    images, captions = split_embeddings(model, split, device)
    return max_pair_similarity(images, captions)
