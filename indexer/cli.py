"""Subcommands of the index stage: reindex, calibrate and index list|activate|rollback|gc."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from indexer.registry import ActiveRegistry
from models.command_line import (
    IndexRootOpt,
    ModelOpt,
    RedisOpt,
    bad_input_exits,
    fail,
    required,
    served_settings,
    settings_from,
)
from models.onnx import ENCODE_BATCH
from models.threads import thread_budget

app = typer.Typer(no_args_is_help=True)
index_app = typer.Typer(no_args_is_help=True, help="Inspect and switch published index versions.")
app.add_typer(index_app, name="index")

T = TypeVar("T")


def _run(action: Callable[[], T]) -> T:
    """Run a command body; domain errors become one line on stderr, never a traceback."""
    try:
        return action()
    except KeyboardInterrupt:
        raise fail(
            "interrupted: nothing was published and the active version is unchanged;"
            " run the same command again to resume from the embedded chunks",
            130,
        ) from None
    except (ValueError, OSError) as e:
        raise fail(str(e)) from None


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


ModalityOpt = Annotated[str, typer.Option("--modality", help="image or text gallery.")]
BatchSizeOpt = Annotated[int, typer.Option(min=1, help="Items per encoder call.")]


@app.command()
def reindex(
    modality: ModalityOpt,
    source: Annotated[
        Path, typer.Option(help="Dataset dir, captions .jsonl, image folder or COCO .json.")
    ],
    model: ModelOpt = None,
    index_root: IndexRootOpt = None,
    metrics: Annotated[
        str,
        typer.Option(
            help="Comma-separated metrics to serve (default: the active version's when the "
            "same model built it, else the one the model ranks this gallery with)."
        ),
    ] = "",
    index_type: Annotated[str, typer.Option(help="auto|flat|ivf|ivfsq|hnsw|ivfpq")] = "auto",
    dtype: Annotated[str, typer.Option(help="float32|float16 for mu.npy/logvar.npy.")] = "float32",
    batch_size: BatchSizeOpt = ENCODE_BATCH,
    chunk_items: Annotated[int, typer.Option(min=1, help="Items per resumable chunk.")] = 4096,
    activate: Annotated[bool, typer.Option(help="Make the new version active.")] = False,
    redis_url: RedisOpt = None,
    max_bad_fraction: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.01,
    split: Annotated[str | None, typer.Option(help="Only this split of a dataset.")] = None,
    image_root: Annotated[Path | None, typer.Option(help="Image folder of a COCO json.")] = None,
    memory_budget_gb: Annotated[float | None, typer.Option(help="Index RAM budget.")] = None,
    device: Annotated[str, typer.Option(help="auto|cpu|cuda for the encoder.")] = "auto",
    engine: Annotated[str, typer.Option(help="local (this process) or ray (Ray Data).")] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster to use; default: a local Ray runtime.")
    ] = None,
    ray_workers: Annotated[
        int | None, typer.Option(min=1, help="Encoder actors; default: one per GPU or CPU.")
    ] = None,
    ray_threads: Annotated[
        int,
        typer.Option(
            min=1, help="CPUs per encoder actor: its ONNX threads on CPU, its image decoding."
        ),
    ] = 1,
) -> None:
    """Embed a gallery and publish a new index version (optionally activating it)."""
    from indexer.publish import ReindexJob, run_reindex
    from indexer.ray_engine import RayOptions
    from indexer.registry import default_redis_url
    from indexer.threads import apply_thread_budget

    settings = settings_from({"model": model, "index_root": index_root, "redis_url": redis_url})
    threads = apply_thread_budget(thread_budget("batch", settings.threads))
    model_dir = required(settings, "model", "--model")
    served = tuple(m.strip() for m in metrics.split(",") if m.strip())
    job = ReindexJob(
        modality=modality,
        source=source,
        model_dir=model_dir,
        index_root=required(settings, "index_root", "--index-root"),
        metrics=served,
        index_type=index_type,
        dtype=dtype,
        batch_size=batch_size,
        chunk_items=chunk_items,
        activate=activate,
        redis_url=default_redis_url(settings.redis_url),
        namespace=settings.namespace,
        max_bad_fraction=max_bad_fraction,
        split=split,
        image_root=image_root,
        memory_budget=int(memory_budget_gb * 2**30) if memory_budget_gb else None,
        device=device,
        engine=engine,
        ray=RayOptions(ray_address, ray_workers, ray_threads),
        shortlist_backend=settings.shortlist_backend,
        milvus_uri=settings.milvus_uri,
        threads=threads,
    )
    _setup_logging()
    started = time.perf_counter()
    result = _run(lambda: run_reindex(job))
    wall = time.perf_counter() - started
    report = result.report
    typer.echo(
        f"published {modality} version {result.version} at {result.path}: {report['kept']} items"
        f" ({report['bad']} skipped, {result.reused_chunks} chunks reused)"
        + ("; activated" if result.activated else "")
    )
    typer.echo(
        f"{report['total']} items read in {wall:.1f} s wall time"
        f" ({report['total'] / max(wall, 1e-9):.1f} items/s, engine {engine})"
    )
    if result.calibration_note:
        typer.echo(f"calibration: {result.calibration_note}")
    if result.unfamiliar_note:
        typer.echo(f"warning: {result.unfamiliar_note}")
    if result.activated and job.redis_url is None:
        typer.echo(_FILE_ONLY)


def _registry(index_root: Path | None, redis_url: str | None) -> ActiveRegistry:
    from indexer.publish import milvus_backend
    from indexer.registry import default_redis_url

    settings = settings_from({"index_root": index_root, "redis_url": redis_url})
    root = required(settings, "index_root", "--index-root")
    aliases = _run(lambda: milvus_backend(settings.shortlist_backend, settings.milvus_uri))
    redis_url = default_redis_url(settings.redis_url)
    return ActiveRegistry(root, redis_url, aliases=aliases, namespace=settings.namespace)


_REGISTRY_OPTIONS = [
    inspect.Parameter(
        "index_root", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=IndexRootOpt
    ),
    inspect.Parameter(
        "redis_url", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RedisOpt
    ),
]


def _registry_command(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register `body(registry, **options)` as `index <name>`: the command takes the body's
    options plus --index-root and --redis-url (flag, else environment) and passes the body
    the registry they name."""

    def register(body: Callable[..., None]) -> Callable[..., None]:
        options = list(inspect.signature(body, eval_str=True).parameters.values())[1:]

        def command(
            *, index_root: Path | None = None, redis_url: str | None = None, **kw: Any
        ) -> None:
            body(_registry(index_root, redis_url), **kw)

        command.__name__, command.__doc__ = body.__name__, body.__doc__
        command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in options] + _REGISTRY_OPTIONS
        )
        index_app.command(name)(command)
        return body

    return register


