"""The settings every probsearch entry point shares (env PROBSEARCH_*; CLI flags override).

One class declares each PROBSEARCH_ name once: the offline commands (train, eval, reindex,
index) read it directly, and the service's Settings extends it with the serving options.
"""

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProbsearchSettings(BaseSettings):
    """Where the artifacts are and which device runs them; empty variables count as unset."""

    model_config = SettingsConfigDict(
        env_prefix="PROBSEARCH_", extra="ignore", env_ignore_empty=True
    )

    index_root: Path | None = None  # PROBSEARCH_INDEX_ROOT: <root>/<modality>/<version>/
    model: Path | None = None  # PROBSEARCH_MODEL: a model dir written by `probsearch train`
    redis_url: str | None = None  # PROBSEARCH_REDIS_URL; None: no Redis (pointer files only)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # PROBSEARCH_DEVICE
    # PROBSEARCH_THREADS: torch threads of the offline commands; None: the CPUs this process
    # may use (models.threads)
    threads: int | None = Field(None, ge=1)
    # PROBSEARCH_SHORTLIST_BACKEND: where the augmented vectors are searched: "faiss" (the
    # version dir's index files) or "milvus" (collections at PROBSEARCH_MILVUS_URI, written by
    # reindex); mu/logvar for the exact re-rank stay in the version dir either way.
    shortlist_backend: Literal["faiss", "milvus"] = "faiss"
    # PROBSEARCH_MILVUS_URI: a Milvus Lite file (one machine, tests), e.g. /data/milvus.db, or
    # a server/cluster URI, e.g. http://milvus:19530
    milvus_uri: str | None = None
