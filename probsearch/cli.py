"""The `probsearch` console script: one root command that mounts each stage's subcommands,
and the demo."""

import os

# OpenMP threads that spin while they wait steal the cores from everything else on a shared
# machine (a training step went from 0.07 s to 2.4 s); they must sleep instead. This has to be
# set before torch, ONNX Runtime or FAISS start their pools, hence here, first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path
from typing import Annotated

import typer

from indexer.cli import app as indexer_app
from models.allocator import keep_freed_memory
from models.cli import app as models_app
from models.command_line import EXIT_BAD_INPUT, RedisOpt, fail, one_line, settings_from
from models.datasets.cli import app as data_app
from models.evaluation.cli import eval_command
from service.commands import app as service_app

app = typer.Typer(
    name="probsearch",
    help="Uncertainty-aware image <-> text retrieval with Gaussian embeddings.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Help texts are plain text, not Rich markup: markup took "[env PROBSEARCH_MODEL]" (and
    # "[default: ...]") for a style tag and printed "Model dir ." Set on the root, it holds for
    # every subcommand that is mounted here.
    rich_markup_mode=None,
)
app.add_typer(models_app)
app.add_typer(data_app, name="data", help="Generate or check datasets.")
app.command("eval")(eval_command)
app.add_typer(indexer_app)
app.add_typer(service_app)
demo_app = typer.Typer()  # its own group, so `demo` is listed last, after the service's commands
app.add_typer(demo_app)


@demo_app.command()
def demo(
    cache_dir: Annotated[Path, typer.Option(help="Where the demo builds and reuses.")] = Path(
        ".cache/demo"
    ),
    serve: Annotated[bool, typer.Option(help="Serve after building (--no-serve: stop).")] = True,
    shapes: Annotated[
        bool,
        typer.Option(help="The shapes lab (exact ambiguity ground truth) instead of clip art."),
    ] = False,
    small: Annotated[bool, typer.Option(help="A reduced shapes build (CI, a quick look).")] = False,
    image_backbone: Annotated[
        str | None,
        typer.Option(
            help="Clip art: the heads' image backbone (default efficientnet-lite0-style; "
            "efficientnet-lite0 is the plain vector, or an ONNX image graph's path)."
        ),
    ] = None,
    examples_only: Annotated[
        bool, typer.Option(help="Stop after the example queries instead of serving on.")
    ] = False,
    host: Annotated[str | None, typer.Option(help="Bind address [env PROBSEARCH_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Port, 0: any [env PROBSEARCH_PORT].")] = None,
    redis_url: RedisOpt = None,
) -> None:
    """Build (or reuse) the data, model, indexes and calibration, then serve on :8000: clip art
    searched with heads on pretrained backbones, or with --shapes the shapes lab."""
    import httpx

    from indexer.registry import DEFAULT_LOCAL_REDIS, redis_answering
    from indexer.threads import apply_thread_budget
    from models.threads import available_cpus, thread_budget
    from probsearch.background_server import BackgroundServer
    from probsearch.demo import (
        CLIPART_PLAN,
        SHAPES_PLAN,
        SMALL_PLAN,
        build_demo,
        run_examples,
        with_image_backbone,
    )

    try:
        settings = settings_from({"host": host, "port": port, "redis_url": redis_url})
        url = settings.redis_url or DEFAULT_LOCAL_REDIS
        if redis_answering(url):
            typer.echo(f"using Redis at {url} (active versions, result cache)")
        else:
            typer.echo(f"no Redis answers at {url}: running without it (pointer files, no cache)")
            url = None
        plan = SMALL_PLAN if small else SHAPES_PLAN if shapes else CLIPART_PLAN
        if image_backbone is not None:
            plan = with_image_backbone(plan, image_backbone)
        # The clip-art build runs the backbones over every drawing, the only work on the
        # machine while it builds: it takes every core unless PROBSEARCH_THREADS says otherwise.
        cores = available_cpus() if plan.dataset == "clipart" else None
        threads = apply_thread_budget(thread_budget("batch", settings.threads or cores))
        paths = build_demo(cache_dir.resolve(), plan, url, threads=threads)
        if not serve:
            return
        settings = settings.model_copy(
            update={"index_root": paths.index_root, "model": paths.model, "redis_url": url}
        )
        with BackgroundServer(settings, log_level="warning") as server:
            typer.echo(f"\nsearch page: {server.url}/ (open it in a browser)")
            with httpx.Client(timeout=60) as http:
                run_examples(http, server.url, paths, typer.echo)
            if examples_only:
                return
            typer.echo(
                f"\nserving the search page on {server.url}/ (OpenAPI at {server.url}/docs); "
                "Ctrl-C stops"
            )
            server.wait()
    except (ValueError, OSError) as error:
        raise fail(one_line(error), EXIT_BAD_INPUT) from None
    except KeyboardInterrupt:
        typer.echo("stopped")


# faiss and onnxruntime come from the `cpu` or `gpu` extra, not from a plain install.
BACKENDS = {"faiss": "FAISS", "onnxruntime": "ONNX Runtime"}


def main() -> None:
    """Entry point of the `probsearch` console script."""
    keep_freed_memory()
    try:
        app()
    except ModuleNotFoundError as error:
        if error.name not in BACKENDS:
            raise
        typer.echo(
            f"error: {BACKENDS[error.name]} is not installed; install exactly one of the extras: "
            "pip install 'probsearch[cpu]' (CPU) or 'probsearch[gpu]' (NVIDIA GPU, CUDA 12)",
            err=True,
        )
        raise SystemExit(2) from None