@_registry_command("list")
def list_versions(registry: ActiveRegistry, modality: ModalityOpt) -> None:
    """List published versions, oldest first; `*` marks the active one."""
    from indexer.manifest import read_manifest

    def body() -> None:
        sides = registry.sides(modality)
        active = registry.active_version(modality)
        versions = registry.versions(modality)
        if not versions:
            typer.echo(f"no {modality} versions under {registry.index_root}")
        typer.echo(_stores_line(sides, registry.redis_url))
        for version in versions:
            m = read_manifest(registry.version_path(modality, version))
            mark = "*" if version == active else " "
            typer.echo(
                f"{mark} {version}  {m.count} items  {m.index_type}  {','.join(m.metrics)}"
                f"  model {m.model_name}  {m.created_at}"
            )

    _run(body)


_FILE_ONLY = (
    "no Redis configured or answering on 127.0.0.1:6379: only the ACTIVE file was written; a "
    "service reading this index root switches on its next poll (a few seconds), not at once"
)


def _stores_line(sides: Any, redis_url: str | None) -> str:
    """Where the active version is recorded, and any disagreement between the stores."""
    where = f"ACTIVE file and Redis at {redis_url}" if redis_url else "ACTIVE file only (no Redis)"
    problem = sides.disagreement()
    return f"active version recorded in: {where}" + (
        f"\nwarning: {problem}; readers follow the higher generation" if problem else ""
    )


