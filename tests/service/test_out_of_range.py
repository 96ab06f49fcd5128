"""A query far outside the gallery is rejected with a reason (issue 41.7): mu = -1e4 in every
dimension answered with a score of 1.0, unrejected, its mutual information 0."""

import gc

import httpx
import numpy as np
import pytest

from indexer.store import open_version
from models.scoring import gallery_range
from models.scoring.gallery_range import RANGE_LIMIT, GalleryRange, out_of_range
from tests.service.conftest import Artifacts


def embedding_search(client: httpx.Client, mu, logvar, **options) -> dict:
    body = {"mu": list(map(float, mu)), "logvar": list(map(float, logvar)), "gallery": "image",
            **options}  # fmt: skip
    response = client.post("/search/embedding", json=body)
    assert response.status_code == 200, response.text
    return response.json()["query"]


@pytest.fixture(scope="module")
def image_gallery(artifacts: Artifacts):
    index = open_version(artifacts.index_root / "image" / artifacts.image_v1)
    try:
        yield np.array(index.mu), np.array(index.logvar)
    finally:
        index.close()


def test_a_query_far_from_everything_is_rejected_saying_why(
    client: httpx.Client, image_gallery
) -> None:
    mu, logvar = image_gallery
    dim = mu.shape[1]
    for threshold in (None, 1e9):  # no request threshold makes it answerable
        options = {} if threshold is None else {"reject_threshold": threshold}
        query = embedding_search(client, [-1e4] * dim, [0.0] * dim, **options)
        assert query["rejected"] is True
        assert query["reject_score"]["name"] == "out_of_range"
        assert query["reject_score"]["threshold"] == RANGE_LIMIT
        assert query["out_of_range"] > 1000
    # a gallery item's own mean lies inside the gallery: out_of_range plays no part
    inside = embedding_search(client, mu[0], logvar[0])
    assert inside["out_of_range"] <= 1.0
    assert inside["reject_score"]["name"] != "out_of_range"
    # outside, but where the ranking still means something: not rejected by it
    centre = mu.astype(np.float64).mean(0)
    radius = np.linalg.norm(mu - centre, axis=1).max()
    direction = np.eye(dim)[0]
    near = embedding_search(client, centre + 5 * radius * direction, logvar[0])
    assert near["out_of_range"] == pytest.approx(5.0, rel=1e-4)
    assert near["reject_score"]["name"] != "out_of_range"
    far = embedding_search(client, centre + 30 * radius * direction, logvar[0])
    assert far["rejected"] and far["reject_score"]["name"] == "out_of_range"


def test_text_queries_lie_inside_their_gallery(client: httpx.Client) -> None:
    for text in ("a red circle", "a small blue square on the left"):
        query = client.post("/search/text", json={"text": text}).json()["query"]
        assert query["out_of_range"] < RANGE_LIMIT
        assert query["reject_score"]["name"] != "out_of_range"


def test_the_range_score_in_numbers() -> None:
    gallery = np.array([[0.0, 0.0], [2.0, 0.0], [-2.0, 0.0]], np.float32)  # centre 0, radius 2
    queries = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 6.0], [-30.0, -40.0]])
    assert out_of_range(queries, gallery).tolist() == [0.0, 1.0, 3.0, 25.0]
    assert GalleryRange.of(gallery[:1]).out_of_range(queries).tolist() == [0.0] * 4
    assert GalleryRange.of(np.zeros((0, 2))).out_of_range(queries).tolist() == [0.0] * 4
    blocks = np.random.default_rng(0).normal(size=(70_000, 3))  # more than one block
    found = GalleryRange.of(blocks)
    assert np.allclose(found.centre, blocks.mean(0))
    assert found.radius == pytest.approx(np.linalg.norm(blocks - blocks.mean(0), axis=1).max())
    # at the limit, the farthest item is 1.1 times as far as the nearest
    limit = RANGE_LIMIT
    assert (limit + 1) / (limit - 1) == pytest.approx(1.1)


def test_the_range_is_computed_once_per_gallery_array() -> None:
    gallery = np.arange(12, dtype=np.float32).reshape(6, 2)
    first = gallery_range.gallery_range(gallery)
    assert gallery_range.gallery_range(gallery) is first
    key = id(gallery)
    del gallery
    gc.collect()
    assert key not in gallery_range._ranges
