"""`probsearch demo --small`: build, serve, one query per endpoint, shut down; then reuse."""

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import redis

from indexer.active_record import parse_record
from indexer.registry import ActiveRegistry, active_key, namespace_of
from models.datasets.records import attributes_named, is_plausible_match, load_dataset
from probsearch.demo import (
    EXAMPLE_ATTRIBUTES,
    SMALL_PLAN,
    DemoPaths,
    _answered_image,
    _done_stages,
    _save_state,
    _stage_keys,
    load_examples,
)
from tests.service.conftest import PROBSEARCH

NO_REDIS = "redis://127.0.0.1:1/0"


def run_demo(cache_dir: Path, redis_url: str) -> subprocess.CompletedProcess:
    command = [str(PROBSEARCH), "demo", "--small", "--cache-dir", str(cache_dir),
               "--examples-only", "--port", "0", "--redis-url", redis_url]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo built from nothing, without Redis (about two minutes on 2 cores)."""
    cache = tmp_path_factory.mktemp("demo") / "cache"
    return cache, run_demo(cache, NO_REDIS).stdout


def test_first_run_builds_every_stage_and_answers(first_run: tuple[Path, str]) -> None:
    _, out = first_run
    assert "running without it" in out
    for stage in ("[1/4]", "[2/4]", "[3/4]", "[4/4]"):
        assert stage in out
    page = out.index("search page: http://127.0.0.1:")
    assert page < out.index("# text -> images"), "the page's address comes before the examples"
    assert "/search/text -H 'Content-Type: application/json'" in out
    assert "/search/image -F image=@" in out
    photo_example = out.split("# a photograph", 1)[1]
    assert "/search/image -F image=@" in photo_example and "photos/" in photo_example
    # The verdict names the calibrated score, its value and its threshold (the small model
    # is too weak to promise which way it goes; the full demo is checked by hand).
    assert re.search(r"(REJECTED|answered) \((\w+) -?[0-9.]+, threshold -?[0-9.]+\)", photo_example)


def test_examples_are_judged_with_sizes_and_counts(first_run: tuple[Path, str]) -> None:
    """An example answer counts as right only when the dataset's own judgement says so: a
    caption naming the wrong size of a held colour and shape is wrong."""
    cache, _ = first_run
    examples = load_examples(DemoPaths(cache))
    test = load_dataset(cache / "data", "test")
    pairs = [(c, im) for c in test.captions for im in test.images]
    verdicts = {(c.id, im.id): is_plausible_match(c, im) for c, im in pairs}
    assert any(verdicts.values()) and not all(verdicts.values())
    for (caption_id, image_id), expected in verdicts.items():
        assert examples.plausible(caption_id, image_id) is expected
    sized = [c for c in test.captions if any(d.size and d.shape and d.color for d in c.named)]
    wrong_size = [
        (c, im) for c in sized for im in test.images
        if not is_plausible_match(c, im)
        and all(any(o.shape == d.shape and o.color == d.color for o in im.objects)
                for d in c.named)
    ]  # fmt: skip
    assert wrong_size, "the small demo data holds a caption whose size alone misses an image"
    assert not any(examples.plausible(c.id, im.id) for c, im in wrong_size)
    assert examples.captions and all(c.split == "test" for c in examples.captions)


def test_the_image_example_prefers_an_answer_that_says_something(
    first_run: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A right but empty answer ("four things") is shown only when no image gets a right
    answer that names at least EXAMPLE_ATTRIBUTES shape, colour or size words."""
    cache, _ = first_run
    examples = load_examples(DemoPaths(cache))
    own = {path.stem: [c for c in examples.caption_by_id.values() if c.image_id == path.stem]
           for path in examples.images}  # fmt: skip
    vague = next(p for p in examples.images if any(attributes_named(c) < 2 for c in own[p.stem]))
    telling = next(
        p for p in examples.images
        if p != vague and any(attributes_named(c) >= EXAMPLE_ATTRIBUTES for c in own[p.stem])
    )  # fmt: skip

    def answered_with(image: Path, informative: bool) -> dict:
        """An answered response whose first caption is one of the image's own."""
        caption = next(c for c in own[image.stem] if (attributes_named(c) >= 2) is informative)
        return {"query": {"rejected": False}, "results": [{"id": caption.id}]}

    bodies = {vague: answered_with(vague, False), telling: answered_with(telling, True)}
    monkeypatch.setattr("probsearch.demo._upload", lambda http, url, image: bodies[image])
    pair = dataclasses.replace(examples, images=[vague, telling])
    assert _answered_image(None, "", pair) == (telling, bodies[telling])
    alone = dataclasses.replace(examples, images=[vague])
    assert _answered_image(None, "", alone) == (vague, bodies[vague])


