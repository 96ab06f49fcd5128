"""A model on the shipped pretrained backbones, end to end through the real commands and a real
server: `probsearch train` with backbones (and with a user's own vectors, --features),
`probsearch reindex`, and searches whose answers are exact, carry a non-zero MI, and are the
same whether the query is sent as a caption or image, or as its backbone vector."""

import io
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from indexer.manifest import read_manifest
from indexer.registry import ActiveRegistry
from indexer.store import open_version
from models.backbones.registry import load_backbone
from models.datasets.records import load_dataset
from models.datasets.shapes import generate_shapes
from models.networks.preprocess import load_image
from tests.service.conftest import (
    ServerThread,
    brute_force,
    make_settings,
    probsearch,
    redis_url_of,
)

BACKBONES = ("--image-backbone", "efficientnet-lite0", "--text-backbone", "all-minilm-l6-v2")
HEADS = ("--embed-dim", "16", "--head-hidden", "32", "--dropout", "0.2", "--no-progress")


@pytest.fixture(scope="module")
def served(tmp_path_factory, service_redis):
    """Shapes data, heads trained from a user's .npy vectors (made by the shipped backbones),
    both galleries indexed, a server."""
    root = tmp_path_factory.mktemp("pretrained-service")
    data = generate_shapes(root / "shapes", 40, seed=2, progress=False, workers=1)
    vectors = write_vectors(data, root / "vectors")
    model, index_root = root / "model", root / "indexes"
    probsearch("train", "--data", data, "--out", model, "--epochs", "2", *BACKBONES, *HEADS,
               "--features", vectors)  # fmt: skip
    for modality in ("image", "text"):
        probsearch("reindex", "--modality", modality, "--source", data, "--model", model,
                   "--index-root", index_root, "--metrics", "w2,kl", "--index-type", "flat",
                   "--activate")  # fmt: skip
    artifacts = type("Artifacts", (), {"model": model, "index_root": index_root})
    settings = make_settings(artifacts, redis_url=redis_url_of(service_redis, 5))
    with ServerThread(settings) as server:
        yield server, data, index_root


def write_vectors(data: Path, folder: Path) -> Path:
    """Every image's and caption's backbone vector as .npy with an ids file, as a user who
    runs the backbone elsewhere would hand them over."""
    dataset = load_dataset(data)
    folder.mkdir(parents=True)
    image, text = (
        load_backbone("efficientnet-lite0", "image"),
        load_backbone("all-minilm-l6-v2", "text"),
    )

    for stem, records, encode in (
        ("images", dataset.images, lambda rs: image.encode([load_image(r.path) for r in rs])),
        ("captions", dataset.captions, lambda rs: text.encode([r.text for r in rs])),
    ):
        np.save(folder / f"{stem}.npy", encode(records))
        (folder / f"{stem}.ids.txt").write_text("".join(f"{r.id}\n" for r in records))
    return folder


def search(server, path: str, **body) -> dict:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def active_version(index_root: Path, modality: str) -> Path:
    return index_root / modality / ActiveRegistry(index_root, None).active_version(modality)


def test_a_caption_is_answered_exactly_with_a_nonzero_mi(served) -> None:
    server, _, index_root = served
    found = search(server, "/search/text", text="a red circle", k=5, metric="kl",
                   mc_samples=8, return_embedding=True)  # fmt: skip
    query = found["query"]
    assert query["mutual_information"] > 0
    ids, distances = brute_force(active_version(index_root, "image"), "kl", query["mu"],
                                 query["logvar"], 5)  # fmt: skip
    assert [hit["id"] for hit in found["results"]] == ids
    np.testing.assert_allclose([h["distance"] for h in found["results"]], distances, rtol=1e-4)


def test_a_caption_vector_gets_the_captions_answer(served) -> None:
    server, *_ = served
    text = load_backbone("all-minilm-l6-v2", "text")
    caption = "two blue squares and a small green star"
    by_text = search(server, "/search/text", text=caption, k=8)
    vector = text.encode([caption])[0].tolist()
    by_vector = search(server, "/search/embedding", features=vector, gallery="image", k=8)
    assert [h["id"] for h in by_vector["results"]] == [h["id"] for h in by_text["results"]]
    distances = [[h["distance"] for h in found["results"]] for found in (by_vector, by_text)]
    np.testing.assert_allclose(*distances, rtol=1e-3, atol=1e-4)
    assert by_vector["query"]["modality"] == "vector"
    assert by_vector["query"]["log_det"] == pytest.approx(by_text["query"]["log_det"], abs=1e-2)


