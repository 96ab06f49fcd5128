"""The demo's default build, clip art with heads on the pretrained backbones, made from a small
part of Debian's clip-art library: every stage runs, the examples are drawings, and the served
answers carry the MC-dropout uncertainty the heads give."""

import dataclasses
import shutil
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from models.command_line import EXIT_BAD_INPUT
from models.datasets.clipart import LIBRARY
from models.networks.model_config import ModelConfig
from models.settings import Settings
from probsearch.background_server import BackgroundServer
from probsearch.cli import app
from probsearch.demo import (
    CLIPART_PLAN,
    SHAPES_PLAN,
    DemoPaths,
    _stage_keys,
    build_demo,
    demo_model,
    run_examples,
    with_image_backbone,
)

FOLDERS = ("containers", "science", "decorations", "electronics")  # about 100 drawings


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("clipart-demo")
    library = root / "library"
    for folder in FOLDERS:
        shutil.copytree(LIBRARY / folder, library / folder)
    plan = dataclasses.replace(
        CLIPART_PLAN, library=str(library), epochs=3, patience=0, embed_dim=16,
        metrics=("query_mahalanobis", "w2"), mc_samples=4, image_components=16,
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
    assert body["metric"] == "query_mahalanobis"  # the plan's served metric, over HTTP


def test_the_demo_serves_the_style_heads_with_query_mahalanobis() -> None:
    model, _ = demo_model(CLIPART_PLAN)
    assert model.image_backbone == "efficientnet-lite0-style"
    assert model.image_components == 1024
    assert model.search_metric == "query_mahalanobis"
    assert CLIPART_PLAN.metrics[0] == "query_mahalanobis"


def test_a_plan_without_an_index_for_its_served_metric_is_refused() -> None:
    with pytest.raises(ValueError, match="query_mahalanobis; it must be among its metrics"):
        dataclasses.replace(CLIPART_PLAN, metrics=("w2",))


def test_another_image_backbone_changes_the_recipe_and_retrains_only_from_the_model() -> None:
    plain = with_image_backbone(CLIPART_PLAN, "efficientnet-lite0")
    model, _ = demo_model(plain)
    assert model.image_backbone == "efficientnet-lite0"
    assert model.image_components == 0  # the 1,024 components were chosen for the style vector
    assert demo_model(CLIPART_PLAN)[0].image_backbone == "efficientnet-lite0-style"
    plain_keys, style_keys = _stage_keys(plain), _stage_keys(CLIPART_PLAN)
    assert plain_keys["data"] == style_keys["data"]  # the drawings are not rendered again
    assert plain_keys["model"] != style_keys["model"]


@pytest.mark.parametrize(
    ("plan", "backbone", "message"),
    [
        (SHAPES_PLAN, "efficientnet-lite0-style", "not the shapes lab"),
        (CLIPART_PLAN, "resnet-50", "unknown image backbone 'resnet-50'"),
    ],
)
def test_the_shapes_lab_and_unknown_backbones_are_refused(plan, backbone, message) -> None:
    with pytest.raises(ValueError, match=message):
        with_image_backbone(plan, backbone)


def test_the_cli_refuses_a_backbone_for_the_shapes_lab_in_one_line(tmp_path) -> None:
    result = CliRunner().invoke(
        app, ["demo", "--shapes", "--image-backbone", "efficientnet-lite0-style",
              "--cache-dir", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == EXIT_BAD_INPUT
    assert "not the shapes lab" in result.output and "Traceback" not in result.output
