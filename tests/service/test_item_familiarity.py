"""Pictures of the gallery that the familiarity gate would refuse as queries (issue 42): every
image result says whether it is past the gate the caption gallery's calibration sets, and a
reindex of the pictures counts them. The gate here is set by hand on the log-det, at the median
of the gallery's pictures, so about half are past it; each verdict is checked against the
result's own log-det."""

import dataclasses

import httpx
import numpy as np
from selenium.webdriver.common.by import By

from indexer.manifest import Calibration, read_manifest, write_manifest
from indexer.registry import ActiveRegistry
from tests.service.conftest import (
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    probsearch,
)
from tests.service.test_search_page_browser import browser, search_caption, wait  # noqa: F401


def gate_the_caption_gallery(root, limit: float) -> None:
    registry = ActiveRegistry(root, None)
    path = registry.version_path("text", registry.active_version("text"))
    manifest = read_manifest(path)
    gated = {m: Calibration(gate_score="log_det", gate_limit=limit) for m in manifest.metrics}
    write_manifest(path, dataclasses.replace(manifest, calibration=gated))


def midway_limit(root) -> float:
    """Halfway between the two middle pictures' log-dets: no picture sits on the limit."""
    values = np.sort(picture_log_dets(root))
    return float(values[len(values) // 2 - 1] + values[len(values) // 2]) / 2


def picture_log_dets(root) -> np.ndarray:
    registry = ActiveRegistry(root, None)
    path = registry.version_path("image", registry.active_version("image"))
    return np.load(path / "logvar.npy").astype(np.float64).sum(1)


def test_image_results_say_whether_the_gate_would_refuse_them(
    artifacts: Artifacts,
    tmp_path,
    browser,  # noqa: F811
) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    limit = midway_limit(root)
    gate_the_caption_gallery(root, limit)
    dim = read_manifest(root / "text" / ActiveRegistry(root, None).active_version("text")).dim
    settings = make_settings(artifacts, index_root=root)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        hits = http.post("/search/text", json={"text": "a red circle", "k": 50}).json()
        zero = [0.0] * dim
        request = {"mu": zero, "logvar": zero, "gallery": "text", "k": 3}
        captions = http.post("/search/embedding", json=request).json()
        # the page marks the same pictures
        browser.get(f"{server.url}/")
        wait(browser, lambda b: "Model " in b.find_element(By.ID, "footer-info").text)
        cards = search_caption(browser, "a red circle")
        marked = [bool(c.find_elements(By.CLASS_NAME, "item-unfamiliar")) for c in cards]
        first_ten = http.post("/search/text", json={"text": "a red circle", "k": 10}).json()
    assert marked == [hit["unfamiliar"] for hit in first_ten["results"]]
    flags = [hit["unfamiliar"] for hit in hits["results"]]
    assert flags == [hit["log_det"] > limit for hit in hits["results"]]
    assert any(flags) and not all(flags)
    # caption results are never judged by the picture gate
    assert {hit["unfamiliar"] for hit in captions["results"]} == {None}


def test_without_a_gate_no_picture_is_judged(client: httpx.Client) -> None:
    hits = client.post("/search/text", json={"text": "a red circle", "k": 5}).json()["results"]
    assert {hit["unfamiliar"] for hit in hits} == {None}


def test_a_reindex_of_pictures_counts_those_past_the_gate(artifacts: Artifacts, tmp_path) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    limit = midway_limit(root)
    gate_the_caption_gallery(root, limit)
    out = probsearch(
        "reindex", "--modality", "image", "--source", artifacts.shapes, "--model",
        artifacts.model, "--index-root", root, "--index-type", "flat", "--activate",
    )  # fmt: skip
    past = int((picture_log_dets(root) > limit).sum())
    assert f"warning: {past} of {len(picture_log_dets(root))} pictures look unlike" in out