def test_an_image_vector_gets_the_images_answer(served) -> None:
    server, data, _ = served
    image = load_backbone("efficientnet-lite0", "image")
    picture = Image.open(load_dataset(data).split("test").images[0].path).convert("RGB")
    png = io.BytesIO()
    picture.save(png, format="PNG")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        by_image = client.post("/search/image", files={"image": ("q.png", png.getvalue())},
                               data={"k": "6"}).json()  # fmt: skip
    vector = image.encode([picture])[0].tolist()
    by_vector = search(server, "/search/embedding", features=vector, gallery="text", k=6)
    assert [h["id"] for h in by_vector["results"]] == [h["id"] for h in by_image["results"]]


def test_calibration_gates_image_queries_on_novelty_and_noise_is_rejected(served, tmp_path):
    """`probsearch calibrate` sets the image queries' familiarity gate on novelty (it flags
    the synthetic outliers better than the log-det); a noise picture is then rejected naming
    novelty, with the value its answer reports, sent as a picture or as its backbone vector.
    Captions carry no novelty."""
    _, data, index_root = served
    root = Path(shutil.copytree(index_root, tmp_path / "indexes"))
    model = index_root.parent / "model"
    probsearch("calibrate", "--data", data, "--index-root", root, "--model", model,
               "--target-coverage", "0.8", "--mc-samples", "4")  # fmt: skip
    gate = read_manifest(active_version(root, "text")).calibration["w2"]
    assert gate.gate_score == "novelty" and gate.gate_limit is not None
    noise = Image.fromarray(np.random.default_rng(4).integers(0, 256, (96, 96, 3), np.uint8))
    png = io.BytesIO()
    noise.save(png, format="PNG")
    vector = load_backbone("efficientnet-lite0", "image").encode([noise])[0].tolist()
    artifacts = type("Artifacts", (), {"model": model, "index_root": root})
    with ServerThread(make_settings(artifacts)) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            picture = client.post("/search/image", files={"image": ("n.png", png.getvalue())})
        as_vector = search(server, "/search/embedding", features=vector, gallery="text")
        caption = search(server, "/search/text", text="a red circle", k=40)
        first = caption["results"][0]
        with httpx.Client(base_url=server.url, timeout=60) as client:
            picture_file = client.get(f"/v1/items/{first['id']}/image").content
            as_query = client.post("/search/image", files={"image": ("p.png", picture_file)})
    # Each picture's novelty is stored at reindex (novelty.npy), the same as it gets as a query,
    # and each image result says whether the gate would refuse it.
    version = open_version(active_version(root, "image"))
    rows = {r["id"]: i for i, r in enumerate(version.metadata(list(range(version.manifest.count))))}
    stored = np.asarray(version.novelty)
    version.close()
    assert stored[rows[first["id"]]] == pytest.approx(as_query.json()["query"]["novelty"], abs=1e-4)
    for hit in caption["results"]:
        assert hit["unfamiliar"] == bool(stored[rows[hit["id"]]] > gate.gate_limit)
    for query in (picture.json()["query"], as_vector["query"]):
        assert query["novelty"] > gate.gate_limit
        assert query["rejected"] is True
        assert query["reject_score"] == {
            "name": "novelty", "value": query["novelty"], "threshold": gate.gate_limit,
        }  # fmt: skip
    assert caption["query"]["novelty"] is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"features": [0.5] * 100, "gallery": "image"}, "must be (N, 384)"),
        ({"features": [0.5] * 384, "mu": [0.0], "logvar": [0.0], "gallery": "image"}, "either"),
        ({"mu": [0.0] * 16, "gallery": "image"}, "go together"),
    ],
)
def test_bad_vectors_are_clear_4xx(served, body, message) -> None:
    server, *_ = served
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post("/search/embedding", json=body)
    assert 400 <= answer.status_code < 500, answer.text
    assert message in json.dumps(answer.json())


def test_a_model_without_backbones_refuses_vectors(client) -> None:
    answer = client.post("/search/embedding", json={"features": [0.1] * 8, "gallery": "image"})
    assert answer.status_code == 422, answer.text
    assert "no backbone" in answer.json()["detail"]
