"""The clip-art dataset: Debian's openclipart-svg drawings with their authors' words as captions.

`write_clipart(out)` reads every SVG of the library, keeps one copy of each distinct file, turns
its metadata into captions and labels (models.datasets.clipart_metadata), renders it to a PNG
(models.datasets.clipart_render), and writes the dataset format of docs/data-format.md. Every
drawing that cannot be used is skipped and counted by reason; the run never stops on one. A
second run into the same directory renders only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from models.datasets.clipart_metadata import (
    AuthorText,
    MetadataError,
    clean_description,
    clean_keywords,
    clean_title,
    keyword_caption,
    keywords_named,
    plural_folding,
    read_author_text,
)
from models.datasets.clipart_render import (
    INSTALL_HINT,
    RenderError,
    RenderLimits,
    check_svg,
    render_png,
    renderer_available,
)
from models.datasets.records import (
    CAPTIONS_FILE,
    DATASET_FILE,
    FORMAT_VERSION,
    IMAGES_FILE,
    SPLITS,
    DatasetError,
)

DATASET_NAME = "clipart"
LIBRARY = Path("/usr/share/openclipart/svg")
LIBRARY_HINT = (
    "the Open Clip Art Library is not installed: on Debian or Ubuntu run "
    "`apt-get install openclipart-svg` (scripts/bootstrap.sh does it), or pass --library DIR"
)
IMAGE_SIZE = 224  # what ImageNet backbones take; the from-scratch encoders resize it
RENDER_FILE = "render.json"
SKIPPED_FILE = "skipped.jsonl"
TEST_BUCKETS, VAL_BUCKETS = range(0, 10), range(10, 20)  # of 100 path-hash buckets


@dataclass(frozen=True)
class Drawing:
    """One usable drawing: its source, where its PNG goes, and its captions and labels."""

    svg: Path
    source: str  # its path in the library, e.g. "food/fruit/apple.svg"
    image_id: str
    split: str
    category: str
    keywords: tuple[str, ...]
    captions: tuple[str, ...]

    @property
    def file(self) -> str:
        return f"images/{self.image_id}.png"

    @property
    def labels(self) -> tuple[str, ...]:
        return (self.category, *self.keywords)


@dataclass
class Tally:
    """What was dropped and why: whole drawings, and caption sources that were junk."""

    skipped: list[dict[str, str]] = field(default_factory=list)
    rules: Counter[str] = field(default_factory=Counter)

    def skip(self, path: str, reason: str, detail: str = "") -> None:
        self.skipped.append({"path": path, "reason": reason, "detail": detail})

    def reasons(self) -> dict[str, int]:
        return dict(Counter(s["reason"] for s in self.skipped).most_common())


def split_of(relative_path: str) -> str:
    """10% test, 10% val, 80% train, fixed by a hash of the file's path in the library."""
    bucket = int(hashlib.sha1(relative_path.encode()).hexdigest(), 16) % 100
    return "test" if bucket in TEST_BUCKETS else "val" if bucket in VAL_BUCKETS else "train"


def image_id(relative_path: str) -> str:
    return "clipart-" + hashlib.sha1(relative_path.encode()).hexdigest()[:12]


def read_library(library: Path, limits: RenderLimits, tally: Tally) -> list[Drawing]:
    """Every usable drawing of the library in path order, with its captions; the rest tallied."""
    sources: list[tuple[str, Path, AuthorText]] = []
    seen: set[str] = set()
    for svg in sorted(library.rglob("*.svg")):
        relative = svg.relative_to(library).as_posix()
        try:
            data = svg.read_bytes()
            check_svg(data, limits)
            digest = hashlib.sha1(data).hexdigest()
            if digest in seen:
                raise RenderError("duplicate file", "same bytes as an earlier file")
            seen.add(digest)
            sources.append((relative, svg, read_author_text(data)))
        except RenderError as exc:
            tally.skip(relative, exc.reason, str(exc))
        except (MetadataError, OSError) as exc:
            tally.skip(relative, "unreadable", str(exc))
    return _drawings(sources, tally)


def _drawings(sources: list[tuple[str, Path, AuthorText]], tally: Tally) -> list[Drawing]:
    titles = Counter(text.title for _, _, text in sources)
    descriptions = Counter(text.description for _, _, text in sources)
    plurals = plural_folding(k for _, _, text in sources for k in text.keywords)
    drawings = []
    for relative, svg, text in sources:
        category = str(Path(relative).parent.as_posix())
        keywords = clean_keywords(text.keywords, plurals)
        title = clean_title(text.title, titles)
        description = clean_description(text.description, title, descriptions)
        tally.rules["title kept" if title else "title dropped"] += 1
        if text.description:
            tally.rules["description kept" if description else "description dropped"] += 1
        captions = tuple(c for c in (title, description, keyword_caption(keywords, category)) if c)
        drawings.append(
            Drawing(
                svg, relative, image_id(relative), split_of(relative), category, keywords, captions
            )
        )
    return drawings


