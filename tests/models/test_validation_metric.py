"""The training's validation ranks as the service will: a model that names `search_with` is
validated with that metric, each direction with its own query first, so the best-on-validation
checkpoint is chosen by what it serves. Checked against a brute-force ranking built from
torch.distributions, independent of models.distance."""

import pytest
import torch
from torch.distributions import Independent, Normal

from models.networks.probabilistic_model import HeadsModel
from models.training.train import encode_split, validate
from models.training.training_data import SplitTensors
from tests.models.conftest import TINY_HEADS

IMAGES, CAPTIONS = 9, 14
HEADS = TINY_HEADS.replace(metric="cosine", logvar_init=0.0)


def split(generator: torch.Generator) -> SplitTensors:
    """Features for a model on backbones, with plausible matches beyond each caption's own."""
    owner = torch.arange(CAPTIONS) % IMAGES
    plausible = torch.rand(CAPTIONS, IMAGES, generator=generator) < 0.3
    plausible[torch.arange(CAPTIONS), owner] = True
    return SplitTensors(
        pixels=torch.randn(IMAGES, 6, generator=generator),
        ids=torch.randn(CAPTIONS, 4, generator=generator),
        lengths=torch.ones(CAPTIONS, dtype=torch.int64),
        caption_image=owner,
        plausible=plausible,
    )


def model_with(search_with: str, generator: torch.Generator) -> HeadsModel:
    model = HeadsModel(HEADS.replace(search_with=search_with))
    with torch.no_grad():
        for parameter in model.parameters():  # log-variances far from one value per item
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model


def mahalanobis_by_hand(query: tuple, gallery_mu: torch.Tensor) -> torch.Tensor:
    """sum (mu_g - mu_q)^2 / s_q^2 of every gallery mean under every query's Gaussian (Q, G):
    -2 log N(mu_g; mu_q, S_q) less its normaliser."""
    mu, logvar = (t.double() for t in query)
    scale = (0.5 * logvar).exp()
    rows = []
    for m, s in zip(mu, scale, strict=True):
        gaussian = Independent(Normal(m, s), 1)
        normaliser = gaussian.log_prob(m)
        rows.append(-2.0 * (gaussian.log_prob(gallery_mu.double()) - normaliser))
    return torch.stack(rows)


def top1_precision(distances: torch.Tensor, plausible: torch.Tensor) -> float:
    """P@1 (%) of queries (rows): the nearest item is a plausible match, ties against it."""
    hits = []
    for row, good in zip(distances, plausible, strict=True):
        best = row.min()
        tied = row <= best + 1e-9
        hits.append(bool(good[tied].all()))
    return 100.0 * sum(hits) / len(hits)


def test_a_model_served_with_query_mahalanobis_is_validated_with_it() -> None:
    generator = torch.Generator().manual_seed(0)
    data = split(generator)
    model = model_with("query_mahalanobis", generator)
    recalls, *_ = validate(model, data, torch.device("cpu"))
    image_mu, image_logvar, caption_mu, caption_logvar = encode_split(
        model, data, torch.device("cpu")
    )
    t2i = mahalanobis_by_hand((caption_mu, caption_logvar), image_mu)  # captions query
    i2t = mahalanobis_by_hand((image_mu, image_logvar), caption_mu)  # images query
    assert recalls["t2i_P@1"] == pytest.approx(top1_precision(t2i, data.plausible))
    assert recalls["i2t_P@1"] == pytest.approx(top1_precision(i2t, data.plausible.T))
    # the two directions rank differently: each reads its own query's variance
    assert not torch.allclose(t2i, i2t.T)


def test_a_model_without_search_with_is_validated_with_its_training_metric() -> None:
    generator = torch.Generator().manual_seed(1)
    data = split(generator)
    model = model_with("", generator)
    recalls, *_ = validate(model, data, torch.device("cpu"))
    image_mu, _, caption_mu, _ = encode_split(model, data, torch.device("cpu"))
    cosine = -(caption_mu.double() @ image_mu.double().T)  # (N_cap, N_img)
    assert recalls["t2i_P@1"] == pytest.approx(top1_precision(cosine, data.plausible))
    assert recalls["i2t_P@1"] == pytest.approx(top1_precision(cosine.T, data.plausible.T))
