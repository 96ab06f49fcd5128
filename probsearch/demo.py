"""`probsearch demo`: build (or reuse) data, model, indexes and calibration, then serve.

By default the data is Debian's clip art and the model heads on the pretrained backbones
(CLIPART_PLAN); `--shapes` builds the shapes lab instead, whose captions have exact ambiguity
ground truth (SHAPES_PLAN). Every stage writes into one cache dir and is skipped when its
output is already there for the same plan, so a second run only activates and serves:

    <cache>/data/       the dataset                 (probsearch data clipart | shapes)
    <cache>/model/      trained model + ONNX        (probsearch train)
    <cache>/indexes/    image and caption galleries (probsearch reindex, the test split)
    <cache>/demo.json   each stage done, with the plan fields it was built for
"""

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from indexer.calibration import CalibrationJob, Target, run_calibration
from indexer.calibration_inheritance import active_manifest
from indexer.publish import ReindexJob, run_reindex
from indexer.registry import ActiveRegistry
from indexer.threads import apply_thread_budget
from models.backbones.registry import check_spec
from models.datasets.clipart import DATASET_NAME as CLIPART_NAME
from models.datasets.clipart import LIBRARY, write_clipart
from models.datasets.photos import write_photos
from models.datasets.records import (
    CaptionRecord,
    ImageRecord,
    attributes_named,
    is_plausible_match,
    load_dataset,
)
from models.datasets.shapes import generate_shapes
from models.evaluation.evaluate import is_single_object
from models.networks.model_config import ModelConfig, TrainConfig
from models.threads import ThreadBudget, available_cpus, thread_budget
from models.training.train import train

log = logging.getLogger(__name__)

STATE_FILE = "demo.json"
Say = Callable[[str], None]
Threads = ThreadBudget | None
GALLERIES = ("image", "text")


# The image trunk of benchmarks/results/recipe_seeds.md: full-resolution convs with max
# pooling and per-cell object detectors; at the strided trunk's training time it lifts t2i
# P@1 from 40.4 to 48.7 and PMRP by 3.5-4 points on held-out data (3 seeds).
# No MC-dropout: channel dropout in a trunk this narrow erased shape (a linear probe on the
# image means read it at 32-36%, chance 20%; 52% without); dropping it lifted single-object
# P@1 from 21.8 +- 8.4 to 41.9 +- 6.1 on held-out data (3 seeds). MC-dropout stays available
# (--dropout), but this model's MI is 0: the log-det and the retrieval posterior carry its
# uncertainty.
DEMO_TRUNK = {
    "cnn_downsample": "maxpool",
    "stem_stride": 1,
    "image_pooling": "objects",
    "cnn_channels": (8, 16, 32, 64),
    "dropout": 0.0,
}


@dataclass(frozen=True)
class DemoPlan:
    """Sizes of the demo build; a change of plan rebuilds everything after the changed stage.
    The defaults are the shapes lab's (SHAPES_PLAN); CLIPART_PLAN is the demo's default."""

    dataset: str = "shapes"  # or "clipart"
    library: str = ""  # clip art: the SVG library ("" = Debian's openclipart-svg)
    images: int = 2500  # shapes
    epochs: int = 20  # at most; training stops when validation has not improved for `patience`
    patience: int = 5
    embed_dim: int = 32
    seed: int = 0
    metrics: tuple[str, ...] = ("w2", "kl", "min_kl", "js", "csd")
    target_coverage: float = 0.8  # answer the 80% most certain held-out queries, reject the rest
    # MC draws for calibration; a model without dropout draws its one embedding every time,
    # so two draws (the fewest the draw scores need) give the scores sixteen would.
    mc_samples: int = 16 if DEMO_TRUNK["dropout"] > 0 else 2
    # clip art: the image backbone the heads read; efficientnet-lite0-style adds the network's
    # stage statistics (docs/pretrained.md)
    image_backbone: str = "efficientnet-lite0"
    # ModelConfig.image_components: the style backbone's 7,032 features read as their first
    # 1,024 principal components (models.networks.principal_components); 0 for other backbones
    image_components: int = 0
    search_with: str = ""  # ModelConfig.search_with: the metric served by default

    def __post_init__(self) -> None:
        if self.search_with and self.search_with not in self.metrics:
            raise ValueError(f"the demo serves {self.search_with}; it must be among its metrics")


