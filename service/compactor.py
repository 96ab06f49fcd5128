"""Compactions of the served galleries: on demand (POST /admin/compact) and automatically
once a gallery's segment of added rows reaches `compact_at_rows`.

A compaction builds a version (FAISS indexes and all), which is the indexer's write side: the
server does not import it (lint-imports), and it would compete with the searches for the
server's threads. So it runs as its own process, `python -m indexer.cli index compact`, on one
thread, one at a time per gallery; the service swaps to the new version as soon as it is
active (the activation event, else the next poll, else the refresh here)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from typing import Any

from models.settings import Settings
from service.errors import IndexUnavailableError
from service.index_holder import IndexHolder

log = logging.getLogger(__name__)


class Compactor:
    """Starts and awaits the compaction processes of one service (module docstring)."""

    def __init__(self, holder: IndexHolder, settings: Settings) -> None:
        self.holder = holder
        self.settings = settings
        self._running = {gallery: threading.Lock() for gallery in holder.galleries}

    async def run(self, gallery: str) -> dict[str, Any]:
        """Compact `gallery` now (after one already running) and serve the result."""
        return await asyncio.to_thread(self._run_locked, gallery, True)

    def maybe_start(self, gallery: str) -> None:
        """Start a compaction in the background when the gallery's segment has reached
        compact_at_rows and none is running."""
        threshold = self.settings.compact_at_rows
        if threshold <= 0 or self._running[gallery].locked():
            return
        with self.holder.acquire(gallery) as loaded:
            rows = loaded.index.snapshot()[0].size
        if rows >= threshold:
            thread = threading.Thread(
                target=self._background, args=(gallery,), name=f"compact-{gallery}", daemon=True
            )
            thread.start()

    def _background(self, gallery: str) -> None:
        try:
            self._run_locked(gallery, wait=False)
        except Exception as error:  # the writes stay in the log; the next write tries again
            log.error("compacting the %s gallery failed: %s", gallery, error)

    def _run_locked(self, gallery: str, wait: bool) -> dict[str, Any]:
        lock = self._running[gallery]
        if not lock.acquire(blocking=wait):
            return {}
        try:
            result = self._process(gallery)
        finally:
            lock.release()
        self.holder.refresh([gallery])
        log.info("compacted the %s gallery: %s", gallery, result)
        return result

    def _process(self, gallery: str) -> dict[str, Any]:
        command = [
            sys.executable, "-m", "indexer.cli", "index", "compact", "--json",
            "--modality", gallery, "--index-root", str(self.holder.index_root),
        ]  # fmt: skip
        if self.settings.redis_url:
            command += ["--redis-url", self.settings.redis_url]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PROBSEARCH_THREADS": "1"}
        env["PROBSEARCH_NAMESPACE"] = self.holder.namespace
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["no message"]
            raise IndexUnavailableError(f"the compaction of {gallery} failed: {lines[-1]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
