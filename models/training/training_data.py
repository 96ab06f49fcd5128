"""Training and validation tensors of a paired dataset: decoded images, tokenised captions,
and the image-major batches of one epoch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.datasets.records import (
    CaptionRecord,
    ImageRecord,
    PairedDataset,
    load_dataset,
    plausible_match_matrix,
)
from models.networks.model_config import ModelConfig
from models.networks.preprocess import (
    InvalidImageError,
    load_image,
    normalize_uint8,
    resize_to_uint8,
)
from models.networks.tokenizer import Tokenizer


class TrainingDataError(ValueError):
    """A dataset that cannot be trained on (no captions, no val split, a corrupt image...)."""


@dataclass(frozen=True)
class SplitTensors:
    """One split in memory.

    pixels: uint8 (N_img, 3, H, W); ids: int64 (N_cap, T) padded token ids; lengths: int64
    (N_cap,); caption_image: int64 (N_cap,) row of each caption's image in `pixels`;
    plausible: bool (N_cap, N_img) the dataset's plausible matches (validation split only);
    caption_records, image_records: the records in row order, to judge plausible matches
    between the items of a batch; labels: float32 (N_img, L) multi-hot over the dataset's
    label names (L = 0 for a dataset without labels).
    """

    pixels: torch.Tensor
    ids: torch.Tensor
    lengths: torch.Tensor
    caption_image: torch.Tensor
    plausible: torch.Tensor | None = None
    caption_records: tuple[CaptionRecord, ...] = ()
    image_records: tuple[ImageRecord, ...] = ()
    labels: torch.Tensor | None = None

    def batch_plausible(self, image_rows: torch.Tensor, caption_rows: torch.Tensor) -> torch.Tensor:
        """(B, M) bool: caption m of the batch plausibly matches image b of the batch (for a
        dataset without object annotations, only a caption's own image)."""
        captions = [self.caption_records[int(r)] for r in caption_rows]
        images = [self.image_records[int(r)] for r in image_rows]
        return torch.from_numpy(plausible_match_matrix(captions, images)).T

    @property
    def num_images(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def num_captions(self) -> int:
        return int(self.ids.shape[0])


def load_splits(
    data_dir: Path | str, config: ModelConfig, tokenizer: Tokenizer | None = None
) -> tuple[SplitTensors, SplitTensors, Tokenizer]:
    """Read the train and val splits of a dataset dir; build the vocabulary from the train
    captions unless `tokenizer` is given (a resumed run reuses its vocab.json)."""
    dataset = load_dataset(data_dir)
    train, val = dataset.split("train"), dataset.split("val")
    for name, split in (("train", train), ("val", val)):
        if not split.captions:
            raise TrainingDataError(
                f"{data_dir} has no {name} captions: training needs image-"
                f"caption pairs in the train and val splits"
            )
    if tokenizer is None:
        tokenizer = Tokenizer.build(c.text for c in train.captions)
    return (
        _to_tensors(train, config, tokenizer),
        _to_tensors(val, config, tokenizer, with_plausible=True),
        tokenizer,
    )


def _to_tensors(
    split: PairedDataset, config: ModelConfig, tokenizer: Tokenizer, with_plausible: bool = False
) -> SplitTensors:
    """Decode the images that have captions and tokenise their captions."""
    captioned = {c.image_id for c in split.captions}
    images = [im for im in split.images if im.id in captioned]
    row_of = {im.id: row for row, im in enumerate(images)}
    pixels = np.zeros((len(images), 3, config.image_size, config.image_size), dtype=np.uint8)
    for row, record in enumerate(images):
        try:
            pixels[row] = resize_to_uint8(load_image(record.path), config.image_size)
        except InvalidImageError as e:
            raise TrainingDataError(f"image {record.id!r}: {e}") from e
    ids, lengths = tokenizer.encode_batch(
        [c.text for c in split.captions], config.max_caption_tokens
    )
    caption_image = np.array([row_of[c.image_id] for c in split.captions], dtype=np.int64)
    plausible = plausible_match_matrix(split.captions, images) if with_plausible else None
    column = {name: col for col, name in enumerate(split.label_names)}
    labels = np.zeros((len(images), len(column)), dtype=np.float32)
    for row, record in enumerate(images):
        labels[row, [column[name] for name in record.labels]] = 1.0
    return SplitTensors(
        torch.from_numpy(pixels),
        torch.from_numpy(ids),
        torch.from_numpy(lengths),
        torch.from_numpy(caption_image),
        None if plausible is None else torch.from_numpy(plausible),
        tuple(split.captions),
        tuple(images),
        torch.from_numpy(labels),
    )


def image_batch(split: SplitTensors, rows: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Normalised float32 images (B, 3, H, W) of the given image rows."""
    return torch.from_numpy(normalize_uint8(split.pixels[rows].numpy(), config))


def caption_batch(split: SplitTensors, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, T) trimmed to the longest caption of the batch, and lengths (B,)."""
    lengths = split.lengths[rows]
    return split.ids[rows, : int(lengths.max())], lengths


def epoch_batches(
    split: SplitTensors, batch_size: int, captions_per_image: int, seed: int, epoch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Image-major batches of one epoch: (image rows (B,), caption rows (M,), owner (M,)).

    Every captioned image appears once per epoch together with up to `captions_per_image`
    of its captions (0 = all), drawn at random; owner[m] is the position in the batch of
    caption m's image. The draw depends only on (seed, epoch), so a resumed run repeats the
    batches of an uninterrupted one.
    """
    rng = np.random.default_rng([seed, epoch])
    caption_image = split.caption_image.numpy()
    shuffled = rng.permutation(len(caption_image))
    grouped = shuffled[np.argsort(caption_image[shuffled], kind="stable")]  # by image, random
    owners = caption_image[grouped]
    starts = np.searchsorted(owners, owners)  # first position of each caption's image
    rank = np.arange(len(grouped)) - starts  # (N_cap,) rank of the caption within its image
    chosen = grouped[rank < captions_per_image] if captions_per_image > 0 else grouped
    position = np.empty(split.num_images, dtype=np.int64)
    images = rng.permutation(split.num_images)
    for start in range(0, len(images), batch_size):
        rows = images[start : start + batch_size]
        if len(rows) < 2:  # a single image has no negative
            continue
        position[rows] = np.arange(len(rows))
        captions = chosen[np.isin(caption_image[chosen], rows)]
        yield (
            torch.from_numpy(rows),
            torch.from_numpy(captions),
            torch.from_numpy(position[caption_image[captions]]),
        )
