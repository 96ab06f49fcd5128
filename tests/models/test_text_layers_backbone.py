"""The layered text backbone against an independent reading of the same weights:
sentence-transformers' own unit vector for the first block, then per lower layer the mean of
that layer's token vectors computed one caption at a time (no padding), by numpy; then its
ONNX export and its name in the registry."""

import re

import numpy as np
import pytest
import torch

from models.backbones.registry import load_backbone
from models.backbones.text_backbone import MiniLM
from models.backbones.text_layers_backbone import LOWER_LAYERS, MiniLMLayers

CAPTIONS = ["a penguin mascot for linux", "tux", "red flag of a country waving in the wind"]


@pytest.fixture(scope="module")
def layers() -> MiniLMLayers:
    return MiniLMLayers()


def one_caption_layers(backbone: MiniLM, caption: str) -> list[np.ndarray]:
    ids, mask = backbone.tokens([caption])
    assert bool(mask.all())
    with torch.no_grad():
        states = backbone.network(input_ids=ids, output_hidden_states=True).hidden_states
    return [state[0].double().numpy().mean(axis=0) for state in states]


def test_features_are_the_plain_vector_then_each_lower_layers_unit_mean(layers) -> None:
    plain = MiniLM()
    got = layers.encode(CAPTIONS).double().numpy()
    assert got.shape == (3, 384 * 7) == (3, MiniLMLayers.dim)
    np.testing.assert_allclose(got[:, :384], plain.encode(CAPTIONS).double().numpy(), atol=1e-5)
    for row, caption in zip(got, CAPTIONS, strict=True):
        states = one_caption_layers(plain, caption)
        for block, layer in enumerate(LOWER_LAYERS, start=1):
            mean = states[layer]
            part = row[384 * block : 384 * (block + 1)]
            np.testing.assert_allclose(part, mean / np.linalg.norm(mean), atol=1e-5)


def test_registry_loads_it_by_name_and_onnx_reproduces_it() -> None:
    backbone = load_backbone("all-minilm-l6-v2-layers", "text")
    assert backbone.dim == MiniLMLayers.dim
    assert backbone.key.startswith("all-minilm-l6-v2-layers-012345-")
    plain = load_backbone("all-minilm-l6-v2", "text").key  # unchanged: its caches stay valid
    assert re.fullmatch(r"all-minilm-l6-v2-[0-9a-f]{12}", plain), plain
    runner = backbone.onnx_runner(threads=1)
    np.testing.assert_allclose(runner(CAPTIONS), backbone.encode(CAPTIONS), rtol=1e-3, atol=1e-4)
