"""The composition root: settings in, stores out.

This is the one place that knows which backend class a setting names. Optional client
libraries are imported only when their backend is chosen.
"""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from tiermem.clock import Clock, SystemClock
from tiermem.errors import UnsupportedCapabilityError, ValidationError
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.index import SearchIndex
from tiermem.settings import BackendName, TierMemSettings
from tiermem.store.contract import DurableStore, HotStore

__all__ = ["open_durable_store", "open_embedder", "open_hot_store", "open_search_index"]

_EXTRAS = {"redis": "redis", "dynamodb": "dynamodb"}


def _missing_extra(backend: str, exc: ImportError) -> UnsupportedCapabilityError:
    return UnsupportedCapabilityError(
        f"the {backend} backend needs the '{_EXTRAS[backend]}' extra: "
        f"pip install 'tiermem[{_EXTRAS[backend]}]' ({exc})"
    )


def _open(
    role: str, backend: BackendName, settings: TierMemSettings, clock: Clock
) -> HotStore | DurableStore:
    grace = timedelta(seconds=settings.gc_grace_seconds)
    if backend == "memory":
        from tiermem.store.backends import memory

        return (
            memory.MemoryHotStore(clock=clock)
            if role == "hot"
            else memory.MemoryDurableStore(clock=clock)
        )
    if backend == "sqlite":
        from tiermem.store.backends import sqlite

        path = settings.sqlite_path or sqlite.default_database_path()
        if role == "hot":
            return sqlite.SQLiteHotStore(path, clock=clock, gc_grace=grace)
        return sqlite.SQLiteDurableStore(path, clock=clock)
    if backend == "redis":
        try:
            from tiermem.store.backends import redis as redis_backend
        except ImportError as exc:
            raise _missing_extra("redis", exc) from exc
        cls = redis_backend.RedisHotStore if role == "hot" else redis_backend.RedisDurableStore
        return cls.from_url(
            settings.redis_url, clock=clock, prefix=settings.redis_prefix, gc_grace=grace
        )
    try:
        from tiermem.store.backends import dynamodb
    except ImportError as exc:
        raise _missing_extra("dynamodb", exc) from exc
    dyn_cls = dynamodb.DynamoDBHotStore if role == "hot" else dynamodb.DynamoDBDurableStore
    return dyn_cls(
        settings.dynamodb_table,
        clock=clock,
        endpoint_url=settings.dynamodb_endpoint_url,
        region_name=settings.aws_region,
        gc_grace=grace,
    )


def open_hot_store(settings: TierMemSettings, *, clock: Clock | None = None) -> HotStore:
    """The hot store the settings name."""
    return cast(HotStore, _open("hot", settings.hot_backend, settings, clock or SystemClock()))


def open_durable_store(settings: TierMemSettings, *, clock: Clock | None = None) -> DurableStore:
    """The durable store the settings name."""
    return cast(
        DurableStore, _open("durable", settings.durable_backend, settings, clock or SystemClock())
    )


def open_search_index(settings: TierMemSettings) -> SearchIndex | None:
    """The search index for recall that fits the deployment (see docs/recall.md):

    * Redis in the deployment: BM25 postings in Redis under each user's hash tag;
    * SQLite durable tier: FTS5 tables in the same file;
    * in-memory durable tier: an in-process index;
    * otherwise (DynamoDB without Redis): None, and the service warms an in-process index
      per user from the durable store on the user's first query.
    """
    if "redis" in (settings.hot_backend, settings.durable_backend):
        from tiermem.longterm.index_redis import RedisIndex

        return RedisIndex.from_url(settings.redis_url, prefix=settings.redis_prefix)
    if settings.durable_backend == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex
        from tiermem.store.backends import sqlite

        return SQLiteIndex(settings.sqlite_path or sqlite.default_database_path())
    if settings.durable_backend == "memory":
        from tiermem.longterm.index_memory import InProcessIndex

        return InProcessIndex()
    return None


def open_embedder(settings: TierMemSettings) -> Embedder | None:
    """The embedder the settings name, or None."""
    if settings.embedder == "none":
        return None
    if settings.embedder == "local":
        from tiermem.llm.embeddings_local import LocalMiniLMEmbedder

        return LocalMiniLMEmbedder()
    from tiermem.llm import embeddings_remote

    if settings.embedder == "bedrock-titan":
        return embeddings_remote.BedrockTitanEmbedder(
            model_id=settings.embedding_model or "amazon.titan-embed-text-v2:0",
            region_name=settings.aws_region,
        )
    if not settings.embedding_base_url or not settings.embedding_model:
        raise ValidationError(
            "the openai embedder needs TIERMEM_EMBEDDING_BASE_URL and TIERMEM_EMBEDDING_MODEL"
        )
    key = settings.embedding_api_key
    return embeddings_remote.OpenAICompatibleEmbedder(
        settings.embedding_base_url,
        settings.embedding_model,
        api_key=key.get_secret_value() if key else None,
    )
