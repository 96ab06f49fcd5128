"""`probsearch data ...`: write the built-in datasets (shapes, clip art) and check dataset
directories."""

from __future__ import annotations

import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Annotated

import typer

from models.command_line import fail
from models.datasets.clipart import IMAGE_SIZE, LIBRARY, SKIPPED_FILE, write_clipart
from models.datasets.clipart_render import RenderLimits
from models.datasets.records import SPLITS, DatasetError, load_dataset
from models.datasets.shapes import generate_shapes

app = typer.Typer(
    no_args_is_help=True,
    help="Datasets: write the built-in shapes or clip-art dataset, or check a dataset directory.",
)


@app.command("shapes")
def shapes(
    out: Annotated[Path, typer.Option("--out", help="Directory to write (new or empty).")],
    images: Annotated[int, typer.Option("--images", min=1, help="Number of images.")],
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed; same seed, same bytes.")] = 0,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Processes (default: all cores).")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a dataset already in --out.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Write the seeded shapes dataset: images/*.png, images.jsonl, captions.jsonl, dataset.json."""
    started = time.perf_counter()
    try:
        generate_shapes(out, images, seed, workers=workers, overwrite=overwrite, progress=not quiet)
    except (DatasetError, OSError) as exc:
        raise fail(str(exc)) from exc
    except BrokenProcessPool as exc:
        raise fail(f"a worker process died ({exc}); retry with --workers 1") from exc
    elapsed = time.perf_counter() - started
    typer.echo(f"wrote {images} images (seed {seed}) to {out} in {elapsed:.1f} s")


@app.command("clipart")
def clipart(
    out: Annotated[
        Path, typer.Option("--out", help="Directory to write (new, or an earlier run).")
    ],
    library: Annotated[
        Path, typer.Option("--library", help="The SVG library (Debian's openclipart-svg).")
    ] = LIBRARY,
    size: Annotated[int, typer.Option("--size", min=16, help="PNG side in pixels.")] = IMAGE_SIZE,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Renderer processes.")] = 2,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds one drawing may take to render.")
    ] = RenderLimits.timeout_s,
    max_mb: Annotated[
        float, typer.Option("--max-mb", min=0.001, help="Largest SVG file read, in MB.")
    ] = RenderLimits.max_bytes / 2**20,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Write into a non-empty directory anyway.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Write the Open Clip Art Library as a dataset: PNGs on white, captions from the authors'
    titles, descriptions and keywords (rules: docs/data-format.md). A second run into the same
    directory renders only what is missing."""
    limits = RenderLimits(max_bytes=int(max_mb * 2**20), timeout_s=timeout)
    started = time.perf_counter()
    try:
        meta = write_clipart(out, library=library, size=size, workers=workers, limits=limits,
                             overwrite=overwrite, progress=not quiet)  # fmt: skip
    except (DatasetError, OSError) as exc:
        raise fail(str(exc)) from exc
    except BrokenProcessPool as exc:
        raise fail(f"a worker process died ({exc}); retry with --workers 1") from exc
    elapsed = time.perf_counter() - started
    typer.echo(
        f"wrote {meta['num_images']} images and {meta['num_captions']} captions to {out} in "
        f"{elapsed:.1f} s; splits {meta['splits']}"
    )
    skipped = ", ".join(f"{n} {reason}" for reason, n in meta["skipped"].items()) or "none"
    typer.echo(f"skipped drawings: {skipped} (each one: {out / SKIPPED_FILE})")


@app.command("photos")
def photos(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the PNGs into.")],
) -> None:
    """Write real photographs (scikit-image's bundled ones, with crops): images unlike the shapes
    data, for `probsearch eval --ood` and for trying the service with a photograph."""
    from models.datasets.photos import write_photos

    try:
        written = write_photos(out)
    except OSError as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"wrote {len(written)} photographs to {out}")


@app.command("check")
def check(
    directory: Annotated[Path, typer.Argument(help="Dataset directory (docs/data-format.md).")],
) -> None:
    """Validate a dataset directory and print what it holds."""
    try:
        dataset = load_dataset(directory)
    except (DatasetError, OSError) as exc:
        raise fail(str(exc)) from exc
    name = dataset.meta.get("name", "?")
    typer.echo(f"{directory}: dataset {name!r}, {len(dataset.label_names)} label names")
    for split in SPLITS:
        part = dataset.split(split)
        typer.echo(f"  {split:5s}  {len(part.images):7d} images  {len(part.captions):8d} captions")
