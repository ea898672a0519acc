"""Recaller: candidates, filters, episodic recall, resolvers, embeddings, no writes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from tests.recall.conftest import T0, ConceptEmbedder, days, memory
from tiermem.clock import FakeClock
from tiermem.errors import BackendUnavailableError, ValidationError
from tiermem.longterm.access import AccessTracker
from tiermem.longterm.index import IndexedDoc, SearchHit
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.recall import (
    Recaller,
    ResolvedDoc,
    memory_doc,
    parse_turn_doc_id,
    turn_doc_id,
    turn_docs,
)
from tiermem.models import MemoryRecord, Provenance
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.testing.backend import text_turn

WRITES = {
    "put_memory",
    "delete_memory",
    "append_turns",
    "put_record",
    "redact_turn",
    "register_session",
    "delete_session",
    "purge_user",
}


class SpyStore:
    """A durable store that counts calls by method name."""

    def __init__(self, inner: MemoryDurableStore) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.args: dict[str, list[tuple[Any, ...]]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        async def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            self.args.setdefault(name, []).append(args)
            return await attr(*args, **kwargs)

        return spy

    def writes(self) -> int:
        return sum(n for name, n in self.calls.items() if name in WRITES)


class NoVectorIndex(InProcessIndex):
    """An index without vector search (like RedisIndex), for the rerank path."""

    supports_vectors = False

    async def vector_search(self, *args: Any, **kwargs: Any) -> list[SearchHit]:
        raise AssertionError("recall must not ask an index without vectors")


class World:
    def __init__(
        self,
        clock: FakeClock,
        *,
        index: InProcessIndex | None = None,
        embedder: ConceptEmbedder | None = None,
    ) -> None:
        self.clock = clock
        self.store = MemoryDurableStore(clock=clock)
        self.spy = SpyStore(self.store)
        self.index = index or InProcessIndex()
        self.access = AccessTracker(self.store, clock=clock, flush_every=10_000)
        self.embedder = embedder
        self.recaller = Recaller(
            self.spy,  # type: ignore[arg-type]
            self.index,
            clock=clock,
            embedder=embedder,
            access=self.access,
        )

    async def remember(self, *records: MemoryRecord) -> None:
        for record in records:
            if self.embedder is not None and record.embedding is None:
                vector = self.embedder.vector(record.content)
                record = record.model_copy(
                    update={"embedding": tuple(vector), "embedding_model": self.embedder.model_id}
                )
            await self.store.put_memory(record)
            await self.index.upsert([memory_doc(record)])
        if self.embedder is not None:
            self.embedder.calls.clear()

    async def recall(self, query: str, **kwargs: Any) -> list[str]:
        return [hit.doc_id for hit in await self.recaller.recall("u1", query, **kwargs)]


@pytest.fixture
def world(clock: FakeClock) -> World:
    return World(clock)


async def test_recall_returns_scored_memories_with_provenance(world: World) -> None:
    await world.remember(
        memory(
            "m1",
            "Prefers seinen manga like Berserk",
            importance=0.9,
            provenance=Provenance(source="auto", session_id="s1", turn_indexes=(3,)),
        ),
        memory("m2", "Lives in Osaka", memory_type="fact"),
    )
    hits = await world.recaller.recall("u1", "berserk manga")
    assert [h.doc_id for h in hits] == ["m1"]
    hit = hits[0]
    assert hit.kind == "memory"
    assert hit.text == "Prefers seinen manga like Berserk"
    assert hit.memory is not None
    assert hit.memory.memory_id == "m1"
    assert hit.session_id == "s1"
    assert hit.provenance.turn_indexes == (3,)
    assert set(hit.components) == {"bm25", "embedding", "recency", "importance", "access"}
    assert hit.score == pytest.approx(sum(hit.components.values()))
    assert hit.components["bm25"] == pytest.approx(0.45)  # the best match is the max


async def test_filters_types_importance_and_time(world: World) -> None:
    await world.remember(
        memory(
            "pref",
            "likes berserk",
            memory_type="preference",
            importance=0.9,
            created_at=T0 - days(10),
        ),
        memory(
            "fb",
            "berserk arrived damaged",
            memory_type="feedback",
            importance=0.7,
            created_at=T0 - days(5),
        ),
        memory(
            "ep",
            "asked about berserk",
            memory_type="episode",
            importance=0.3,
            created_at=T0 - days(1),
        ),
    )
    assert sorted(await world.recall("berserk")) == ["ep", "fb", "pref"]
    assert await world.recall("berserk", types=["feedback"]) == ["fb"]
    assert sorted(await world.recall("berserk", min_importance=0.5)) == ["fb", "pref"]
    assert sorted(await world.recall("berserk", since=T0 - days(6))) == ["ep", "fb"]
    assert await world.recall("berserk", since=T0 - days(6), until=T0 - days(2)) == ["fb"]


async def test_expired_superseded_future_and_internal_records_are_hidden(
    world: World, clock: FakeClock
) -> None:
    await world.remember(
        memory("live", "berserk live"),
        memory("expiring", "berserk expiring", expires_at=T0 + days(1)),
        memory("superseded", "berserk old fact", invalid_from=T0 + days(2)),
        memory("future", "berserk future fact", valid_from=T0 + days(3)),
        memory("log", "berserk change log", memory_type="_change"),
    )
    assert sorted(await world.recall("berserk", k=10)) == ["expiring", "live", "superseded"]
    clock.advance(days(4))
    assert sorted(await world.recall("berserk", k=10)) == ["future", "live"]


async def test_empty_query_browses_recent_and_important_memories(world: World) -> None:
    await world.remember(
        memory("old", "an old note", created_at=T0 - days(200)),
        memory("new", "a new note", created_at=T0 - days(1)),
        memory("_x", "internal", memory_type="_change"),
    )
    assert await world.recall("") == ["new", "old"]
    assert await world.recall("  the  ") == ["new", "old"]  # only stopwords: no terms


async def test_recall_only_reads_candidates_never_the_partition(world: World) -> None:
    await world.remember(
        *(
            memory(f"m{i}", f"note number {i} about berserk" if i % 10 == 0 else f"note number {i}")
            for i in range(300)
        )
    )
    hits = await world.recall("berserk", k=5)
    assert len(hits) == 5
    assert world.spy.calls["query_memories"] == 0
    # One batch read of the 30 BM25 matches, nothing else.
    assert (world.spy.calls["get_memories"], world.spy.calls["get_memory"]) == (1, 0)
    ((_, fetched),) = world.spy.args["get_memories"]
    assert sorted(fetched) == sorted(f"m{i}" for i in range(0, 300, 10))


async def test_recall_writes_nothing_and_counts_accesses_in_memory(world: World) -> None:
    await world.remember(memory("m1", "berserk"), memory("m2", "berserk vagabond"))
    for _ in range(3):
        await world.recall("berserk")
    assert world.spy.writes() == 0
    assert world.access.pending_count("u1", "m1") == 3
    report = await world.access.flush()
    assert report.applied == 2
    stored = await world.store.get_memory("u1", "m1")
    assert stored is not None
    assert stored.access_count == 3
    assert stored.accessed_at == T0


async def test_episodic_recall_over_archived_turns(world: World) -> None:
    turns = await world.store.append_turns(
        "s1",
        [
            text_turn("hello there"),
            text_turn("Do you have Berserk volume 42?"),
            text_turn("Yes, volume 42 ships tomorrow", role="assistant"),
        ],
    )
    await world.index.upsert(turn_docs("u1", "s1", turns))
    await world.remember(memory("m1", "Collects Berserk"))
    hits = await world.recaller.recall("u1", "berserk volume 42", scope=("turn",))
    assert [h.doc_id for h in hits] == ["s1#1", "s1#2"]
    first = hits[0]
    assert first.kind == "turn"
    assert first.turn is not None
    assert first.turn.index == 1
    assert first.text == "Do you have Berserk volume 42?"
    assert first.session_id == "s1"
    assert first.provenance.session_id == "s1"
    assert first.provenance.turn_indexes == (1,)
    both = await world.recaller.recall("u1", "berserk", scope=("memory", "turn"))
    assert {h.kind for h in both} == {"memory", "turn"}
    assert world.access.pending_count("u1", "s1#1") == 0  # only memories are tracked


def test_turn_doc_ids_round_trip_and_redacted_turns_are_not_indexed() -> None:
    assert parse_turn_doc_id(turn_doc_id("a#b", 7)) == ("a#b", 7)
    with pytest.raises(ValidationError):
        parse_turn_doc_id("no-index")
    redacted = text_turn("secret").with_index(0).redact()
    kept = text_turn("visible").with_index(1)
    docs = turn_docs("u1", "s", [redacted, kept])
    assert [d.doc_id for d in docs] == ["s#1"]


async def test_stale_documents_are_skipped_and_removed_from_the_index(world: World) -> None:
    await world.remember(memory("m1", "berserk"), memory("m2", "berserk too"))
    await world.store.delete_memory("u1", "m2")
    await world.index.upsert(turn_docs("u1", "gone", [text_turn("berserk").with_index(0)]))
    hits = await world.recall("berserk", scope=("memory", "turn"))
    assert hits == ["m1"]
    await world.recaller.aclose()
    assert world.recaller.counters.stale_documents == 2
    left = await world.index.search("u1", "berserk", kinds=("memory", "turn"), limit=5)
    assert [h.doc_id for h in left] == ["m1"]


async def test_chunks_come_through_a_registered_resolver(world: World) -> None:
    await world.index.upsert(
        [
            IndexedDoc(
                user_id="u1",
                doc_id="doc1#0",
                kind="chunk",
                text="return policy for damaged items",
                created_at=T0,
            )
        ]
    )
    with pytest.raises(ValidationError, match="register_resolver"):
        await world.recall("damaged", scope=("chunk",))
    seen: list[Sequence[str]] = []

    async def resolve(user_id: str, doc_ids: Sequence[str]) -> dict[str, Any]:
        seen.append(doc_ids)
        return {"doc1#0": ("Damaged items are replaced.", Provenance(source="knowledge"))}

    world.recaller.register_resolver("chunk", resolve)
    hits = await world.recaller.recall("u1", "damaged", scope=("chunk",))
    assert [(h.kind, h.text) for h in hits] == [("chunk", "Damaged items are replaced.")]
    assert hits[0].provenance.source == "knowledge"
    assert seen == [["doc1#0"]]

    async def dated(user_id: str, doc_ids: Sequence[str]) -> dict[str, ResolvedDoc]:
        return {"doc1#0": ResolvedDoc("x", Provenance(), created_at=T0, importance=0.9)}

    world.recaller.register_resolver("chunk", dated)
    [hit] = await world.recaller.recall("u1", "damaged", scope=("chunk",))
    assert hit.components["recency"] == pytest.approx(0.10)
    assert hit.components["importance"] == pytest.approx(0.10 * 0.9)
    with pytest.raises(ValidationError):
        world.recaller.register_resolver("memory", resolve)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": 0},
        {"k": 101},
        {"scope": "memory"},
        {"scope": ()},
        {"scope": ("bogus",)},
        {"min_importance": 1.5},
        {"since": T0.replace(tzinfo=None)},
        {"types": "fact"},
    ],
)
async def test_bad_arguments_are_rejected(world: World, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        await world.recaller.recall("u1", "x", **kwargs)


# -- embeddings -----------------------------------------------------------------------------


async def test_embeddings_find_paraphrases_bm25_misses(clock: FakeClock) -> None:
    plain = World(clock)
    hybrid = World(clock, embedder=ConceptEmbedder())
    for w in (plain, hybrid):
        await w.remember(
            memory("horror", "Dislikes horror manga"),
            memory("ship", "Wants courier delivery to Osaka"),
            memory("cat", "Has a kitten named Mochi"),
        )
    query = "anything too scary for them?"
    assert await plain.recall(query) == []
    assert (await hybrid.recall(query))[0] == "horror"
    assert (await hybrid.recall("猫の本"))[0] == "cat"
    # Stored embeddings are used: only the query itself was embedded.
    assert hybrid.embedder is not None
    assert hybrid.embedder.calls == [[query], ["猫の本"]]


async def test_without_index_vectors_embeddings_rerank_recent_memories(clock: FakeClock) -> None:
    w = World(clock, index=NoVectorIndex(), embedder=ConceptEmbedder())
    await w.remember(
        memory("horror", "Dislikes horror manga", created_at=T0 - days(3)),
        memory("ship", "Wants courier delivery to Osaka", created_at=T0 - days(2)),
    )
    assert (await w.recall("is it too scary?"))[0] == "horror"
    assert w.spy.calls["query_memories"] == 1


async def test_texts_without_stored_vectors_are_embedded_in_one_call(clock: FakeClock) -> None:
    embedder = ConceptEmbedder()
    w = World(clock, embedder=embedder)
    turns = await w.store.append_turns(
        "s1", [text_turn("I find horror creepy"), text_turn("horror is fine at night")]
    )
    await w.index.upsert(turn_docs("u1", "s1", turns))  # no turn vectors
    hits = await w.recaller.recall("u1", "horror scary", scope=("turn",))
    assert [h.doc_id for h in hits] == ["s1#0", "s1#1"]
    assert all(h.components["embedding"] > 0 for h in hits)
    assert embedder.calls == [["horror scary"], ["I find horror creepy", "horror is fine at night"]]


async def test_embedder_failure_degrades_to_bm25(clock: FakeClock) -> None:
    embedder = ConceptEmbedder()
    w = World(clock, embedder=embedder)
    await w.remember(memory("m1", "Dislikes horror manga"))
    embedder.fail = True
    assert await w.recall("horror") == ["m1"]
    assert await w.recall("scary") == []
    assert w.recaller.counters.embedding_failures == 2
    strict = Recaller(w.store, w.index, clock=clock, embedder=embedder, raise_embedding_errors=True)
    with pytest.raises(BackendUnavailableError):
        await strict.recall("u1", "horror")


async def test_other_models_embeddings_are_not_compared(clock: FakeClock) -> None:
    embedder = ConceptEmbedder()
    w = World(clock, index=NoVectorIndex(), embedder=embedder)
    foreign = memory(
        "m1", "Dislikes horror manga", embedding=tuple([1.0] * 32), embedding_model="another-model"
    )
    await w.remember(foreign)
    hits = await w.recaller.recall("u1", "scary stuff")
    assert [h.doc_id for h in hits] == ["m1"]  # re-embedded with our model, found
    assert embedder.calls[-1] == ["Dislikes horror manga"]
