"""`probsearch demo`: build (or reuse) data, model, indexes and calibration, then serve.

Every stage writes into one cache dir and is skipped when its output is already there for the
same plan, so a second run only activates and serves:

    <cache>/data/       shapes dataset              (probsearch data shapes)
    <cache>/model/      trained model + ONNX        (probsearch train)
    <cache>/indexes/    image and caption galleries (probsearch reindex, the test split)
    <cache>/demo.json   the plan and the stages done (calibration on the val split included)
"""

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from indexer.publish import ReindexJob, run_reindex
from indexer.registry import ActiveRegistry
from models.datasets.shapes import generate_shapes
from models.model_config import ModelConfig, TrainConfig
from models.train import train
from service.calibration import CalibrationJob, Target, run_calibration

log = logging.getLogger(__name__)

STATE_FILE = "demo.json"
GALLERIES = ("image", "text")


@dataclass(frozen=True)
class DemoPlan:
    """Sizes of the demo build; a change of plan rebuilds everything after the changed stage."""

    images: int = 3000
    epochs: int = 12
    embed_dim: int = 32
    seed: int = 0
    metrics: tuple[str, ...] = ("w2", "kl", "min_kl", "js", "csd")
    target_precision: float = 0.5
    mc_samples: int = 16


SMALL_PLAN = DemoPlan(images=300, epochs=2, embed_dim=16, metrics=("w2", "kl", "min_kl"))


@dataclass(frozen=True)
class DemoPaths:
    """Where the demo keeps its artifacts."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def index_root(self) -> Path:
        return self.root / "indexes"


def redis_answering(url: str | None) -> bool:
    """Whether a Redis server answers PING at `url` within a second."""
    if not url:
        return False
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _load_state(paths: DemoPaths, plan: DemoPlan) -> dict[str, Any]:
    """The stages already done for this plan (none when the plan changed)."""
    path = paths.root / STATE_FILE
    if not path.is_file():
        return {}
    state = json.loads(path.read_text())
    if state.get("plan") != json.loads(json.dumps(dataclasses.asdict(plan))):
        log.info("the demo plan changed: rebuilding %s", paths.root)
        return {}
    return state.get("stages", {})


def _save_state(paths: DemoPaths, plan: DemoPlan, stages: dict[str, Any]) -> None:
    path = paths.root / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"plan": dataclasses.asdict(plan), "stages": stages}, indent=2))
    tmp.replace(path)


def _build_data(paths: DemoPaths, plan: DemoPlan, say: Callable[[str], None]) -> None:
    say(f"[1/4] generating {plan.images} shapes images into {paths.data}")
    generate_shapes(paths.data, plan.images, seed=plan.seed, overwrite=True)


def _build_model(paths: DemoPaths, plan: DemoPlan, say: Callable[[str], None]) -> None:
    say(f"[2/4] training a gcie model for {plan.epochs} epochs into {paths.model}")
    config = ModelConfig(model_type="gcie", embed_dim=plan.embed_dim)
    train(paths.data, paths.model, config, TrainConfig(epochs=plan.epochs, seed=plan.seed))


def _build_indexes(paths: DemoPaths, plan: DemoPlan, say: Callable[[str], None]) -> dict:
    versions = {}
    for gallery in GALLERIES:
        say(f"[3/4] indexing the test-split {gallery} gallery into {paths.index_root}")
        job = ReindexJob(
            modality=gallery, source=paths.data, model_dir=paths.model,
            index_root=paths.index_root, metrics=plan.metrics, split="test", seed=plan.seed,
        )  # fmt: skip
        versions[gallery] = run_reindex(job).version
    return versions


def _calibrate(paths: DemoPaths, plan: DemoPlan, versions: dict, say: Callable[[str], None]):
    registry = ActiveRegistry(paths.index_root, None)
    for gallery, version in versions.items():
        say(f"[4/4] calibrating T and tau of the {gallery} gallery on the val split")
        job = CalibrationJob(
            version_dir=registry.version_path(gallery, version), model_dir=paths.model,
            data_dir=paths.data, target=Target(precision=plan.target_precision),
            mc_samples=plan.mc_samples, seed=plan.seed,
        )  # fmt: skip
        for result in run_calibration(job):
            say(
                f"      {result.metric}: T={result.temperature:g} tau={result.threshold:.4f} "
                f"keeps {100 * result.kept_fraction:.0f}% of queries at R@1 precision "
                f"{100 * result.kept_precision:.0f}% (all: {100 * result.accuracy:.0f}%)"
            )


def build_demo(
    cache_dir: Path, plan: DemoPlan, redis_url: str | None, say: Callable[[str], None] = print
) -> DemoPaths:
    """Build what is missing under `cache_dir`, then activate the demo's index versions."""
    paths = DemoPaths(cache_dir)
    paths.root.mkdir(parents=True, exist_ok=True)
    stages = _load_state(paths, plan)
    if "data" not in stages:
        stages = {}
        _build_data(paths, plan, say)
        stages["data"] = True
        _save_state(paths, plan, stages)
    if "model" not in stages:
        _build_model(paths, plan, say)
        stages = {"data": True, "model": True}
        _save_state(paths, plan, stages)
    if "indexes" not in stages:
        stages["indexes"] = _build_indexes(paths, plan, say)
        _save_state(paths, plan, stages)
    if "calibration" not in stages:
        _calibrate(paths, plan, stages["indexes"], say)
        stages["calibration"] = True
        _save_state(paths, plan, stages)
    registry = ActiveRegistry(paths.index_root, redis_url)
    for gallery, version in stages["indexes"].items():
        registry.activate(gallery, version)
    where = f"Redis at {redis_url} and the ACTIVE files" if redis_url else "the ACTIVE files"
    say(f"activated {stages['indexes']} in {where}")
    return paths


