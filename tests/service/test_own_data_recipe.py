"""README's "Search your own pictures" recipe, run exactly as written (its fenced block, in
bash) from a checkout whose demo is being served: it must switch the running service to the
user's pictures and captions with no extra flag or variable, and a person on the search page
must then find their own pictures."""

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from pytest_redis.executor.process import RedisExecutor
from selenium.webdriver.common.by import By

from indexer.registry import ActiveRegistry
from models.datasets.records import load_dataset
from tests.service.conftest import (
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    probsearch,
    redis_url_of,
    wait_for,
)
from tests.service.test_search_page_browser import browser, search_caption, wait  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
PICTURES = 12


def readme_recipe() -> str:
    """The bash block under README's "## Search your own pictures" heading."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Search your own pictures", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "README.md's 'Search your own pictures' section has no ```bash block"
    return match.group(1)


@dataclass
class Trip:
    server: ServerThread
    before: dict[str, str | None]
    after: dict[str, str | None]
    output: str
    picture_ids: set[str]
    caption: str


@pytest.fixture(scope="module")
def trip(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Trip]:
    """A checkout with the demo's cache (the session's model and indexes), a home with
    ~/Pictures and a captions file; the service runs on it while the recipe runs."""
    checkout = tmp_path_factory.mktemp("checkout")
    demo = checkout / ".cache" / "demo"
    demo.mkdir(parents=True)
    (demo / "model").symlink_to(artifacts.model)
    root = copy_index_root(artifacts, demo / "indexes")
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    home = checkout / "home"
    pictures = home / "Pictures"
    (pictures / "holiday").mkdir(parents=True)
    dataset = load_dataset(artifacts.shapes, "test")
    for i, image in enumerate(dataset.images[:PICTURES]):
        folder = pictures / "holiday" if i % 2 else pictures
        shutil.copy(image.path, folder / f"mine-{i:02d}.png")
    captions = [
        {"id": f"my-caption-{i}", "text": c.text} for i, c in enumerate(dataset.captions[:8])
    ]
    (checkout / "my-captions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in captions))
    probsearch(
        "calibrate", "--data", artifacts.shapes, "--index-root", root, "--model", artifacts.model,
        "--target-coverage", "0.8", "--mc-samples", "8", "--metrics", "w2",
    )  # fmt: skip
    url = redis_url_of(service_redis, 4)
    redis.Redis.from_url(url).flushdb()
    settings = make_settings(artifacts, index_root=root, redis_url=url, poll_interval_s=1.0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBSEARCH_")}
    env["HOME"] = str(home)
    with ServerThread(settings) as server:
        before = server.services.holder.versions()
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", readme_recipe()],
            cwd=checkout, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        registry = ActiveRegistry(root, None)
        target = {m: registry.active_version(m) for m in ("image", "text")}
        wait_for(lambda: server.services.holder.versions() == target, 15, "the switch")
        ids = {f"mine-{i:02d}.png" if i % 2 == 0 else f"holiday/mine-{i:02d}.png"
               for i in range(PICTURES)}  # fmt: skip
        yield Trip(server, before, target, done.stdout, ids, captions[0]["text"])


def test_the_recipe_switches_the_running_service_to_your_gallery(trip: Trip) -> None:
    assert trip.after["image"] != trip.before["image"]
    assert trip.after["text"] != trip.before["text"]
    listed = [line for line in trip.output.splitlines() if line.startswith("* ")]
    assert listed and trip.after["image"] in listed[0], trip.output
    with httpx.Client(base_url=trip.server.url, timeout=30) as http:
        body = http.post("/search/text", json={"text": trip.caption, "k": 5}).json()
        assert body["index_version"] == trip.after["image"]
        assert {hit["id"] for hit in body["results"]} <= trip.picture_ids
        assert len(body["results"]) == 5
        # the demo's metrics came along and its calibration was carried over
        config = http.get("/v1/config").json()
        indexes = {i["modality"]: i for i in http.get("/v1/indexes").json()["indexes"]}
        assert set(indexes["image"]["metrics"]) >= {config["default_metric"]}
        assert "w2" not in indexes["image"]["uncalibrated_metrics"]


def test_the_search_page_finds_your_pictures(trip: Trip, browser) -> None:  # noqa: F811
    browser.get(f"{trip.server.url}/")
    wait(browser, lambda b: "Model " in b.find_element(By.ID, "footer-info").text)
    shown = search_caption(browser, trip.caption)
    assert {card.get_attribute("data-id") for card in shown} <= trip.picture_ids
    thumbnail = shown[0].find_element(By.TAG_NAME, "img")
    wait(browser, lambda b: b.execute_script("return arguments[0].naturalWidth", thumbnail) > 0)
