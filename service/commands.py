"""Subcommands of the service stage: serve, calibrate."""

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from indexer.shortlist_backends import make_backend
from models.command_line import EXIT_BAD_INPUT, check_served_paths, fail, one_line, settings_from

app = typer.Typer(no_args_is_help=True)


@app.command()
def serve(
    index_root: Annotated[
        Path | None, typer.Option(help="Index root (PROBSEARCH_INDEX_ROOT).")
    ] = None,
    model: Annotated[Path | None, typer.Option(help="Model dir (PROBSEARCH_MODEL).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (PROBSEARCH_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (PROBSEARCH_PORT).")] = None,
    workers: Annotated[int | None, typer.Option(help="Worker processes.")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL (PROBSEARCH_REDIS_URL).")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the HTTP query service (every setting also reads PROBSEARCH_*; flags win)."""
    import uvicorn

    from service.main import create_app

    overrides = {
        "index_root": index_root,
        "model": model,
        "host": host,
        "port": port,
        "workers": workers,
        "redis_url": redis_url,
    }
    try:
        settings = settings_from(overrides).with_default_paths()
        check_served_paths(settings)
        make_backend(settings.shortlist_backend, settings.milvus_uri)  # pymilvus, URI set
    except (ValueError, OSError) as error:
        raise fail(one_line(error), EXIT_BAD_INPUT) from None
    if settings.workers == 1:
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            **settings.uvicorn_options(),
        )
        return
    # Worker processes rebuild the settings from the environment: hand the flags on there.
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"PROBSEARCH_{name.upper()}"] = str(value)
    uvicorn.run(
        "service.main:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=log_level,
        **settings.uvicorn_options(),
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
    index_root: Annotated[
        Path | None, typer.Option(help="Index root (PROBSEARCH_INDEX_ROOT).")
    ] = None,
    model: Annotated[Path | None, typer.Option(help="Model dir (PROBSEARCH_MODEL).")] = None,
    gallery: Annotated[list[str] | None, typer.Option(help="image and/or text.")] = None,
    split: Annotated[str, typer.Option(help="Held-out split the gallery does not hold.")] = "val",
    metrics: Annotated[str, typer.Option(help="Comma-separated; default: all served.")] = "",
    mc_samples: Annotated[
        int | None, typer.Option(help="MC draws (PROBSEARCH_MC_SAMPLES).")
    ] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL (PROBSEARCH_REDIS_URL).")] = None,
) -> None:
    """Pick the reject score, its temperature and threshold for the active indexes on held-out
    queries (the score with the best normalised AUPRC)."""
    from indexer.calibration import CalibrationJob, Target, run_calibration
    from indexer.registry import ActiveRegistry
    from indexer.threads import apply_thread_budget
    from models.threads import thread_budget

    try:
        flags = {"index_root": index_root, "model": model, "redis_url": redis_url}
        settings = settings_from(flags).with_default_paths()
        threads = apply_thread_budget(thread_budget("batch", settings.threads))
        check_served_paths(settings)
        target = Target(precision=target_precision, coverage=target_coverage)
        registry = ActiveRegistry(settings.index_root, settings.redis_url)
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
                mc_samples=settings.mc_samples if mc_samples is None else mc_samples,
                device=settings.device,
                threads=threads,
            )
            for result in run_calibration(job):
                typer.echo(_calibration_line(modality, version, result))
    except (ValueError, OSError) as error:
        raise fail(one_line(error), EXIT_BAD_INPUT) from None


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
