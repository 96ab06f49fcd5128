"""Two galleries served from one Redis (issue 43.4): a staging and a live index root that hold
versions of the same names, each served by its own server, keep their own active versions,
calibrations and cached answers, because every key is scoped by the root's namespace."""

import httpx
import redis
from pytest_redis.executor.process import RedisExecutor

from indexer.manifest import Calibration
from indexer.registry import ActiveRegistry
from indexer.version_writer import update_calibration
from tests.service.conftest import (
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    redis_url_of,
)

REQUEST = {"text": "a red circle", "k": 3, "metric": "w2"}


def test_two_index_roots_on_one_redis_keep_versions_calibrations_and_caches_apart(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path
) -> None:
    url = redis_url_of(service_redis, 6)
    redis.Redis.from_url(url).flushdb()
    staging = copy_index_root(artifacts, tmp_path / "staging")
    live = copy_index_root(artifacts, tmp_path / "live")
    # same version names in both roots; only live's image version is calibrated to refuse all
    update_calibration(live / "image" / artifacts.image_v1, {"w2": Calibration(1.0, -1e9)})
    ActiveRegistry(staging, url).activate("image", artifacts.image_v2)
    ActiveRegistry(live, url).activate("image", artifacts.image_v1)

    def serve(root) -> ServerThread:
        return ServerThread(make_settings(artifacts, index_root=root, redis_url=url))

    with serve(staging) as first, serve(live) as second:
        a = httpx.Client(base_url=first.url, timeout=30)
        b = httpx.Client(base_url=second.url, timeout=30)
        assert first.services.holder.versions()["image"] == artifacts.image_v2
        assert second.services.holder.versions()["image"] == artifacts.image_v1
        a.post("/search/text", json=REQUEST)
        staged = a.post("/search/text", json=REQUEST)
        live_first = b.post("/search/text", json=REQUEST)
        live_again = b.post("/search/text", json=REQUEST)
        # staging activates v1 too: same version name as live's, still its own cache
        ActiveRegistry(staging, url).activate("image", artifacts.image_v1)
        first.services.holder.refresh(["image"])
        staged_v1 = a.post("/search/text", json=REQUEST)
        a.close()
        b.close()
    assert staged.headers["x-cache"] == "hit" and staged.json()["query"]["rejected"] is False
    assert live_first.headers["x-cache"] == "miss"  # not staging's answer
    assert live_first.json()["query"]["rejected"] is True  # live's own calibration
    assert live_again.headers["x-cache"] == "hit"
    assert staged_v1.json()["index_version"] == artifacts.image_v1
    assert staged_v1.headers["x-cache"] == "miss"  # live's cached v1 answer is not staging's
    assert staged_v1.json()["query"]["rejected"] is False
