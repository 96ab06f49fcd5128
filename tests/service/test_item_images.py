"""GET /v1/items/{id}/image: an active image item's own file, and 404 for everything else
(unknown ids, caption ids, paths, every traversal attempt), sent as raw request targets."""

import dataclasses
import http.client
import io
import os
import shutil
import sqlite3
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest
from PIL import Image

from indexer.manifest import checksum_dir, read_manifest, write_manifest
from indexer.registry import ActiveRegistry
from indexer.store import open_version
from service.errors import ItemNotFoundError
from service.item_images import media_type_of, read_item_image
from tests.service.conftest import ADMIN_KEY, Artifacts, ServerThread, make_settings


def gallery_record(artifacts: Artifacts, modality: str, version: str, row: int = 0) -> dict:
    version_dir = artifacts.index_root / modality / version
    index = open_version(version_dir)
    try:
        return index.metadata([row])[0]
    finally:
        index.close()


def raw_get(server: ServerThread, target: str) -> tuple[int, str, bytes]:
    """GET with the request target sent byte for byte (no client-side normalisation)."""
    address = urlsplit(server.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.putrequest("GET", target, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.getheader("content-type", ""), response.read()
    finally:
        connection.close()


def test_an_active_image_item_gets_its_recorded_file(
    client: httpx.Client, artifacts: Artifacts
) -> None:
    record = gallery_record(artifacts, "image", artifacts.image_v1, row=3)
    response = client.get(f"/v1/items/{quote(record['id'], safe='')}/image")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert not Path(record["uri"]).is_absolute()  # relative to the dataset dir (issue 42.4)
    assert response.content == (artifacts.shapes / record["uri"]).read_bytes()


def traversal_targets(artifacts: Artifacts) -> list[str]:
    record = gallery_record(artifacts, "image", artifacts.image_v1)
    known, relative = record["id"], record["uri"]  # images/shapes-000000.png
    uri = (artifacts.shapes / relative).as_posix()
    caption = gallery_record(artifacts, "text", artifacts.text_v1)["id"]
    return [
        "/v1/items/does-not-exist/image",
        f"/v1/items/{caption}/image",  # an item, but of the caption gallery
        f"/v1/items/{quote(uri, safe='')}/image",  # the recorded path itself, as an id
        f"/v1/items/{uri}/image",
        f"/v1/items/{quote(relative, safe='')}/image",
        f"/v1/items/{relative}/image",
        f"/v1/items/{known}%00/image",
        f"/v1/items/{known}/../../../../etc/passwd/image",
        "/v1/items/../../../../etc/passwd/image",
        "/v1/items/..%2F..%2F..%2F..%2Fetc%2Fpasswd/image",
        "/v1/items/%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd/image",
        "/v1/items/..%252F..%252Fetc%252Fpasswd/image",
        "/v1/items/%2Fetc%2Fpasswd/image",
        "/v1/items//etc/passwd/image",
        "/v1/items/....//....//....//etc/passwd/image",
        "/v1/items/..%5C..%5C..%5Cetc%5Cpasswd/image",
        "/v1/items/file:%2F%2F%2Fetc%2Fpasswd/image",
        "/v1/items/~%2F.ssh%2Fid_rsa/image",
        "/v1/items/%2Fproc%2Fself%2Fenviron/image",
        "/v1/items/.%2Fmetadata.sqlite/image",
        "/static/../service/http/main.py",
        "/static/..%2Fmain.py",
        "/static/%2e%2e/main.py",
        "/static/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    ]


def test_unknown_ids_and_every_traversal_attempt_get_a_404(
    server: ServerThread, artifacts: Artifacts
) -> None:
    targets = traversal_targets(artifacts)
    for target in targets:
        status, content_type, body = raw_get(server, target)
        assert status == 404, f"{target} -> {status}: {body[:200]!r}"
        assert content_type.startswith("application/json"), f"{target} -> {content_type}"
        assert b"root:" not in body and b"import" not in body, target
    passwd = Path("/etc/passwd").read_bytes()[:20]
    assert all(passwd not in raw_get(server, t)[2] for t in targets[-4:])


def test_an_inactive_version_is_never_consulted(client: httpx.Client, artifacts: Artifacts) -> None:
    # Both image versions index the same gallery, so an id of v2 is also one of v1; the
    # endpoint reads v1 (the active one): the 404 message names the version it looked in.
    response = client.get("/v1/items/not-in-any-version/image")
    assert response.status_code == 404
    assert artifacts.image_v1 in response.json()["detail"]
    assert artifacts.image_v2 not in response.json()["detail"]


# ----- reading a record's file ---------------------------------------------------------------


def image_bytes(format_name: str, size: tuple[int, int] = (8, 6)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, "orange").save(buffer, format_name)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("format_name", "media_type"),
    [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif"),
     ("BMP", "image/bmp"), ("WEBP", "image/webp")],
)  # fmt: skip
def test_web_formats_are_sent_as_they_are_with_their_own_type(
    tmp_path: Path, format_name: str, media_type: str
) -> None:
    data = image_bytes(format_name)
    path = tmp_path / "picture.bin"  # the name says nothing: the bytes decide the type
    path.write_bytes(data)
    image = read_item_image({"id": "a", "uri": str(path)}, max_bytes=10_000, max_pixels=10_000)
    assert (image.media_type, image.data) == (media_type, data)
    assert media_type_of(data) == media_type


def test_other_formats_are_converted_to_png(tmp_path: Path) -> None:
    path = tmp_path / "scan.tif"
    path.write_bytes(image_bytes("TIFF"))
    image = read_item_image({"id": "a", "uri": str(path)}, max_bytes=100_000, max_pixels=10_000)
    assert image.media_type == "image/png"
    assert Image.open(io.BytesIO(image.data)).size == (8, 6)


def test_files_that_cannot_be_served_are_not_found(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    big.write_bytes(image_bytes("PNG", (64, 64)))
    not_image = tmp_path / "notes.png"
    not_image.write_text("root:x:0:0")
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)  # opening it for reading must not wait for a writer
    cases = {
        "larger than": {"uri": str(big)},
        "is missing": {"uri": str(tmp_path / "gone.png")},
        "not a regular file": {"uri": str(fifo)},
        "no image file": {"uri": "https://example.com/a.png"},
        "not readable": {"uri": str(not_image)},
    }
    for reason, record in cases.items():
        with pytest.raises(ItemNotFoundError, match=reason):
            read_item_image({"id": "x", **record}, max_bytes=len(big.read_bytes()) - 1,
                            max_pixels=10_000)  # fmt: skip
    with pytest.raises(ItemNotFoundError, match="not a regular file"):
        read_item_image({"id": "x", "uri": str(tmp_path)}, max_bytes=100, max_pixels=100)
    with pytest.raises(ItemNotFoundError, match="no image file"):
        read_item_image({"id": "x", "text": "a caption"}, max_bytes=100, max_pixels=100)


# ----- relative uris and their root (issue 42.4, issue 41.7) ---------------------------------


def test_a_relative_uri_is_read_under_its_root_and_never_outside_it(tmp_path: Path) -> None:
    root, outside = tmp_path / "gallery", tmp_path / "private"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    data = image_bytes("PNG")
    (root / "sub" / "a.png").write_bytes(data)
    (outside / "secret.png").write_bytes(image_bytes("PNG", (3, 3)))
    (root / "inside-link.png").symlink_to(root / "sub" / "a.png")
    (root / "outside-link.png").symlink_to(outside / "secret.png")
    (root / "outside-dir").symlink_to(outside, target_is_directory=True)

    def read(uri: str) -> bytes:
        record = {"id": "x", "uri": uri}
        return read_item_image(record, max_bytes=10_000, max_pixels=10_000, image_root=root).data

    assert read("sub/a.png") == data
    assert read("sub/../sub/a.png") == data  # `..` that stays inside is fine
    assert read("inside-link.png") == data  # a symlink to a file of the gallery too
    for escape in ("../private/secret.png", "sub/../../private/secret.png",
                   "outside-link.png", "outside-dir/secret.png"):  # fmt: skip
        with pytest.raises(ItemNotFoundError, match="outside the gallery"):
            read(escape)
    # an old version's absolute uri stays absolute, whatever the root
    assert read(str(root / "sub" / "a.png")) == data


def test_results_and_the_index_list_show_no_absolute_server_path(
    server: ServerThread, client: httpx.Client, artifacts: Artifacts
) -> None:
    hits = client.post("/search/text", json={"text": "a red circle", "k": 5}).json()["results"]
    uris = [hit["metadata"]["uri"] for hit in hits]
    assert uris and all(not Path(uri).is_absolute() for uri in uris), uris
    assert all((artifacts.shapes / uri).is_file() for uri in uris)
    indexes = client.get("/v1/indexes").json()["indexes"]
    text = str(indexes)
    assert str(artifacts.shapes) not in text and str(artifacts.index_root) not in text
    for info in indexes:
        assert "model_hash" not in info["manifest"] and "image_root" not in info["manifest"]
        assert info["manifest"]["source"] == artifacts.shapes.name
    admin = client.get("/v1/indexes", headers={"X-API-Key": ADMIN_KEY}).json()["indexes"]
    by_modality = {info["modality"]: info["manifest"] for info in admin}
    assert by_modality["image"]["source"] == str(artifacts.shapes.resolve())
    assert by_modality["image"]["image_root"] == str(artifacts.shapes.resolve())
    assert len(by_modality["text"]["model_hash"]) == 64
    wrong = client.get("/v1/indexes", headers={"Authorization": "Bearer not-the-key-0123456"})
    assert wrong.status_code == 401


def test_an_old_version_with_absolute_uris_still_serves_its_images(
    tmp_path: Path, artifacts: Artifacts
) -> None:
    """A version written before uris were relative: absolute uris, no image_root."""
    root = tmp_path / "indexes"
    shutil.copytree(artifacts.index_root / "image" / artifacts.image_v1,
                    root / "image" / artifacts.image_v1)  # fmt: skip
    version_dir = root / "image" / artifacts.image_v1
    with sqlite3.connect(version_dir / "metadata.sqlite") as db:
        db.execute("UPDATE items SET uri = ? || '/' || uri", (str(artifacts.shapes),))
    manifest = read_manifest(version_dir)
    old = dataclasses.replace(manifest, image_root="")
    write_manifest(version_dir, old.with_files(checksum_dir(version_dir)))
    ActiveRegistry(root, None).activate("image", artifacts.image_v1)
    settings = make_settings(artifacts, index_root=root, galleries=["image"])
    record = gallery_record(artifacts, "image", artifacts.image_v1, row=2)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url) as http:
        response = http.get(f"/v1/items/{quote(record['id'], safe='')}/image")
        assert response.status_code == 200, response.text
        assert response.content == (artifacts.shapes / record["uri"]).read_bytes()
