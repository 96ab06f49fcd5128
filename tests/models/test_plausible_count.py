"""variance_objective "plausible_count" (models.training.gallery_spread.plausible_count): the
targets against a numpy computation, the partner count of a sparse matrix against its dense
column sums, their ends (one partner: the floor; every candidate: the
gallery's spread) and monotony in the count, what the training loop hands each epoch, the
batch loss, and a short training run on shapes."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.datasets.records import is_plausible_match
from models.networks.model_config import TrainConfig
from models.objectives.regularizers import SPREAD_FLOOR, count_target, partner_count
from models.training.gallery_spread import plausible_count
from models.training.train import _gallery_targets, encode_split


def numpy_target(count: int, total: int, candidate_mu: np.ndarray) -> np.ndarray:
    """By hand: floor * (g / floor) ** (ln n / ln N), g = numpy's variance of every
    candidate's mean, at least the floor; n at least 1."""
    gallery = np.maximum(candidate_mu.var(axis=0), SPREAD_FLOOR)
    share = np.log(max(count, 1)) / np.log(total)
    return SPREAD_FLOOR * (gallery / SPREAD_FLOOR) ** share


def random_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means of 40 images and 25 captions (D = 5; dimension 4 almost constant, its gallery
    variance below the floor) and a random plausible matrix (C, I) with a caption of no image,
    one of a single image and one of every image."""
    rng = np.random.default_rng(seed)
    image_mu, caption_mu = rng.normal(size=(40, 5)) * 0.3, rng.normal(size=(25, 5)) * 0.3
    image_mu[:, 4] *= 0.01
    caption_mu[:, 4] *= 0.01
    plausible = rng.random((25, 40)) < 0.2
    plausible[3], plausible[4], plausible[5] = False, np.arange(40) == 7, True
    return image_mu, caption_mu, plausible


def test_targets_match_a_numpy_computation_for_every_caption_and_image() -> None:
    image_mu, caption_mu, plausible = random_split()
    sparse = torch.from_numpy(plausible).double().to_sparse()
    got = plausible_count(torch.from_numpy(image_mu), torch.from_numpy(caption_mu), sparse)
    for c in range(25):
        expected = numpy_target(plausible[c].sum(), 40, image_mu)
        np.testing.assert_allclose(got.captions[c], expected, rtol=1e-9)
    for i in range(40):
        expected = numpy_target(plausible[:, i].sum(), 25, caption_mu)
        np.testing.assert_allclose(got.images[i], expected, rtol=1e-9)
    np.testing.assert_allclose(got.outlier, numpy_target(25, 25, caption_mu), rtol=1e-9)
    dense = plausible_count(
        torch.from_numpy(image_mu), torch.from_numpy(caption_mu), torch.from_numpy(plausible)
    )  # the same from a dense matrix
    torch.testing.assert_close(dense.captions, got.captions)
    torch.testing.assert_close(dense.images, got.images)


def test_one_partner_gets_the_floor_and_every_candidate_the_gallery_spread() -> None:
    image_mu, caption_mu, plausible = random_split()
    got = plausible_count(
        torch.from_numpy(image_mu), torch.from_numpy(caption_mu), torch.from_numpy(plausible)
    )
    floor = np.full(5, SPREAD_FLOOR)
    np.testing.assert_allclose(got.captions[4], floor, rtol=1e-12)  # one image
    np.testing.assert_allclose(got.captions[3], floor, rtol=1e-12)  # none: counted as one
    gallery = np.maximum(image_mu.var(axis=0), SPREAD_FLOOR)
    np.testing.assert_allclose(got.captions[5], gallery, rtol=1e-12)  # every image
    assert gallery[0] > 10 * SPREAD_FLOOR and gallery[4] == SPREAD_FLOOR  # both ends differ


def test_the_target_grows_with_the_count() -> None:
    gallery = torch.tensor([0.5, 0.02, SPREAD_FLOOR, SPREAD_FLOOR / 10], dtype=torch.float64)
    counts = torch.arange(1, 101, dtype=torch.float64)
    target = count_target(counts, 100, gallery)  # (100, 4)
    steps = target.diff(dim=0)
    assert (steps[:, :2] > 0).all()  # strictly where the gallery is wider than the floor
    torch.testing.assert_close(target[:, 2:], torch.full_like(target[:, 2:], SPREAD_FLOOR))
    torch.testing.assert_close(target[0], torch.full_like(target[0], SPREAD_FLOOR))
    torch.testing.assert_close(target[-1], gallery.clamp_min(SPREAD_FLOOR))
    # geometric: ln t is linear in ln n
    half = count_target(torch.tensor([10.0], dtype=torch.float64), 100, gallery)[0]
    torch.testing.assert_close(half, (SPREAD_FLOOR * gallery.clamp_min(SPREAD_FLOOR)).sqrt())


def test_the_training_loop_hands_each_caption_its_count_over_the_whole_split(
    split_and_model,
) -> None:
    """Against the dataset's own judgement of every pair and the untrained model's means."""
    split, model = split_and_model
    config = TrainConfig(variance_objective="plausible_count")
    targets = _gallery_targets(model, split, config, torch.device("cpu"))
    image_mu = encode_split(model, split, torch.device("cpu"))[0].double().numpy()
    generator = np.random.default_rng(1)
    counts = []
    for c in generator.choice(split.num_captions, 30, replace=False):
        caption = split.caption_records[c]
        count = sum(is_plausible_match(caption, im) for im in split.image_records)
        expected = numpy_target(count, split.num_images, image_mu)
        np.testing.assert_allclose(targets.captions[c], expected, rtol=1e-4)
        counts.append(count)
    assert min(counts) < max(counts)  # the sample spans several counts


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.floats(0.0, 3.0)), max_size=40),
)
def test_a_sparse_matrix_counts_its_partners_as_its_dense_column_sums(
    rows: int, columns: int, entries: list[tuple[int, int, float]]
) -> None:
    """partner_count of a sparse COO matrix, repeated entries (uncoalesced) and weights
    included, against torch's own column sums of the dense matrix."""
    entries = [(r % rows, c % columns, w) for r, c, w in entries]
    indices = torch.tensor([[r for r, _, _ in entries], [c for _, c, _ in entries]]).reshape(2, -1)
    values = torch.tensor([w for _, _, w in entries], dtype=torch.float64)
    sparse = torch.sparse_coo_tensor(indices, values, (rows, columns), check_invariants=True)
    want = sparse.to_dense().sum(dim=0)[:, None]
    torch.testing.assert_close(partner_count(sparse), want)
    torch.testing.assert_close(partner_count(sparse.t()), sparse.to_dense().sum(dim=1)[:, None])
