"""Settings: one object, read from ``TIERMEM_*`` environment variables.

Built only at the composition root (the CLI, the service factory, your application's
startup) and passed down; no module reads the environment on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["BackendName", "TierMemSettings"]

BackendName = Literal["memory", "sqlite", "redis", "dynamodb"]


class TierMemSettings(BaseSettings):
    """Every knob of a tiermem deployment. Defaults are the embedded setup: no server."""

    model_config = SettingsConfigDict(env_prefix="TIERMEM_", env_file=None, extra="ignore")

    hot_backend: BackendName = "memory"
    """Where the hot tier lives: ``memory`` (in-process, default) or ``redis`` in production."""
    durable_backend: BackendName = "sqlite"
    """Where the archive and long-term memory live: ``sqlite`` (default) or ``dynamodb``."""

    sqlite_path: Path | None = None
    """SQLite database file; default: ``tiermem.db`` in the per-user data directory."""
    sqlite_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    """When SQLite syncs to disk (WAL mode). ``NORMAL`` (default): a committed write survives
    the process crashing or being killed, but a power loss or OS crash may drop the last
    transactions. ``FULL``: it survives those too, at one fsync per commit (a group commit
    shares it). See docs/decisions.md, "SQLite durability"."""

    redis_url: str = "redis://localhost:6379/0"
    """One server's URL; with ``redis_cluster``, one or more startup nodes of a Redis
    Cluster, comma-separated (``redis://10.0.0.1:6379,redis://10.0.0.2:6379``)."""
    redis_prefix: str = Field(default="tm", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    redis_cluster: bool = False
    """Talk to a Redis Cluster (``TIERMEM_REDIS_CLUSTER=true``): the client discovers every
    master from the startup nodes in ``redis_url`` and follows MOVED/ASK redirections.
    A session's keys share one hash tag and so do a user's, so every script runs on one
    slot; ``tiermem doctor`` checks it."""
    redis_wait_replicas: int = Field(default=0, ge=0, le=16)
    """With Redis as the durable tier: how many replicas must acknowledge a turn append (and
    a session record write) before the call returns (Redis ``WAIT``, sent on the write's
    connection in the same round trip). 0 (default): off, a write returns once the master
    applied it. When fewer acknowledge within ``redis_wait_timeout_ms`` the call raises
    ``NotReplicatedError``: the turn *is* stored on the master, only not confirmed on the
    replicas; a retry with the same idempotency key writes nothing twice and waits again.
    WAIT narrows what a failover can lose; it is not strong consistency (see
    docs/decisions.md, "Redis durability and WAIT")."""
    redis_wait_timeout_ms: int = Field(default=100, ge=1, le=60_000)
    """How long a write waits for ``redis_wait_replicas`` acknowledgements, in
    milliseconds (1..60000; WAIT's 0 would block forever when a replica is down). It is
    also the longest a turn can be delayed by a slow or missing replica."""

    dynamodb_table: str = Field(default="tiermem", pattern=r"^[A-Za-z0-9_.-]{3,255}$")
    dynamodb_endpoint_url: str | None = None
    """Set for DynamoDB Local, e.g. ``http://127.0.0.1:8000``."""
    aws_region: str | None = None

    series_catalogue: Path | None = None
    """A JSON file naming the series (titles) entity rules can find: an object of alias to
    canonical title (``{"berserk": "Berserk", "ベルセルク": "Berserk"}``) or a list of
    titles (each its own alias). Series are found only with a catalogue (seed 001's
    "series: Berserk"); it reaches turn analysis, memory detection, the offline summarizer
    and structured memory. Read once at start-up."""

    hot_window: int = Field(default=20, ge=1, le=10_000)
    """Turns kept in the hot tier per session (seed 000: 20)."""
    index_linger_ms: float = Field(default=5, ge=0, le=1000)
    """How long a short batch of background work after an append (a turn's index write and
    memory detection) waits for more turns, in milliseconds (0..1000). Turns that arrive
    meanwhile, of any session, share one index write. 5 (default) merges a busy process's
    turns; where turns come tens of milliseconds apart each index write goes alone (one
    script call on Redis: ~220 µs of redis-server a turn), and 50-200 merges them, at the
    cost of that much more delay before a turn is searchable and its memories detected.
    See docs/decisions.md, "Index write linger"."""
    gc_grace_seconds: int = Field(default=3600, ge=0)
    """How long native TTLs let data linger past its logical expiry."""
    default_model: str = "claude-3-5-sonnet"

    embedder: Literal["none", "local", "bedrock-titan", "openai"] = "none"
    """Embeddings for recall: ``none`` (BM25 + recency + importance + access), ``local``
    (all-MiniLM-L6-v2, extra ``embeddings``), ``bedrock-titan`` or ``openai`` (any
    OpenAI-compatible endpoint such as Ollama or vLLM; extra ``llm``)."""
    embedding_model: str | None = None
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None

    llm: Literal["none", "bedrock", "openai", "anthropic"] = "none"
    """The chat model for summaries and structured memory: ``none`` (the deterministic
    offline engine, default), ``bedrock`` (Converse), ``openai`` (any OpenAI-compatible
    server: Ollama, vLLM, llama.cpp, LM Studio, OpenAI) or ``anthropic``; extra ``llm``."""
    llm_model: str | None = None
    """The model id the provider knows, e.g. ``us.anthropic.claude-3-5-haiku-20241022-v1:0``
    (Bedrock), ``llama3.1:8b`` (Ollama) or ``claude-3-5-haiku-latest``; required."""
    llm_base_url: str | None = None
    """API root: required for ``openai`` (e.g. ``http://localhost:11434/v1``); optional for
    ``anthropic`` (default ``https://api.anthropic.com``); unused for Bedrock."""
    llm_api_key: SecretStr | None = None
    """Bearer token for ``openai`` (local servers need none); ``x-api-key`` for ``anthropic``
    (required). Bedrock uses the AWS credential chain and ``aws_region``."""
    llm_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Seconds to wait for one model answer before the attempt counts as failed."""
    llm_max_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts per model call: throttling, 5xx, timeouts and unparseable JSON are retried
    with backoff; after the last one the job fails with ModelFailedError."""
    llm_json_mode: bool = False
    """``openai`` only: also send ``response_format={"type": "json_object"}`` (off by default
    because not every OpenAI-compatible server accepts it)."""

    api_keys_file: Path | None = None
    """The REST/MCP API keys file (hashed keys per tenant, see
    :mod:`tiermem.interfaces.tenancy`); default: ``api_keys.json`` next to the SQLite file
    (the per-user data directory)."""
    api_max_body_bytes: int = Field(default=1_048_576, ge=1_024, le=1_073_741_824)
    """Largest request body the REST API accepts; larger ones get a 413."""
    api_rate_limit_per_minute: int = Field(default=600, ge=1, le=1_000_000)
    """Requests per minute each API key (or the local tenant) may make; more get a 429."""
    api_rate_limit_burst: int = Field(default=60, ge=1, le=1_000_000)
    """Requests a key may make at once before the per-minute rate applies."""

    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    """The event loop of what tiermem runs itself (``tiermem serve``, ``tiermem mcp``, the
    CLI, ``SyncMemory.from_settings``): ``auto`` (default) takes uvloop when it is installed
    (the ``api`` and ``mcp`` extras bring it; ~17 % fewer client instructions a Redis turn),
    else asyncio's; ``uvloop`` fails at start without it. A library caller's own loop is
    theirs (:mod:`tiermem.runtime`)."""

    @model_validator(mode="after")
    def _wait_needs_redis_durable(self) -> Self:
        if self.redis_wait_replicas and self.durable_backend != "redis":
            raise ValueError(
                f"TIERMEM_REDIS_WAIT_REPLICAS={self.redis_wait_replicas} applies only when Redis "
                f"is the durable tier (TIERMEM_DURABLE_BACKEND=redis), not "
                f"{self.durable_backend!r}: the hot tier is rebuilt from the durable tier after "
                "a failover and needs no WAIT. Unset it, or set it to 0"
            )
        return self
