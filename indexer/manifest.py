"""The manifest of an index version: what was built, from what, and the checksums of every file."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
# the live gallery's write-ahead log (indexer.live_log): appended after the version is built,
# so it is no part of the checksummed files
LIVE_LOG_NAME = "live.wal"
FORMAT_VERSION = 1


class ManifestError(ValueError):
    """A manifest is missing, unreadable or inconsistent with its version dir."""


@dataclass(frozen=True)
class Calibration:
    """How the service rejects queries ranked with one metric: the uncertainty score
    (models.scoring.query_scores.SCORE_NAMES), its threshold tau, and the temperature T of
    the retrieval posterior."""

    temperature: float = 1.0
    threshold: float | None = None
    score: str = "mutual_information"
    # Image queries whose `gate_score` (novelty or log_det) exceeds `gate_limit` are unlike
    # the images the model was trained on and rejected whatever the score says (None: no
    # such gate; see indexer.calibration).
    gate_score: str = "log_det"
    gate_limit: float | None = None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Calibration:
        """From the manifest's JSON; a manifest written before the novelty gate names its
        log-det gate `log_det_limit`."""
        values = dict(values)
        if "log_det_limit" in values:
            values["gate_limit"] = values.pop("log_det_limit")
        return cls(**values)


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to trust and search a version dir (DESIGN section 4).

    `metrics` are the metrics this version can shortlist natively (min_kl included when both
    kl and kl_reverse are built); `families` are the FAISS index families built, one file each
    (`<family>.faiss`). `index_params` and `search_params` are keyed by family.
    """

    version: str
    modality: str
    model_name: str
    model_hash: str
    dim: int
    count: int
    metrics: tuple[str, ...]
    families: tuple[str, ...]
    index_type: str
    index_params: dict[str, dict[str, Any]]
    search_params: dict[str, dict[str, Any]]
    calibration: dict[str, Calibration]
    created_at: str
    dtype: str = "float32"
    source: str = ""
    # The folder an image's metadata `uri` is relative to (resolved at reindex: the image
    # folder, the dataset dir or a COCO --image-root). "" in a version written before uris
    # were relative: its uris are absolute (or relative to the reindex's working directory).
    image_root: str = ""
    files: dict[str, str] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    calibration_inherited_from: str | None = None  # version whose calibration was copied
    engine: str = "local"  # what embedded the gallery: "local" or "ray" (reindex --engine)

    def to_json(self) -> str:
        """Serialise to indented JSON (the on-disk form)."""
        data = asdict(self)
        data["metrics"] = list(self.metrics)
        data["families"] = list(self.families)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse the on-disk form; raises ManifestError on missing or malformed fields."""
        try:
            data = json.loads(text)
            data["metrics"] = tuple(data["metrics"])
            data["families"] = tuple(data["families"])
            data["calibration"] = {
                metric: Calibration.from_dict(values)
                for metric, values in data["calibration"].items()
            }
            return cls(**data)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ManifestError(f"malformed manifest: {e}") from e

    def with_files(self, files: dict[str, str]) -> Manifest:
        """A copy with the checksum table replaced."""
        data = {**self.__dict__, "files": dict(files)}
        return Manifest(**data)


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks (arrays may be many GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def checksum_dir(version_dir: Path) -> dict[str, str]:
    """sha256 of every file in a version dir except the manifest and the live log, keyed by
    file name."""
    return {
        p.name: sha256_file(p)
        for p in sorted(version_dir.iterdir())
        if p.is_file() and p.name not in (MANIFEST_NAME, LIVE_LOG_NAME)
    }


def write_manifest(version_dir: Path, manifest: Manifest) -> None:
    """Write manifest.json (temp file + fsync + os.replace, so it is never half-written)."""
    tmp = version_dir / f".{MANIFEST_NAME}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, version_dir / MANIFEST_NAME)


def read_manifest(version_dir: Path) -> Manifest:
    """Read manifest.json of a version dir."""
    path = version_dir / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"{version_dir} is not an index version: no {MANIFEST_NAME}")
    return Manifest.from_json(path.read_text(encoding="utf-8"))


def verify_checksums(version_dir: Path, manifest: Manifest) -> None:
    """Raise ManifestError unless the dir holds exactly the manifest's files, unchanged."""
    actual = checksum_dir(version_dir)
    if set(actual) != set(manifest.files):
        missing = sorted(set(manifest.files) - set(actual))
        extra = sorted(set(actual) - set(manifest.files))
        raise ManifestError(f"{version_dir}: missing files {missing}, unexpected files {extra}")
    bad = sorted(name for name, digest in actual.items() if manifest.files[name] != digest)
    if bad:
        raise ManifestError(f"{version_dir}: checksum mismatch for {bad} (corrupted copy?)")
