"""Settings: one object, read from ``TIERMEM_*`` environment variables.

Built only at the composition root (the CLI, the service factory, your application's
startup) and passed down; no module reads the environment on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
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

    redis_url: str = "redis://localhost:6379/0"
    redis_prefix: str = Field(default="tm", pattern=r"^[A-Za-z0-9_.-]{1,32}$")

    dynamodb_table: str = Field(default="tiermem", pattern=r"^[A-Za-z0-9_.-]{3,255}$")
    dynamodb_endpoint_url: str | None = None
    """Set for DynamoDB Local, e.g. ``http://127.0.0.1:8000``."""
    aws_region: str | None = None

    hot_window: int = Field(default=20, ge=1, le=10_000)
    """Turns kept in the hot tier per session (seed 000: 20)."""
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
