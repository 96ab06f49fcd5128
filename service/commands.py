"""Subcommands of the service stage: serve."""

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Annotated

import typer

from indexer.shortlist_backends import make_backend
from models.command_line import IndexRootOpt, ModelOpt, RedisOpt, bad_input_exits, served_settings
from service.worker_processes import check_port_free, run_workers

app = typer.Typer(no_args_is_help=True)


@app.command()
def serve(
    index_root: IndexRootOpt = None,
    model: ModelOpt = None,
    host: Annotated[str | None, typer.Option(help="Bind address [env PROBSEARCH_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Port [env PROBSEARCH_PORT].")] = None,
    workers: Annotated[
        int | None, typer.Option(help="Worker processes [env PROBSEARCH_WORKERS].")
    ] = None,
    redis_url: RedisOpt = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the HTTP query service (every setting also reads PROBSEARCH_*; flags win)."""
    import uvicorn

    from service.http.main import create_app
    from service.http.transport import server_options

    overrides = {
        "index_root": index_root,
        "model": model,
        "host": host,
        "port": port,
        "workers": workers,
        "redis_url": redis_url,
    }
    settings = served_settings(overrides)
    with bad_input_exits():
        make_backend(settings.shortlist_backend, settings.milvus_uri)  # pymilvus, URI set
    if settings.workers == 1:
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            **server_options(settings),
        )
        return
    with bad_input_exits():
        check_port_free(settings.host, settings.port)
    with shared_metrics_directory():
        status = run_workers(settings, log_level)
    if status:
        raise typer.Exit(status)


@contextlib.contextmanager
def shared_metrics_directory() -> Iterator[None]:
    """An empty PROMETHEUS_MULTIPROC_DIR for the worker processes (service.metrics), removed
    when they have stopped; one the operator set is used as it is, and left."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="probsearch-metrics-") as folder:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        try:
            yield
        finally:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