def test_first_run_activates_calibrated_versions(first_run: tuple[Path, str]) -> None:
    cache, _ = first_run
    state = json.loads((cache / "demo.json").read_text())
    assert list(state) == ["data", "model", "indexes", "calibration"]
    for gallery, version in state["indexes"]["result"].items():
        assert parse_record((cache / "indexes" / gallery / "ACTIVE").read_text()).version == version
        manifest = json.loads((cache / "indexes" / gallery / version / "manifest.json").read_text())
        assert manifest["calibration"]["w2"]["threshold"] is not None


def test_second_run_reuses_and_activates_in_redis(
    first_run: tuple[Path, str], redis_url: str
) -> None:
    cache, _ = first_run
    out = run_demo(cache, redis_url).stdout
    assert f"using Redis at {redis_url}" in out
    assert "[1/4]" not in out and "[4/4]" not in out
    assert "# image -> captions (upload)" in out
    client = redis.Redis.from_url(redis_url)
    state = json.loads((cache / "demo.json").read_text())
    for gallery, version in state["indexes"]["result"].items():
        key = active_key(namespace_of(cache / "indexes"), gallery)
        assert parse_record(client.get(key)).version == version


def test_a_changed_plan_field_rebuilds_its_stage_and_the_later_ones(tmp_path: Path) -> None:
    paths = DemoPaths(tmp_path)
    keys = _stage_keys(SMALL_PLAN)
    results = {"data": True, "model": True, "indexes": {"image": "v1"}, "calibration": True}
    _save_state(paths, keys, results)
    assert _done_stages(paths, keys) == results
    new_metrics = _stage_keys(dataclasses.replace(SMALL_PLAN, metrics=("w2",)))
    assert _done_stages(paths, new_metrics) == {"data": True, "model": True}
    new_target = _stage_keys(dataclasses.replace(SMALL_PLAN, target_coverage=0.5))
    assert list(_done_stages(paths, new_target)) == ["data", "model", "indexes"]
    new_seed = _stage_keys(dataclasses.replace(SMALL_PLAN, seed=1))
    assert _done_stages(paths, new_seed) == {}


def test_a_changed_recipe_retrains_the_cached_model(tmp_path: Path, monkeypatch) -> None:
    """A cache built before the demo's recipe changed (here: its outlier fraction) keeps its
    data but not its model, so an update of probsearch never serves a stale demo model."""
    paths = DemoPaths(tmp_path)
    results = {"data": True, "model": True, "indexes": {"image": "v1"}, "calibration": True}
    _save_state(paths, _stage_keys(SMALL_PLAN), results)
    monkeypatch.setattr("probsearch.demo.DEMO_OUTLIERS", 0.5)
    assert _done_stages(paths, _stage_keys(SMALL_PLAN)) == {"data": True}


def test_a_moved_cache_dir_still_shows_the_examples(
    first_run: tuple[Path, str], tmp_path: Path
) -> None:
    """The demo's versions name the data path they were built from; after the cache dir
    moved, the demo took its own galleries for the user's and skipped its examples."""
    cache, _ = first_run
    moved = tmp_path / "moved-cache"
    shutil.copytree(cache, moved)
    out = run_demo(moved, NO_REDIS).stdout
    assert "keeping your" not in out
    assert "# text -> images" in out and "your own gallery is active" not in out


def test_a_rerun_keeps_the_gallery_you_activated(
    first_run: tuple[Path, str], redis_url: str, tmp_path: Path
) -> None:
    """Issue 42: running the demo again re-activated its own galleries over the user's."""
    cache, _ = first_run
    captions = tmp_path / "mine.jsonl"
    captions.write_text(
        "".join(f'{{"id": "mine-{i}", "text": "a red circle {i}"}}\n' for i in range(5))
    )
    reindex = [str(PROBSEARCH), "reindex", "--modality", "text", "--source", str(captions),
               "--model", str(cache / "model"), "--index-root", str(cache / "indexes"),
               "--activate", "--redis-url", redis_url]  # fmt: skip
    subprocess.run(reindex, check=True, capture_output=True, timeout=300)
    registry = ActiveRegistry(cache / "indexes", redis_url)
    mine = registry.active_version("text")
    out = run_demo(cache, redis_url).stdout
    assert f"keeping your text gallery {mine} active" in out
    assert "activated the demo's image gallery" in out
    assert "your own gallery is active: the demo's example queries are skipped" in out
    assert registry.active_version("text") == mine
