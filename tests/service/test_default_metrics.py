"""A model whose image queries default to a metric of their own (ModelConfig.image_query_metric):
the service ranks each gallery with its default when a query names no metric."""

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from models.networks.model_config import ModelConfig
from tests.service.conftest import Artifacts, ServerThread, brute_force, make_settings, reindex
from tests.service.test_search_e2e import png_bytes


@pytest.fixture(scope="module")
def kl_for_images(
    artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[httpx.Client, Path, dict[str, str]]]:
    """The session's model with image_query_metric kl, its own indexes, and a server."""
    root = tmp_path_factory.mktemp("image-query-metric")
    model = root / "model"
    shutil.copytree(artifacts.model, model)
    dataclasses.replace(ModelConfig.load(model), image_query_metric="kl").save(model)
    versions = {
        g: reindex(root, artifacts.shapes, model, g, activate=True) for g in ("image", "text")
    }
    settings = make_settings(artifacts, index_root=root / "indexes", model=model, redis_url=None)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield http, root / "indexes", versions


def test_each_gallery_is_ranked_with_its_default_metric(kl_for_images) -> None:
    client, index_root, versions = kl_for_images
    config = client.get("/v1/config").json()
    assert config["default_metrics"] == {"image": "w2", "text": "kl"}
    assert config["default_metric"] == "w2"

    image = client.post(
        "/search/image",
        files={"image": ("q.png", png_bytes("green"), "image/png")},
        data={"k": "5", "return_embedding": "true"},
    )
    assert image.status_code == 200, image.text
    body = image.json()
    assert body["metric"] == "kl"
    expected, _ = brute_force(
        index_root / "text" / versions["text"],
        "kl",
        body["query"]["mu"],
        body["query"]["logvar"],
        5,
    )
    assert [hit["id"] for hit in body["results"]] == expected

    text = client.post("/search/text", json={"text": "a red circle", "k": 5}).json()
    assert text["metric"] == "w2"
    embedding = {"mu": body["query"]["mu"], "logvar": body["query"]["logvar"], "k": 5}
    for gallery, metric in (("text", "kl"), ("image", "w2")):
        answer = client.post("/search/embedding", json={**embedding, "gallery": gallery})
        assert answer.status_code == 200, answer.text
        assert answer.json()["metric"] == metric
    named = client.post("/search/embedding", json={**embedding, "gallery": "text", "metric": "w2"})
    assert named.json()["metric"] == "w2"
