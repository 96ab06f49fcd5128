"""A reindex + activate under load keeps rejecting at the calibrated threshold; a version
without calibration is never silent."""

import logging
import threading
from pathlib import Path

import httpx
import numpy as np
import redis
from pytest_redis.executor.process import RedisExecutor

from indexer.manifest import Calibration, read_manifest
from indexer.registry import ActiveRegistry
from indexer.version_writer import update_calibration
from service.index_holder import IndexHolder
from service.metrics import ServiceMetrics
from tests.service.conftest import (
    METRICS,
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    probsearch,
    redis_url_of,
)
from tests.service.test_resilience import wait_for

TEXTS = [
    f"{size} {color} {shape}"
    for size in ("a small", "a large", "two")
    for color in ("red", "green", "blue")
    for shape in ("circle", "square", "star")
]
TEMPERATURE = 0.1


def median_mi(artifacts: Artifacts, root: Path) -> float:
    """The median MI of TEXTS at TEMPERATURE: a threshold that rejects about half of them."""
    settings = make_settings(artifacts, index_root=root, galleries=["image"])
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        answers = [http.post("/search/text", json={"text": t, "temperature": TEMPERATURE})
                   for t in TEXTS]  # fmt: skip
    return float(np.median([a.json()["query"]["mutual_information"] for a in answers]))


def test_reindex_and_activate_under_load_keeps_rejecting_at_the_calibrated_threshold(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path: Path
) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    v1 = artifacts.image_v1
    tau = median_mi(artifacts, root)
    calibration = {"w2": Calibration(TEMPERATURE, tau), "kl": Calibration(0.3, 1.0),
                   "min_kl": Calibration(1.0, 2.0)}  # fmt: skip
    update_calibration(root / "image" / v1, calibration)
    url = redis_url_of(service_redis, 3)
    redis.Redis.from_url(url).flushdb()
    # A long poll interval: the new version must arrive through the activation event.
    settings = make_settings(artifacts, index_root=root, redis_url=url, galleries=["image"],
                             poll_interval_s=60)  # fmt: skip
    answers: list[httpx.Response] = []
    stop = threading.Event()

    def load(offset: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for i in range(offset, 100_000):
                if stop.is_set():
                    return
                answers.append(
                    http.post(
                        "/search/text",
                        json={"text": TEXTS[i % len(TEXTS)], "k": 1 + i // len(TEXTS) % 5},
                    )
                )

    with ServerThread(settings) as server:
        threads = [threading.Thread(target=load, args=(offset,)) for offset in (0, 13)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(answers) >= 10, 60, "answers before the reindex")
            out = probsearch(
                "reindex",
                "--modality",
                "image",
                "--source",
                artifacts.shapes,
                "--model",
                artifacts.model,
                "--index-root",
                root,
                "--metrics",
                METRICS,
                "--index-type",
                "flat",
                "--activate",
                "--redis-url",
                url,
            )
            (v2,) = set(ActiveRegistry(root, None).versions("image")) - {v1, artifacts.image_v2}
            wait_for(
                lambda: any(a.json()["index_version"] == v2 for a in answers[-4:]),
                20,
                "answers from the new version",
            )
            count = len(answers)
            wait_for(lambda: len(answers) >= count + 2 * len(TEXTS), 60, "answers after the swap")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)

    assert f"calibration: inherited calibration of w2, kl, min_kl from {v1}" in out
    manifest = read_manifest(root / "image" / v2)
    assert manifest.calibration == read_manifest(root / "image" / v1).calibration
    assert manifest.calibration_inherited_from == v1
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers[:3]]
    bodies = [a.json() for a in answers]
    assert {b["index_version"] for b in bodies} == {v1, v2}
    for version in (v1, v2):
        queries = [b["query"] for b in bodies if b["index_version"] == version]
        assert all(q["reject_threshold"] == tau and q["temperature"] == TEMPERATURE
                   for q in queries)  # fmt: skip
        assert all(q["rejected"] == (q["mutual_information"] > tau) for q in queries)
        rejected = np.mean([q["rejected"] for q in queries])
        assert 0.2 < rejected < 0.8, f"{version} rejected {rejected:.0%}"


def test_uncalibrated_versions_show_in_readyz_indexes_and_the_log(
    client: httpx.Client, artifacts: Artifacts, caplog
) -> None:
    ready = client.get("/readyz").json()
    assert ready["ready"]
    assert f"warning: the image index {artifacts.image_v1} has no calibration" in ready["detail"]
    for info in client.get("/v1/indexes").json()["indexes"]:
        assert info["uncalibrated_metrics"] == info["metrics"]
        assert "run `probsearch calibrate`" in info["calibration_warning"]
    holder = IndexHolder(artifacts.index_root, ["text"], None, ServiceMetrics())
    with caplog.at_level(logging.WARNING, logger="service.index_holder"):
        holder.start()
        holder.stop()
    assert f"the text index {artifacts.text_v1} has no calibration" in caplog.text
