"""variance_objective "gallery_spread" (models.training.gallery_spread): the whole-gallery
targets against a numpy loop, against the batch objective's targets on captions whose partners
no batch holds together, in the batch loss, and in a short training run on shapes."""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from models.datasets.records import is_plausible_match
from models.networks.model_config import VOCAB_FILE, ConfigError, ModelConfig, TrainConfig
from models.networks.probabilistic_model import load_model
from models.networks.tokenizer import Tokenizer
from models.objectives import BatchEmbeddings, batch_loss
from models.objectives.regularizers import SPREAD_FLOOR, spread_nll, spread_target
from models.training.gallery_spread import gallery_spread, partner_distance
from models.training.train import _gallery_targets, encode_split, train
from models.training.training_data import epoch_batches, load_splits


def loop_target(partner_mu: np.ndarray, partners: np.ndarray) -> np.ndarray:
    """One item's target by hand: numpy's variance of its partners' means plus the floor, the
    floor alone with fewer than two partners."""
    if partners.sum() < 2:
        return np.full(partner_mu.shape[1], SPREAD_FLOOR)
    return partner_mu[partners].var(axis=0) + SPREAD_FLOOR


def test_gallery_targets_match_a_loop_over_every_caption_and_image() -> None:
    rng = np.random.default_rng(0)
    image_mu, caption_mu = rng.normal(size=(40, 5)), rng.normal(size=(25, 5))
    plausible = rng.random((25, 40)) < 0.1  # (C, I)
    plausible[3] = False  # a caption with no plausible image, one with a single one
    plausible[4] = np.arange(40) == 7
    sparse = torch.from_numpy(plausible).double().to_sparse()
    got = gallery_spread(torch.from_numpy(image_mu), torch.from_numpy(caption_mu), sparse)
    for c in range(25):
        np.testing.assert_allclose(got.captions[c], loop_target(image_mu, plausible[c]), rtol=1e-9)
    for i in range(40):
        np.testing.assert_allclose(
            got.images[i], loop_target(caption_mu, plausible[:, i]), rtol=1e-9
        )
    every = np.ones(25, dtype=bool)
    np.testing.assert_allclose(got.outlier, loop_target(caption_mu, every), rtol=1e-9)
    dense = gallery_spread(
        torch.from_numpy(image_mu), torch.from_numpy(caption_mu), torch.from_numpy(plausible)
    )  # the same from a dense matrix
    torch.testing.assert_close(dense.captions, got.captions)
    images, captions = got.of_batch(torch.tensor([2, 5]), torch.tensor([4, 0]), outliers=1)
    torch.testing.assert_close(images, torch.stack([got.images[2], got.images[5], got.outlier]))
    torch.testing.assert_close(captions, got.captions[[4, 0]])


def test_each_caption_gets_the_spread_of_its_plausible_images_in_the_whole_split(
    split_and_model,
) -> None:
    """What the training loop hands each epoch, checked against the dataset's own judgement
    of every pair and the untrained model's means: the gallery, not a batch."""
    split, model = split_and_model
    config = TrainConfig(variance_objective="gallery_spread")
    targets = _gallery_targets(model, split, config, torch.device("cpu"))
    image_mu = encode_split(model, split, torch.device("cpu"))[0].double().numpy()
    generator = np.random.default_rng(1)
    for c in generator.choice(split.num_captions, 30, replace=False):
        caption = split.caption_records[c]
        partners = np.array([is_plausible_match(caption, im) for im in split.image_records])
        np.testing.assert_allclose(targets.captions[c], loop_target(image_mu, partners), rtol=1e-4)
    assert _gallery_targets(model, split, TrainConfig(variance_objective="spread"), "cpu") is None


def test_captions_whose_partners_share_no_batch_still_get_their_spread(split_and_model) -> None:
    """The batch objective gives a caption whose plausible images never meet in one batch the
    floor; over the gallery it gets their spread. A batch-limited target fails this."""
    split, model = split_and_model
    config = TrainConfig(variance_objective="gallery_spread")
    targets = _gallery_targets(model, split, config, torch.device("cpu"))
    image_mu = encode_split(model, split, torch.device("cpu"))[0]
    floored, above = 0, 0
    for image_rows, caption_rows, _ in epoch_batches(split, 8, 0, seed=0, epoch=0):
        partners = split.batch_plausible(image_rows, caption_rows).double()  # (B, M)
        in_batch = spread_target(image_mu[image_rows].double(), partners)  # (M, D)
        gallery = targets.of_batch(image_rows, caption_rows)[1]
        lone = (partners.sum(0) < 2) & (split.plausible_pairs.to_dense()[caption_rows].sum(1) > 1)
        floored += int(lone.sum())
        torch.testing.assert_close(in_batch[lone], torch.full_like(in_batch[lone], SPREAD_FLOOR))
        above += int((gallery[lone] > 2 * SPREAD_FLOOR).any(dim=1).sum())
    assert floored > 100 and above == floored


