"""Training and validation tensors of a paired dataset: decoded images, tokenised captions,
and the image-major batches of one epoch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from models.datasets.counterfactuals import ATTRIBUTES, counterfactual_texts, swapped_shape_scene
from models.datasets.records import (
    CaptionRecord,
    ImageRecord,
    PairedDataset,
    PlausibleMatcher,
    attribute_names,
    image_attributes,
    load_dataset,
    plausible_match_matrix,
)
from models.datasets.shapes import DATASET_NAME as SHAPES_NAME
from models.datasets.shapes import image_index
from models.datasets.shapes_render import render_scene, sample_scene
from models.networks.model_config import COUNTERFACTUALS, ModelConfig
from models.networks.preprocess import (
    InvalidImageError,
    load_image,
    normalize_uint8,
    resize_to_uint8,
)
from models.networks.tokenizer import Tokenizer


class TrainingDataError(ValueError):
    """A dataset that cannot be trained on (no captions, no val split, a corrupt image...)."""


IMAGE_SWAP_STREAM = 1  # rng stream of the image swaps, apart from the caption swaps


@dataclass(frozen=True)
class Counterfactuals:
    """Swapped captions of a split (models.datasets.counterfactuals), K of them in all.

    ids: int64 (K, T) padded token ids; lengths: int64 (K,); caption: int64 (K,) the caption
    row each one was made from (a caption has up to one per attribute).
    """

    ids: torch.Tensor
    lengths: torch.Tensor
    caption: torch.Tensor

    def of(self, caption_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The counterfactuals of a batch's captions: ids (K_b, T_b) trimmed, lengths (K_b,),
        and the position in `caption_rows` of the caption each one swaps (K_b,)."""
        size = int(torch.cat([self.caption, caption_rows, torch.zeros(1, dtype=torch.int64)]).max())
        size += 1
        position = torch.full((size,), -1, dtype=torch.int64)
        position[caption_rows] = torch.arange(len(caption_rows))
        rows = (position[self.caption] >= 0).nonzero().squeeze(1)
        lengths = self.lengths[rows]
        width = int(lengths.max()) if len(rows) else 1
        return self.ids[rows, :width], lengths, position[self.caption[rows]]