VAGUE_QUERIES = ("something", "a shape", "some shapes", "an object", "things", "a colourful object")


def _first_test_image(paths: DemoPaths) -> Path:
    for line in (paths.data / "images.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["split"] == "test":
            return paths.data / record["file"]
    raise ValueError(f"{paths.data} has no test image")


def _describe(body: dict[str, Any]) -> str:
    query = body["query"]
    top = ", ".join(f"{hit['id']} ({hit['distance']:.3f})" for hit in body["results"])
    verdict = "REJECTED" if query["rejected"] else "answered"
    return (
        f"{verdict}: MI {query['mutual_information']:.4f} vs tau {query['reject_threshold']}; "
        f"top: {top}"
    )


def run_examples(http: Any, url: str, paths: DemoPaths, say: Callable[[str], None]) -> None:
    """Send one text query, one image upload and a query the service rejects; print curls."""
    text = {"text": "a red circle left of a blue square", "k": 3}
    body = _checked(http.post(f"{url}/search/text", json=text))
    say(f"\n# text -> images\ncurl -s {url}/search/text -H 'Content-Type: application/json' "
        f"-d '{json.dumps(text)}'\n  {_describe(body)}")  # fmt: skip
    image = _first_test_image(paths)
    with image.open("rb") as handle:
        files = {"image": (image.name, handle, "image/png")}
        body = _checked(http.post(f"{url}/search/image", files=files, data={"k": "3"}))
    say(f"\n# image -> captions (upload)\ncurl -s {url}/search/image -F image=@{image} -F k=3"
        f"\n  {_describe(body)}")  # fmt: skip
    rejected = _find_rejected(http, url)
    say(f"\n# a query the service rejects\ncurl -s {url}/search/text "
        f"-H 'Content-Type: application/json' -d '{json.dumps(rejected[0])}'\n"
        f"  {_describe(rejected[1])}")  # fmt: skip


def _find_rejected(http: Any, url: str) -> tuple[dict, dict]:
    """A vague query that the calibrated threshold rejects; else one with threshold 0."""
    for text in VAGUE_QUERIES:
        request = {"text": text, "k": 3}
        body = _checked(http.post(f"{url}/search/text", json=request))
        if body["query"]["rejected"]:
            return request, body
    request = {"text": VAGUE_QUERIES[0], "k": 3, "reject_threshold": 0.0}
    return request, _checked(http.post(f"{url}/search/text", json=request))


def _checked(response: Any) -> dict[str, Any]:
    if response.status_code != 200:
        raise RuntimeError(f"{response.request.url} answered {response.status_code}: "
                           f"{response.text[:300]}")  # fmt: skip
    return response.json()
