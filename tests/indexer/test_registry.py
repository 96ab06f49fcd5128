"""Active-version registry with a real Redis: activation (key, pointer file, event), the
fallback to the pointer file when Redis is absent, the publish lock, rollback and gc."""

import json
import socket
import time

import pytest
import redis

from indexer.active_record import ActiveRecord
from indexer.publish import publish_version
from indexer.registry import (
    ActiveRegistry,
    PublishLockedError,
    RedisUnreachableError,
    RegistryError,
    VersionNotFoundError,
    active_key,
    publish_lock_key,
)
from tests.indexer.synthetic import (
    clustered_gaussians,
    publish_synthetic,
    write_synthetic_version,
)


@pytest.fixture
def closed_port_url() -> str:
    """A Redis URL on a port nobody listens on (Redis "down")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def next_message(pubsub: redis.client.PubSub, timeout: float = 5.0) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message is not None:
            return message
    return None


def test_activate_sets_redis_pointer_file_and_publishes_event(tmp_path, redis_url) -> None:
    registry = ActiveRegistry(tmp_path, redis_url)
    publish_synthetic(registry, "image", "20240101T000000000Z-aaaa")
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(registry.events_channel)
    next_message(pubsub, timeout=0.5)
    assert registry.activate("image", "20240101T000000000Z-aaaa") == ActiveRecord(
        "20240101T000000000Z-aaaa", 1
    )
    record = {"version": "20240101T000000000Z-aaaa", "generation": 1}
    assert json.loads(client.get(active_key(registry.namespace, "image"))) == record
    assert json.loads((tmp_path / "image" / "ACTIVE").read_text()) == record
    message = next_message(pubsub)
    assert message is not None and json.loads(message["data"]) == {
        "event": "activated",
        "modality": "image",
        **record,
    }
    assert registry.active_version("image") == "20240101T000000000Z-aaaa"
    assert registry.active_version("text") is None
    with pytest.raises(VersionNotFoundError, match="no complete image version 'nope'"):
        registry.activate("image", "nope")
    with pytest.raises(RegistryError, match="unknown modality"):
        registry.activate("audio", "x")


def test_without_redis_the_pointer_file_is_the_truth(
    tmp_path, redis_url, closed_port_url, caplog
) -> None:
    up = ActiveRegistry(tmp_path, redis_url)
    publish_synthetic(up, "text", "v1")
    publish_synthetic(up, "text", "v2", seed=1)
    up.activate("text", "v1")
    down = ActiveRegistry(tmp_path, closed_port_url)
    assert down.active_version("text") == "v1"
    assert "Redis unreachable" in caplog.text
    with pytest.raises(RedisUnreachableError, match=r"active in the ACTIVE file \(generation 2\)"):
        down.activate("text", "v2")  # the file takes it; the exit says Redis did not
    assert ActiveRegistry(tmp_path, None).active_version("text") == "v2"
    # Redis still says v1, at an older generation: readers follow the file and repair Redis
    assert up.sides("text").disagreement() == (
        "the ACTIVE file says v2 (generation 2), Redis says v1 (generation 1)"
    )
    assert up.active_version("text") == "v2"
    assert up.sides("text").disagreement() is None


def test_publish_lock_lets_one_job_publish_at_a_time(tmp_path, redis_url) -> None:
    registry = ActiveRegistry(tmp_path, redis_url)
    tmp_dir = tmp_path / "text" / ".tmp-v1"  # a finished build waiting to be published
    mu, logvar = clustered_gaussians(100, 8, clusters=5)
    write_synthetic_version(tmp_dir, mu, logvar)
    other_job = ActiveRegistry(tmp_path, redis_url)
    # another host holds the Redis lock: this job fails at once with a clear message
    key = publish_lock_key(registry.namespace, "text")
    lock = redis.Redis.from_url(redis_url).lock(key, timeout=30)
    assert lock.acquire(blocking=False)
    with pytest.raises(PublishLockedError, match="another job is publishing a text version"):
        publish_version(tmp_dir, other_job, "text", "v1", activate=True)
    assert registry.active_version("text") is None and not (tmp_path / "text" / "v1").exists()
    lock.release()
    # another job on this host holds the local lock (also covers running without Redis)
    with registry.publish_lock("text"), pytest.raises(PublishLockedError):
        publish_version(tmp_dir, ActiveRegistry(tmp_path, None), "text", "v1", activate=True)
    # free: publishing renames into place and activates
    path = publish_version(tmp_dir, other_job, "text", "v1", activate=True)
    assert path == tmp_path / "text" / "v1" and not tmp_dir.exists()
    assert registry.active_version("text") == "v1"


def test_rollback_and_gc_never_touch_the_active_version(tmp_path, redis_url) -> None:
    registry = ActiveRegistry(tmp_path, redis_url)
    names = [f"2024010{i}T000000000Z-abcd" for i in range(1, 6)]
    for i, name in enumerate(names):
        publish_synthetic(registry, "image", name, n=50, seed=i)
    (tmp_path / "image" / ".tmp-half-written").mkdir()  # never listed as a version
    assert registry.versions("image") == names
    registry.activate("image", names[1])
    assert registry.rollback("image") == names[0]
    with pytest.raises(VersionNotFoundError, match="older than"):
        registry.rollback("image")
    removed = registry.gc("image", keep=2)
    assert removed == names[1:3]  # names[0] is active, names[3:] are the newest two
    assert registry.versions("image") == [names[0], *names[3:]]
    assert registry.active_version("image") == names[0]