SHAPES_PLAN = DemoPlan()
SMALL_PLAN = DemoPlan(
    images=300, epochs=2, patience=0, embed_dim=16, metrics=("w2", "kl", "min_kl")
)
# Heads on the pretrained backbones, trained on cached features: the budget of
# docs/results-clipart-backbones.md (at most 60 epochs, patience 10), MC dropout in the heads.
# The style backbone and query_mahalanobis: on the clip-art test split no worse than either
# point model in either direction (docs/results-clipart-style.md); the image heads read the
# vector's first 1,024 principal components, no worse on val at 2.5x the training speed
# (docs/results-clipart-components.md).
CLIPART_PLAN = DemoPlan(
    dataset="clipart", epochs=60, patience=10, embed_dim=256, mc_samples=16,
    image_backbone="efficientnet-lite0-style", image_components=1024,
    search_with="query_mahalanobis",
    metrics=("query_mahalanobis", "w2", "kl", "min_kl", "js", "csd"),
)  # fmt: skip
BACKBONES = {"image_backbone": "efficientnet-lite0", "text_backbone": "all-minilm-l6-v2"}
# The heads' batch and learning rate, chosen on val for vse (benchmarks/model_comparison.py),
# and InfoNCE at T = 0.1 with the batch's other plausible matches out of the softmax: on val
# (3 seeds, models.objectives.infonce) the best objective for both vse and gcie-spread.
HEADS_TRAINING = {"batch_size": 128, "lr": 1e-3}
NCE_TRAINING = {"objective": "infonce", "temperature": 0.1, "positives": "plausible"}

# Each caption ranks its image above the image re-rendered with one shape swapped
# (models.datasets.counterfactuals), at this weight: single-object P@1 41.9 +- 6.1 -> 57.5 +-
# 3.4, t2i PMRP 18.2 -> 20.9 on held-out data (benchmarks/results/recipe_seeds.md).
# Captions with their size word swapped join them ("a small purple star" -> "a large purple
# star"): with the attribute probe, captions naming a size were answered at chance (their
# means barely held size); single-object P@1 on val 87.8 +- 3.6 -> 93.7 +- 4.2 (3 seeds), 92.5
# +- 3.3 on test. Swapping shape and colour words as well helped as much but made training 40%
# slower, past the demo's 3-minute build.
DEMO_COUNTERFACTUALS = {
    "counterfactual_weight": 10.0,
    "counterfactuals": "both",
    "caption_swaps": "size",
}


# Synthetic outliers per real image (models.datasets.outliers): in the recipe sweep they took
# the image log-det's AUROC for photographs against shapes images from 0.20 to 0.97 (0.981 on
# held-out seed 7, benchmarks/results/heldout_check.md).
DEMO_OUTLIERS = 0.25

# Weight of ranking each synthetic outlier's image log-det above every real image's: on a
# dataset nothing else used (shapes seed 13, 3 training seeds), the image log-det's AUROC for
# photographs against shapes test images rose from 0.71 +- 0.06 to 0.999, with no difference
# in retrieval (benchmarks/results/outlier_ranking.md).
DEMO_OUTLIER_RANKING = 1.0


# Weight of the loss that reads each image's shapes, colours and sizes off the trunk features
# (models.objectives.labels): without it the trunk learns colour and barely shape. Chosen on
# val of held-out data (shapes seed 11, 3 seeds; weights 1, 10, 30, 100): single-object P@1
# 64.3 +- 4.0 -> 87.8 +- 3.6, and every other column up (benchmarks/results/recipe_seeds.md).
DEMO_ATTRIBUTES = 100.0


def with_image_backbone(plan: DemoPlan, image_backbone: str) -> DemoPlan:
    """The clip-art plan with its heads on another image backbone: a shipped one by name or an
    ONNX image graph by path; ValueError for the shapes lab, which has no backbone."""
    if plan.dataset != "clipart":
        raise ValueError("--image-backbone goes with the clip-art demo, not the shapes lab")
    check_spec(image_backbone, "image")
    components = plan.image_components if image_backbone == CLIPART_PLAN.image_backbone else 0
    return replace(plan, image_backbone=image_backbone, image_components=components)


