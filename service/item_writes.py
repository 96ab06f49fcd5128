"""Items added to and deleted from the served galleries without a rebuild (issue 43): an item
is embedded the way a reindex embeds it (the encoder's deterministic pass, its novelty for a
picture), then logged durably and served (indexer.live_index through IndexHolder.write).

A caption goes to the caption ("text") gallery and a picture to the image gallery; a Gaussian
(mu, logvar) or a backbone vector names its gallery. Only what the gallery stores is kept: the
service does not keep an uploaded picture's file, so an image item that should be shown gets
a `uri` the image root resolves, as a reindexed picture has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from indexer.live_index import LiveWriteError, WriteResult
from indexer.live_log import Delete, Put
from service.errors import IndexUnavailableError, InvalidQueryError, ItemNotFoundError
from service.index_holder import IndexHolder
from service.services import Services


@dataclass(frozen=True)
class NewItem:
    """One item to add: its id, gallery, metadata, and exactly one of its contents."""

    item_id: str
    gallery: str
    metadata: dict[str, Any]
    uri: str | None = None
    text: str | None = None
    image: Image.Image | None = None
    features: np.ndarray | None = None  # (F,) a backbone vector
    mu: np.ndarray | None = None  # (D,)
    logvar: np.ndarray | None = None  # (D,)


@dataclass(frozen=True)
class Written:
    """What a write did, for the response."""

    item_id: str
    gallery: str
    index_version: str
    live_items: int


def embedded(services: Services, item: NewItem) -> Put:
    """The item as its gallery stores it: mean, log-variance, novelty, metadata record."""
    record: dict[str, Any] = {"extra": item.metadata}
    if item.text is not None:
        record["text"] = item.text
    if item.uri is not None:
        record["uri"] = item.uri
    if item.mu is not None and item.logvar is not None:
        return Put(item.item_id, _vector(item.mu), _vector(item.logvar), record)
    out = _encode(services, item)
    novelty = None if out.novelty is None else float(out.novelty[0])
    return Put(item.item_id, _vector(out.mu[0]), _vector(out.logvar[0]), record, novelty)


def _encode(services: Services, item: NewItem) -> Any:
    kind = item.gallery  # a gallery holds what its encoder embeds: captions or pictures
    name = f"vector-{kind}" if item.features is not None else kind
    encoder = services.encoders.get(name)
    if encoder is None:
        what = "backbone vectors" if item.features is not None else f"{kind} items"
        raise InvalidQueryError(
            f"this service loads no encoder for {what} of the {item.gallery} gallery: send "
            "mu and logvar, or serve the gallery's query side too"
        )
    try:
        if item.features is not None:
            return encoder.encode_features(item.features[None])
        if item.image is not None:
            return encoder.encode_images([item.image])
        return encoder.encode_texts([item.text or ""])
    except ValueError as error:
        raise InvalidQueryError(f"the item cannot be encoded: {error}") from None


def _vector(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32)


def add_item(services: Services, item: NewItem) -> Written:
    """Embed and log one item (replacing the item of the same id); blocking."""
    _, version = _write(services.holder, item.gallery, embedded(services, item))
    services.compactor.maybe_start(item.gallery)
    return Written(item.item_id, item.gallery, version, _live_items(services.holder, item.gallery))


def delete_item(holder: IndexHolder, gallery: str, item_id: str) -> Written:
    """Log the deletion of one item; ItemNotFoundError when the gallery has no such item."""
    result, version = _write(holder, gallery, Delete(item_id))
    if result.missing:
        raise ItemNotFoundError(f"the {gallery} gallery ({version}) has no item {item_id[:200]!r}")
    return Written(item_id, gallery, version, _live_items(holder, gallery))


def _write(holder: IndexHolder, gallery: str, entry: Put | Delete) -> tuple[WriteResult, str]:
    if gallery not in holder.galleries:
        raise IndexUnavailableError(holder.unavailable_message(gallery))
    try:
        return holder.write(gallery, [entry])
    except LiveWriteError as error:
        raise InvalidQueryError(str(error)) from None
    except OSError as error:
        raise IndexUnavailableError(
            f"the {gallery} gallery's log cannot be written ({error.strerror or error}); is the "
            "index root read-only here? Write through a replica that can write it"
        ) from None


def _live_items(holder: IndexHolder, gallery: str) -> int:
    with holder.acquire(gallery) as loaded:
        return loaded.index.count
