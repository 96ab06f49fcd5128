"""One list of metrics (issue 42.3): what GET /v1/config advertises, what the served OpenAPI
schema allows, what every search route accepts and what its refusals list are the same set,
on a real server whose versions have no calibration and on one where they have some."""

import re
from collections.abc import Callable, Iterator
from dataclasses import replace

import httpx
import pytest

from indexer.manifest import read_manifest
from indexer.registry import ActiveRegistry
from indexer.version_writer import update_calibration
from models.distance.gaussian import METRICS
from service.http.schemas import SearchOptions
from tests.service.conftest import Artifacts, ServerThread, copy_index_root, make_settings

ASKED = [*METRICS, "elk", "cosine", "mahalanobis", "max_pair"]
DIM = 32  # the session model's embedding dimension
SERVED = re.compile(r"; served: (.*)$")


@pytest.fixture(scope="module")
def partly_calibrated(
    artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    """Both galleries indexed for w2, kl, kl_reverse and min_kl, calibrated for w2 and min_kl
    only (as a reindex that inherited some metrics' calibration leaves them)."""
    root = copy_index_root(artifacts, tmp_path_factory.mktemp("partly") / "indexes")
    registry = ActiveRegistry(root, None)
    for modality in ("image", "text"):
        version_dir = registry.version_path(modality, registry.active_version(modality))
        manifest = read_manifest(version_dir)
        update_calibration(
            version_dir,
            {m: replace(manifest.calibration[m], threshold=1e9) for m in ("w2", "min_kl")},
        )
    with ServerThread(make_settings(artifacts, index_root=root)) as running:
        yield running


def searches(metric: str, image: bytes) -> dict[str, Callable]:
    """One request per route (and per gallery for /search/embedding) naming `metric`."""
    options = {"metric": metric, "k": 3, "mc_samples": 0}
    embedding = {"mu": [0.0] * DIM, "logvar": [0.0] * DIM, **options}
    return {
        "text": lambda c: c.post("/search/text", json={"text": "a red circle", **options}),
        "image form": lambda c: c.post(
            "/search/image",
            files={"image": ("s.png", image, "image/png")},
            data={"metric": metric, "k": "3", "mc_samples": "0"},
        ),
        "embedding image": lambda c: c.post(
            "/search/embedding", json={**embedding, "gallery": "image"}
        ),
        "embedding text": lambda c: c.post(
            "/search/embedding", json={**embedding, "gallery": "text"}
        ),
    }


def check_one_list(client: httpx.Client, image: bytes) -> list[str]:
    config = client.get("/v1/config").json()
    advertised = config["metrics"]
    assert advertised, config
    for gallery in config["galleries"].values():
        assert gallery["metrics"] == advertised  # both galleries serve the same here
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    props = schema["EmbeddingSearchRequest"]["properties"]["metric"]
    assert next(b["enum"] for b in props["anyOf"] if b.get("type") == "string") == advertised
    assert "GET /v1/config's `metrics`" in props["description"]
    for metric in ASKED:
        for route, send in searches(metric, image).items():
            response = send(client)
            where = (metric, route, response.text[:300])
            if metric in advertised:
                assert response.status_code == 200, where
                assert response.json()["metric"] == metric, where
                continue
            assert response.status_code == 422, where
            body = response.json()
            assert body["error"] == "invalid_query", where
            served = SERVED.search(body["detail"])
            assert served is not None, where
            assert served.group(1).split(", ") == advertised, where
    return advertised


def test_without_calibration_every_indexed_metric_and_no_other_is_served(
    client: httpx.Client, artifacts: Artifacts
) -> None:
    image = next((artifacts.shapes / "images").glob("*.png")).read_bytes()
    assert check_one_list(client, image) == ["w2", "kl", "kl_reverse", "min_kl"]
    # elk has no index of its own and was re-ranked from w2 before; these versions were not
    # built for it, and its distances were never calibrated.
    refused = client.post("/search/text", json={"text": "a red circle", "metric": "elk"})
    assert "metric 'elk' is not indexed by the active image version" in refused.text
    unknown = client.post("/search/text", json={"text": "a red circle", "metric": "cosine"})
    served = "w2, kl, kl_reverse, min_kl"
    assert unknown.json()["detail"] == f"unknown metric 'cosine'; served: {served}"


def test_once_calibrated_only_the_calibrated_metrics_are_served(
    partly_calibrated: ServerThread, artifacts: Artifacts
) -> None:
    image = next((artifacts.shapes / "images").glob("*.png")).read_bytes()
    with httpx.Client(base_url=partly_calibrated.url, timeout=30) as client:
        assert check_one_list(client, image) == ["w2", "min_kl"]
        refused = client.post("/search/text", json={"text": "a circle", "metric": "kl"}).json()
    assert "metric 'kl' is not calibrated in the active image version" in refused["detail"]
    assert "probsearch calibrate --gallery image --metrics kl" in refused["detail"]


def test_the_request_model_names_no_metric_list_of_its_own() -> None:
    """Only the loaded versions decide: the request model takes any name (Searcher.params
    refuses the others), and the served schema gets its enum from them."""
    metric = SearchOptions.model_json_schema()["properties"]["metric"]
    assert all("enum" not in branch for branch in metric["anyOf"])