def demo_model(plan: DemoPlan) -> tuple[ModelConfig, TrainConfig]:
    """The recipe of the plan's dataset (clipart_model or shapes_model)."""
    return clipart_model(plan) if plan.dataset == "clipart" else shapes_model(plan)


def clipart_model(plan: DemoPlan) -> tuple[ModelConfig, TrainConfig]:
    """gcie-count-nce on the pretrained backbones (docs/results-clipart-backbones.md): means
    from InfoNCE on cosine (T = 0.1, the batch's other plausible matches out of the softmax),
    with the batch and learning rate chosen on val for the heads; each variance read from the
    standardised backbone vector and fitted to the number of the item's plausible training
    matches (variance_objective plausible_count), so a vague caption gets a larger log-det.
    The variance fitted to the spread of the batch's plausible matches (gcie-spread-nce) left
    the caption log-det against ambiguity (val Spearman -0.20; benchmarks/results/
    variance_reads_backbone_clipart.md). The text backbone is served with int8 weights: its
    graph runs 1.8-1.9x faster and is no worse in retrieval or rejection over 3 seeds
    (benchmarks/results/text_int8.md)."""
    model = ModelConfig(
        model_type="gcie", metric="cosine", embed_dim=plan.embed_dim, variance_reads_only=True,
        variance_reads_backbone=True, name="probsearch-clipart", text_backbone_int8=True,
        search_with=plan.search_with, image_components=plan.image_components,
        **{**BACKBONES, "image_backbone": plan.image_backbone},
    )  # fmt: skip
    training = TrainConfig(
        epochs=plan.epochs, patience=plan.patience, variance_objective="plausible_count",
        seed=plan.seed, **NCE_TRAINING, **HEADS_TRAINING,
    )  # fmt: skip
    return model, training


def shapes_model(plan: DemoPlan) -> tuple[ModelConfig, TrainConfig]:
    """The recipe docs/results.md found best (gcie-spread): means from the hinge loss on
    cosine, each variance fitted to the spread of the item's plausible matches; with the
    image trunk that recipe_seeds.md found better (DEMO_TRUNK), synthetic outliers,
    swapped-shape images (DEMO_COUNTERFACTUALS) and attribute supervision (DEMO_ATTRIBUTES)."""
    model = ModelConfig(
        model_type="gcie",
        metric="cosine",
        embed_dim=plan.embed_dim,
        variance_reads_only=True,
        **DEMO_TRUNK,
    )
    training = TrainConfig(
        epochs=plan.epochs,
        patience=plan.patience,
        variance_objective="spread",
        outlier_fraction=DEMO_OUTLIERS,
        outlier_ranking_weight=DEMO_OUTLIER_RANKING,
        attribute_weight=DEMO_ATTRIBUTES,
        **DEMO_COUNTERFACTUALS,
        seed=plan.seed,
    )
    return model, training


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


# Each stage depends on its own plan fields and on every stage before it.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("data", ("dataset", "library", "images", "seed")),
    ("model", ("epochs", "patience", "embed_dim")),
    ("indexes", ("metrics",)),
    ("calibration", ("target_coverage", "mc_samples")),
)


def _stage_keys(plan: DemoPlan) -> dict[str, dict[str, Any]]:
    """For each stage, the plan fields its output depends on (its own and earlier stages');
    from the model stage on, also the whole recipe of demo_model, so a cached model trained
    with another recipe is retrained."""
    keys, fields = {}, {}
    for name, own in STAGES:
        fields.update({field: getattr(plan, field) for field in own})
        if name == "model":
            model, training = demo_model(plan)
            fields["recipe"] = {"model": asdict(model), "training": asdict(training)}
        keys[name] = json.loads(json.dumps(fields))
    return keys