def _render_task(task: tuple[str, str, int, RenderLimits]) -> tuple[str, str, str]:
    """(image_id, reason, detail); reason "" when rendered."""
    svg, out, size, limits = task
    try:
        render_png(Path(svg), Path(out), size, limits)
    except RenderError as exc:
        return Path(out).stem, exc.reason, str(exc)
    return Path(out).stem, "", ""


def _rendered(tasks: list[tuple], workers: int) -> Iterator[tuple[str, str, str]]:
    if workers <= 1:
        yield from map(_render_task, tasks)
        return
    # spawn: each worker is one thread, so the renderer's preexec_fn runs safely there.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from pool.map(_render_task, tasks, chunksize=16)


def render_all(
    drawings: list[Drawing],
    out: Path,
    size: int,
    limits: RenderLimits,
    workers: int,
    progress: bool,
    tally: Tally,
) -> list[Drawing]:
    """The drawings whose PNG exists after rendering the missing ones; failures tallied."""
    missing = [d for d in drawings if not (out / d.file).is_file()]
    tasks = [(str(d.svg), str(out / d.file), size, limits) for d in missing]
    by_id = {d.image_id: d for d in missing}
    bar = tqdm(
        _rendered(tasks, workers),
        total=len(tasks),
        desc="clip art",
        unit="svg",
        disable=not progress,
    )
    for drawing_id, reason, detail in bar:
        if reason:
            tally.skip(by_id[drawing_id].source, reason, detail)
    return [d for d in drawings if (out / d.file).is_file()]


def _prepare_out(out: Path, size: int, overwrite: bool) -> None:
    """Refuse a non-empty directory that is not an earlier clip-art run (unless `overwrite`);
    drop earlier PNGs made at another size."""
    settings = out / RENDER_FILE
    if out.exists() and not out.is_dir():
        raise DatasetError(f"{out} exists and is not a directory")
    earlier = _earlier_settings(settings)
    if out.is_dir() and any(out.iterdir()) and earlier is None and not overwrite:
        raise DatasetError(
            f"{out} is not empty and holds no earlier clip-art run; choose an empty or new "
            "directory, or --overwrite"
        )
    (out / DATASET_FILE).unlink(missing_ok=True)  # written last: a dataset mid-run won't load
    images = out / "images"
    if earlier is not None and earlier.get("size") != size:
        for png in images.glob("*.png"):
            png.unlink()
    images.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"size": size}) + "\n")


def _earlier_settings(path: Path) -> dict | None:
    """The render settings of an earlier run into the same directory, if any."""
    if not path.is_file():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise DatasetError(
            f"{path} is not an earlier run's settings ({exc}); use --overwrite"
        ) from exc


def write_clipart(
    out: Path | str,
    *,
    library: Path | str = LIBRARY,
    size: int = IMAGE_SIZE,
    workers: int = 2,
    limits: RenderLimits | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Write the clip-art dataset to `out`; returns its dataset.json (with the skip counts)."""
    library, out, limits = Path(library), Path(out), limits or RenderLimits()
    if not library.is_dir():
        raise DatasetError(LIBRARY_HINT)
    if not renderer_available():
        raise DatasetError(INSTALL_HINT)
    if size < 16:
        raise DatasetError(f"--size must be at least 16 pixels, got {size}")
    _prepare_out(out, size, overwrite)
    tally = Tally()
    drawings = read_library(library, limits, tally)
    drawings = render_all(drawings, out, size, limits, workers, progress, tally)
    if not drawings:
        raise DatasetError(f"no drawing of {library} could be used: see {out / SKIPPED_FILE}")
    _write_records(out, drawings)
    _write_lines(out / SKIPPED_FILE, tally.skipped)
    meta = _dataset_meta(drawings, library, size, tally)
    (out / DATASET_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def _write_records(out: Path, drawings: list[Drawing]) -> None:
    images = [
        {
            "id": d.image_id,
            "file": d.file,
            "split": d.split,
            "labels": list(d.labels),
            "source": d.source,
        }
        for d in drawings
    ]
    captions = [
        {
            "id": f"{d.image_id}-{k}",
            "image_id": d.image_id,
            "text": text,
            "split": d.split,
            "labels": [d.category, *keywords_named(text, d.keywords)],
        }
        for d in drawings
        for k, text in enumerate(d.captions)
    ]
    _write_lines(out / IMAGES_FILE, images)
    _write_lines(out / CAPTIONS_FILE, captions)


def _write_lines(path: Path, records: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as lines:
        lines.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


def _dataset_meta(drawings: list[Drawing], library: Path, size: int, tally: Tally) -> dict:
    labels = sorted({label for d in drawings for label in d.labels})
    return {
        "name": DATASET_NAME,
        "version": FORMAT_VERSION,
        "label_names": labels,
        "library": str(library),
        "image_size": size,
        "num_images": len(drawings),
        "num_captions": sum(len(d.captions) for d in drawings),
        "splits": {s: sum(d.split == s for d in drawings) for s in SPLITS},
        "skipped": tally.reasons(),
        "caption_sources": dict(sorted(tally.rules.items())),
    }
