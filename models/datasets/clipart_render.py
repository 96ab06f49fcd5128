"""SVG to PNG with librsvg's `rsvg-convert`, inside limits a hostile file cannot pass.

Each drawing is rendered by its own `rsvg-convert` process, so a file that crashes the renderer
or runs it out of memory costs one drawing, not the run. The process gets a wall-clock timeout,
an address-space limit and a CPU-time limit (set by util-linux's `prlimit` before it execs the
renderer where it is installed, else by setrlimit in the forked child); files over a byte limit
and files with scripts or
event handlers are refused before rendering. The picture is laid on white, centred on a square
of the requested size, and written through a temporary file, so an interrupted run never leaves
a half-written PNG that a second run would take for finished.
"""

from __future__ import annotations

import io
import os
import re
import resource
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

RENDERER = "rsvg-convert"
# util-linux (essential on Debian): with it the child runs no Python code before exec, so
# subprocess can use vfork; a preexec_fn made each drawing 4.4 ms slower (23.5 ms in all)
PRLIMIT = shutil.which("prlimit")
INSTALL_HINT = (
    "rsvg-convert (librsvg) is not installed: on Debian or Ubuntu run "
    "`apt-get install librsvg2-bin` (scripts/bootstrap.sh does it)"
)
SCRIPTED = re.compile(rb"<script\b|\son[a-z]+\s*=", re.IGNORECASE)
BLANK_SPREAD = 2.0  # a render whose pixels' standard deviation is below this shows nothing


@dataclass(frozen=True)
class RenderLimits:
    """What one drawing may cost: file size, wall-clock seconds, memory of the renderer."""

    max_bytes: int = 4 * 1024 * 1024
    timeout_s: float = 20.0
    memory_bytes: int = 1024 * 1024 * 1024


class RenderError(Exception):
    """A drawing that was not rendered; `reason` is one of the counted skip reasons."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def renderer_available() -> bool:
    """True when rsvg-convert is on PATH."""
    return shutil.which(RENDERER) is not None


def check_svg(svg: bytes, limits: RenderLimits) -> None:
    """RenderError("too large") or RenderError("scripted") before any rendering."""
    if len(svg) > limits.max_bytes:
        raise RenderError("too large", f"{len(svg)} bytes > {limits.max_bytes}")
    if SCRIPTED.search(svg):
        raise RenderError("scripted", "has a <script> element or an on* event handler")


def render_png(svg: Path, out: Path, size: int, limits: RenderLimits) -> None:
    """Render `svg` to an RGB `size` x `size` PNG at `out` (atomically), or raise RenderError."""
    picture = _rasterise(svg, size, limits)
    if float(np.asarray(picture).std()) < BLANK_SPREAD:
        raise RenderError("blank", "the rendered picture is one flat colour")
    canvas = Image.new("RGB", (size, size), "white")
    canvas.paste(picture, ((size - picture.width) // 2, (size - picture.height) // 2))
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        canvas.save(partial, format="PNG", compress_level=1)  # 1.0 ms a drawing, not 1.9; +1% size
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def _rasterise(svg: Path, size: int, limits: RenderLimits) -> Image.Image:
    """The drawing scaled to fit `size` x `size`, on white, as RGB."""
    command = [
        RENDERER,
        "--width",
        str(size),
        "--height",
        str(size),
        "--keep-aspect-ratio",
        "--background-color",
        "white",
        "--format",
        "png",
        str(svg),
    ]
    command, preexec = _limited(command, limits)
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            timeout=limits.timeout_s,
            preexec_fn=preexec,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RenderError("timed out", f"over {limits.timeout_s:g} s") from exc
    if done.returncode != 0 or not done.stdout:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RenderError("renderer failed", message[-1] if message else f"exit {done.returncode}")
    try:
        with Image.open(io.BytesIO(done.stdout)) as image:
            image.load()
            picture = image.convert("RGB")
    except (OSError, ValueError) as exc:
        raise RenderError("renderer failed", f"unreadable PNG ({exc})") from exc
    if min(picture.size) < 1 or max(picture.size) > 2 * size:
        raise RenderError("renderer failed", f"unexpected size {picture.size}")
    picture.thumbnail((size, size), Image.LANCZOS)  # rsvg-convert may round a side up by one
    return picture


def _limited(
    command: list[str], limits: RenderLimits
) -> tuple[list[str], Callable[[], None] | None]:
    """The renderer's command and preexec_fn that cap its memory and CPU time: prlimit in front
    of the command where it is installed, else a preexec_fn that sets the same limits."""
    if PRLIMIT is not None:
        cpu = _cpu_seconds(limits)
        return [PRLIMIT, f"--as={limits.memory_bytes}", f"--cpu={cpu}", *command], None
    return command, lambda: _limit_resources(limits)


def _cpu_seconds(limits: RenderLimits) -> int:
    return int(limits.timeout_s) + 1


def _limit_resources(limits: RenderLimits) -> None:
    """Runs in the renderer's process before exec: caps its memory and CPU time."""
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    cpu = _cpu_seconds(limits)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
