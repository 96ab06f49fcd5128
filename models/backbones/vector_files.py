"""A user's own backbone vectors, read from files, for training heads without running the
backbone (`probsearch train --features DIR`).

DIR holds, per modality, either `images.npy` and `images.ids.txt` (one id per line, row i of
the array is the vector of line i's id) or `images.parquet` with the columns `id` and
`vector` (a list of floats); the same for `captions`. Ids are the dataset's image and caption
ids; vectors of ids the dataset does not have are ignored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.networks.model_config import ConfigError

STEMS = {"image": "images", "text": "captions"}


def read_vectors(folder: Path, modality: str) -> dict[str, np.ndarray]:
    """The vectors of one modality by id (float32 (F,) each); ConfigError when the files are
    missing, unreadable or do not agree."""
    stem = folder / STEMS[modality]
    parquet, npy = stem.with_suffix(".parquet"), stem.with_suffix(".npy")
    if parquet.is_file():
        ids, vectors = _parquet(parquet)
    elif npy.is_file():
        ids, vectors = _npy(npy, folder / f"{STEMS[modality]}.ids.txt")
    else:
        raise ConfigError(f"{folder} has neither {parquet.name} nor {npy.name}")
    if vectors.ndim != 2 or len(vectors) != len(ids) or not np.isfinite(vectors).all():
        raise ConfigError(
            f"{stem.name}: need one finite vector per id; got {len(ids)} ids and an array of "
            f"shape {vectors.shape}"
        )
    return dict(zip(ids, vectors.astype(np.float32), strict=True))


def vectors_of(vectors: dict[str, np.ndarray], ids: list[str], what: str) -> np.ndarray:
    """(len(ids), F) in the order of `ids`; ConfigError naming the first ids that have none."""
    missing = [i for i in ids if i not in vectors]
    if missing:
        raise ConfigError(
            f"{len(missing)} {what} have no vector, e.g. {', '.join(map(repr, missing[:3]))}"
        )
    return np.stack([vectors[i] for i in ids]) if ids else np.zeros((0, 0), np.float32)


def _npy(path: Path, ids_path: Path) -> tuple[list[str], np.ndarray]:
    if not ids_path.is_file():
        raise ConfigError(f"{path.name} needs {ids_path.name}: the id of each row, one a line")
    try:
        vectors = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is not a readable .npy array: {error}") from error
    return ids_path.read_text().splitlines(), np.asarray(vectors)


def _parquet(path: Path) -> tuple[list[str], np.ndarray]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["id", "vector"])
    except Exception as error:  # pyarrow raises its own types for bad files and columns
        raise ConfigError(f"{path} has no readable columns id and vector: {error}") from error
    ids = [str(i) for i in table.column("id").to_pylist()]
    rows = table.column("vector").to_pylist()
    try:
        return ids, np.asarray(rows, dtype=np.float32)
    except ValueError as error:
        raise ConfigError(f"{path}: the vectors must all have one length ({error})") from error
