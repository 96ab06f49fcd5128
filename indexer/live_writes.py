"""`probsearch index add|delete`: items written to the active version's log from the command
line (issue 43), embedded as a reindex embeds them (indexer.embed.embed_chunk). Running
services read the log on their next request; nothing is rebuilt."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from indexer.embed import MAX_CAPTION_CHARS, BadItem, Encoder, embed_chunk
from indexer.live_index import LiveIndex, VersionMovedError
from indexer.live_log import Delete, Entry, Put
from indexer.registry import ActiveRegistry, RegistryError
from indexer.sources import GalleryItem, open_source, relative_uri
from indexer.store import open_version
from models.onnx import ENCODE_BATCH

BATCH_ITEMS = 256  # items embedded and logged per write


@dataclass(frozen=True)
class WriteSummary:
    """What an add or delete did."""

    version: str
    written: int
    skipped: list[BadItem]
    missing: list[str]
    live_items: int
    unshown: int = 0  # pictures outside the gallery's image root: searched, never shown
    image_root: str = ""


def add_items(
    registry: ActiveRegistry,
    modality: str,
    source: Path,
    encoder: Encoder,
    batch_size: int = ENCODE_BATCH,
    progress: Callable[[int], None] | None = None,
) -> WriteSummary:
    """Embed every item of `source` (a gallery source, as reindex reads) and log it to the
    active version; an id the gallery holds is replaced."""
    items = list(open_source(source, modality).items())
    version_root = _image_root(registry, modality)
    written, skipped, version, unshown = 0, [], "", 0
    for start in range(0, len(items), BATCH_ITEMS):
        batch = [_rooted(item, version_root) for item in items[start : start + BATCH_ITEMS]]
        chunk = embed_chunk(batch, encoder, modality, set(), batch_size, MAX_CAPTION_CHARS)
        skipped += chunk.bad
        outside = {item.id for item in batch if item.path is not None and item.uri is None}
        unshown += sum(r["id"] in outside for r in chunk.records)
        puts = [
            Put(r["id"], chunk.mu[i], chunk.logvar[i], _stored(r, outside),
                None if chunk.novelty is None else float(chunk.novelty[i]))
            for i, r in enumerate(chunk.records)
        ]  # fmt: skip
        if puts:
            version, _ = _write_active(registry, modality, puts)
        written += len(puts)
        if progress is not None:
            progress(len(batch))
    count = _live_count(registry, modality)
    root = str(version_root or "")
    return WriteSummary(version, written, skipped, [], count, unshown, root)


def delete_items(registry: ActiveRegistry, modality: str, ids: Sequence[str]) -> WriteSummary:
    """Log the deletion of each id; ids the gallery does not hold are reported, not logged."""
    version, result = _write_active(registry, modality, [Delete(i) for i in ids])
    return WriteSummary(
        version, len(ids) - len(result.missing), [], list(result.missing),
        _live_count(registry, modality),
    )  # fmt: skip


def read_ids(path: Path) -> list[str]:
    """Item ids from a file: one per line, or JSON lines with an "id" each."""
    ids = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                line = str(json.loads(line)["id"])
            except (ValueError, KeyError) as error:
                raise ValueError(
                    f"{path}:{number}: not a JSON object with an id ({error})"
                ) from None
        ids.append(line)
    return ids


def _write_active(registry: ActiveRegistry, modality: str, entries: list[Entry]):
    """Log to the active version, following a compaction that activates another meanwhile."""
    for _ in range(3):
        version = registry.active_version(modality)
        if version is None:
            raise RegistryError(f"no active {modality} version to write to; reindex first")
        live = LiveIndex(open_version(registry.version_path(modality, version), device="cpu"))
        try:
            result = live.write(
                entries, still_active=lambda v=version: registry.active_version(modality) == v
            )
            return version, result
        except VersionMovedError:
            continue
        finally:
            live.close()
    raise RegistryError(f"the active {modality} version changed three times; run it again")


def _live_count(registry: ActiveRegistry, modality: str) -> int:
    version = registry.active_version(modality)
    if version is None:
        return 0
    live = LiveIndex(open_version(registry.version_path(modality, version), device="cpu"))
    try:
        return live.count
    finally:
        live.close()


def _image_root(registry: ActiveRegistry, modality: str) -> Path | None:
    version = registry.active_version(modality)
    if version is None:
        raise RegistryError(f"no active {modality} version to write to; reindex first")
    root = open_version(registry.version_path(modality, version), device="cpu")
    try:
        return Path(root.manifest.image_root) if root.manifest.image_root else None
    finally:
        root.close()


def _rooted(item: GalleryItem, image_root: Path | None) -> GalleryItem:
    """A picture with its uri relative to the gallery's own image root, the one folder the
    service shows pictures from; a picture outside it gets none (uri None): a uri relative to
    another folder would name the wrong file, or none, under that root."""
    if item.path is None:
        return item
    uri = None if image_root is None else relative_uri(item.path.resolve(), image_root.resolve())
    if uri is not None and uri.startswith(".."):
        uri = None
    return GalleryItem(item.id, item.text, item.path, item.extra, item.problem, uri)


def _stored(record: dict, unshown: set[str]) -> dict:
    """The record a put logs: no id (the put has it), and no uri for a picture outside the
    image root (embed_chunk would record its absolute path)."""
    drop = {"id", "uri"} if record["id"] in unshown else {"id"}
    return {key: value for key, value in record.items() if key not in drop}
