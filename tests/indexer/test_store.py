"""Version dirs: memory-mapped arrays, metadata by row, checksums and counts, float16 storage,
metrics a version can and cannot serve, calibration updates."""

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from indexer.manifest import (
    Calibration,
    Manifest,
    ManifestError,
    read_manifest,
    verify_checksums,
)
from indexer.store import UnsupportedMetricError, open_version
from indexer.version_writer import update_calibration
from tests.indexer.synthetic import clustered_gaussians, nearby_queries, write_synthetic_version


@pytest.fixture
def version_dir(tmp_path: Path) -> Path:
    mu, logvar = clustered_gaussians(500, 8, seed=0, clusters=20)
    write_synthetic_version(tmp_path / "v1", mu, logvar, ("w2", "kl"), "flat")
    return tmp_path / "v1"


def test_open_version_maps_arrays_and_reads_metadata_in_order(version_dir: Path) -> None:
    version = open_version(version_dir, verify=True)
    assert isinstance(version.mu, np.memmap) and version.mu.shape == (500, 8)
    assert isinstance(version.logvar, np.memmap)
    manifest = version.manifest
    assert (manifest.count, manifest.dim, manifest.families) == (500, 8, ("kl", "w2"))
    assert manifest.calibration["w2"] == Calibration(temperature=1.0, threshold=None)
    assert set(manifest.files) == {
        "mu.npy",
        "logvar.npy",
        "metadata.sqlite",
        "kl.faiss",
        "w2.faiss",
    }
    records = version.metadata([42, 7, 42])
    assert [r["id"] for r in records] == ["item-42", "item-7", "item-42"]
    assert records[1] == {"id": "item-7", "text": "caption 7", "extra": {"i": 7}}
    with pytest.raises(ValueError, match="out of range"):
        version.metadata([500])
    version.close()


def test_record_finds_an_item_by_its_id_and_nothing_else(version_dir: Path) -> None:
    version = open_version(version_dir)
    assert version.record("item-7") == {"id": "item-7", "text": "caption 7", "extra": {"i": 7}}
    assert version.record("item-499")["extra"] == {"i": 499}
    for unknown in ("item-500", "", "item-7 ", "ITEM-7", "%", "item-%", "../item-7"):
        assert version.record(unknown) is None, unknown
    version.close()


def test_supports_and_refuses_metrics_without_an_index(version_dir: Path) -> None:
    version = open_version(version_dir)
    assert version.supports("w2") and version.supports("kl")
    assert version.supports("bhattacharyya")  # re-ranked from the w2 shortlist
    assert not version.supports("min_kl") and not version.supports("nonsense")
    mu_q, logvar_q = nearby_queries(version.mu, version.logvar, 3)
    with pytest.raises(UnsupportedMetricError, match="--metrics min_kl"):
        version.shortlist("min_kl", mu_q, logvar_q, 5)
    distances, rows = version.search_family("w2", mu_q, logvar_q, 600)  # more than the gallery
    assert rows.shape == (3, 600) and np.all(rows[:, 500:] == -1)
    assert np.all(np.isinf(distances[:, 500:])) and np.all(np.isfinite(distances[:, :500]))


def test_tampered_or_truncated_versions_are_refused(version_dir: Path) -> None:
    with open(version_dir / "w2.faiss", "ab") as f:
        f.write(b"x")
    with pytest.raises(ManifestError, match=r"checksum mismatch for \['w2.faiss'\]"):
        open_version(version_dir, verify=True)
    mu = np.load(version_dir / "mu.npy")
    np.save(version_dir / "mu.npy", mu[:-1])
    with pytest.raises(ManifestError, match=r"mu\.npy has shape"):
        open_version(version_dir)


def test_float16_arrays_and_calibration_update(tmp_path: Path) -> None:
    mu, logvar = clustered_gaussians(300, 8, seed=1, clusters=10)
    write_synthetic_version(tmp_path / "v16", mu, logvar, ("w2",), "flat", dtype="float16")
    version = open_version(tmp_path / "v16", verify=True)
    assert version.mu.dtype == np.float16 and version.manifest.dtype == "float16"
    rows = version.shortlist("w2", mu[:5], logvar[:5], 1)
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4]
    update_calibration(tmp_path / "v16", {"w2": Calibration(temperature=0.5, threshold=0.3)})
    manifest = read_manifest(tmp_path / "v16")
    assert manifest.calibration["w2"] == Calibration(0.5, 0.3)
    verify_checksums(tmp_path / "v16", manifest)  # the manifest is not in its own checksums
    with pytest.raises(ManifestError, match="unknown metrics"):
        update_calibration(tmp_path / "v16", {"cosine": Calibration()})


def test_a_manifest_written_before_the_novelty_gate_keeps_its_log_det_gate(
    version_dir: Path,
) -> None:
    """Older manifests name the gate's limit log_det_limit; it is read as a log-det gate."""
    path = version_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["calibration"]["w2"] = {"temperature": 0.5, "threshold": 0.3, "score": "log_det",
                                 "log_det_limit": -120.0}  # fmt: skip
    manifest = Manifest.from_json(json.dumps(data))
    assert manifest.calibration["w2"] == Calibration(0.5, 0.3, "log_det", "log_det", -120.0)


def test_non_finite_metadata_is_stored_as_null_so_filters_can_read_every_row(
    tmp_path: Path,
) -> None:
    import math

    from indexer.metadata_filter import MetadataFilter
    from indexer.version_writer import MetadataWriter

    writer = MetadataWriter(tmp_path / "metadata.sqlite")
    writer.add([
        {"id": "a", "extra": {"score": math.nan, "tags": [math.inf, 1.0]}},
        {"id": "b", "extra": {"score": 2.0}},
    ])  # fmt: skip
    writer.close()
    db = sqlite3.connect(tmp_path / "metadata.sqlite")
    mask = MetadataFilter.parse({"score": {"gte": 1}}).matching_rows(db, 2)
    assert mask.tolist() == [False, True]
    assert json.loads(db.execute("SELECT extra FROM items WHERE id = 'a'").fetchone()[0]) == {
        "score": None,
        "tags": [None, 1.0],
    }
