"""The one configuration object of every probsearch command and of the query service
(env PROBSEARCH_*; command-line flags win).

Each PROBSEARCH_ name is declared here once. Entry points (each command of models, indexer,
service and probsearch, and the app factory) build a Settings and pass what they read from it
down as arguments; nothing below them reads the environment. It lives in models, the bottom
layer, so that the commands of every layer can build it.
"""

import resource
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from models.distance.augmented import INDEX_FAMILIES

Modality = Literal["image", "text"]

# Where the server (and `calibrate`) look when index_root or model is not configured; the other
# offline commands ask for the flag instead (Settings.with_default_paths).
DEFAULT_PATHS = {"index_root": Path("indexes"), "model": Path("model")}
# File descriptors left to the service's own files (model, index versions, Redis, logs) when
# the connection cap is derived from the descriptor limit.
FILE_RESERVE = 256


def _split_commas(value: object) -> object:
    """Turn "a, b,,c" into ["a", "b", "c"]; lists pass through unchanged."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Everything probsearch reads from its environment, with safe defaults; empty variables
    count as unset.

    List-valued settings (api_keys, cors_origins, galleries) are comma-separated in the
    environment, e.g. PROBSEARCH_API_KEYS="key-one,key-two".
    """

    model_config = SettingsConfigDict(
        env_prefix="PROBSEARCH_", extra="ignore", env_ignore_empty=True
    )

    # Where the artifacts are (None: not configured; see DEFAULT_PATHS) and what runs them.
    index_root: Path | None = Field(None, description="Root of <modality>/<version>/ dirs.")
    model: Path | None = Field(
        None, description="Model dir written by `probsearch train` (the ONNX encoders)."
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Threads of the numeric pools (torch, ONNX Runtime, FAISS); None: the role's budget from
    # the CPUs this process may use (models.threads).
    threads: int | None = Field(None, ge=1)
    # Where the augmented vectors are searched: "faiss" (the version dir's index files) or
    # "milvus" (collections at milvus_uri, written by reindex); mu/logvar for the exact re-rank
    # stay in the version dir either way.
    shortlist_backend: Literal["faiss", "milvus"] = "faiss"
    # A Milvus Lite file (one machine, tests), e.g. /data/milvus.db, or a server/cluster URI,
    # e.g. http://milvus:19530
    milvus_uri: str | None = None
    redis_url: str | None = None  # None: no Redis (the ACTIVE pointer files decide, no cache)
    namespace: str | None = Field(
        None,
        description="Scopes the index root's Redis keys (active versions, locks, events, "
        "cache) so that galleries can share one Redis; default: the index root's directory "
        "name and a hash of its absolute path.",
    )

    # What to serve.
    galleries: Annotated[list[Modality], NoDecode] = Field(
        default_factory=lambda: ["image", "text"],
        description="Gallery modalities served; /readyz waits for an index of each.",
    )

    # Redis (with redis_url set).
    cache_ttl_s: int = Field(3600, ge=0, description="Result cache TTL; 0 disables the cache.")
    cache_write_delay_ms: float = Field(
        10.0,
        ge=0,
        le=1000,
        description="Cached bodies stored within this many ms go to Redis in one pipeline.",
    )
    redis_socket_timeout_s: float = Field(0.5, gt=0)
    redis_backoff_max_s: float = Field(
        2.0, gt=0, description="Longest wait between reconnection attempts while Redis is down."
    )
    redis_health_interval_s: float = Field(
        1.0, gt=0, description="How often Redis is pinged while up (drives the redis_up gauge)."
    )
    poll_interval_s: float = Field(
        2.0, gt=0, description="How often the ACTIVE version is re-read (pub/sub is faster)."
    )

    # Security.
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    require_api_key_for_search: bool = Field(
        False,
        description="Whether /search/* needs an API key (admin endpoints always do); the "
        "OpenAPI schema declares the security of exactly the endpoints that need it.",
    )
    admin_auth_max_failures: int = Field(
        5, ge=1, description="Failed admin authentications allowed per client and window."
    )
    admin_auth_window_s: int = Field(
        60, ge=1, description="Window of admin_auth_max_failures; then 429 until it passes."
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Addresses of the reverse proxies whose X-Forwarded-For names the client "
        "(the admin lockout counts by client address); empty: the socket's peer is the client "
        "and forwarded headers are ignored, so nobody can forge an address.",
    )

    # HTTP server.
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1)
    request_body_timeout_s: float = Field(
        10.0, gt=0, description="Time to receive a whole request body; then 408 and close."
    )
    keep_alive_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Idle keep-alive connections are closed after this long, and so is a "
        "connection whose request headers are not complete this long after it opened.",
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="Open connections past which a new one gets 503 and is closed; default: "
        "the file-descriptor limit less 256 for the service's own files, at least 64.",
    )

    # Live galleries (items added and deleted without a rebuild).
    compact_at_rows: int = Field(
        10_000,
        ge=0,
        description="Items added to a gallery since its version was built past which the "
        "service compacts it into a new version in the background (a process of its own); "
        "0: only on demand (POST /admin/compact, `probsearch index compact`).",
    )

    # Request limits.
    max_text_chars: int = Field(1000, ge=1)
    max_image_bytes: int = Field(10 * 1024 * 1024, ge=1)
    max_json_bytes: int = Field(
        512 * 1024,
        ge=1024,
        description="Largest JSON request body (every route but /search/image): three vectors "
        "of max_embedding_dim numbers fit in about 330 KB.",
    )
    max_image_pixels: int | None = Field(
        None,
        ge=1,
        description="Most pixels decoded per image (JPEGs after their 1/2-1/8 draft scaling); "
        "default (32 x the model's image_size)^2, 4.2 Mpx for a 64 x 64 model.",
    )
    max_concurrent_decodes: int | None = Field(
        None, ge=1, description="Images decoded at the same time; default: usable CPUs / 4, >= 1."
    )
    decode_nice: int = Field(
        10, ge=0, le=19, description="How much lower the decode threads' CPU priority is (Linux)."
    )
    max_k: int = Field(1000, ge=1)
    max_shortlist: int = Field(10_000, ge=1)
    max_mc_samples: int = Field(64, ge=0)
    mc_samples: int = Field(16, ge=0, description="MC-dropout draws when a request sets none.")
    max_embedding_dim: int = Field(4096, ge=1)

    # Micro-batching.
    batch_max_size: int = Field(32, ge=1)
    # Batches of one batcher that may run at once; 0: models.threads.concurrent_batches.
    batch_concurrency: int = Field(0, ge=0)
    # 0: a batch takes what has arrived and waits for nothing (service.batching: a window
    # only delayed queries at low concurrency on CPU; it may pay where a batch costs about
    # the same as one query, e.g. on a GPU).
    batch_max_wait_ms: float = Field(0.0, ge=0)
    # A caption or embedding query with no other search under way runs on the event loop
    # instead of the batcher's worker thread (service.batching: two thread hand-offs fewer).
    batch_inline_when_alone: bool = True

    # Re-rank of metrics without a native index (bhattacharyya, elk, match_prob).
    candidate_metric: str = "w2"

    @field_validator("api_keys", "cors_origins", "galleries", "trusted_proxies", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return _split_commas(value)

    @field_validator("candidate_metric")
    @classmethod
    def _indexable(cls, value: str) -> str:
        if value not in INDEX_FAMILIES:
            families = ", ".join(INDEX_FAMILIES)
            raise ValueError(f"candidate_metric must have an index form: {families}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        if self.mc_samples > self.max_mc_samples:
            raise ValueError(
                f"mc_samples={self.mc_samples} exceeds max_mc_samples={self.max_mc_samples}"
            )
        if self.require_api_key_for_search and not self.api_keys:
            raise ValueError(
                "require_api_key_for_search is set but no api_keys are configured; "
                "set PROBSEARCH_API_KEYS"
            )
        if any(len(key.get_secret_value()) < 16 for key in self.api_keys):
            raise ValueError("every API key must be at least 16 characters long")
        if not self.galleries:
            raise ValueError("galleries must name at least one of: image, text")
        self.galleries = sorted(set(self.galleries))
        return self

    @classmethod
    def with_flags(cls, flags: dict[str, Any]) -> "Settings":
        """Settings from PROBSEARCH_* with the given command-line flags on top (None: not
        given): the one "flag, else environment" of every command."""
        return cls(**{name: value for name, value in flags.items() if value is not None})

    def with_default_paths(self) -> "Settings":
        """A copy with DEFAULT_PATHS where index_root or model is not configured."""
        missing = {
            name: path for name, path in DEFAULT_PATHS.items() if getattr(self, name) is None
        }
        return self.model_copy(update=missing) if missing else self

    def uvicorn_options(self) -> dict[str, Any]:
        """Server options that bound idle and slow connections (the body deadline is the
        app's own: service.http.transport.BodyReadTimeoutMiddleware), and whose forwarded
        headers are believed: only those of `trusted_proxies` (uvicorn's default trusts
        127.0.0.1, so a forged X-Forwarded-For through a local proxy chose the address)."""
        return {
            "timeout_keep_alive": self.keep_alive_timeout_s,
            "proxy_headers": bool(self.trusted_proxies),
            "forwarded_allow_ips": ",".join(self.trusted_proxies) or None,
        }

    @property
    def connection_cap(self) -> int:
        """max_connections, or the soft RLIMIT_NOFILE less FILE_RESERVE (at least 64)."""
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 65_536
        return max(64, soft - FILE_RESERVE)

    @property
    def max_body_bytes(self) -> int:
        """Largest request body accepted: a base64 image at the byte limit plus form fields."""
        return self.max_image_bytes * 4 // 3 + 64 * 1024


# The name the offline commands used before the service's settings joined this class.
ProbsearchSettings = Settings
