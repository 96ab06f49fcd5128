"""Multi-vector (PVSE) search against a brute-force best-pair scan of the whole gallery."""

from pathlib import Path

import numpy as np
import pytest
import torch

from indexer.multivector import MultiVectorError, MultiVectorIndex, best_pair_scores
from indexer.publish import ReindexJob, run_reindex
from indexer.store import open_version
from models.datasets.records import load_dataset
from models.networks.model_config import VOCAB_FILE, ModelConfig
from models.networks.tokenizer import Tokenizer
from models.onnx.encoder_runtime import OnnxEncoder
from models.onnx.export import export_encoders
from models.pvse.model import PvseModel


def unit(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def brute_force(queries: np.ndarray, gallery: np.ndarray, k: int) -> np.ndarray:
    """Best-pair scores of every item by plain loops, top-k scores descending."""
    scores = np.array(
        [[max(float(x @ y) for x in q for y in item) for item in gallery] for q in queries]
    )
    return -np.sort(-scores, axis=1)[:, :k]


@pytest.mark.parametrize(("k_query", "k_item"), [(1, 1), (2, 2), (4, 4), (3, 2)])
def test_best_pair_scores_match_the_loop(k_query: int, k_item: int) -> None:
    rng = np.random.default_rng(0)
    queries, gallery = unit(rng, 3, k_query, 6), unit(rng, 20, k_item, 6)
    np.testing.assert_allclose(
        -np.sort(-best_pair_scores(queries, gallery), axis=1),
        brute_force(queries, gallery, 20),
        atol=1e-5,
    )


@pytest.mark.parametrize("per_item", [2, 4])
@pytest.mark.parametrize("k", [1, 10, 100])
def test_search_returns_the_exact_top_k_items(per_item: int, k: int) -> None:
    rng = np.random.default_rng(per_item * 1000 + k)
    # Clustered items: an item's vectors are close to each other, so the nearest vectors of a
    # query vector come in groups of K from few items (the case the k*K bound is for).
    centres = unit(rng, 400, 1, 8)
    gallery = centres + 0.05 * rng.standard_normal((400, per_item, 8)).astype(np.float32)
    gallery /= np.linalg.norm(gallery, axis=-1, keepdims=True)
    queries = unit(rng, 25, per_item, 8)
    index = MultiVectorIndex(gallery)
    scores, rows = index.search(queries, k)
    expected = brute_force(queries, gallery, k)
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    full = best_pair_scores(queries, gallery)
    np.testing.assert_allclose(np.take_along_axis(full, rows, axis=1), scores, atol=1e-6)
    assert all(len(set(r)) == len(r) for r in rows.tolist())


def test_fetching_fewer_than_k_times_k_vectors_can_miss_an_item() -> None:
    """The bound is needed: K copies of one item's vector fill a k-vector fetch."""
    gallery = np.zeros((3, 2, 2), dtype=np.float32)
    gallery[0] = [1.0, 0.0]  # two copies of the query direction
    gallery[1] = [[0.8, 0.6], [0.8, 0.6]]
    gallery[2] = [[0.0, 1.0], [0.0, 1.0]]
    queries = np.array([[[1.0, 0.0]]], dtype=np.float32)
    index = MultiVectorIndex(gallery)
    _, ids = index.index.search(queries[0], 2)  # only k = 2 vectors, not k * K = 4
    assert set(ids[0].tolist()) == {0}  # item 1, the true second best, is missed
    _, rows = index.search(queries, 2)
    assert rows[0].tolist() == [0, 1]


def test_small_gallery_save_load_and_bad_input(tmp_path) -> None:
    rng = np.random.default_rng(1)
    gallery = unit(rng, 5, 2, 4)
    MultiVectorIndex(gallery).save(tmp_path)
    loaded = MultiVectorIndex.load(tmp_path)
    _, rows = loaded.search(unit(rng, 2, 2, 4), 50)
    assert rows.shape == (2, 5) and sorted(rows[0].tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(MultiVectorError, match="dimensions"):
        loaded.search(unit(rng, 1, 2, 3), 5)
    with pytest.raises(MultiVectorError, match="k must be"):
        loaded.search(unit(rng, 1, 2, 4), 0)
    with pytest.raises(MultiVectorError, match="NaN"):
        loaded.search(np.full((1, 2, 4), np.nan, dtype=np.float32), 5)


@pytest.fixture(scope="module")
def random_pvse(tmp_path_factory, small_shapes) -> Path:
    """A pvse model dir (K = 2, D = 8, seeded random weights) with both ONNX encoders."""
    out = tmp_path_factory.mktemp("pvse-model") / "random-pvse"
    out.mkdir()
    tokenizer = Tokenizer.build(c.text for c in load_dataset(small_shapes).captions)
    config = ModelConfig(model_type="pvse", embed_dim=8, num_embeds=2, vocab_size=len(tokenizer))
    torch.manual_seed(0)
    model = PvseModel(config).eval()
    config.save(out)
    tokenizer.save(out / VOCAB_FILE)
    export_encoders(model, out, verify=False)
    return out


def test_reindexed_pvse_gallery_searches_exactly_by_best_pair(
    tmp_path, small_shapes, random_pvse
) -> None:
    job = ReindexJob(
        modality="text", source=small_shapes, model_dir=random_pvse, index_root=tmp_path,
        chunk_items=64, progress=False,
    )  # fmt: skip
    result = run_reindex(job)
    version = open_version(result.path, verify=True)
    assert version.multivector is not None and version.multivector.per_item == 2
    encoder = OnnxEncoder(random_pvse, "text")
    texts = [c.text for c in load_dataset(small_shapes).captions]
    gallery = encoder.encode_texts(texts).embeddings  # (N, 2, 8), in gallery row order
    np.testing.assert_allclose(version.multivector.embeddings, gallery, atol=1e-6)
    queries = encoder.encode_texts(["a red circle", "two blue squares", "green"]).embeddings
    for k in (10, 100):
        scores, rows = version.multivector.search(queries, k)
        np.testing.assert_allclose(scores, brute_force(queries, gallery, k), atol=1e-5)
        ids = [m["id"] for m in version.metadata(rows[0].tolist())]
        assert len(set(ids)) == k