@pytest.mark.parametrize("objective", ["gallery_spread", "plausible_count"])
def test_the_batch_loss_fits_the_handed_targets_and_only_the_variances(objective: str) -> None:
    generator = torch.Generator().manual_seed(3)
    mu_i, lv_i, mu_c, lv_c = (torch.randn(4, 6, generator=generator) for _ in range(4))
    for t in (mu_i, lv_i, mu_c, lv_c):
        t.requires_grad_()
    owner = torch.arange(4)
    own = owner[:, None] == owner[None, :]
    targets = (torch.rand(4, 6, generator=generator), torch.rand(4, 6, generator=generator))
    base = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own, own)
    with_targets = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own, own, spread_targets=targets)
    match, model = (torch.tensor(2.0), torch.tensor(1.0)), ModelConfig(metric="cosine")
    hinge = batch_loss(base, model, TrainConfig(), match, "sum", None)
    whole_split = TrainConfig(variance_objective=objective)
    loss = batch_loss(with_targets, model, whole_split, match, "sum", None)
    expected = hinge + spread_nll(targets[0], lv_i) + spread_nll(targets[1], lv_c)
    torch.testing.assert_close(loss, expected)
    mean_grads = torch.autograd.grad(loss - hinge, [mu_i, mu_c], allow_unused=True)
    assert all(g is None or not g.any() for g in mean_grads)
    with pytest.raises(ConfigError, match=objective):  # the error lists the valid names
        TrainConfig(variance_objective=objective[:-1])


@pytest.mark.parametrize("objective", ["gallery_spread", "plausible_count"])
def test_training_with_it_gives_vaguer_captions_a_larger_log_det(
    objective: str, shapes_dir, tmp_path
) -> None:
    """A short run on shapes: val caption log-det rises with ln(#plausible images) (0.60 with
    gallery_spread, 0.72 with plausible_count, 0.65 with "spread", -0.11 with no variance
    objective)."""
    model = ModelConfig(embed_dim=16, metric="cosine", variance_reads_only=True)
    config = TrainConfig(epochs=3, patience=0, seed=0, variance_objective=objective)
    out = tmp_path / "m"
    train(shapes_dir, out, model, config, progress=False, export=False, log=lambda line: None)
    trained = load_model(out)
    _, val, _ = load_splits(shapes_dir, trained.config, Tokenizer.load(out / VOCAB_FILE))
    caption_logvar = encode_split(trained, val, torch.device("cpu"))[3]
    ambiguity = np.log(val.plausible.sum(1).clamp_min(1).numpy())
    rho = spearmanr(caption_logvar.sum(1).numpy(), ambiguity).correlation
    assert rho > 0.4, rho


def test_partner_distance_targets_match_a_loop_over_every_caption_and_image() -> None:
    """variance_objective "partner_distance": each item's target is the mean over its
    plausible partners of (mu_partner - mu_item)^2 plus the floor, by a loop; an item with no
    partner gets the floor alone."""
    rng = np.random.default_rng(1)
    image_mu, caption_mu = rng.normal(size=(30, 4)), rng.normal(size=(20, 4))
    plausible = rng.random((20, 30)) < 0.15  # (C, I)
    plausible[2] = False
    plausible[5] = np.arange(30) == 3

    def loop(item: np.ndarray, partners: np.ndarray) -> np.ndarray:
        if not partners.any():
            return np.full(item.shape, SPREAD_FLOOR)
        return np.mean([(p - item) ** 2 for p in partners], axis=0) + SPREAD_FLOOR

    for matrix in (torch.from_numpy(plausible).double().to_sparse(), torch.from_numpy(plausible)):
        got = partner_distance(torch.from_numpy(image_mu), torch.from_numpy(caption_mu), matrix)
        for c in range(20):
            want = loop(caption_mu[c], image_mu[plausible[c]])
            np.testing.assert_allclose(got.captions[c], want, rtol=1e-9)
        for i in range(30):
            want = loop(image_mu[i], caption_mu[plausible[:, i]])
            np.testing.assert_allclose(got.images[i], want, rtol=1e-9)
    np.testing.assert_allclose(got.captions[2], SPREAD_FLOOR)
    np.testing.assert_allclose(got.captions[5], (image_mu[3] - caption_mu[5]) ** 2 + SPREAD_FLOOR)
