"""The demo's default build, clip art with heads on the pretrained backbones, made from a small
part of Debian's clip-art library: every stage runs, the examples are drawings, and the served
answers carry the MC-dropout uncertainty the heads give."""

import dataclasses
import shutil
from pathlib import Path

import httpx
import pytest

from models.datasets.clipart import LIBRARY
from models.networks.model_config import ModelConfig
from models.settings import Settings
from probsearch.background_server import BackgroundServer
from probsearch.demo import CLIPART_PLAN, DemoPaths, build_demo, run_examples

FOLDERS = ("containers", "science", "decorations", "electronics")  # about 100 drawings


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("clipart-demo")
    library = root / "library"
    for folder in FOLDERS:
        shutil.copytree(LIBRARY / folder, library / folder)
    plan = dataclasses.replace(
        CLIPART_PLAN, library=str(library), epochs=3, patience=0, embed_dim=16,
        metrics=("w2", "kl"), mc_samples=4,
    )  # fmt: skip
    said: list[str] = []
    paths = build_demo(root / "cache", plan, None, say=said.append)
    return paths.root, said


def test_every_stage_builds_the_clipart_demo_on_backbones(built) -> None:
    cache, said = built
    text = "\n".join(said)
    assert "rendering the clip art" in text and "heads on the pretrained backbones" in text
    config = ModelConfig.load(cache / "model")
    assert config.pretrained and config.name == "probsearch-clipart"
    assert (cache / "data" / "features").is_dir()


def test_the_examples_are_drawings_and_answers_carry_mutual_information(built) -> None:
    cache, _ = built
    settings = Settings(index_root=cache / "indexes", model=cache / "model", port=0,
                        host="127.0.0.1", device="cpu")  # fmt: skip
    lines: list[str] = []
    with (
        BackgroundServer(settings, log_level="warning") as server,
        httpx.Client(timeout=60) as http,
    ):
        run_examples(http, server.url, DemoPaths(cache), lines.append)
        body = http.post(f"{server.url}/search/text", json={"text": "a test tube", "k": 3}).json()
    shown = "\n".join(lines)
    assert "# text -> images" in shown and "clipart-" in shown
    assert "nothing like the drawings it knows" in shown
    assert body["query"]["mutual_information"] > 0
