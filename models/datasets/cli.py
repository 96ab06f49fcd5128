"""`probsearch data ...`: generate the built-in shapes dataset and check dataset directories."""

from __future__ import annotations

import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Annotated

import typer

from models.datasets.records import SPLITS, DatasetError, load_dataset
from models.datasets.shapes import generate_shapes

app = typer.Typer(
    no_args_is_help=True,
    help="Datasets: write the built-in shapes dataset, or check a dataset directory.",
)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=1)


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
        raise _fail(str(exc)) from exc
    except BrokenProcessPool as exc:
        raise _fail(f"a worker process died ({exc}); retry with --workers 1") from exc
    elapsed = time.perf_counter() - started
    typer.echo(f"wrote {images} images (seed {seed}) to {out} in {elapsed:.1f} s")


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
        raise _fail(str(exc)) from exc
    typer.echo(f"wrote {len(written)} photographs to {out}")


@app.command("check")
def check(
    directory: Annotated[Path, typer.Argument(help="Dataset directory (docs/data-format.md).")],
) -> None:
    """Validate a dataset directory and print what it holds."""
    try:
        dataset = load_dataset(directory)
    except (DatasetError, OSError) as exc:
        raise _fail(str(exc)) from exc
    name = dataset.meta.get("name", "?")
    typer.echo(f"{directory}: dataset {name!r}, {len(dataset.label_names)} label names")
    for split in SPLITS:
        part = dataset.split(split)
        typer.echo(f"  {split:5s}  {len(part.images):7d} images  {len(part.captions):8d} captions")
