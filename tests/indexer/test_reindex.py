"""`reindex` end to end with real ONNX encoders: dataset dirs, captions JSONL and image folders,
bad data (report, threshold), user errors without tracebacks, and resuming after SIGKILL."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import redis
from typer.testing import CliRunner

from indexer.active_record import parse_record
from indexer.cli import app
from indexer.registry import ActiveRegistry, active_key, namespace_of
from indexer.store import open_version
from models.datasets.records import load_dataset
from models.onnx.encoder_runtime import OnnxEncoder
from tests.indexer.synthetic import publish_synthetic

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def reindex(*args: str, env: dict | None = None):
    return runner.invoke(app, ["reindex", *args], env=env, catch_exceptions=False)


def only_version(root: Path, modality: str) -> Path:
    versions = ActiveRegistry(root, None).versions(modality)
    assert len(versions) == 1, versions
    return root / modality / versions[0]


def test_text_gallery_from_a_dataset_dir(tmp_path, small_shapes, random_model, redis_url) -> None:
    env = {"PROBSEARCH_MODEL": str(random_model), "PROBSEARCH_REDIS_URL": redis_url}
    result = reindex(
        "--modality",
        "text",
        "--source",
        str(small_shapes),
        "--index-root",
        str(tmp_path),
        "--metrics",
        "w2,min_kl",
        "--activate",
        env=env,
    )
    assert result.exit_code == 0, result.output
    path = only_version(tmp_path, "text")
    stored = redis.Redis.from_url(redis_url).get(active_key(namespace_of(tmp_path), "text"))
    assert parse_record(stored) == parse_record((tmp_path / "text" / "ACTIVE").read_text())
    assert parse_record(stored).version == path.name
    captions = load_dataset(small_shapes).captions
    version = open_version(path, verify=True)
    manifest = version.manifest
    assert manifest.count == len(captions) and manifest.model_name == "random-gcie"
    assert set(manifest.families) == {"w2", "kl", "kl_reverse"}
    assert {"w2", "kl", "kl_reverse", "min_kl"} <= set(manifest.metrics)
    # row i holds caption i, embedded exactly as the shared encoder embeds it
    want = OnnxEncoder(random_model, "text").encode_texts([c.text for c in captions[:7]])
    np.testing.assert_allclose(version.mu[:7], want.mu, atol=1e-5)
    np.testing.assert_allclose(version.logvar[:7], want.logvar, atol=1e-5)
    assert version.metadata([3])[0] == {
        "id": captions[3].id,
        "text": captions[3].text,
        "extra": {"split": captions[3].split, "image_id": captions[3].image_id},
    }
    report = json.loads((path / "report.json").read_text())
    assert (report["total"], report["bad"]) == (len(captions), 0)
    assert not (tmp_path / "text" / ".work").exists() or not any(
        (tmp_path / "text" / ".work").iterdir()
    )


def test_without_metrics_each_gallery_gets_the_models_metric_for_it(
    tmp_path, small_shapes, random_model
) -> None:
    """A model that ranks image queries with kl gets a kl index for its caption gallery, so the
    service's default works on it; the image gallery keeps the model's w2."""
    import dataclasses

    from models.networks.model_config import ModelConfig

    model = tmp_path / "model"
    shutil.copytree(random_model, model)
    dataclasses.replace(ModelConfig.load(model), image_query_metric="kl").save(model)
    for modality, metric in (("text", "kl"), ("image", "w2")):
        result = reindex("--modality", modality, "--source", str(small_shapes), "--model",
                         str(model), "--index-root", str(tmp_path / "idx"))  # fmt: skip
        assert result.exit_code == 0, result.output
        assert open_version(only_version(tmp_path / "idx", modality)).manifest.metrics == (metric,)


def test_image_folder_with_broken_files(tmp_path, small_shapes, random_model) -> None:
    folder = tmp_path / "photos"
    shutil.copytree(small_shapes / "images", folder)
    images = sorted(folder.rglob("*.png"))
    (folder / "zz_not_an_image.png").write_bytes(b"hello")
    truncated = images[0].read_bytes()
    (folder / "zz_truncated.png").write_bytes(truncated[: len(truncated) // 2])
    root = tmp_path / "index"
    common = [
        "--modality",
        "image",
        "--source",
        str(folder),
        "--model",
        str(random_model),
        "--index-root",
        str(root),
    ]
    failed = reindex(*common)  # 2 bad of 122 > 1%
    assert failed.exit_code == 1
    assert "2 of 122 items are bad" in failed.output and "Traceback" not in failed.output
    assert ActiveRegistry(root, None).versions("image") == []
    result = reindex(*common, "--max-bad-fraction", "0.05", "--activate")
    assert result.exit_code == 0, result.output
    path = only_version(root, "image")
    report = json.loads((path / "report.json").read_text())
    assert report["by_reason"] == {"unreadable_image": 2}
    assert {item["id"] for item in report["items"]} == {"zz_not_an_image.png", "zz_truncated.png"}
    version = open_version(path)
    assert version.manifest.count == len(images)
    # the uri is relative to the folder, which the manifest names (issue 42.4)
    assert version.metadata([0])[0]["uri"] == images[0].relative_to(folder).as_posix()
    assert version.manifest.image_root == str(folder.resolve())
    assert ActiveRegistry(root, None).active_version("image") == path.name


def test_bad_captions_are_skipped_counted_and_fail_over_the_limit(tmp_path, random_model) -> None:
    lines = [json.dumps({"id": f"c{i}", "text": f"a red circle number {i}"}) for i in range(95)]
    lines += [
        json.dumps({"id": "e1", "text": "   "}),
        json.dumps({"id": "long", "text": "x" * 1001}),
        json.dumps({"id": "c3", "text": "a duplicate id"}),
        "{not json",
        json.dumps({"text": "no id"}),
    ]
    source = tmp_path / "captions.jsonl"
    source.write_text("\n".join(lines) + "\n")
    root = tmp_path / "index"
    registry = ActiveRegistry(root, None)
    publish_synthetic(registry, "text", "20000101T000000000Z-old")
    registry.activate("text", "20000101T000000000Z-old")
    common = [
        "--modality",
        "text",
        "--source",
        str(source),
        "--model",
        str(random_model),
        "--index-root",
        str(root),
        "--activate",
    ]
    failed = reindex(*common)
    assert failed.exit_code == 1 and "5 of 100 items are bad" in failed.output
    assert registry.active_version("text") == "20000101T000000000Z-old"
    assert registry.versions("text") == ["20000101T000000000Z-old"]
    assert reindex(*common, "--max-bad-fraction", "0.05").exit_code == 0
    new = registry.active_version("text")
    report = json.loads((root / "text" / new / "report.json").read_text())
    assert report["by_reason"] == {
        "caption_too_long": 1,
        "duplicate_id": 1,
        "empty_caption": 1,
        "malformed_record": 2,
    }
    assert open_version(root / "text" / new).manifest.count == 95


def test_user_errors_are_one_line_without_traceback(tmp_path, small_shapes, random_model) -> None:
    cases = [
        (["--modality", "text", "--source", str(tmp_path / "missing")], "does not exist"),
        (["--modality", "text", "--source", str(small_shapes / "images")], "--modality image"),
        (
            ["--modality", "text", "--source", str(small_shapes), "--metrics", "cosine"],
            "unknown metric",
        ),
        (
            ["--modality", "text", "--source", str(small_shapes), "--index-type", "annoy"],
            "unknown index type",
        ),
    ]
    for args, message in cases:
        result = reindex(*args, "--model", str(random_model), "--index-root", str(tmp_path))
        assert result.exit_code == 1, (args, result.output)
        assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "text").exists()  # refused before embedding anything
    no_root = runner.invoke(
        app,
        [
            "reindex",
            "--modality",
            "text",
            "--source",
            str(small_shapes),
            "--model",
            str(random_model),
        ],
        env={"PROBSEARCH_INDEX_ROOT": ""},
    )
    assert no_root.exit_code == 2 and "PROBSEARCH_INDEX_ROOT" in no_root.output


def test_index_commands(tmp_path, redis_url) -> None:
    registry = ActiveRegistry(tmp_path, redis_url)
    names = [f"2024010{i}T000000000Z-abcd" for i in range(1, 4)]
    for i, name in enumerate(names):
        publish_synthetic(registry, "text", name, n=30, seed=i)
    base = ["--modality", "text", "--index-root", str(tmp_path), "--redis-url", redis_url]
    assert runner.invoke(app, ["index", "activate", names[2], *base]).exit_code == 0
    listing = runner.invoke(app, ["index", "list", *base]).output
    assert f"* {names[2]}" in listing and f"  {names[0]}" in listing
    rolled = runner.invoke(app, ["index", "rollback", *base])
    assert rolled.exit_code == 0 and names[1] in rolled.output
    gc = runner.invoke(app, ["index", "gc", "--keep", "1", *base])
    assert gc.exit_code == 0 and registry.versions("text") == names[1:]
    missing = runner.invoke(app, ["index", "activate", "nope", *base])
    assert missing.exit_code == 1 and "no complete text version 'nope'" in missing.output


def test_killed_job_leaves_active_version_and_rerun_reuses_chunks(
    tmp_path, small_shapes, random_model, redis_url
) -> None:
    root = tmp_path / "index"
    registry = ActiveRegistry(root, redis_url)
    publish_synthetic(registry, "text", "20000101T000000000Z-old")
    registry.activate("text", "20000101T000000000Z-old")
    args = [
        "reindex",
        "--modality",
        "text",
        "--source",
        str(small_shapes),
        "--model",
        str(random_model),
        "--index-root",
        str(root),
        "--redis-url",
        redis_url,
        "--activate",
        "--chunk-items",
        "1",
        "--batch-size",
        "1",
    ]
    code = "from indexer.cli import app; app()"
    job = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    work = root / "text" / ".work"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(work.glob("*/chunk-*.npz"))) < 10:
        time.sleep(0.005)
    job.send_signal(signal.SIGKILL)
    job.wait()
    done = len(list(work.glob("*/chunk-*.npz")))
    assert 10 <= done < 600, done  # killed mid-way through 600 one-caption chunks
    assert registry.active_version("text") == "20000101T000000000Z-old"
    assert registry.versions("text") == ["20000101T000000000Z-old"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    reused = int(result.output.split(" chunks reused")[0].rsplit(" ", 1)[1])
    assert reused >= done
    new = registry.active_version("text")
    assert new != "20000101T000000000Z-old"
    assert open_version(root / "text" / new, verify=True).manifest.count == 600
    assert os.listdir(work) == []
