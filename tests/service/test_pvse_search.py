"""A pvse model end to end, on the small trunks and on the pretrained backbones (K heads of
the vector): `probsearch train --model-type pvse`, `reindex`, then the running service's top-10
against a brute-force best-pair ranking of the whole gallery, for captions and, on backbones,
for a caption's backbone vector sent to /search/embedding."""

import json
import os
import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest

from indexer.registry import ActiveRegistry
from models.backbones.registry import load_backbone
from models.datasets.shapes import generate_shapes
from models.onnx.encoder_runtime import OnnxEncoder
from models.settings import Settings
from tests.service.conftest import ServerThread, probsearch

# The console script imports this checkout (a git worktree may differ from the installed one).
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
QUERIES = ("a red circle", "two blue squares", "a small green triangle")
TRUNKS = {
    "small": (),
    "backbones": ("--image-backbone", "efficientnet-lite0", "--text-backbone", "all-minilm-l6-v2",
                  "--embed-dim", "16", "--head-hidden", "32", "--dropout", "0.2"),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(TRUNKS))
def pvse_server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"pvse-service-{request.param}")
    shapes, model, index_root = root / "shapes", root / "model", root / "indexes"
    generate_shapes(shapes, num_images=120, seed=0, workers=1, progress=False)
    probsearch("train", "--data", shapes, "--out", model, "--model-type", "pvse",
               "--num-embeds", "2", "--epochs", "1", "--no-progress", *TRUNKS[request.param],
               env=ENV)  # fmt: skip
    for modality in ("image", "text"):
        probsearch("reindex", "--modality", modality, "--source", shapes, "--model", model,
                   "--index-root", index_root, "--metrics", "w2", "--index-type", "flat",
                   "--activate", env=ENV)  # fmt: skip
    settings = Settings(index_root=index_root, model=model, device="cpu", mc_samples=4)
    with ServerThread(settings) as running:
        yield running, model, index_root


def brute_force_top10(model, index_root, text: str) -> list[str]:
    """Best-pair cosine of the query's K vectors to every gallery item's, by plain numpy."""
    query = OnnxEncoder(model, "text").encode_texts([text]).embeddings[0]  # (K, D)
    return brute_force_top10_of(index_root, query)


def brute_force_top10_of(index_root, query: np.ndarray) -> list[str]:
    """The image gallery's top 10 by best-pair cosine to the query's K vectors (K, D)."""
    version = index_root / "image" / ActiveRegistry(index_root, None).versions("image")[0]
    gallery = np.load(version / "embeddings.npy")  # (N, K, D)
    assert gallery.shape[1:] == query.shape
    scores = np.array([max(float(x @ y) for x in query for y in item) for item in gallery])
    with sqlite3.connect(version / "metadata.sqlite") as db:
        ids = dict(db.execute("select row, id from items"))
    return [str(ids[int(row)]) for row in np.argsort(-scores, kind="stable")[:10]]


def test_text_search_top10_is_the_brute_force_best_pair_ranking(pvse_server) -> None:
    server, model, index_root = pvse_server
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for text in QUERIES:
            response = client.post("/search/text", json={"text": text, "k": 10, "mc_samples": 4})
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["metric"] == "max_pair"
            assert [r["id"] for r in body["results"]] == brute_force_top10(model, index_root, text)
            distances = [r["distance"] for r in body["results"]]
            assert distances == sorted(distances)
            assert body["query"]["mutual_information"] is not None
            assert all(np.isfinite(r["log_det"]) for r in body["results"])


def test_image_search_and_bad_metric_requests(pvse_server) -> None:
    server, _, index_root = pvse_server
    with httpx.Client(base_url=server.url, timeout=60) as client:
        images = sorted((index_root.parent / "shapes" / "images").iterdir())
        png = images[0].read_bytes()
        response = client.post("/search/image", files={"image": ("a.png", png, "image/png")})
        assert response.status_code == 200, response.text
        assert response.json()["metric"] == "max_pair" and len(response.json()["results"]) == 10
        mu = json.loads(client.post(
            "/search/text", json={"text": "a red circle", "return_embedding": True}
        ).text)["query"]  # fmt: skip
        bad = client.post(
            "/search/embedding",
            json={"mu": mu["mu"], "logvar": mu["logvar"], "gallery": "image", "metric": "max_pair"},
        )
        assert bad.status_code in (400, 422) and "pvse" in bad.text


def test_a_backbone_vector_query_top10_is_the_brute_force_best_pair_ranking(pvse_server) -> None:
    """On backbones, a caption's backbone vector is embedded by the text heads alone (K vectors
    and MC draws), searched by max_pair exactly, and answered as the caption itself is."""
    server, model, index_root = pvse_server
    if not json.loads((model / "model.json").read_text())["text_backbone"]:  # small trunks
        with httpx.Client(base_url=server.url, timeout=60) as client:
            body = {"features": [0.1] * 384, "gallery": "image", "metric": "max_pair"}
            refused = client.post("/search/embedding", json=body)
        assert refused.status_code in (400, 422), refused.text
        return

    backbone = load_backbone("all-minilm-l6-v2", "text")
    heads = OnnxEncoder(model, "text", heads_only=True)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for text in QUERIES:
            vector = backbone.encode([text])  # (1, F)
            query = heads.encode_features(vector).embeddings[0]  # (K, D)
            response = client.post("/search/embedding", json={
                "features": vector[0].tolist(), "gallery": "image", "k": 10, "mc_samples": 4,
                "metric": "max_pair",
            })  # fmt: skip
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["metric"] == "max_pair"
            ids = [r["id"] for r in body["results"]]
            assert ids == brute_force_top10_of(index_root, query)
            assert ids == brute_force_top10(model, index_root, text)
            assert body["query"]["mutual_information"] is not None