@_registry_command("activate")
def activate_version(
    registry: ActiveRegistry,
    modality: ModalityOpt,
    version: Annotated[str, typer.Argument(help="Version name (see `index list`).")],
) -> None:
    """Make a published version active (Redis key, ACTIVE file, activation event)."""
    record = _run(lambda: registry.activate(modality, version))
    typer.echo(f"activated {modality} version {version} (generation {record.generation})")
    if registry.redis_url is None:
        typer.echo(_FILE_ONLY)


@_registry_command("rollback")
def rollback(registry: ActiveRegistry, modality: ModalityOpt) -> None:
    """Activate the newest version older than the active one."""
    version = _run(lambda: registry.rollback(modality))
    typer.echo(f"rolled back: {modality} version {version} is active")


@_registry_command("gc")
def gc(
    registry: ActiveRegistry,
    modality: ModalityOpt,
    keep: Annotated[int, typer.Option(min=1, help="Newest versions to keep.")] = 3,
) -> None:
    """Delete old versions, keeping the newest --keep and always the active one, and what
    dead jobs left behind (their build dirs and pointer temp files)."""
    removed = _run(lambda: registry.gc(modality, keep))
    typer.echo(f"removed {len(removed)} {modality} versions" + "".join(f"\n  {v}" for v in removed))
    from indexer.job_owner import remove_debris

    debris = remove_debris(registry.modality_dir(modality))
    if debris:
        typer.echo(f"removed what dead jobs left: {', '.join(debris)}")


@_registry_command("add")
def add(
    registry: ActiveRegistry,
    modality: ModalityOpt,
    source: Annotated[Path, typer.Option(help="Captions .jsonl, image folder or dataset dir.")],
    model: ModelOpt = None,
    batch_size: BatchSizeOpt = ENCODE_BATCH,
) -> None:
    """Add the source's items to the active version without a rebuild (an id the gallery
    holds is replaced); running services serve them on their next request."""
    from indexer.live_writes import add_items
    from indexer.threads import apply_thread_budget
    from models.onnx.encoder_runtime import OnnxEncoder

    settings = settings_from({"model": model})
    threads = apply_thread_budget(thread_budget("batch", settings.threads))
    model_dir = required(settings, "model", "--model")

    def body() -> Any:
        encoder = OnnxEncoder(model_dir, modality, "auto", batch_size, threads)  # type: ignore[arg-type]
        return add_items(registry, modality, source, encoder, batch_size)

    summary = _run(body)
    typer.echo(
        f"added {summary.written} items to {modality} version {summary.version}"
        f" ({len(summary.skipped)} skipped); the gallery holds {summary.live_items}"
    )
    for bad in summary.skipped[:10]:
        typer.echo(f"  skipped {bad.id}: {bad.detail}")
    if summary.unshown:
        typer.echo(
            f"warning: {summary.unshown} pictures lie outside the gallery's image root "
            f"{summary.image_root or '(none)'}, the one folder the service shows pictures from: "
            "they are searched, but results cannot show them; copy them under it and add again"
        )


@_registry_command("delete")
def delete(
    registry: ActiveRegistry,
    modality: ModalityOpt,
    ids: Annotated[Path, typer.Option(help="Item ids, one a line (or JSON lines with an id).")],
) -> None:
    """Delete items from the active version without a rebuild."""
    from indexer.live_writes import delete_items, read_ids

    summary = _run(lambda: delete_items(registry, modality, read_ids(ids)))
    typer.echo(
        f"deleted {summary.written} items from {modality} version {summary.version}; the "
        f"gallery holds {summary.live_items}"
    )
    if summary.missing:
        shown = ", ".join(summary.missing[:10])
        typer.echo(f"{len(summary.missing)} ids were not in the gallery: {shown}")