def _read_state(paths: DemoPaths) -> dict[str, Any]:
    """The state file: each built stage's key and result ({} before the first build)."""
    path = paths.root / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _done_stages(paths: DemoPaths, keys: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Results of the stages built for these keys, in order, up to the first stale one."""
    state = _read_state(paths)
    done: dict[str, Any] = {}
    for name, key in keys.items():
        entry = state.get(name)
        if entry is None or entry.get("key") != key:
            break
        done[name] = entry["result"]
    return done


def _save_state(paths: DemoPaths, keys: dict[str, Any], done: dict[str, Any]) -> None:
    state = {name: {"key": keys[name], "result": result} for name, result in done.items()}
    tmp = (paths.root / STATE_FILE).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(paths.root / STATE_FILE)


def _build_data(paths: DemoPaths, plan: DemoPlan, done: dict, say: Say, threads: Threads) -> bool:
    if plan.dataset == "clipart":
        library = plan.library or LIBRARY
        say(f"[1/4] rendering the clip art of {library} into {paths.data}")
        write_clipart(paths.data, library=library, overwrite=True)
        return True
    say(f"[1/4] generating {plan.images} shapes images into {paths.data}")
    generate_shapes(paths.data, plan.images, seed=plan.seed, overwrite=True)
    return True


def _build_model(paths: DemoPaths, plan: DemoPlan, done: dict, say: Say, threads: Threads) -> bool:
    model, training = demo_model(plan)
    what = "heads on the pretrained backbones" if model.pretrained else "a gcie model"
    say(f"[2/4] training {what} (at most {plan.epochs} epochs) into {paths.model}")
    shutil.rmtree(paths.model, ignore_errors=True)  # a stale model of an older plan
    train(paths.data, paths.model, model, training)
    return True


def _build_indexes(
    paths: DemoPaths, plan: DemoPlan, done: dict, say: Say, threads: Threads
) -> dict:
    versions = {}
    for gallery in GALLERIES:
        say(f"[3/4] indexing the test-split {gallery} gallery into {paths.index_root}")
        job = ReindexJob(
            modality=gallery, source=paths.data, model_dir=paths.model,
            index_root=paths.index_root, metrics=plan.metrics, split="test", seed=plan.seed,
            threads=threads,
        )  # fmt: skip
        versions[gallery] = run_reindex(job).version
    return versions


def _calibrate(paths: DemoPaths, plan: DemoPlan, done: dict, say: Say, threads: Threads) -> bool:
    """Where the build's pools take every CPU, calibrates on the batch budget's instead (half
    the CPUs a pool, concurrent_batches metrics and query chunks at once: the same CPUs, less
    waiting; on 2 cores one-thread pools beat two-thread pools taking turns,
    benchmarks/results/calibrate_metrics.md). The build's pools come back after; a budget the
    user set (PROBSEARCH_THREADS) is kept."""
    if threads is None or threads.intra_op != available_cpus():
        _calibrate_galleries(paths, plan, done, say, threads)
        return True
    budget = apply_thread_budget(thread_budget("batch"))
    try:
        _calibrate_galleries(paths, plan, done, say, budget)
    finally:
        apply_thread_budget(threads)
    return True


def _calibrate_galleries(
    paths: DemoPaths, plan: DemoPlan, done: dict, say: Say, threads: Threads
) -> None:
    registry = ActiveRegistry(paths.index_root, None)
    for gallery, version in done["indexes"].items():
        say(
            f"[4/4] calibrating the reject score, T and tau of the {gallery} gallery "
            "on the val split"
        )
        job = CalibrationJob(
            version_dir=registry.version_path(gallery, version), model_dir=paths.model,
            data_dir=paths.data, target=Target(coverage=plan.target_coverage),
            mc_samples=plan.mc_samples, seed=plan.seed, threads=threads,
        )  # fmt: skip
        for result in run_calibration(job):
            say(
                f"      {result.metric}: {result.score} T={result.temperature:g} "
                f"tau={result.threshold:.4f} "
                f"keeps {100 * result.kept_fraction:.0f}% of queries at P@1 precision "
                f"{100 * result.kept_precision:.0f}% (all: {100 * result.accuracy:.0f}%)"
                f"{result.gate_note()}"
            )


BUILDERS = {
    "data": _build_data,
    "model": _build_model,
    "indexes": _build_indexes,
    "calibration": _calibrate,
}


def build_demo(
    cache_dir: Path,
    plan: DemoPlan,
    redis_url: str | None,
    say: Say = print,
    threads: Threads = None,
) -> DemoPaths:
    """Build what is missing or stale under `cache_dir`, then activate the demo's versions;
    `threads` sizes the encoders' pools (None: the batch budget, models.threads)."""
    paths = DemoPaths(cache_dir)
    paths.root.mkdir(parents=True, exist_ok=True)
    keys = _stage_keys(plan)
    done = _done_stages(paths, keys)
    for name in keys:
        if name not in done:
            done[name] = BUILDERS[name](paths, plan, done, say, threads)
            _save_state(paths, keys, done)
    registry = ActiveRegistry(paths.index_root, redis_url)
    where = f"Redis at {redis_url} and the ACTIVE files" if redis_url else "the ACTIVE files"
    for gallery, version in done["indexes"].items():
        users = user_version(registry, gallery, paths)
        if users is None:
            registry.activate(gallery, version)
            say(f"activated the demo's {gallery} gallery {version} in {where}")
        else:
            say(
                f"keeping your {gallery} gallery {users} active (the demo's is {version}: "
                f"`probsearch index activate --modality {gallery} {version} --index-root "
                f"{paths.index_root}` switches back)"
            )
    return paths


def user_version(registry: ActiveRegistry, gallery: str, paths: DemoPaths) -> str | None:
    """The active version of `gallery` when a user activated one built from a source other
    than the demo's data (their own pictures or captions), else None: the demo then activates
    its own, and never takes the slot from theirs. A version the demo's state file names is
    the demo's, even when the cache dir has moved since it was built (its manifest then
    names the old data path)."""
    manifest = active_manifest(registry, gallery)
    if manifest is None or manifest.version == _demo_versions(paths).get(gallery):
        return None
    if Path(manifest.source) == paths.data.resolve():
        return None
    return manifest.version


def _demo_versions(paths: DemoPaths) -> dict[str, str]:
    """gallery -> the version the demo's indexes stage built, from its state file."""
    return dict(_read_state(paths).get("indexes", {}).get("result") or {})


EXAMPLE_CANDIDATES = 60  # test captions / images tried for each example
EXAMPLE_ATTRIBUTES = 2  # words of shape, colour or size the example image's answer names


@dataclass(frozen=True)
class DemoExamples:
    """What the demo's examples are drawn from: the test split (the galleries hold it) and
    real photographs (images unlike anything the model was trained on)."""

    captions: list[CaptionRecord]  # test captions, single-object ones first
    caption_by_id: dict[str, CaptionRecord]  # every test caption by id, to judge answers
    images: list[Path]
    labels: dict[str, list[str]]  # image id -> its "<colour> <shape>" labels
    photos: list[Path]
    image_by_id: dict[str, ImageRecord]  # every test image by id, to judge answers
    clipart: bool = False

    def plausible(self, caption_id: str, image_id: str) -> bool:
        """Whether the image holds everything the caption names, sizes and counts included
        (models.datasets.records.is_plausible_match, as the evaluation judges)."""
        return is_plausible_match(self.caption_by_id[caption_id], self.image_by_id[image_id])


def load_examples(paths: DemoPaths) -> DemoExamples:
    """The test split's captions and images, and the photographs (written on first use)."""
    test = load_dataset(paths.data, "test")
    # stable sort: single-object captions ("a purple star") first
    captions = sorted(test.captions, key=lambda c: not is_single_object(c))
    photos_dir = paths.root / "photos"
    if not any(photos_dir.glob("*.png")):
        write_photos(photos_dir)
    return DemoExamples(
        captions=captions[:EXAMPLE_CANDIDATES],
        caption_by_id={c.id: c for c in test.captions},
        images=[im.path for im in test.images[:EXAMPLE_CANDIDATES]],
        labels={im.id: list(im.labels) for im in test.images},
        photos=sorted(photos_dir.glob("*-full.png")),
        image_by_id={im.id: im for im in test.images},
        clipart=test.meta.get("name") == CLIPART_NAME,
    )


def _verdict(query: dict[str, Any]) -> str:
    reject = query["reject_score"]
    value = "n/a" if reject["value"] is None else f"{reject['value']:.3f}"
    word = "REJECTED" if query["rejected"] else "answered"
    return f"{word} ({reject['name']} {value}, threshold {reject['threshold']})"


def _describe_images(body: dict[str, Any], labels: dict[str, list[str]]) -> str:
    hits = [f"{h['id']} [{', '.join(labels.get(h['id'], []))}]" for h in body["results"]]
    return f"{_verdict(body['query'])}; top: " + "; ".join(hits)


def _describe_captions(body: dict[str, Any]) -> str:
    hits = [f'"{h["metadata"].get("text", h["id"])}"' for h in body["results"]]
    return f"{_verdict(body['query'])}; top: " + "; ".join(hits)


def run_examples(http: Any, url: str, paths: DemoPaths, say: Say) -> None:
    """Show a caption and an image the service answers, and a photograph it rejects (a kind
    of image it was never trained on), each as a curl command and its answer."""
    registry = ActiveRegistry(paths.index_root, None)
    if any(user_version(registry, gallery, paths) for gallery in GALLERIES):
        say("\nyour own gallery is active: the demo's example queries are skipped")
        return
    examples = load_examples(paths)
    request, body = _answered_caption(http, url, examples)
    say(f"\n# text -> images\n{_text_curl(url, request)}\n  "
        f"{_describe_images(body, examples.labels)}")  # fmt: skip
    image, body = _answered_image(http, url, examples)
    say(f"\n# image -> captions (upload)\ncurl -s {url}/search/image -F image=@{image} -F k=3"
        f"\n  {_describe_captions(body)}")  # fmt: skip
    photo, body = _first_upload(http, url, examples.photos, rejected=True)
    known = "drawings" if examples.clipart else "shapes"
    say(
        f"\n# a photograph: nothing like the {known} it knows, so it should be rejected\n"
        f"curl -s {url}/search/image -F image=@{photo} -F k=3\n  {_describe_captions(body)}"
    )


def _text_curl(url: str, request: dict) -> str:
    return (
        f"curl -s {url}/search/text -H 'Content-Type: application/json' -d '{json.dumps(request)}'"
    )


def _answered_caption(http: Any, url: str, examples: DemoExamples) -> tuple[dict, dict]:
    """The first test caption (single-object ones first) that is answered and whose first
    result is a plausible match of it; else the first one tried."""
    first = None
    for caption in examples.captions:
        request = {"text": caption.text, "k": 3}
        body = _checked(http.post(f"{url}/search/text", json=request))
        first = first or (request, body)
        top = body["results"][0]["id"] if body["results"] else None
        if not body["query"]["rejected"] and top and examples.plausible(caption.id, top):
            return request, body
    return first


def _answered_image(http: Any, url: str, examples: DemoExamples) -> tuple[Path, dict]:
    """The first test image that is answered and whose first caption is a plausible match of
    it that says something about it (names at least EXAMPLE_ATTRIBUTES shape, colour or size
    words: "four things" is true of many images and shows little); else the first answered
    plausibly; else the first one tried."""
    first = plausible = None
    for image in examples.images:
        body = _upload(http, url, image)
        first = first or (image, body)
        top = body["results"][0]["id"] if body["results"] else None
        held = top in examples.caption_by_id and examples.plausible(top, image.stem)
        if body["query"]["rejected"] or not held:
            continue
        if attributes_named(examples.caption_by_id[top]) >= EXAMPLE_ATTRIBUTES:
            return image, body
        plausible = plausible or (image, body)
    return plausible or first


def _upload(http: Any, url: str, image: Path) -> dict[str, Any]:
    with image.open("rb") as handle:
        files = {"image": (image.name, handle, "image/png")}
        return _checked(http.post(f"{url}/search/image", files=files, data={"k": "3"}))


def _first_upload(http: Any, url: str, images: list[Path], rejected: bool) -> tuple[Path, dict]:
    """The first image whose verdict is `rejected` (else the first one) and its response."""
    first = None
    for image in images:
        body = _upload(http, url, image)
        if body["query"]["rejected"] is rejected:
            return image, body
        first = first or (image, body)
    return first


def _checked(response: Any) -> dict[str, Any]:
    if response.status_code != 200:
        raise RuntimeError(f"{response.request.url} answered {response.status_code}: "
                           f"{response.text[:300]}")  # fmt: skip
    return response.json()
