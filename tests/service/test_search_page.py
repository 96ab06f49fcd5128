"""GET / and its static files (shipped in the package, nothing from another origin) and
GET /v1/config, checked against the model and the index files themselves."""

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx
import numpy as np
import pytest

from indexer.store import open_version
from models.networks.model_config import ModelConfig
from service.gallery_stats import log_det_range
from tests.service.conftest import Artifacts

STATIC = Path(__file__).parents[2] / "service" / "http" / "static"
ROOT = Path(__file__).parents[2]
# A reference to another origin: scheme-relative or absolute URLs with a host name.
FOREIGN_URL = re.compile(r"(?:https?:)?//[a-z0-9-]+(?:\.[a-z0-9-]+)+", re.IGNORECASE)
SVG_NAMESPACE = 'xmlns="http://www.w3.org/2000/svg"'


def test_the_page_is_html_that_may_only_load_from_this_service(client: httpx.Client) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    policy = response.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "img-src 'self' blob:" in policy
    html = response.text
    for asset in ("/static/page.css", "/static/page.js", "/static/favicon.svg"):
        assert f'"{asset}"' in html


@pytest.mark.parametrize(
    ("name", "media_type"),
    [("page.css", "text/css"), ("page.js", "javascript"), ("favicon.svg", "image/svg+xml")],
)
def test_static_files_are_served_with_their_types(
    client: httpx.Client, name: str, media_type: str
) -> None:
    response = client.get(f"/static/{name}")
    assert response.status_code == 200
    assert media_type in response.headers["content-type"]
    assert response.content == (STATIC / name).read_bytes()


def test_no_static_file_names_another_origin() -> None:
    files = sorted(STATIC.iterdir())
    assert {f.name for f in files} >= {"index.html", "page.css", "page.js", "favicon.svg"}
    for path in files:
        text = path.read_text(encoding="utf-8").replace(SVG_NAMESPACE, "")
        assert not FOREIGN_URL.search(text), f"{path.name}: {FOREIGN_URL.search(text)}"
        assert "@import" not in text and "@font-face" not in text, path.name


def test_every_static_file_is_package_data() -> None:
    # Non-editable installs (the Docker images) ship only what package-data names.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["service.http"]
    for path in STATIC.rglob("*"):
        relative = path.relative_to(STATIC.parent).as_posix()
        if path.is_file():
            assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative


def test_config_has_the_service_defaults_and_the_galleries_log_det_range(
    client: httpx.Client, artifacts: Artifacts
) -> None:
    response = client.get("/v1/config")
    assert response.status_code == 200, response.text
    config = response.json()
    model = ModelConfig.load(artifacts.model)
    assert config["model"] == model.name
    assert config["default_metric"] == model.default_metric("image")
    assert config["default_metrics"] == {g: model.default_metric(g) for g in ("image", "text")}
    assert set(config["default_metrics"].values()) <= set(config["metrics"])
    assert (config["default_k"], config["max_k"], config["max_text_chars"]) == (10, 1000, 500)
    expected_versions = {"image": artifacts.image_v1, "text": artifacts.text_v1}
    assert {g: s["version"] for g, s in config["galleries"].items()} == expected_versions
    for gallery, version in expected_versions.items():
        logvar = np.load(artifacts.index_root / gallery / version / "logvar.npy")  # (N, D)
        log_dets = logvar.astype(np.float64).sum(axis=1)  # not models.scoring.uncertainty's
        summary = config["galleries"][gallery]
        assert summary["count"] == summary["log_det_rows"] == len(logvar)
        assert summary["log_det_low"] == pytest.approx(log_dets.min(), rel=1e-5)
        assert summary["log_det_high"] == pytest.approx(log_dets.max(), rel=1e-5)
        assert summary["log_det_low"] < summary["log_det_high"]


def test_a_large_gallery_range_is_read_from_evenly_spaced_rows(artifacts: Artifacts) -> None:
    index = open_version(artifacts.index_root / "image" / artifacts.image_v1)
    try:
        full = log_det_range(index)
        sampled = log_det_range(index, max_rows=7)
        log_dets = np.asarray(index.logvar, np.float64).sum(axis=1)
    finally:
        index.close()
    assert (sampled.rows, sampled.count) == (7, full.count)
    rows = np.linspace(0, full.count - 1, 7).astype(np.int64)
    assert sampled.low == pytest.approx(log_dets[rows].min(), rel=1e-5)
    assert sampled.high == pytest.approx(log_dets[rows].max(), rel=1e-5)
    assert full.low <= sampled.low <= sampled.high <= full.high
