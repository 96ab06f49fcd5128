"""A training batch's inputs, made ready on the CPU one batch ahead of the step that uses them.

Everything a step needs besides the model (pixels and synthetic outliers, token ids, the
plausible-match matrix, the swapped-shape images) is numpy and small torch work. A background
thread prepares batch i + 1 while the step of batch i runs, since torch's kernels release the
GIL. In the demo's build on 2 idle cores an epoch went from 7.8-8.6 s to 6.8-7.6 s (the first
one, which also fills the plausible-match memo, from 10.8 s to 7.1 s): 166 s to 145 s in all.
Batches are prepared one at a time and in order, so the outliers' random stream and the
result are the same as preparing each in the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from models.datasets.outliers import synthetic_outliers
from models.networks.model_config import ModelConfig, TrainConfig
from models.networks.preprocess import normalize_uint8
from models.training.mixed_samples import MixedSamples, mix_images
from models.training.training_data import SplitTensors, caption_batch, image_batch

Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # image rows, caption rows, owner


@dataclass(frozen=True)
class PreparedBatch:
    """One batch's inputs on the CPU. `images` holds the real images, then `outliers`
    synthetic outliers; `plausible` (B + outliers, M) has all-False rows for the outliers;
    `image_swaps` is (normalised pixels (K_i, 3, H, W), caption positions each swap makes
    miss (K,), swapped image of each (K,)) or None; `mixed` says which real images were
    mixed with another of the batch (`mixed_sample_fraction`), or None."""

    rows: Rows
    images: torch.Tensor
    outliers: int
    ids: torch.Tensor
    lengths: torch.Tensor
    plausible: torch.Tensor | None
    image_swaps: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    mixed: MixedSamples | None = None


def prepare_batch(
    rows: Rows,
    split: SplitTensors,
    config: TrainConfig,
    model_config: ModelConfig,
    outlier_rng: np.random.Generator,
    mix_rng: np.random.Generator | None = None,
) -> PreparedBatch:
    """The inputs of the batch `rows` (see PreparedBatch); with `mixed_sample_fraction`, some
    real images mixed with others of the batch, drawn from `mix_rng`."""
    image_rows, caption_rows, _ = rows
    images = image_batch(split, image_rows, model_config)
    mixed = None
    if config.mixed_sample_fraction > 0:
        if mix_rng is None:
            raise ValueError("mixed_sample_fraction needs a mix_rng")
        images, mixed = mix_images(images, config.mixed_sample_fraction, mix_rng)
    count = round(config.outlier_fraction * len(image_rows))
    if count:
        pixels = synthetic_outliers(count, model_config.image_size, outlier_rng)
        images = torch.cat([images, torch.from_numpy(normalize_uint8(pixels, model_config))])
    plausible = None
    spread = model_config.model_type != "pvse" and config.variance_objective == "spread"
    if config.positives != "pairs" or spread:
        plausible = split.batch_plausible(image_rows, caption_rows)
        plausible = torch.cat([plausible, plausible.new_zeros(count, plausible.shape[1])])
    ids, lengths = caption_batch(split, caption_rows)
    swaps = _image_swaps(split, rows, config, model_config)
    return PreparedBatch(rows, images, count, ids, lengths, plausible, swaps, mixed)


def _image_swaps(
    split: SplitTensors, rows: Rows, config: TrainConfig, model_config: ModelConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The batch's images with one shape swapped, normalised; the batch position of each
    caption they make miss; and the swapped image of each. None when the run does not use
    them."""
    if config.counterfactual_weight == 0 or split.image_counterfactuals is None:
        return None
    image_rows, caption_rows, owner = rows
    swaps = split.image_counterfactuals
    swapped, missed, position = swaps.of(image_rows, caption_rows, owner)
    if len(missed) == 0:
        return None
    pixels = torch.from_numpy(normalize_uint8(swaps.pixels[swapped].numpy(), model_config))
    return pixels, missed, position


_Item = TypeVar("_Item")
_Ready = TypeVar("_Ready")


def prefetched(items: Iterable[_Item], prepare: Callable[[_Item], _Ready]) -> Iterator[_Ready]:
    """prepare(item) for each item in order, the next one computed in a background thread
    while the caller works on the current one; an error in prepare is raised here."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:
        pending: Future[_Ready] | None = None
        for item in items:
            upcoming = pool.submit(prepare, item)
            if pending is not None:
                yield pending.result()
            pending = upcoming
        if pending is not None:
            yield pending.result()
