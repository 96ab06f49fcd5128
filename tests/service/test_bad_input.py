"""Hostile and mistaken requests: each gets its 4xx and a message a person can act on."""

import base64
import io
import json
import struct
import zlib
from collections.abc import Callable

import httpx
import pytest
from PIL import Image

from tests.service.conftest import ADMIN_KEY, Artifacts, ServerThread, make_settings

PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"


def png_claiming(width: int, height: int) -> bytes:
    """A tiny valid-looking PNG whose header claims width x height (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))  # fmt: skip


def png_of_rows(width: int, height: int, rows: int) -> bytes:
    """A hand-made 8-bit RGB PNG whose header says width x height and whose IDAT holds a
    complete zlib stream of only `rows` rows (issue 41.7: Pillow decoded it without an error)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = (b"\x00" + b"\xc8" * (3 * width)) * rows  # filter byte 0, then a grey row
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(pixels)) + chunk(b"IEND", b""))  # fmt: skip


ONE_ROW_OF_2000 = (
    "image is truncated: its header says 2000x2000, but its pixel data holds only 1 of"
)


def truncated_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (128, 128), "orange").save(buffer, "JPEG")
    data = buffer.getvalue()
    return data[: len(data) // 2]


def upload(data: bytes, content_type: str = "image/png", **fields: str) -> Callable:
    return lambda c: c.post("/search/image", files={"image": ("f", data, content_type)},
                            data=fields)  # fmt: skip


def text(**body) -> Callable:
    return lambda c: c.post("/search/text", json=body)


def b64(data: bytes) -> Callable:
    return lambda c: c.post("/search/image", json={"image_base64": base64.b64encode(data).decode()})


BAD_REQUESTS = {
    "empty text": (text(text=""), 422, "text: String should have at least 1 character"),
    "blank text": (text(text="   "), 422, "text is empty"),
    "100k-character text": (text(text="a" * 100_000), 422, "the limit is 500"),
    "unknown metric": (text(text="a", metric="cosine"), 422,
                       "unknown metric 'cosine'; served: w2, kl, kl_reverse, min_kl"),
    "k=0": (text(text="a", k=0), 422, "k: Input should be greater than or equal to 1"),
    "k=10^6": (text(text="a", k=10**6), 422, "k=1000000 is above the limit 1000"),
    "shortlist below k": (text(text="a", k=20, shortlist=5), 422, "it must be >= k"),
    "shortlist too big": (text(text="a", shortlist=10**7), 422, "above the limit 10000"),
    "too many MC samples": (text(text="a", mc_samples=10**4), 422, "mc_samples=10000"),
    "negative temperature": (text(text="a", temperature=-1), 422, "temperature: Input should be"),
    "unknown field": (text(text="a", top_k=3), 422, "top_k: Extra inputs are not permitted"),
    "true for k": (text(text="a", k=True), 422, "k: Input should be a valid integer"),
    "1 for a boolean": (text(text="a", return_embedding=1), 422,
                        "return_embedding: Input should be a valid boolean"),
    "string for k": (text(text="a", k="3"), 422, "k: Input should be a valid integer"),
    "temperature 1e-300": (text(text="a", temperature=1e-300), 422,
                           "temperature: Input should be greater than or equal to 0.001"),
    "invalid UTF-8": (
        lambda c: c.post("/search/text", content=b'{"text": "\xff\xfe"}',
                         headers={"content-type": "application/json"}),
        400, "the request body is not valid UTF-8"),
    "mu of 3e38": (
        lambda c: c.post("/search/embedding", json={"mu": [3e38] * 32, "logvar": [0.0] * 32,
                                                     "gallery": "image"}),
        422, "every mu value must lie in [-10000, 10000]: beyond that, distances to the gallery "
             "overflow float32 (and 31 more like it)"),
    "logvar of 1000": (
        lambda c: c.post("/search/embedding", json={"mu": [0.0] * 32, "logvar": [1000.0] * 32,
                                                     "gallery": "text"}),
        422, "logvar.0: Value error, every logvar value must lie in [-30, 30]"),
    "PDF upload": (upload(PDF, "application/pdf"), 415, "the `image` part is 'application/pdf'"),
    "PDF labelled PNG": (upload(PDF), 415, "not in an image format"),
    "PDF as base64": (b64(PDF), 415, "not in an image format"),
    "truncated JPEG": (upload(truncated_jpeg(), "image/jpeg"), 422, "truncated or corrupt"),
    "PNG of one row under a 2000x2000 header": (upload(png_of_rows(2000, 2000, 1)), 422,
                                                ONE_ROW_OF_2000),
    "one-row PNG as base64": (b64(png_of_rows(2000, 2000, 1)), 422, ONE_ROW_OF_2000),
    "20000x20000 PNG bomb": (upload(png_claiming(20000, 20000)), 413, "at most 4194304 pixels"),
    "PNG bomb as base64": (b64(png_claiming(7000, 7000)), 413, "7000x7000"),
    "image over the byte limit": (upload(b"\x89PNG" + b"0" * 250_000), 413, "larger than 200000"),
    "body over the byte limit": (upload(b"0" * 400_000), 413, "request body exceeds"),
    "JSON body over its route's limit": (
        lambda c: c.post("/search/text", json={"text": "a" * 600_000}),
        413, "request body exceeds 524288 bytes; this route takes JSON up to the max_json_bytes"),
    "malformed base64": (lambda c: c.post("/search/image", json={"image_base64": "@@not*b64"}),
                         422, "image_base64 is not valid base64"),
    "missing image part": (lambda c: c.post("/search/image", files={"k": (None, "3")}),
                           422, "multipart field `image` is missing"),
    "bad form field": (upload(png_claiming(8, 8), k="many"), 422, "k: Input should be a valid"),
    "repeated form field": (upload(png_claiming(8, 8), k=["3", "4"]), 422,
                            "form fields given more than once: k"),
    "text/plain to /search/text": (
        lambda c: c.post("/search/text", content=b"cats", headers={"content-type": "text/plain"}),
        415, "send the request body as application/json"),
    "XML to /search/image": (
        lambda c: c.post("/search/image", content=b"<a/>", headers={"content-type": "text/xml"}),
        415, "send multipart/form-data"),
    "malformed JSON": (
        lambda c: c.post("/search/text", content=b'{"text": ',
                         headers={"content-type": "application/json"}),
        422, "JSON decode error"),
    "mu and logvar lengths differ": (
        lambda c: c.post("/search/embedding", json={"mu": [0.0] * 3, "logvar": [0.0] * 4,
                                                     "gallery": "image"}),
        422, "they must match"),
    "embedding of the wrong dimension": (
        lambda c: c.post("/search/embedding", json={"mu": [0.0] * 3, "logvar": [0.0] * 3,
                                                     "gallery": "image"}),
        422, "holds 32-dimensional embeddings"),
    "NaN in an embedding": (
        lambda c: c.post("/search/embedding", content=b'{"mu": [NaN], "logvar": [0.0], '
                         b'"gallery": "text"}', headers={"content-type": "application/json"}),
        422, "mu.0: Input should be a finite number"),
    "unknown gallery": (
        lambda c: c.post("/search/embedding", json={"mu": [0.0], "logvar": [0.0],
                                                     "gallery": "audio"}),
        422, "gallery: Input should be 'image' or 'text'"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request_gets_its_status_and_message(client: httpx.Client, name: str) -> None:
    send, status, message = BAD_REQUESTS[name]
    response = send(client)
    assert response.status_code == status, response.text
    body = response.json()
    assert message in body["detail"]
    assert set(body) == {"detail", "error"}
    assert "Traceback" not in response.text
    documented = client.get("/openapi.json").json()["paths"]
    path = response.request.url.path
    assert str(status) in documented[path]["post"]["responses"]


def test_a_complete_hand_made_png_is_still_searched(client: httpx.Client) -> None:
    response = upload(png_of_rows(300, 200, 200), k="3")(client)
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 3


def test_json_routes_have_their_own_body_limit(artifacts: Artifacts) -> None:
    """A JSON body over max_json_bytes is refused by its Content-Length, before it is read;
    an image of the same size still reaches /search/image. The largest valid embedding body
    (mu, logvar and features of max_embedding_dim numbers, each as long as a float prints)
    fits the default limit."""
    settings = make_settings(artifacts, max_json_bytes=4096)
    image = io.BytesIO()
    Image.effect_noise((48, 48), 60).convert("RGB").save(image, format="PNG")
    assert len(image.getvalue()) > 5000
    with ServerThread(settings) as server, httpx.Client(base_url=server.url) as http:
        refused = http.post("/search/text", json={"text": "a" * 5000})
        assert refused.status_code == 413 and "max_json_bytes" in refused.json()["detail"]
        files = {"image": ("noise.png", image.getvalue(), "image/png")}
        assert http.post("/search/image", files=files).status_code == 200
    widest = [-1234.5678901234567] * make_settings(artifacts).max_embedding_dim
    body = {"mu": widest, "logvar": widest, "features": widest, "gallery": "image"}
    assert len(json.dumps(body)) < make_settings(artifacts).max_json_bytes


def test_admin_reload_needs_a_valid_key(client: httpx.Client, artifacts: Artifacts) -> None:
    assert client.post("/admin/reload").status_code == 401
    wrong = client.post("/admin/reload", headers={"X-API-Key": "wrong-key-but-long-enough"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "invalid API key"
    right = client.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert right.status_code == 200
    assert right.json()["active"] == {"image": artifacts.image_v1, "text": artifacts.text_v1}


def test_missing_index_is_503_and_search_key_is_enforced(artifacts: Artifacts, tmp_path) -> None:
    settings = make_settings(artifacts, index_root=tmp_path, require_api_key_for_search=True)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url) as http:
        assert http.get("/healthz").status_code == 200
        ready = http.get("/readyz")
        assert ready.status_code == 503 and "no index loaded for: image, text" in ready.text
        assert http.post("/search/text", json={"text": "a circle"}).status_code == 401
        missing = http.post("/search/text", json={"text": "a circle"},
                            headers={"X-API-Key": ADMIN_KEY})  # fmt: skip
        assert missing.status_code == 503
        assert "no image index is loaded yet; build one with `probsearch reindex" in missing.text
        assert missing.headers["retry-after"] == "5"