@_registry_command("compact")
def compact_gallery(
    registry: ActiveRegistry,
    modality: ModalityOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Fold the active version's added and deleted items into a new version (re-encoding
    nothing) and activate it; writes made meanwhile are kept."""
    import json
    from dataclasses import asdict

    from indexer.build import default_memory_budget
    from indexer.compaction import compact

    _setup_logging()
    result = _run(lambda: compact(registry, modality, default_memory_budget()))
    if as_json:
        typer.echo(json.dumps(asdict(result)))
    elif result.new_version is None:
        typer.echo(f"nothing to compact: {modality} version {result.old_version} has no writes")
    else:
        typer.echo(
            f"compacted {modality} version {result.old_version} into {result.new_version}: "
            f"{result.items} items ({result.folded_writes} writes folded, "
            f"{result.copied_writes} made meanwhile copied); activated"
        )


@app.command()
def calibrate(
    data: Annotated[Path, typer.Option(help="Dataset dir with the held-out queries.")],
    target_precision: Annotated[
        float | None, typer.Option(help="P@1 precision the kept queries must reach.")
    ] = None,
    target_coverage: Annotated[
        float | None, typer.Option(help="Fraction of queries to keep instead.")
    ] = None,
    index_root: IndexRootOpt = None,
    model: ModelOpt = None,
    gallery: Annotated[list[str] | None, typer.Option(help="image and/or text.")] = None,
    split: Annotated[str, typer.Option(help="Held-out split the gallery does not hold.")] = "val",
    metrics: Annotated[str, typer.Option(help="Comma-separated; default: all served.")] = "",
    mc_samples: Annotated[
        int | None, typer.Option(help="MC draws [env PROBSEARCH_MC_SAMPLES].")
    ] = None,
    redis_url: RedisOpt = None,
) -> None:
    """Pick the reject score, its temperature and threshold for the active indexes on held-out
    queries (the score with the best normalised AUPRC)."""
    from indexer.calibration import CalibrationJob, Target, run_calibration
    from indexer.registry import ActiveRegistry, default_redis_url
    from indexer.threads import apply_thread_budget
    from models.threads import thread_budget

    settings = served_settings({"index_root": index_root, "model": model, "redis_url": redis_url})
    threads = apply_thread_budget(thread_budget("batch", settings.threads))
    with bad_input_exits():
        target = Target(precision=target_precision, coverage=target_coverage)
        redis = default_redis_url(settings.redis_url)
        registry = ActiveRegistry(settings.index_root, redis, namespace=settings.namespace)
        for modality in gallery or settings.galleries:
            version = registry.active_version(modality)
            if version is None:
                raise ValueError(f"no active {modality} index under {settings.index_root}")
            job = CalibrationJob(
                version_dir=registry.version_path(modality, version),
                model_dir=settings.model,
                data_dir=data,
                target=target,
                split=split,
                metrics=tuple(m.strip() for m in metrics.split(",") if m.strip()),
                # not a settings flag: calibration may draw more than the server's max_mc_samples
                mc_samples=settings.mc_samples if mc_samples is None else mc_samples,
                device=settings.device,
                threads=threads,
            )
            for result in run_calibration(job):
                typer.echo(_calibration_line(modality, version, result))


def _calibration_line(modality: str, version: str, result: Any) -> str:
    met = "" if result.target_met else "  (target NOT met: most certain group kept)"
    quality = max(result.normalized_auprc.values())
    return (
        f"{modality} {version} {result.metric}: rejects by {result.score} "
        f"(normalised AUPRC {quality:.3f}) T={result.temperature:g} tau={result.threshold:.4f}"
        f" keeps {100 * result.kept_fraction:.1f}% at P@1 precision "
        f"{100 * result.kept_precision:.1f}% (all queries: {100 * result.accuracy:.1f}%)"
        f"{result.gate_note()}{met}"
    )


if __name__ == "__main__":  # a service starts `python -m indexer.cli index compact`
    app()
