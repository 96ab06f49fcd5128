"""Items added and deleted on a running server without a rebuild (issue 43): through the
admin API, durable across a restart, exact against brute force over the live items, never
answered from the cache once deleted, and compacted into a new version under the server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import torch
from pytest_redis.executor.process import RedisExecutor

from indexer.store import open_version
from models.distance.gaussian import pairwise_distance
from tests.service.conftest import (
    ADMIN_KEY,
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    redis_url_of,
)

ADMIN = {"X-API-Key": ADMIN_KEY}


@pytest.fixture
def live_server(artifacts: Artifacts, service_redis: RedisExecutor, tmp_path):
    url = redis_url_of(service_redis, 7)
    redis.Redis.from_url(url).flushdb()
    root = copy_index_root(artifacts, tmp_path / "root")
    settings = make_settings(artifacts, index_root=root, redis_url=url, compact_at_rows=0)
    with ServerThread(settings) as running:
        yield running


def _row(artifacts: Artifacts, gallery: str, version: str, row: int) -> tuple[list, list, str]:
    found = open_version(artifacts.index_root / gallery / version)
    try:
        mu, logvar = found.mu[row].tolist(), found.logvar[row].tolist()
        return mu, logvar, found.metadata([row])[0]["id"]
    finally:
        found.close()


def _search(http: httpx.Client, gallery: str, mu, logvar, k: int = 5, metric: str = "w2"):
    body = {"gallery": gallery, "mu": mu, "logvar": logvar, "k": k, "metric": metric}
    response = http.post("/search/embedding", json=body)
    assert response.status_code == 200, response.text
    return response


def _count(server: ServerThread, gallery: str) -> int:
    with server.services.holder.acquire(gallery) as loaded:
        return loaded.index.count


def test_added_items_are_found_at_once_and_deleted_ones_never_again(
    live_server: ServerThread, artifacts: Artifacts
) -> None:
    mu, logvar, _ = _row(artifacts, "image", artifacts.image_v1, 7)
    far_mu = [m + 3.0 for m in mu]
    count = _count(live_server, "image")
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        before = _search(http, "image", far_mu, logvar)
        again = _search(http, "image", far_mu, logvar)
        assert again.headers["x-cache"] == "hit"
        item = {"id": "new-1", "gallery": "image", "mu": far_mu, "logvar": logvar,
                "metadata": {"shop": "north"}}  # fmt: skip
        added = http.post("/v1/items", json=item, headers=ADMIN)
        assert added.status_code == 200, added.text
        assert added.json()["live_items"] == count + 1 == _count(live_server, "image")
        found = _search(http, "image", far_mu, logvar)
        assert found.headers["x-cache"] == "miss"  # the write moved the cache key on
        top = found.json()["results"][0]
        assert top["id"] == "new-1" and top["distance"] == pytest.approx(0.0, abs=1e-3)
        assert top["metadata"]["extra"] == {"shop": "north"}
        for metric in ("w2", "kl", "min_kl"):
            got = [
                h["id"]
                for h in _search(http, "image", far_mu, logvar, 10, metric).json()["results"]
            ]
            want = _filtered_brute_force(live_server, "image", far_mu, logvar, metric, 10, None)
            assert got == want[0], metric
        deleted = http.delete("/v1/items/new-1", params={"gallery": "image"}, headers=ADMIN)
        assert deleted.status_code == 200, deleted.text
        after = _search(http, "image", far_mu, logvar)
        assert after.headers["x-cache"] == "miss"
        assert [h["id"] for h in after.json()["results"]] == [
            h["id"] for h in before.json()["results"]
        ]
        missing = http.delete("/v1/items/new-1", params={"gallery": "image"}, headers=ADMIN)
        assert missing.status_code == 404


def test_a_caption_added_by_text_is_embedded_as_the_reindex_embedded_it(
    live_server: ServerThread, artifacts: Artifacts
) -> None:
    mu, logvar, caption_id = _row(artifacts, "text", artifacts.text_v1, 3)
    with live_server.services.holder.acquire("text") as loaded:
        text = loaded.index.record(caption_id)["text"]
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        added = http.post("/v1/items", json={"id": "copy", "text": text}, headers=ADMIN)
        assert added.status_code == 200, added.text
        assert added.json()["gallery"] == "text"
        hits = _search(http, "text", mu, logvar, 3).json()["results"]
    by_id = {h["id"]: h for h in hits}
    assert "copy" in by_id and caption_id in by_id
    assert by_id["copy"]["distance"] == pytest.approx(by_id[caption_id]["distance"], abs=1e-4)
    assert by_id["copy"]["metadata"]["text"] == text


def test_writes_need_the_admin_key_and_bad_items_are_refused_clearly(
    live_server: ServerThread, artifacts: Artifacts
) -> None:
    mu, logvar, _ = _row(artifacts, "image", artifacts.image_v1, 0)
    cases = [
        ({"id": "x", "text": "a red circle", "mu": mu, "logvar": logvar}, "exactly one of"),
        ({"id": "x", "mu": mu, "logvar": logvar}, "needs `gallery`"),
        ({"id": "x", "text": "a star", "gallery": "image"}, "goes to the text gallery"),
        ({"id": "x", "gallery": "image", "mu": mu[:-1], "logvar": logvar[:-1]}, "finite numbers"),
        ({"id": "x", "image_base64": "not base64!"}, "not valid standard base64"),
        ({"text": "a star"}, "id"),
    ]
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        unkeyed = http.post("/v1/items", json={"id": "x", "text": "a star"})
        assert unkeyed.status_code == 401
        for body, message in cases:
            response = http.post("/v1/items", json=body, headers=ADMIN)
            assert response.status_code == 422, (body, response.text)
            assert message in response.text, (message, response.text)
        no_gallery = http.delete("/v1/items/item-0", headers=ADMIN)
        assert no_gallery.status_code == 422
        count = http.get("/readyz").status_code
    assert count == 200


def test_writes_survive_a_restart_and_a_compaction_keeps_the_answers(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path
) -> None:
    url = redis_url_of(service_redis, 7)
    redis.Redis.from_url(url).flushdb()
    root = copy_index_root(artifacts, tmp_path / "root")
    settings = make_settings(artifacts, index_root=root, redis_url=url, compact_at_rows=0)
    mu, logvar, first_id = _row(artifacts, "image", artifacts.image_v1, 11)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for i in range(5):
            item = {"id": f"added-{i}", "gallery": "image", "logvar": logvar,
                    "mu": [m + 0.05 * i for m in mu]}  # fmt: skip
            assert http.post("/v1/items", json=item, headers=ADMIN).status_code == 200
        gone = http.delete(f"/v1/items/{first_id}", params={"gallery": "image"}, headers=ADMIN)
        assert gone.status_code == 200
        before = [h["id"] for h in _search(http, "image", mu, logvar, 10).json()["results"]]
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        restarted = [h["id"] for h in _search(http, "image", mu, logvar, 10).json()["results"]]
        compacted = http.post("/admin/compact", params={"gallery": "image"}, headers=ADMIN)
        assert compacted.status_code == 200, compacted.text
        result = compacted.json()
        assert result["old_version"] == artifacts.image_v1 and result["folded_writes"] == 6
        assert server.services.holder.versions()["image"] == result["new_version"]
        after = _search(http, "image", mu, logvar, 10).json()
    assert restarted == before and before[0] == "added-0" and first_id not in before
    assert [h["id"] for h in after["results"]] == before
    assert after["index_version"] == result["new_version"]


def _filtered_brute_force(server, gallery, mu, logvar, metric, k, spec):
    """Top-k ids over the server's live items (those the filter matches, record by record in
    Python; all when `spec` is None), from its own arrays, by a full scan; and their count."""
    from indexer.metadata_filter import MetadataFilter

    wanted = MetadataFilter.parse(spec or {})
    with server.services.holder.acquire(gallery) as loaded:
        live = loaded.index
        state = live.snapshot()[0]
        rows = state.live_rows().tolist()
        records = live.metadata(rows)
        rows = np.array(
            [r for r, record in zip(rows, records, strict=True) if wanted.matches(record)]
        )
        if len(rows) == 0:
            return [], 0
        distances = pairwise_distance(
            metric, torch.tensor([mu]), torch.tensor([logvar]),
            torch.from_numpy(np.asarray(live.mu[rows], np.float32)),
            torch.from_numpy(np.asarray(live.logvar[rows], np.float32)),
        )[0].numpy()  # fmt: skip
        order = np.argsort(distances, kind="stable")[:k]
        return [r["id"] for r in live.metadata(rows[order].tolist())], len(rows)


def test_filtered_searches_equal_brute_force_over_the_matching_items(
    live_server: ServerThread, artifacts: Artifacts
) -> None:
    mu, logvar, _ = _row(artifacts, "image", artifacts.image_v1, 21)
    with live_server.services.holder.acquire("image") as loaded:
        five = [loaded.index.metadata([r])[0]["id"] for r in (2, 40, 41, 90, 150)]
    filters = [{"split": "test"}, {"split": {"in": ["val", "test"]}}, {"id": {"in": five}}]
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        item = {"id": "tagged", "gallery": "image", "mu": mu, "logvar": logvar,
                "metadata": {"split": "test", "shop": "north", "price": 12.5}}  # fmt: skip
        assert http.post("/v1/items", json=item, headers=ADMIN).status_code == 200
        filters += [{"shop": "north"}, {"price": {"gte": 10, "lt": 20}}]
        for spec in filters:
            for metric in ("w2", "kl", "min_kl"):
                body = {"gallery": "image", "mu": mu, "logvar": logvar, "k": 10,
                        "metric": metric, "filter": spec}  # fmt: skip
                response = http.post("/search/embedding", json=body)
                assert response.status_code == 200, response.text
                got = [h["id"] for h in response.json()["results"]]
                want, matched = _filtered_brute_force(
                    live_server, "image", mu, logvar, metric, 10, spec
                )
                assert got == want, (spec, metric)
                assert response.json()["matched"] == matched, spec
        five_found = http.post(
            "/search/embedding",
            json={
                "gallery": "image",
                "mu": mu,
                "logvar": logvar,
                "k": 10,
                "filter": {"id": {"in": five}},
            },
        ).json()
        bad = http.post(
            "/search/embedding",
            json={
                "gallery": "image",
                "mu": mu,
                "logvar": logvar,
                "filter": {"split": {"like": "t%"}},
            },
        )
        unfiltered = _search(http, "image", mu, logvar).json()
    assert sorted(h["id"] for h in five_found["results"]) == sorted(five)
    assert five_found["matched"] == 5
    assert bad.status_code == 422 and "filter" in bad.json()["detail"]
    assert unfiltered["matched"] is None


def test_the_cli_adds_deletes_and_compacts_and_a_running_server_sees_it(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path
) -> None:
    from tests.service.conftest import probsearch

    url = redis_url_of(service_redis, 7)
    root = copy_index_root(artifacts, tmp_path / "root")
    captions = tmp_path / "captions.jsonl"
    captions.write_text(
        '{"id": "cli-1", "text": "a big green star", "shop": "north"}\n'
        '{"id": "cli-2", "text": "a tiny red circle"}\n'
        '{"id": "cli-3", "text": ""}\n'
    )
    common = ["--modality", "text", "--index-root", root, "--redis-url", url]
    settings = make_settings(artifacts, index_root=root, redis_url=url, compact_at_rows=0)
    with ServerThread(settings) as server:
        added = probsearch(
            "index", "add", *common, "--source", captions, "--model", artifacts.model
        )
        with server.services.holder.acquire("text") as loaded:
            seen = loaded.index.record("cli-1"), loaded.index.record("cli-2")
        ids = tmp_path / "gone.txt"
        ids.write_text("cli-2\nno-such-id\n")
        deleted = probsearch("index", "delete", *common, "--ids", ids)
        with server.services.holder.acquire("text") as loaded:
            after_delete = loaded.index.record("cli-2")
        compacted = probsearch("index", "compact", *common)
        server.services.holder.refresh(["text"])
        with server.services.holder.acquire("text") as loaded:
            new_version, kept = loaded.version, loaded.index.record("cli-1")
            was_live = loaded.index.live_offset
    assert "added 2 items" in added and "1 skipped" in added and "empty" in added
    assert seen[0]["extra"] == {"shop": "north"} and seen[1]["text"] == "a tiny red circle"
    assert "deleted 1 items" in deleted and "1 ids were not in the gallery: no-such-id" in deleted
    assert after_delete is None
    assert f"compacted text version {artifacts.text_v1} into {new_version}" in compacted
    assert kept is not None and kept["extra"] == {"shop": "north"} and was_live == 0


def test_the_cli_says_clearly_when_there_is_nothing_to_write_to(tmp_path) -> None:
    from tests.service.conftest import PROBSEARCH

    ids = tmp_path / "ids.txt"
    ids.write_text("a\n")
    done = subprocess.run(
        [str(PROBSEARCH), "index", "delete", "--modality", "text", "--ids", ids,
         "--index-root", tmp_path / "empty", "--redis-url", ""],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "no active text version to write to" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_service_compacts_a_gallery_by_itself_past_compact_at_rows(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path
) -> None:
    from tests.service.conftest import wait_for

    url = redis_url_of(service_redis, 7)
    root = copy_index_root(artifacts, tmp_path / "root")
    settings = make_settings(artifacts, index_root=root, redis_url=url, compact_at_rows=2)
    mu, logvar, _ = _row(artifacts, "image", artifacts.image_v1, 4)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for i in range(2):
            item = {"id": f"auto-{i}", "gallery": "image", "mu": [m + 2.0 + i for m in mu],
                    "logvar": logvar}  # fmt: skip
            assert http.post("/v1/items", json=item, headers=ADMIN).status_code == 200
        holder = server.services.holder
        wait_for(lambda: holder.versions()["image"] != artifacts.image_v1, 120, "a compaction")
        top = _search(http, "image", [m + 2.0 for m in mu], logvar, 1).json()
        served = holder.versions()["image"]
    assert top["results"][0]["id"] == "auto-0"
    assert top["index_version"] == served


def test_a_multipart_image_search_takes_its_filter_as_json_text(
    live_server: ServerThread, artifacts: Artifacts
) -> None:
    import json

    picture = next(iter(sorted(artifacts.shapes.rglob("*.png")))).read_bytes()
    with live_server.services.holder.acquire("text") as loaded:
        two = [loaded.index.metadata([r])[0]["id"] for r in (5, 9)]
    fields = {"filter": json.dumps({"id": {"in": two}}), "k": "5"}
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        found = http.post("/search/image", files={"image": ("q.png", picture)}, data=fields)
    assert found.status_code == 200, found.text
    assert sorted(h["id"] for h in found.json()["results"]) == sorted(two)
    assert found.json()["matched"] == 2


def test_a_filter_that_matches_nothing_answers_with_no_results(
    live_server: ServerThread, artifacts: Artifacts
) -> None:
    mu, logvar, _ = _row(artifacts, "image", artifacts.image_v1, 3)
    body = {"gallery": "image", "mu": mu, "logvar": logvar, "filter": {"shop": "nowhere"}}
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        found = http.post("/search/embedding", json=body)
        caption = http.post("/search/text", json={"text": "a red circle", "filter": {"split": "x"}})
    assert found.status_code == 200, found.text
    assert found.json()["results"] == [] and found.json()["matched"] == 0
    assert found.json()["query"]["shortlist_size"] == 0
    assert caption.status_code == 200 and caption.json()["results"] == []


def test_pictures_added_by_the_cli_are_shown_only_from_the_gallerys_image_root(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path
) -> None:
    """A picture under the gallery's image root is recorded relative to it and shown; one
    outside it is searched but recorded without a uri (relative to another folder it would
    name the wrong file), and the command says so."""
    import shutil

    from tests.service.conftest import probsearch

    url = redis_url_of(service_redis, 7)
    root = copy_index_root(artifacts, tmp_path / "root")
    image_root = Path(open_version(root / "image" / artifacts.image_v1).manifest.image_root)
    pictures = sorted(artifacts.shapes.rglob("*.png"))[:2]
    inside = image_root / f"live-test-{tmp_path.name}"
    outside = tmp_path / "elsewhere"
    for folder, picture in ((inside, pictures[0]), (outside, pictures[1])):
        folder.mkdir()
        shutil.copy(picture, folder / f"{folder.name}.png")
    common = ["--modality", "image", "--index-root", root, "--redis-url", url,
              "--model", artifacts.model]  # fmt: skip
    settings = make_settings(artifacts, index_root=root, redis_url=url, compact_at_rows=0)
    try:
        with ServerThread(settings) as server, httpx.Client(base_url=server.url) as http:
            shown = probsearch("index", "add", *common, "--source", inside)
            unshown = probsearch("index", "add", *common, "--source", outside)
            with server.services.holder.acquire("image") as loaded:
                records = {r["id"]: r for r in (loaded.index.record(i) for i in
                           (f"{inside.name}.png", "elsewhere.png")) if r}  # fmt: skip
            inside_image = http.get(f"/v1/items/{inside.name}.png/image")
            outside_image = http.get("/v1/items/elsewhere.png/image")
    finally:
        shutil.rmtree(inside)
    assert "warning" not in shown and "1 pictures lie outside" in unshown
    assert str(image_root) in unshown, unshown
    assert records[f"{inside.name}.png"]["uri"] == f"{inside.name}/{inside.name}.png"
    assert "uri" not in records["elsewhere.png"]
    assert inside_image.status_code == 200 and outside_image.status_code == 404
