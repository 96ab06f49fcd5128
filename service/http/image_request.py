"""The image and options of a POST /search/image request (multipart or JSON base64)."""

import base64
import binascii
import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect

from service.errors import InvalidQueryError, PayloadTooLargeError, UnsupportedMediaTypeError
from service.http.schemas import ImageSearchRequest, SearchOptions
from service.http.transport import BodyReadTimeoutError


async def read_image_request(request: Request, max_bytes: int) -> tuple[bytes, SearchOptions]:
    """The image bytes and options of a multipart or JSON /search/image request."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        return await _read_multipart(request, max_bytes)
    if media_type in ("application/json", ""):
        return await _read_json_image(request, max_bytes)
    raise UnsupportedMediaTypeError(
        f"Content-Type {media_type!r} is not accepted: send multipart/form-data with the file in "
        "field `image`, or application/json with `image_base64`"
    )


async def _read_multipart(request: Request, max_bytes: int) -> tuple[bytes, SearchOptions]:
    try:
        form = await request.form(max_files=1, max_fields=20)
    except (BodyReadTimeoutError, ClientDisconnect):
        raise
    except Exception as error:  # python-multipart raises several types for malformed bodies
        raise InvalidQueryError(f"malformed multipart body: {error}") from None
    upload = form.get("image")
    if not isinstance(upload, UploadFile):
        raise InvalidQueryError(
            "multipart field `image` is missing or not a file: "
            "send the image as a file part named `image`"
        )
    declared = (upload.content_type or "").split(";")[0].strip().lower()
    if declared and not declared.startswith("image/") and declared != "application/octet-stream":
        raise UnsupportedMediaTypeError(
            f"the `image` part is {declared!r}; send an image file (PNG, JPEG, ...)"
        )
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PayloadTooLargeError(f"image is larger than {max_bytes} bytes (max_image_bytes)")
    names = [name for name, _ in form.multi_items()]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidQueryError(f"form fields given more than once: {', '.join(repeated)}")
    fields = {name: _form_value(value) for name, value in form.multi_items() if name != "image"}
    return data, _validate(SearchOptions, fields)


async def _read_json_image(request: Request, max_bytes: int) -> tuple[bytes, SearchOptions]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise InvalidQueryError("the body is not valid JSON") from None
    parsed = _validate(ImageSearchRequest, body)
    if len(parsed.image_base64) > max_bytes * 4 // 3 + 4:
        raise PayloadTooLargeError(f"image is larger than {max_bytes} bytes (max_image_bytes)")
    try:
        data = base64.b64decode(parsed.image_base64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidQueryError(
            "image_base64 is not valid base64 (standard alphabet, with padding)"
        ) from None
    options = SearchOptions.model_validate(parsed.model_dump(exclude={"image_base64"}))
    return data, options


def _form_value(value: Any) -> Any:
    """A form field as the JSON value it spells ("3" -> 3, "true" -> True, a `filter`'s
    '{"split": "test"}' -> its object); other text (a metric name, "null": form fields are
    never null) stays a string."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, int | float | dict) else value


def _validate(model: type, data: Any) -> Any:
    """Validate like FastAPI does for declared bodies (errors become the same 422)."""
    if not isinstance(data, dict):
        raise InvalidQueryError("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise RequestValidationError(error.errors(include_url=False)) from None
