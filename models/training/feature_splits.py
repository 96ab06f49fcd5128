"""The train and val splits of a model on pretrained backbones: each image's and caption's
backbone vector, computed once per backbone and read from the cache beside the dataset after
that (models.backbones.feature_cache), so that an epoch trains only the heads."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.backbones.feature_cache import split_features
from models.backbones.registry import Backbone, load_backbone
from models.datasets.records import PairedDataset, attribute_names, load_dataset
from models.networks.model_config import ModelConfig
from models.training.training_data import (
    SplitTensors,
    TrainingDataError,
    captioned_images,
    split_tensors,
)


def load_feature_splits(
    data_dir: Path | str, config: ModelConfig
) -> tuple[SplitTensors, SplitTensors, ModelConfig, Backbone]:
    """The train and val splits as backbone features, the config with the backbones' widths
    (and the image backbone's input size) filled in, and the text backbone (its tokenizer
    goes into the model dir)."""
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
    train, val = (
        _feature_tensors(dataset, name, image, text, attributes, with_plausible=name == "val")
        for name in ("train", "val")
    )
    config = config.replace(
        image_backbone_dim=image.dim,
        text_backbone_dim=text.dim,
        image_size=image.image_size or config.image_size,
        max_caption_tokens=text.max_tokens or config.max_caption_tokens,
    )
    return train, val, config, text


def _feature_tensors(
    dataset: PairedDataset,
    name: str,
    image: Backbone,
    text: Backbone,
    attributes: tuple[str, ...],
    with_plausible: bool,
) -> SplitTensors:
    split = dataset.split(name)
    image_ids, image_features = split_features(dataset, name, "image", image.key, image.encode)
    _, caption_features = split_features(dataset, name, "text", text.key, text.encode)
    row_of = {image_id: row for row, image_id in enumerate(image_ids)}
    images = captioned_images(split)
    pixels = image_features[[row_of[record.id] for record in images]]
    lengths = np.ones(len(caption_features), dtype=np.int64)
    return split_tensors(
        split, images, pixels, caption_features, lengths, attributes, with_plausible
    )
