"""The items of the galleries: GET /v1/items/{id}/image (a picture by its item's id), and
the live writes POST /v1/items and DELETE /v1/items/{id} (service.item_writes)."""

import asyncio
import base64
import binascii
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response

from service import item_writes
from service.errors import InvalidQueryError, ItemNotFoundError
from service.http.deps import AdminAuth, SearchAuth, ServicesDep
from service.http.schemas import (
    ADMIN_ERROR_RESPONSES,
    ERROR_RESPONSES,
    SEARCH_ERROR_RESPONSES,
    ErrorResponse,
    ItemWriteRequest,
    ItemWriteResponse,
    json_body_schema,
    read_json_request,
)
from service.http.search_flow import decode_image
from service.http.vectors import backbone_vector, gaussian
from service.item_images import read_item_image

router = APIRouter(prefix="/v1/items", tags=["items"], dependencies=[SearchAuth])
# POST /v1/items may carry a picture (up to max_image_bytes, base64); other routes take JSON only
IMAGE_PATHS = frozenset({"/v1/items"})

_IMAGE_RESPONSES = {
    200: {
        "description": "The image file (PNG, JPEG, GIF, BMP or WebP; other formats as PNG).",
        "content": {"image/*": {"schema": {"type": "string", "format": "binary"}}},
    },
    404: {"model": ErrorResponse, "description": "No item of the active image index has this id."},
    **ERROR_RESPONSES,
}


@router.get("/{item_id:path}/image", response_class=Response, responses=_IMAGE_RESPONSES)
async def item_image(item_id: str, services: ServicesDep) -> Response:
    """The image of a gallery item, found by its id in the active image index; ids that may
    contain "/" (image-folder galleries) are sent percent-encoded or as they are."""
    with services.holder.acquire("image") as loaded:
        record = await asyncio.to_thread(loaded.index.record, item_id)
        version = loaded.version
        image_root = loaded.index.manifest.image_root
    if record is None:
        raise ItemNotFoundError(
            f"no item of the active image index {version} has id {item_id[:200]!r}"
        )
    settings = services.settings
    image = await asyncio.to_thread(
        read_item_image, record, settings.max_image_bytes, settings.max_image_pixels, image_root
    )
    headers = {"Cache-Control": "private, max-age=300", "X-Content-Type-Options": "nosniff"}
    return Response(image.data, media_type=image.media_type, headers=headers)


# Writes need the admin key: they change what every client is answered.
writes = APIRouter(prefix="/v1/items", tags=["items"], dependencies=[AdminAuth])
_WRITE_RESPONSES = {
    **SEARCH_ERROR_RESPONSES,
    404: {"model": ErrorResponse, "description": "DELETE: the gallery has no item of this id."},
    **ADMIN_ERROR_RESPONSES,
}


@writes.post(
    "",
    response_model=ItemWriteResponse,
    responses=_WRITE_RESPONSES,
    openapi_extra=json_body_schema(ItemWriteRequest),
)
async def add_item(request: Request, services: ServicesDep) -> ItemWriteResponse:
    """Add an item to a gallery, or replace the item of the same id, without a rebuild: a
    caption (text gallery), a picture (image gallery), a Gaussian or a backbone vector. The
    200 comes once the write is durable, and every search from then on sees it."""
    body = await read_json_request(request, ItemWriteRequest)
    item = await _new_item(body, services)
    written = await asyncio.to_thread(item_writes.add_item, services, item)
    return ItemWriteResponse(**vars(written) | {"id": written.item_id})


@writes.delete("/{item_id:path}/image", include_in_schema=False)
async def no_image_delete(item_id: str) -> Response:
    """A picture is deleted with its item: DELETE on .../image is not a method of that path
    (405), rather than the deletion of an item whose id ends in "/image"."""
    return Response(status_code=405, headers={"Allow": "GET"})


@writes.delete("/{item_id:path}", response_model=ItemWriteResponse, responses=_WRITE_RESPONSES)
async def delete_item(
    item_id: str,
    services: ServicesDep,
    gallery: Annotated[Literal["image", "text"], Query(description="The item's gallery.")],
) -> ItemWriteResponse:
    """Delete an item without a rebuild; no answer after the 200 holds it, cached or not."""
    written = await asyncio.to_thread(item_writes.delete_item, services.holder, gallery, item_id)
    return ItemWriteResponse(**vars(written) | {"id": written.item_id})


async def _new_item(body: ItemWriteRequest, services: ServicesDep) -> item_writes.NewItem:
    """The request as a NewItem: exactly one content, and the gallery it goes to."""
    given = [
        name
        for name, present in (
            ("text", body.text is not None),
            ("image_base64", body.image_base64 is not None),
            ("mu and logvar", body.mu is not None or body.logvar is not None),
            ("features", body.features is not None),
        )
        if present
    ]
    if len(given) != 1:
        raise InvalidQueryError(
            "send exactly one of text, image_base64, mu and logvar, or features"
            + (f"; got {', '.join(given)}" if given else "")
        )
    implied = {"text": "text", "image_base64": "image"}.get(given[0])
    if implied is not None and body.gallery not in (None, implied):
        raise InvalidQueryError(f"{given[0]} goes to the {implied} gallery, not {body.gallery}")
    gallery = implied or body.gallery
    if gallery is None:
        raise InvalidQueryError(f"{given[0]} needs `gallery`: image or text")
    common = {"item_id": body.id, "gallery": gallery, "metadata": body.metadata, "uri": body.uri}
    max_dim = services.settings.max_embedding_dim
    if body.features is not None:
        return item_writes.NewItem(**common, features=backbone_vector(body.features, max_dim))
    if body.mu is not None or body.logvar is not None:
        mu, logvar = gaussian(body.mu or [], body.logvar or [], max_dim)
        return item_writes.NewItem(**common, mu=mu, logvar=logvar)
    if body.image_base64 is not None:
        image = await decode_image(services, _base64(body.image_base64))
        return item_writes.NewItem(**common, image=image)
    services.searcher.check_text(body.text or "")
    return item_writes.NewItem(**common, text=body.text)


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidQueryError("image_base64 is not valid standard base64") from None
