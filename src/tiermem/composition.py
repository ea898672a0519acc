"""The composition root: settings in, a wired service out.

This is the one place that knows which backend class a setting names and how the parts of
long-term memory (index, recaller, knowledge base, access tracking) are put together.
Optional client libraries are imported only when their backend is chosen.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tiermem.clock import Clock, IdFactory, SystemClock
from tiermem.errors import UnsupportedCapabilityError, ValidationError
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.access import AccessTracker
from tiermem.longterm.index import SearchIndex
from tiermem.longterm.knowledge import KnowledgeBase
from tiermem.longterm.memory import LongTermMemory
from tiermem.settings import BackendName, TierMemSettings
from tiermem.store.contract import Capability, DurableStore, HotStore
from tiermem.tokens import TokenCounter

if TYPE_CHECKING:
    from tiermem.background import BackgroundWork
    from tiermem.service import MemoryService
    from tiermem.store.backends.redis_durable import RedisDurableStore
    from tiermem.store.backends.redis_hot import RedisHotStore
    from tiermem.store.backends.redis_scripts import RedisClient
    from tiermem.summaries.handoff import SessionHandoff
    from tiermem.summaries.jobs import SummaryJobs
    from tiermem.summaries.models import SessionSummarizer, StructuredExtractor
    from tiermem.summaries.rolling import SummaryPolicy
    from tiermem.summaries.rollup import ProgressiveRollup, RollupPolicy

__all__ = [
    "build_longterm",
    "build_summaries",
    "open_durable_store",
    "open_embedder",
    "open_hot_store",
    "open_search_index",
    "open_service",
    "summary_engines",
]

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
        sync = settings.sqlite_synchronous
        if role == "hot":
            return sqlite.SQLiteHotStore(path, clock=clock, gc_grace=grace, synchronous=sync)
        return sqlite.SQLiteDurableStore(path, clock=clock, synchronous=sync)
    if backend == "redis":
        return _open_redis(role, settings, clock)
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


def _open_redis(
    role: str,
    settings: TierMemSettings,
    clock: Clock,
    *,
    client: RedisClient | None = None,
    **client_options: Any,
) -> RedisHotStore | RedisDurableStore:
    """A Redis store of ``role``: on ``client`` (borrowed: the store's ``aclose`` leaves it
    open), or on a client of its own built from the settings and ``client_options`` (owned:
    its ``aclose`` closes it)."""
    try:
        from tiermem.store.backends import redis as redis_backend
    except ImportError as exc:
        raise _missing_extra("redis", exc) from exc
    cls = redis_backend.RedisHotStore if role == "hot" else redis_backend.RedisDurableStore
    options: dict[str, Any] = {}
    if role == "durable" and settings.redis_wait_replicas:
        # WAIT on the writes that make a turn durable (the combined hot + durable
        # append reads it from the durable store). It is the store's option, not the
        # client's: every waited write sends WAIT alone, in the same round trip as the
        # write and on its connection, whichever store's client that is.
        options["replica_wait"] = redis_backend.ReplicaWait(
            settings.redis_wait_replicas, settings.redis_wait_timeout_ms
        )
    common: dict[str, Any] = {
        "clock": clock,
        "prefix": settings.redis_prefix,
        "gc_grace": timedelta(seconds=settings.gc_grace_seconds),
    }
    if client is not None:
        return cls(client, **common, **options)
    return cls.from_url(
        settings.redis_url, cluster=settings.redis_cluster, **common, **options, **client_options
    )


def open_hot_store(settings: TierMemSettings, *, clock: Clock | None = None) -> HotStore:
    """The hot store the settings name."""
    return cast(HotStore, _open("hot", settings.hot_backend, settings, clock or SystemClock()))


def open_durable_store(settings: TierMemSettings, *, clock: Clock | None = None) -> DurableStore:
    """The durable store the settings name."""
    return cast(
        DurableStore, _open("durable", settings.durable_backend, settings, clock or SystemClock())
    )


def open_search_index(
    settings: TierMemSettings, *, clock: Clock | None = None
) -> SearchIndex | None:
    """The search index for recall that fits the deployment (see docs/recall.md):

    * Redis in the deployment: BM25 postings in Redis under each user's hash tag;
    * SQLite durable tier: FTS5 tables in the same file;
    * in-memory durable tier: an in-process index;
    * otherwise (DynamoDB without Redis): None, and the service warms an in-process index
      per user from the durable store on the user's first query.
    """
    if "redis" in (settings.hot_backend, settings.durable_backend):
        from tiermem.longterm.index_redis import RedisIndex

        return RedisIndex.from_url(
            settings.redis_url,
            prefix=settings.redis_prefix,
            clock=clock,
            cluster=settings.redis_cluster,
        )
    if settings.durable_backend == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex
        from tiermem.store.backends import sqlite

        return SQLiteIndex(settings.sqlite_path or sqlite.default_database_path(), clock=clock)
    if settings.durable_backend == "memory":
        from tiermem.longterm.index_memory import InProcessIndex

        return InProcessIndex(clock=clock)
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


def build_longterm(
    durable: DurableStore,
    index: SearchIndex | None,
    *,
    longterm: LongTermMemory | None = None,
    clock: Clock,
    ids: IdFactory,
    tokens: TokenCounter,
    embedder: Embedder | None,
    turn_retention: timedelta | None = None,
) -> tuple[LongTermMemory, KnowledgeBase, AccessTracker]:
    """Long-term memory, knowledge documents and access tracking over one durable store and
    one search index. Without an index: a persistent store gets an in-process index warmed
    per user from the store on first query (memories, archived turns, document chunks), the
    in-memory store a plain one. An injected ``longterm`` brings its own index, which the
    knowledge base then shares (one index per deployment, never two). ``turn_retention`` is
    how long archived turns live (the session tier's ``durable_ttl``): warmed turn
    documents expire no later."""
    from tiermem.longterm.index_memory import InProcessIndex, WarmingIndex
    from tiermem.longterm.recall import Recaller, memory_loader, turn_loader

    warming: WarmingIndex | None = None
    if longterm is not None:
        index = longterm.index
    if index is None:
        if Capability.PERSISTENT in durable.capabilities:
            turns = turn_loader(durable, retention=turn_retention, clock=clock)
            index = warming = WarmingIndex([turns], clock=clock)
        else:
            index = InProcessIndex(clock=clock)
    knowledge = KnowledgeBase(durable, index, clock=clock, ids=ids, embedder=embedder)
    if warming is not None:
        warming.add_loader(knowledge.indexed_docs)
    access = AccessTracker(durable, clock=clock)
    recaller = Recaller(durable, index, clock=clock, embedder=embedder, access=access)
    recaller.register_resolver("chunk", knowledge.resolve_chunks)
    if longterm is not None:
        return longterm, knowledge, access
    longterm = LongTermMemory(
        durable,
        index,
        clock=clock,
        ids=ids,
        tokens=tokens,
        embedder=embedder,
        recaller=recaller,
    )
    if warming is not None:
        # Custom memory types registered on this instance are warmed too.
        warming.add_loader(memory_loader(durable, types=longterm.types, clock=clock))
    return longterm, knowledge, access


def open_service(
    settings: TierMemSettings, *, clock: Clock | None = None, **engines: Any
) -> MemoryService:
    """The service the settings describe; ``engines`` override any constructor argument of
    :class:`~tiermem.service.MemoryService`.

    The Redis parts of one service (hot store, durable store, search index: the settings
    name one Redis URL for all of them) share one standalone client, see
    :func:`_open_shared_redis`."""
    from tiermem.service import MemoryService
    from tiermem.tiers.config import SessionTierConfig

    clock = clock or SystemClock()
    engines.setdefault("config", SessionTierConfig(window=settings.hot_window))
    engines.setdefault("index_linger", settings.index_linger_ms / 1000)
    if "embedder" not in engines:
        engines["embedder"] = open_embedder(settings)
    for name, engine in summary_engines(settings).items():
        engines.setdefault(name, engine)
    if settings.series_catalogue is not None:
        for name, engine in catalogue_engines(load_series_catalogue(settings.series_catalogue)):
            engines.setdefault(name, engine)
    wants_index = "index" not in engines and "longterm" not in engines
    shared = _open_shared_redis(settings, clock, index=wants_index)
    if shared is not None:
        hot, durable, index = shared
    else:
        hot = open_hot_store(settings, clock=clock)
        durable = open_durable_store(settings, clock=clock)
        index = open_search_index(settings, clock=clock) if wants_index else None
    if wants_index:
        engines["index"] = index
    return MemoryService(hot, durable, clock=clock, **engines)


def _open_shared_redis(
    settings: TierMemSettings, clock: Clock, *, index: bool
) -> tuple[HotStore, DurableStore, SearchIndex | None] | None:
    """The hot store, the durable store and (with ``index``) the search index of one
    service, the Redis ones on ONE standalone client; None where fewer than two parts are
    on Redis, or on a Redis Cluster (each part then builds its own client, as before).

    Why one client: a client's :class:`~tiermem.store.backends.redis_scripts.DirectLane`
    merges the calls made in one turn of the event loop while a round trip is in flight
    into one write, but only the calls of its own pool. With a client per part, the hot
    store's, the durable store's and the index's calls of one turn went as separate
    writes on three pools; one client took Redis + Redis from 0.66 to 0.57 writes per turn
    at 50 sessions (``bench/results/turns_redis_shared_client.json``). The
    parts are the same server and options by construction (one ``TIERMEM_REDIS_URL``);
    ``WAIT`` is the durable store's option, not the client's, and the lane always sends a
    waited write alone, with its WAIT, on one connection, whichever client carries it.

    The pool holds up to :data:`DEFAULT_MAX_CONNECTIONS` per part sharing it: the same
    ceiling as the separate pools had together (connections are opened only when needed;
    a ``max_connections`` in the URL's query wins, as for any client built from it).

    Closing: the durable store when it is on Redis, else the hot store, is built with
    ``from_url`` and owns the client; the other parts borrow it (their ``aclose`` leaves it
    open), so :meth:`MemoryService.aclose <tiermem.service.MemoryService.aclose>` closes it
    exactly once, and nothing runs commands after that (the service drains its
    background work and flushes access tracking before it closes any part).

    A cluster client is not shared: it takes redis-py's own path (no lane, so nothing to
    merge and no CPU to save), and redis-py 8.1 answers a ``ClusterDownError`` or
    ``SlotNotCoveredError`` of one command by closing every connection of the client, so
    one client would widen that to the commands of every part in flight.
    """
    roles = [
        role
        for role, backend in (("durable", settings.durable_backend), ("hot", settings.hot_backend))
        if backend == "redis"
    ]
    sharing = len(roles) + (1 if index and roles else 0)  # the index is on Redis with them
    if settings.redis_cluster or sharing < 2:
        return None
    from tiermem.store.backends.redis_scripts import DEFAULT_MAX_CONNECTIONS

    owner = _open_redis(
        roles[0], settings, clock, max_connections=DEFAULT_MAX_CONNECTIONS * sharing
    )
    borrowed = {role: _open_redis(role, settings, clock, client=owner.client) for role in roles[1:]}
    stores = {roles[0]: owner, **borrowed}
    hot = stores["hot"] if "hot" in stores else open_hot_store(settings, clock=clock)
    durable = (
        stores["durable"] if "durable" in stores else open_durable_store(settings, clock=clock)
    )
    search: SearchIndex | None = None
    if index:
        from tiermem.longterm.index_redis import RedisIndex

        search = RedisIndex(owner.client, prefix=settings.redis_prefix, clock=clock)
    return cast(HotStore, hot), cast(DurableStore, durable), search


# -- summaries (rolling tiers, handoff, roll-up) ----------------------------------------------


def build_summaries(
    durable: DurableStore,
    longterm: LongTermMemory,
    background: BackgroundWork,
    *,
    clock: Clock,
    tokens: TokenCounter,
    summarizer: SessionSummarizer | None = None,
    extractor: StructuredExtractor | None = None,
    policy: SummaryPolicy | None = None,
    rollup_policy: RollupPolicy | None = None,
) -> tuple[SummaryJobs, SessionHandoff, ProgressiveRollup]:
    """Summarization jobs, the session handoff and the progressive roll-up, wired. Without
    engines: the offline ones (extractive summaries, rule-based structured memory)."""
    from tiermem.summaries.handoff import SessionHandoff
    from tiermem.summaries.jobs import SummaryJobs
    from tiermem.summaries.offline import ExtractiveSummarizer
    from tiermem.summaries.rollup import ProgressiveRollup
    from tiermem.summaries.structured import RuleStructuredExtractor

    jobs = SummaryJobs(
        durable,
        summarizer=summarizer or ExtractiveSummarizer(tokens),
        extractor=extractor or RuleStructuredExtractor(),
        background=background,
        clock=clock,
        tokens=tokens,
        policy=policy,
    )
    jobs.index_for_recall(longterm)  # earlier sessions' summaries are recall sources
    rollup = ProgressiveRollup(longterm, clock=clock, tokens=tokens, policy=rollup_policy)
    handoff = SessionHandoff(
        durable, longterm, jobs, clock=clock, tokens=tokens, after=rollup.roll_up
    )
    return jobs, handoff, rollup


def load_series_catalogue(path: Path) -> dict[str, str]:
    """The catalogue file ``TIERMEM_SERIES_CATALOGUE`` names, as alias -> canonical title
    (see :attr:`TierMemSettings.series_catalogue`).

    Raises:
        ValidationError: the file cannot be read, is not JSON, or is neither an object of
            non-empty strings nor a list of them.
    """
    import json

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValidationError(
            f"TIERMEM_SERIES_CATALOGUE {str(path)!r} cannot be read as JSON: {exc}"
        ) from exc
    pairs = [(t, t) for t in raw] if isinstance(raw, list) else raw
    if isinstance(pairs, dict):
        pairs = list(pairs.items())
    if not isinstance(pairs, list) or not all(
        isinstance(a, str) and isinstance(t, str) and a.strip() and t.strip() for a, t in pairs
    ):
        raise ValidationError(
            f"TIERMEM_SERIES_CATALOGUE {str(path)!r} must hold a JSON object of alias to "
            'title ({"berserk": "Berserk"}) or a list of titles, all non-empty strings'
        )
    return {alias.strip(): title.strip() for alias, title in pairs}


def catalogue_engines(titles: dict[str, str]) -> list[tuple[str, Any]]:
    """The rule engines that read series, each given the catalogue ``titles``: turn
    analysis, memory detection, the offline summarizer and structured memory (engines a
    caller passes, or an LLM engine from the settings, are kept)."""
    from tiermem.extraction.entities import RuleEntityExtractor
    from tiermem.longterm.detect import RuleMemoryDetector
    from tiermem.summaries.offline import ExtractiveSummarizer
    from tiermem.summaries.structured import RuleStructuredExtractor

    extractor = RuleStructuredExtractor(titles)
    return [
        ("entities", RuleEntityExtractor(titles)),
        ("detector", RuleMemoryDetector(titles)),
        ("extractor", extractor),
        ("summarizer", ExtractiveSummarizer(known_titles=titles, extractor=extractor)),
    ]


def summary_engines(settings: TierMemSettings) -> dict[str, Any]:
    """The LLM summarization engines and policy the settings name: an LLM engine when
    ``TIERMEM_LLM`` names a provider (else none: the service uses the offline engine), and
    a trigger threshold from ``default_model``'s window (min(60% of it, 8k) tokens)."""
    from tiermem.errors import UnknownModelError
    from tiermem.llm.chat_factory import open_chat_model
    from tiermem.summaries.llm_engine import LLMStructuredExtractor, LLMSummarizer
    from tiermem.summaries.rolling import SummaryPolicy
    from tiermem.tokens import default_registry

    engines: dict[str, Any] = {}
    try:
        spec = default_registry().get(settings.default_model)
    except UnknownModelError:
        spec = None  # an unlisted model: the 8k default applies
    engines["summary_policy"] = SummaryPolicy.for_model(spec)
    model = open_chat_model(settings)
    if model is not None:
        engines["summarizer"] = LLMSummarizer(model)
        engines["extractor"] = LLMStructuredExtractor(model)
    return engines