@dataclass(frozen=True)
class ImageCounterfactuals:
    """Each image of a split re-rendered with one object's shape swapped.

    pixels: uint8 (N_img, 3, H, W) the swapped images (the original where none was made);
    misses: bool (N_cap,) caption j matches its image but not the swapped one.
    """

    pixels: torch.Tensor
    misses: torch.Tensor

    def of(
        self, image_rows: torch.Tensor, caption_rows: torch.Tensor, owner: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For a batch: the image rows to swap (K_i,), and for each caption of the batch that
        a swap misses, its position in the batch (K,) and the position of its swapped image
        among the K_i (K,)."""
        missed = self.misses[caption_rows].nonzero().squeeze(1)  # caption positions
        swapped, position = torch.unique(owner[missed], return_inverse=True)
        return image_rows[swapped], missed, position


@dataclass(frozen=True)
class SplitTensors:
    """One split in memory.

    pixels: uint8 (N_img, 3, H, W); ids: int64 (N_cap, T) padded token ids; lengths: int64
    (N_cap,) (for a model on pretrained backbones, features instead: see `features`);
    caption_image: int64 (N_cap,) row of each caption's image in `pixels`;
    plausible: bool (N_cap, N_img) the dataset's plausible matches (validation split only);
    caption_records, image_records: the records in row order, to judge plausible matches
    between the items of a batch; labels: float32 (N_img, L) multi-hot over the dataset's
    label names (L = 0 for a dataset without labels); attributes: float32 (N_img, A)
    multi-hot over the dataset's object attribute values (models.datasets.records.
    attribute_names; A = 0 without object annotations); counterfactuals: swapped captions
    (train split, when asked for).
    """

    pixels: torch.Tensor
    ids: torch.Tensor
    lengths: torch.Tensor
    caption_image: torch.Tensor
    plausible: torch.Tensor | None = None
    caption_records: tuple[CaptionRecord, ...] = ()
    image_records: tuple[ImageRecord, ...] = ()
    labels: torch.Tensor | None = None
    attributes: torch.Tensor | None = None
    counterfactuals: Counterfactuals | None = None
    image_counterfactuals: ImageCounterfactuals | None = None

    def batch_plausible(self, image_rows: torch.Tensor, caption_rows: torch.Tensor) -> torch.Tensor:
        """(B, M) bool: caption m of the batch plausibly matches image b of the batch (for a
        dataset without object annotations, only a caption's own image)."""
        captions = [self.caption_records[int(r)] for r in caption_rows]
        return torch.from_numpy(self._matcher.matrix(captions, image_rows.cpu().numpy())).T

    @cached_property
    def plausible_pairs(self) -> torch.Tensor:
        """Sparse float32 (N_cap, N_img): 1 where a caption plausibly matches an image of the
        whole split (only its own image without caption records). The partners of the
        whole-gallery spread objective (models.training.gallery_spread); judged once per split
        and kept sparse, since a caption matches a handful of thousands of images."""
        if self.plausible is not None:
            dense = self.plausible.numpy()
        elif self.caption_records:
            dense = self._matcher.matrix(self.caption_records)
        else:
            dense = np.zeros((self.num_captions, self.num_images), dtype=bool)
            dense[np.arange(self.num_captions), self.caption_image.numpy()] = True
        rows, columns = np.nonzero(dense)
        indices = torch.from_numpy(np.stack([rows, columns]))
        values = torch.ones(len(rows), dtype=torch.float32)
        return torch.sparse_coo_tensor(
            indices, values, dense.shape, check_invariants=True
        ).coalesce()

    @cached_property
    def _matcher(self) -> PlausibleMatcher:
        """Judges captions against every image of the split, remembering each descriptor set."""
        return PlausibleMatcher(self.image_records)

    @property
    def features(self) -> bool:
        """Whether `pixels` and `ids` hold backbone features (float32 (N, F)) rather than
        uint8 pixels and token ids: the split of a model on pretrained backbones, whose
        `lengths` are unused ones."""
        return self.pixels.is_floating_point()

    @property
    def num_images(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def num_captions(self) -> int:
        return int(self.ids.shape[0])


def load_splits(
    data_dir: Path | str,
    config: ModelConfig,
    tokenizer: Tokenizer | None = None,
    counterfactual_seed: int | None = None,
    counterfactual_kinds: str = "both",
    caption_swaps: tuple[str, ...] = ATTRIBUTES,
) -> tuple[SplitTensors, SplitTensors, Tokenizer]:
    """Read the train and val splits of a dataset dir; build the vocabulary from the train
    captions unless `tokenizer` is given (a resumed run reuses its vocab.json). With a
    `counterfactual_seed`, the train split carries the counterfactuals of
    `counterfactual_kinds` ("captions", "images" or "both") drawn with it."""
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
    attributes = attribute_names(dataset.images)
    return (
        _with_counterfactuals(
            _to_tensors(train, config, tokenizer, attributes),
            train,
            tokenizer,
            config,
            counterfactual_seed,
            counterfactual_kinds,
            caption_swaps,
        ),
        _to_tensors(val, config, tokenizer, attributes, with_plausible=True),
        tokenizer,
    )


def _to_tensors(
    split: PairedDataset,
    config: ModelConfig,
    tokenizer: Tokenizer,
    attributes: tuple[str, ...] = (),
    with_plausible: bool = False,
) -> SplitTensors:
    """Decode the images that have captions and tokenise their captions."""
    images = captioned_images(split)
    pixels = np.zeros((len(images), 3, config.image_size, config.image_size), dtype=np.uint8)
    for row, record in enumerate(images):
        try:
            pixels[row] = resize_to_uint8(load_image(record.path), config.image_size)
        except InvalidImageError as e:
            raise TrainingDataError(f"image {record.id!r}: {e}") from e
    ids, lengths = tokenizer.encode_batch(
        [c.text for c in split.captions], config.max_caption_tokens
    )
    return split_tensors(split, images, pixels, ids, lengths, attributes, with_plausible)


def captioned_images(split: PairedDataset) -> list[ImageRecord]:
    """The split's images that have captions (the rows of SplitTensors), in dataset order."""
    captioned = {c.image_id for c in split.captions}
    return [im for im in split.images if im.id in captioned]


def split_tensors(
    split: PairedDataset,
    images: list[ImageRecord],
    pixels: np.ndarray,
    ids: np.ndarray,
    lengths: np.ndarray,
    attributes: tuple[str, ...] = (),
    with_plausible: bool = False,
) -> SplitTensors:
    """SplitTensors of the split's captioned `images` and its captions, given their inputs
    (pixels or features, token ids or features): the pairs, plausible matches and labels."""
    row_of = {im.id: row for row, im in enumerate(images)}
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
        torch.from_numpy(_attribute_matrix(images, attributes)),
    )


def _attribute_matrix(images: list[ImageRecord], names: tuple[str, ...]) -> np.ndarray:
    """float32 (len(images), len(names)): 1 where the image holds that attribute value."""
    column = {name: col for col, name in enumerate(names)}
    matrix = np.zeros((len(images), len(names)), dtype=np.float32)
    for row, record in enumerate(images):
        matrix[row, [column[name] for name in image_attributes(record)]] = 1.0
    return matrix


def _with_counterfactuals(
    tensors: SplitTensors,
    split: PairedDataset,
    tokenizer: Tokenizer,
    config: ModelConfig,
    seed: int | None,
    kinds: str,
    caption_swaps: tuple[str, ...] = ATTRIBUTES,
) -> SplitTensors:
    if seed is None:
        return tensors
    if kinds not in COUNTERFACTUALS:
        raise ValueError(f"unknown counterfactuals {kinds!r}; choose one of {COUNTERFACTUALS}")
    texts = images = None
    if kinds in ("captions", "both"):
        texts = _counterfactual_captions(tensors, tokenizer, config, seed, caption_swaps)
    if kinds in ("images", "both"):
        images = _counterfactual_images(tensors, split, config, seed)
    return replace(tensors, counterfactuals=texts, image_counterfactuals=images)


def _counterfactual_captions(
    tensors: SplitTensors,
    tokenizer: Tokenizer,
    config: ModelConfig,
    seed: int,
    attributes: tuple[str, ...],
) -> Counterfactuals:
    caption_image = tensors.caption_image.tolist()
    records = tensors.caption_records, tensors.image_records
    texts = counterfactual_texts(*records, caption_image, seed, attributes)
    made = [(row, text) for row, swaps in enumerate(texts) for text in swaps if text is not None]
    ids, lengths = tokenizer.encode_batch([t for _, t in made], config.max_caption_tokens)
    caption = np.array([row for row, _ in made], dtype=np.int64)
    return Counterfactuals(*(torch.from_numpy(a) for a in (ids, lengths, caption)))


def _counterfactual_images(
    tensors: SplitTensors, split: PairedDataset, config: ModelConfig, seed: int
) -> ImageCounterfactuals:
    """Re-render every image of the split with one object's shape swapped (shapes data only:
    its scenes are a pure function of the dataset seed and the image index)."""
    if split.meta.get("name") != SHAPES_NAME or "seed" not in split.meta:
        raise TrainingDataError(
            "counterfactual images need the shapes dataset (its scenes can be re-rendered); "
            "use counterfactuals 'captions' for this dataset"
        )
    pixels = tensors.pixels.clone()
    misses = np.zeros(len(tensors.caption_records), dtype=bool)
    caption_image = tensors.caption_image.numpy()
    for row, image in enumerate(tensors.image_records):
        rows = np.flatnonzero(caption_image == row)
        scene = sample_scene(int(split.meta["seed"]), image_index(image.id))
        rng = np.random.default_rng([seed, row, IMAGE_SWAP_STREAM])
        swap = swapped_shape_scene(scene, image, [tensors.caption_records[r] for r in rows], rng)
        if swap is not None:
            rendered = resize_to_uint8(render_scene(swap[0]), config.image_size)
            pixels[row] = torch.from_numpy(rendered)
            misses[rows] = swap[1]
    return ImageCounterfactuals(pixels, torch.from_numpy(misses))


def image_batch(split: SplitTensors, rows: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Normalised float32 images (B, 3, H, W) of the given image rows (a split of backbone
    features: their features (B, F))."""
    if split.features:
        return split.pixels[rows]
    return torch.from_numpy(normalize_uint8(split.pixels[rows].numpy(), config))


def caption_batch(split: SplitTensors, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, T) trimmed to the longest caption of the batch, and lengths (B,) (a split
    of backbone features: their features (B, F) and the unused lengths)."""
    lengths = split.lengths[rows]
    if split.features:
        return split.ids[rows], lengths
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
