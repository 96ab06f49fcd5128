"""The train and val splits of a model on pretrained backbones: each image's and caption's
backbone vector, computed once per backbone and read from the cache beside the dataset after
that (models.backbones.feature_cache), so that an epoch trains only the heads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from models.backbones.feature_cache import split_features
from models.backbones.registry import Backbone, load_backbone
from models.backbones.vector_files import read_vectors, vectors_of
from models.datasets.records import PairedDataset, attribute_names, load_dataset
from models.networks.model_config import ConfigError, ModelConfig
from models.threads import ThreadBudget, concurrent_batches
from models.training.training_data import (
    SplitTensors,
    TrainingDataError,
    captioned_images,
    split_tensors,
)


def load_feature_splits(
    data_dir: Path | str, config: ModelConfig, vectors: Path | None = None
) -> tuple[SplitTensors, SplitTensors, ModelConfig, Backbone]:
    """The train and val splits as backbone features, the config with the backbones' widths
    (and the image backbone's input size) filled in, and the text backbone (its tokenizer
    goes into the model dir). With `vectors`, a folder of the user's own vectors
    (models.backbones.vector_files), the features are read from there instead: vectors the
    named backbones made, so that the exported whole path serves what the heads learnt."""
    dataset = load_dataset(data_dir)
    for name in ("train", "val"):
        if not dataset.split(name).captions:
            raise TrainingDataError(
                f"{data_dir} has no {name} captions: training needs image-caption pairs in "
                "the train and val splits"
            )
    image = load_backbone(config.image_backbone, "image")
    text = load_backbone(config.text_backbone, "text")
    attributes = attribute_names(dataset.images)
    features = _computed(dataset, image, text) if vectors is None else _read(vectors, image, text)
    train, val = (
        _feature_tensors(dataset, name, features, attributes, with_plausible=name == "val")
        for name in ("train", "val")
    )
    config = config.replace(
        image_backbone_dim=image.dim,
        text_backbone_dim=text.dim,
        image_size=image.image_size or config.image_size,
        max_caption_tokens=text.max_tokens or config.max_caption_tokens,
        novelty_bank=min(config.novelty_bank, len(train.pixels)),
    )
    return train, val, config, text


Features = Callable[[str, list[str], list[str]], tuple[np.ndarray, np.ndarray]]
# Batches encoded at once on a machine with many CPUs: each holds its batch's activations.
FEATURE_RUNNERS = 8


def _computed(dataset: PairedDataset, image: Backbone, text: Backbone) -> Features:
    """Features of a split's images and captions (by id) from the backbones, cached; a cache
    miss runs the backbone with ONNX Runtime, a batch per CPU at once on one thread each (at
    most FEATURE_RUNNERS).

    On 2 cores (benchmarks/results/feature_workers.md, images; captions alike) two one-thread
    batches at once encode 1.9x the images a second of one batch, and 1.2x those of one batch
    on two threads; beside a busy process 1.4x one batch, where one batch on two threads fell
    to 0.9x (its threads wait for each other). The features do not depend on the thread
    budget either."""
    encode_image, encode_text = (_on_first_miss(backbone) for backbone in (image, text))
    workers = min(FEATURE_RUNNERS, concurrent_batches(ThreadBudget(1)))

    def features(split: str, image_ids: list[str], _: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, images = split_features(
            dataset, split, "image", image.key, encode_image, workers=workers
        )
        _, captions = split_features(dataset, split, "text", text.key, encode_text, workers=workers)
        row_of = {image_id: row for row, image_id in enumerate(ids)}
        return images[[row_of[i] for i in image_ids]], captions

    return features


def _on_first_miss(backbone: Backbone) -> Callable[[list], np.ndarray]:
    """backbone.onnx_runner, made when the first batch needs it (never, on a cache hit), once
    whatever the number of threads that call it."""
    runner: list[Callable[[list], np.ndarray]] = []
    made = threading.Lock()

    def encode(batch: list) -> np.ndarray:
        with made:
            if not runner:
                runner.append(backbone.onnx_runner(1))
        return runner[0](batch)

    return encode


def _read(folder: Path, image: Backbone, text: Backbone) -> Features:
    """Features of a split's images and captions (by id) from the user's vector files."""
    by_modality = {modality: read_vectors(folder, modality) for modality in ("image", "text")}
    for backbone in (image, text):
        width = len(next(iter(by_modality[backbone.modality].values()), []))
        if width != backbone.dim:
            raise ConfigError(
                f"the {backbone.modality} vectors in {folder} have {width} values, but "
                f"{backbone.key} gives {backbone.dim}: they must come from the named backbone"
            )

    def features(split: str, image_ids: list[str], caption_ids: list[str]):
        return (
            vectors_of(by_modality["image"], image_ids, f"{split} images"),
            vectors_of(by_modality["text"], caption_ids, f"{split} captions"),
        )

    return features


def _feature_tensors(
    dataset: PairedDataset,
    name: str,
    features: Features,
    attributes: tuple[str, ...],
    with_plausible: bool,
) -> SplitTensors:
    split = dataset.split(name)
    images = captioned_images(split)
    pixels, caption_features = features(
        name, [record.id for record in images], [c.id for c in split.captions]
    )
    lengths = np.ones(len(caption_features), dtype=np.int64)
    return split_tensors(
        split, images, pixels, caption_features, lengths, attributes, with_plausible
    )
