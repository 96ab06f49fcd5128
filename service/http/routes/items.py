"""GET /v1/items/{id}/image: a gallery image by the id of an item of the active image index."""

import asyncio

from fastapi import APIRouter, Response

from service.errors import ItemNotFoundError
from service.http.deps import SearchAuth, ServicesDep
from service.http.schemas import ERROR_RESPONSES, ErrorResponse
from service.item_images import read_item_image

router = APIRouter(prefix="/v1/items", tags=["items"], dependencies=[SearchAuth])

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
