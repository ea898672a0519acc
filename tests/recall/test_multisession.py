"""Per-turn recall for the context: dates, fusion, diversity, de-duplication, neighbours,
the recall block's budget, and that recall never lands in the stored history."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta

import pytest

from tiermem.clock import FakeClock
from tiermem.context import assemble_context
from tiermem.context.recall_block import plan_recall_block
from tiermem.errors import ValidationError
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.recall import Recaller, memory_doc, turn_doc_id, turn_docs
from tiermem.longterm.recall_context import (
    ContextRecallPolicy,
    expand_query,
    hop_names,
    recall_for_context,
)
from tiermem.longterm.recall_dates import (
    day_term,
    find_date_mentions,
    month_term,
    query_date_terms,
    turn_date_terms,
    week_term,
)
from tiermem.models import MemoryRecord, NewTurn, Provenance, SessionRef, TextBlock, Turn
from tiermem.policies.recall import (
    RecallPolicy,
    RecallSignals,
    diversify,
    rank_candidates,
    rrf_fuse,
)
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.tokens import TiktokenCounter

TUESDAY = datetime(2026, 3, 10, 15, tzinfo=UTC)  # a Tuesday


# -- dates ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "day", "precision"),
    [
        ("I bought it yesterday", date(2026, 3, 9), "day"),
        ("the day before yesterday", date(2026, 3, 8), "day"),
        ("two days ago", date(2026, 3, 8), "day"),
        ("3 days ago", date(2026, 3, 7), "day"),
        ("last Tuesday", date(2026, 3, 3), "day"),
        ("on Sunday", date(2026, 3, 8), "day"),
        ("last week", date(2026, 3, 2), "week"),
        ("two weeks ago", date(2026, 2, 23), "week"),
        ("last month", date(2026, 2, 1), "month"),
        ("on March 3rd", date(2026, 3, 3), "day"),
        ("the 28th of February", date(2026, 2, 28), "day"),
        ("on December 30", date(2025, 12, 30), "day"),  # the past, not nine months ahead
        ("2026-01-05", date(2026, 1, 5), "day"),
    ],
)
def test_relative_dates_resolve_against_the_day_they_were_said(
    text: str, day: date, precision: str
) -> None:
    (mention,) = find_date_mentions(text, TUESDAY)
    assert (mention.day, mention.precision) == (day, precision)


def test_a_turn_is_indexed_under_its_own_date_and_the_dates_it_mentions() -> None:
    terms = turn_date_terms("I picked it up yesterday", TUESDAY)
    assert terms[:3] == [day_term(date(2026, 3, 10)), week_term(date(2026, 3, 10)), "mo202603"]
    assert day_term(date(2026, 3, 9)) in terms
    assert turn_date_terms("nothing dated here", TUESDAY) == terms[:3]


def test_query_dates_resolve_against_the_clock_at_the_precision_asked() -> None:
    clock = FakeClock(TUESDAY)
    assert query_date_terms("what did I buy two days ago?", clock.now()) == [
        day_term(date(2026, 3, 8))
    ]
    clock.advance(timedelta(days=7))
    assert query_date_terms("what did I buy last week?", clock.now()) == [
        week_term(date(2026, 3, 10))
    ]
    assert query_date_terms("anything in February?", clock.now()) == [month_term(date(2026, 2, 1))]
    assert query_date_terms("what series do I like", clock.now()) == []


def test_turn_docs_carry_date_terms_also_when_terms_were_counted() -> None:
    turn = Turn(
        role="user", content=(TextBlock(text="ordered yesterday"),), timestamp=TUESDAY, index=3
    )
    (plain,) = turn_docs("u1", "s1", [turn])
    (counted,) = turn_docs("u1", "s1", [turn], terms=[{"ordered": 1, "yesterday": 1}])
    assert day_term(date(2026, 3, 9)) in plain.tags
    assert counted.terms is not None
    assert counted.terms[day_term(date(2026, 3, 9))] == 1


# -- fusion, diversity, query expansion -------------------------------------------------------


def test_rrf_rewards_agreement_between_rankings() -> None:
    fused = rrf_fuse([["a", "b", "c"], ["c", "b", "d"]], k=60)
    assert {key for key, _ in fused[:2]} == {"b", "c"}  # in both lists, near the top
    assert dict(fused)["a"] == pytest.approx(1 / 61)
    with pytest.raises(ValidationError):
        rrf_fuse([["a"]], k=0)


def test_rrf_fusion_ranks_by_reciprocal_ranks_in_both_lists() -> None:
    policy = RecallPolicy(fusion="rrf", recency_weight=0, importance_weight=0, access_weight=0)
    candidates = [
        ("a", RecallSignals(bm25=9.0, cosine=0.30)),  # bm25 1st, cosine 3rd
        ("b", RecallSignals(bm25=5.0, cosine=0.90)),  # bm25 2nd, cosine 1st
        ("c", RecallSignals(bm25=4.0, cosine=0.50)),  # bm25 3rd, cosine 2nd
        ("d", RecallSignals(bm25=0.0, cosine=0.95)),  # no term matched, cosine best
    ]
    ranked = rank_candidates(policy, candidates, k=4, require_relevance=True)
    assert [key for key, _ in ranked] == ["b", "a", "c", "d"]
    b = dict(ranked)["b"].components
    assert b["bm25"] == pytest.approx(0.45 * 61 / 62)
    assert b["embedding"] == pytest.approx(0.45 * 61 / 62)  # 2nd: "d" has the best cosine
    # Without cosines, RRF changes nothing: BM25 is normalised as before.
    lexical = [(k, RecallSignals(bm25=s.bm25)) for k, s in candidates]
    assert rank_candidates(policy, lexical, k=3, require_relevance=True) == rank_candidates(
        RecallPolicy(recency_weight=0, importance_weight=0, access_weight=0),
        lexical,
        k=3,
        require_relevance=True,
    )
    with pytest.raises(ValidationError):
        RecallPolicy(fusion="sum")  # type: ignore[arg-type]


def test_diversify_caps_a_session_and_drops_near_duplicates() -> None:
    items = [
        ("a1", "s1", frozenset({"berserk", "volume", "41"})),
        ("a2", "s1", frozenset({"berserk", "volume", "41"})),  # near duplicate of a1
        ("a3", "s1", frozenset({"budget", "yen"})),
        ("a4", "s1", frozenset({"postcode"})),
        ("b1", "s2", frozenset({"naruto"})),
    ]
    assert diversify(items, limit=3, per_group=2) == ["a1", "a3", "b1"]
    # Capped items come back when there is room left; duplicates never.
    assert diversify(items, limit=10, per_group=2) == ["a1", "a3", "b1", "a4"]


def test_expand_query_adds_dates_and_aliases() -> None:
    expanded = expand_query("AoT volume from yesterday", TUESDAY, {"aot": ("Attack", "Titan")})
    assert day_term(date(2026, 3, 9)) in expanded
    assert "Attack Titan" in expanded
    assert expand_query("plain", TUESDAY, {}) == "plain"


def test_hop_names_are_names_the_query_did_not_say() -> None:
    hit = RecallHit(kind="turn", doc_id="s#1", text="My nephew Kenji loves Pluto.", score=1.0)
    assert hop_names("what does my nephew like?", [hit], 3) == ["Kenji", "Pluto"]
    assert hop_names("what does Kenji like?", [hit], 3) == ["Pluto"]


# -- recall for the context over a real store and index ---------------------------------------


def _turn(text: str, role: str, at: datetime) -> NewTurn:
    return NewTurn(role=role, content=(TextBlock(text=text),), timestamp=at)


async def _recaller(
    sessions: dict[str, list[tuple[str, str]]], *, days_apart: int = 3
) -> tuple[Recaller, MemoryDurableStore, InProcessIndex, FakeClock]:
    start = datetime(2026, 3, 1, 10, tzinfo=UTC)
    clock = FakeClock(start + timedelta(days=days_apart * len(sessions)))
    store = MemoryDurableStore(clock=clock)
    index = InProcessIndex(clock=clock)
    for n, (session_id, turns) in enumerate(sessions.items()):
        at = start + timedelta(days=days_apart * n)
        await store.register_session(SessionRef(session_id=session_id, user_id="u1", created_at=at))
        stored = await store.append_turns(
            session_id,
            [_turn(text, role, at + timedelta(minutes=i)) for i, (role, text) in enumerate(turns)],
        )
        await index.upsert(turn_docs("u1", session_id, stored))
    return Recaller(store, index, clock=clock), store, index, clock


async def test_temporal_question_finds_the_turn_said_with_a_relative_date() -> None:
    days = {
        f"s{n}": [("user", f"I picked up Monster volume {n + 2} yesterday."), ("assistant", "Ok.")]
        for n in range(4)
    }
    recaller, _, _, clock = await _recaller(days)
    # s2 started 2026-03-07, so "yesterday" there is 2026-03-06.
    hits = await recall_for_context(
        recaller, "u1", "Which volume did I buy on March 6?", now=clock.now()
    )
    assert hits[0].doc_id == "s2#0"


async def test_hot_window_turns_never_take_a_recall_slot() -> None:
    turns = [("user", f"berserk note {i}") for i in range(12)]
    recaller, _, _, clock = await _recaller({"s0": turns})
    policy = ContextRecallPolicy(k=3, candidates=3, neighbours=False)
    hits = await recall_for_context(
        recaller, "u1", "berserk", now=clock.now(), session_id="s0",
        hot_indexes=range(4, 12), policy=policy,
    )  # fmt: skip
    assert len(hits) == 3
    assert all(int(h.doc_id.rpartition("#")[2]) < 4 for h in hits)


async def test_second_hop_joins_facts_by_the_name_between_them() -> None:
    filler = [("user", f"spending on manga box {i} was high") for i in range(20)]
    recaller, _, _, clock = await _recaller(
        {
            "s0": [("user", "My nephew Kenji is obsessed with Pluto."), ("assistant", "Nice.")],
            "s1": filler,
            "s2": [("user", "For Kenji I can spend up to 4,000 yen."), ("assistant", "Noted.")],
        }
    )
    question = "How much for my nephew?"  # no word of the s2 turn
    policy = ContextRecallPolicy(k=3, candidates=3, neighbours=False, second_hop=True)
    with_hop = await recall_for_context(recaller, "u1", question, now=clock.now(), policy=policy)
    no_hop = await recall_for_context(
        recaller, "u1", question, now=clock.now(),
        policy=ContextRecallPolicy(k=3, candidates=3, neighbours=False, second_hop=False),
    )  # fmt: skip
    assert {"s0#0", "s2#0"} <= {h.doc_id for h in with_hop}
    assert "s2#0" not in {h.doc_id for h in no_hop}


async def test_a_memory_and_its_source_turn_are_recalled_once() -> None:
    recaller, store, index, clock = await _recaller(
        {"s0": [("user", "My postcode is 150-0001 for deliveries"), ("assistant", "Saved.")]}
    )
    record = MemoryRecord(
        memory_id="m1",
        user_id="u1",
        memory_type="fact",
        content="postcode 150-0001 for deliveries",
        created_at=clock.now(),
        provenance=Provenance(source="auto", session_id="s0", turn_indexes=(0,)),
    )
    await store.put_memory(record)
    await index.upsert([memory_doc(record)])
    hits = await recall_for_context(
        recaller, "u1", "postcode deliveries", now=clock.now(),
        scope=("memory", "turn"), policy=ContextRecallPolicy(neighbours=False),
    )  # fmt: skip
    ids = [h.doc_id for h in hits]
    assert len({"m1", "s0#0"} & set(ids)) == 1


async def test_a_user_turn_hit_brings_the_answer_after_it() -> None:
    recaller, _, _, clock = await _recaller(
        {"s0": [("user", "I finished Planetes, what next?"), ("assistant", "Try Frieren.")]}
    )
    hits = await recall_for_context(recaller, "u1", "after Planetes", now=clock.now())
    assert [(h.doc_id, h.neighbour_of) for h in hits] == [("s0#0", None), ("s0#1", "s0#0")]


async def test_candidate_turns_are_read_in_runs_with_their_neighbours() -> None:
    filler = [("assistant", f"filler {i}") for i in range(40)]
    sessions = {
        "s0": [("user", f"berserk note {i}") for i in range(6)],
        "s1": [("user", "berserk first"), *filler[:29], ("user", "berserk later"), *filler[:9]],
    }
    recaller, store, _, clock = await _recaller(sessions)
    reads: Counter[str] = Counter()
    get_turn, get_turns = store.get_turn, store.get_turns

    # Instrumentation on the real store: count the reads, answer as it does.
    async def counted_turn(session_id: str, index: int) -> Turn:
        reads["get_turn"] += 1
        return await get_turn(session_id, index)

    async def counted_turns(session_id: str, start: int = 0, end: int | None = None) -> list[Turn]:
        reads["get_turns"] += 1
        return await get_turns(session_id, start, end)

    store.get_turn = counted_turn  # type: ignore[method-assign]
    store.get_turns = counted_turns  # type: ignore[method-assign]
    scope = ("memory", "turn")
    one_by_one = await recaller.recall("u1", "berserk", k=8, scope=scope, candidates=12)
    assert reads == {"get_turn": 8}
    reads.clear()
    read: dict[str, Turn | None] = {}
    in_runs = await recaller.recall(
        "u1", "berserk", k=8, scope=scope, candidates=12, turns_read=read
    )
    # s0's six turns are one run [0, 7); s1's two hits are far apart: two runs.
    assert reads == {"get_turns": 3}
    assert in_runs == one_by_one
    assert read["s0#6"] is None  # past the session's end: known missing
    reads.clear()
    neighbours = await recaller.neighbour_turns(in_runs, known=read)
    assert reads == {}
    assert neighbours == await recaller.neighbour_turns(in_runs)
    assert {h.doc_id for h in neighbours} >= {"s1#1", "s1#31"}
    # recall_for_context reads candidates and neighbours in runs only.
    reads.clear()
    await recall_for_context(recaller, "u1", "berserk", now=clock.now())
    assert reads["get_turn"] == 0


# -- the recall block ----------------------------------------------------------------------------


def _hit(session: str, index: int, text: str, score: float, *, of: str | None = None) -> RecallHit:
    day = datetime(2026, 3, 1, tzinfo=UTC) + timedelta(days=int(session[1:]))
    turn = Turn(
        role="user" if index % 2 == 0 else "assistant",
        content=(TextBlock(text=text),),
        timestamp=day,
        index=index,
    )
    return RecallHit(
        kind="turn", doc_id=turn_doc_id(session, index), text=text, score=score, turn=turn,
        session_id=session, neighbour_of=of,
    )  # fmt: skip


def test_neighbours_fit_within_the_room_and_hits_come_first() -> None:
    counter = TiktokenCounter()
    hits = [
        _hit("s1", 4, "first hit about Berserk volumes " * 3, 0.9),
        _hit("s2", 8, "second hit about a postcode", 0.5),
        _hit("s1", 5, "the answer to the first hit " * 3, 0.9, of="s1#4"),
    ]
    roomy, _ = plan_recall_block(hits, 400, counter)
    assert sum(i.tokens for i in roomy) <= 400
    assert [i.provenance.turn_indexes for i in roomy] == [(4,), (5,), (8,)]
    assert roomy[0].text.startswith("Recalled for this message")
    assert "Session s1 — " in roomy[0].text
    assert "Session s2 — " in roomy[2].text
    for room in range(0, 400, 7):
        items, _ = plan_recall_block(hits, room, counter)
        assert sum(i.tokens for i in items) <= room
        placed = [i.provenance.turn_indexes[0] for i in items]
        if 5 in placed:  # a neighbour is placed only with its hit
            assert 4 in placed


def test_recall_block_shows_relative_dates_resolved() -> None:
    (item,), _ = plan_recall_block(
        [_hit("s9", 2, "I returned it yesterday", 1.0)], 200, TiktokenCounter()
    )
    assert "yesterday → 2026-03-09" in item.text
    assert "Tuesday 2026-03-10" in item.text


def test_assembled_recall_never_exceeds_the_budget_and_keeps_provenance() -> None:
    hits = [_hit(f"s{n}", 2 * n, f"fact number {n} " * 20, 1.0 - n / 10) for n in range(8)]
    for budget in (300, 512, 1024, 2048):
        window = assemble_context(recall=hits, current="what facts?", budget=budget)
        assert window.total_tokens <= budget
        for item in window.items:
            if item.kind == "recall":
                assert item.provenance.tier == "archive"
                assert item.provenance.turn_indexes


# -- end to end: recall is read, never stored --------------------------------------------------


async def test_session_context_recalls_earlier_sessions_and_never_stores_it() -> None:
    clock = FakeClock(datetime(2026, 3, 1, 10, tzinfo=UTC))
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings, clock=clock) as service:
        old = await service.session("old-s", user_id="u1")
        await old.add_turn("user", "My cousin Aiko lives in Sapporo.")
        await old.add_turn("assistant", "Good to know.")
        await service.drain()
        clock.advance(timedelta(minutes=30))
        new = await service.session("new-s", user_id="u1")
        for i in range(6):
            await new.add_turn("user", f"small talk {i}")
        await service.drain()
        window = await new.context(query="Where does Aiko live?", budget=2000)
        recalled = [i for i in window.items if i.kind == "recall"]
        assert any(i.provenance.session_id == "old-s" for i in recalled)
        assert any("Session old-s" in i.text for i in recalled)
        stored = await new.get_turns()
        assert [t.text for t in stored] == [f"small talk {i}" for i in range(6)]
        assert all("Sapporo" not in t.text for t in stored)


# -- embeddings at index time ------------------------------------------------------------------


async def test_turns_are_embedded_when_indexed_and_a_query_embeds_only_itself() -> None:
    from tests.recall.conftest import ConceptEmbedder

    embedder = ConceptEmbedder()
    clock = FakeClock(TUESDAY)
    store = MemoryDurableStore(clock=clock)
    index = InProcessIndex(clock=clock)
    recaller = Recaller(store, index, clock=clock, embedder=embedder)
    await store.register_session(SessionRef(session_id="s1", user_id="u1", created_at=TUESDAY))
    texts = ["I find horror creepy", "a sunny walk in the park", "horror is fine at night"]
    stored = await store.append_turns("s1", [_turn(t, "user", TUESDAY) for t in texts])
    docs = await recaller.embed_documents(turn_docs("u1", "s1", stored))
    assert embedder.calls == [texts]  # one batch, at index time
    assert all(d.embedding is not None for d in docs)
    await index.upsert(docs)
    embedder.calls.clear()
    hits = await recall_for_context(
        recaller, "u1", "anything scary?", now=clock.now(), scope=("turn",),
        policy=ContextRecallPolicy(neighbours=False),
    )  # fmt: skip
    assert hits
    assert hits[0].doc_id in {"s1#0", "s1#2"}
    assert embedder.calls == [["anything scary?"]]
