"""Milvus shortlists (Milvus Lite, flat collections) against FAISS flat and brute force."""

from pathlib import Path

import numpy as np
import pytest
import torch

from indexer.milvus_schema import (
    METADATA_FIELDS,
    ROW_FIELD,
    VARCHAR_MAX_BYTES,
    MetadataTooLongError,
    entities,
)
from indexer.milvus_store import MilvusBackend, MilvusCollectionError, alias_name, collection_name
from indexer.milvus_writer import write_version_dir
from indexer.shortlist_backends import make_backend
from indexer.store import open_version
from models.distance.augmented import INDEX_FAMILIES
from models.distance.gaussian import pairwise_distance
from tests.indexer.synthetic import (
    clustered_gaussians,
    exact_top,
    nearby_queries,
    write_synthetic_version,
)

N, D, Q, K = 3000, 16, 40, 10
NATIVE_METRICS = tuple(INDEX_FAMILIES)  # every metric with an exact index form


@pytest.fixture(scope="module")
def gallery() -> tuple[np.ndarray, np.ndarray]:
    return clustered_gaussians(N, D, seed=3, clusters=60)


@pytest.fixture(scope="module")
def queries(gallery) -> tuple[np.ndarray, np.ndarray]:
    return nearby_queries(*gallery, num=Q, seed=4)


@pytest.fixture(scope="module")
def milvus(tmp_path_factory) -> MilvusBackend:
    backend = MilvusBackend(str(tmp_path_factory.mktemp("milvus") / "milvus.db"))
    yield backend
    backend.connection.close()


@pytest.fixture(scope="module")
def versions(tmp_path_factory, gallery, milvus):
    """The same flat version opened twice: shortlists from FAISS files and from Milvus."""
    path = Path(tmp_path_factory.mktemp("flat")) / "v1"
    write_synthetic_version(path, *gallery, metrics=NATIVE_METRICS, index_type="flat")
    write_version_dir(milvus, path)
    faiss_version = open_version(path, verify=True)
    milvus_version = open_version(path, backend=milvus)
    yield faiss_version, milvus_version
    faiss_version.close()
    milvus_version.close()


@pytest.mark.parametrize("metric", NATIVE_METRICS)
def test_milvus_flat_equals_faiss_flat_and_brute_force(versions, gallery, queries, metric) -> None:
    faiss_version, milvus_version = versions
    faiss_distances, faiss_rows = exact_top(faiss_version, metric, *queries, K)
    distances, rows = exact_top(milvus_version, metric, *queries, K)
    np.testing.assert_array_equal(rows, faiss_rows)
    # the per-query constants are added back: the distances are the metric's own
    np.testing.assert_allclose(distances, faiss_distances, rtol=1e-4, atol=1e-3)
    as64 = [torch.from_numpy(a).double() for a in (*queries, *gallery)]
    exact = pairwise_distance(metric, *as64).numpy()  # (Q, N) brute force
    truth = np.argsort(exact, axis=1)[:, :K]
    assert all(set(r) == set(t) for r, t in zip(rows, truth, strict=True))
    np.testing.assert_allclose(distances, np.take_along_axis(exact, rows, 1), rtol=1e-3, atol=2e-3)


def test_each_row_carries_its_metadata_as_scalar_fields(versions, milvus) -> None:
    faiss_version, _ = versions
    name = collection_name(faiss_version.manifest.modality, faiss_version.manifest.version, "kl")
    rows = [0, 7, N - 1]
    got = milvus.connection.call(
        lambda c: c.query(
            name, filter=f"{ROW_FIELD} in {rows}", output_fields=list(METADATA_FIELDS)
        )
    )
    stored = {hit[ROW_FIELD]: hit for hit in got}
    assert sorted(stored) == rows
    for row, record in zip(rows, faiss_version.metadata(rows), strict=True):
        assert stored[row]["item_id"] == record["id"] == f"item-{row}"
        assert stored[row]["text"] == record["text"] == f"caption {row}"
        assert stored[row]["uri"] is None and stored[row]["extra"] == record["extra"] == {"i": row}
    hits = milvus.connection.call(
        lambda c: c.query(name, filter='text == "caption 7"', output_fields=["item_id"])
    )
    assert [hit["item_id"] for hit in hits] == ["item-7"]


def test_a_shortlist_longer_than_the_gallery_is_padded(tmp_path, milvus) -> None:
    mu, logvar = clustered_gaussians(30, 4, seed=1, clusters=3)
    write_synthetic_version(tmp_path / "small", mu, logvar, ("kl",), "flat")
    write_version_dir(milvus, tmp_path / "small")
    version = open_version(tmp_path / "small", backend=milvus)
    distances, rows = version.search_family("kl", mu[:2], logvar[:2], 40)
    assert (rows[:, :30] >= 0).all() and (rows[:, 30:] == -1).all()
    assert np.isinf(distances[:, 30:]).all() and rows[0, 0] == 0


def test_alias_moves_to_the_activated_version(tmp_path, milvus) -> None:
    mu, logvar = clustered_gaussians(50, 4, seed=2, clusters=3)
    for version in ("va", "vb"):
        write_synthetic_version(tmp_path / version, mu, logvar, ("w2",), "flat", "image")
        write_version_dir(milvus, tmp_path / version)
    milvus.activate("image", "va", ("w2",))
    assert milvus.active_collection("image", "w2") == collection_name("image", "va", "w2")
    milvus.activate("image", "vb", ("w2",))
    assert milvus.active_collection("image", "w2") == collection_name("image", "vb", "w2")
    assert alias_name("image", "w2") != collection_name("image", "vb", "w2")
    with pytest.raises(MilvusCollectionError, match="rebuild it"):
        milvus.activate("image", "never-built", ("w2",))


def test_a_version_without_collections_is_refused_with_the_fix(tmp_path, milvus) -> None:
    mu, logvar = clustered_gaussians(50, 4, seed=2, clusters=3)
    write_synthetic_version(tmp_path / "faiss-only", mu, logvar, ("w2",), "flat")
    with pytest.raises(MilvusCollectionError, match="PROBSEARCH_SHORTLIST_BACKEND=milvus"):
        open_version(tmp_path / "faiss-only", backend=milvus)


def test_milvus_backend_needs_a_uri() -> None:
    with pytest.raises(ValueError, match="PROBSEARCH_MILVUS_URI"):
        make_backend("milvus", None)


def test_metadata_longer_than_a_varchar_is_refused_with_the_row() -> None:
    record = {"id": "item-0", "text": "x" * (VARCHAR_MAX_BYTES + 1), "extra": {}}
    with pytest.raises(MetadataTooLongError, match="row 5: its text"):
        entities(np.array([5]), np.zeros((1, 4), np.float32), [record])
    fits = entities(np.array([5]), np.zeros((1, 4), np.float32), [{"id": "a", "extra": {}}])
    assert fits[0]["row"] == 5 and fits[0]["text"] is None and fits[0]["extra"] == {}
