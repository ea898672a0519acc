"""The user context block: layout, provenance, the token budget (never exceeded, lowest
priority dropped first), and building it from a backend with the real recaller."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.longterm.conftest import FakeRecaller, make_longterm
from tiermem.errors import UnknownModelError, ValidationError
from tiermem.longterm.context import (
    EMPTY_TEXT,
    MAX_LINE_CHARS,
    UserContext,
    describe_provenance,
    render_user_context,
)
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.recall import Recaller
from tiermem.models import MemoryRecord, Provenance
from tiermem.testing import BackendUnderTest
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
T0 = datetime(2030, 1, 2, tzinfo=UTC)


def record(
    memory_id: str,
    content: str,
    *,
    memory_type: str = "fact",
    importance: float = 0.7,
    provenance: Provenance | None = None,
    at: datetime = T0,
) -> MemoryRecord:
    return MemoryRecord(
        memory_id=memory_id,
        user_id="u-1",
        memory_type=memory_type,
        content=content,
        importance=importance,
        created_at=at,
        provenance=provenance or Provenance(),
    )


def hit(memory: MemoryRecord, score: float) -> RecallHit:
    return RecallHit(
        kind="memory", doc_id=memory.memory_id, text=memory.content, score=score, memory=memory
    )


PREFS = [
    record(
        "p-1",
        "prefers seinen",
        memory_type="preference",
        importance=0.9,
        provenance=Provenance(source="auto", session_id="s-1", turn_indexes=(3,)),
    ),
    record(
        "p-2",
        "dislikes horror",
        memory_type="preference",
        importance=0.8,
        provenance=Provenance(source="auto", session_id="s-2", turn_indexes=(0,)),
    ),
]
HITS = [
    hit(
        record(
            "m-1",
            "Talked about Berserk volume 42 and its reprint",
            memory_type="interaction_summary",
            provenance=Provenance(source="handoff", session_id="s-1", turn_indexes=(0, 1, 2, 3)),
        ),
        0.8,
    ),
    hit(record("m-2", "Collects first editions", provenance=Provenance(source="explicit")), 0.5),
    hit(
        record(
            "m-3",
            "Profile: budget-conscious collector",
            provenance=Provenance(source="rollup", memory_ids=("m-1", "m-2")),
        ),
        0.2,
    ),
]


def render(
    budget: int, prefs: list[MemoryRecord] = PREFS, hits: list[RecallHit] = HITS
) -> UserContext:
    return render_user_context("u-1", prefs, hits, budget_tokens=budget, counter=COUNTER)


def test_layout_preferences_first_then_recalled_with_provenance() -> None:
    context = render(1000)
    assert context.text == (
        "Known about this user:\n"
        "Preferences:\n"
        "- prefers seinen  [pref, session s-1 turn 3]\n"
        "- dislikes horror  [pref, session s-2 turn 0]\n"
        "Relevant memories:\n"
        "- Talked about Berserk volume 42 and its reprint  "
        "[summary, 2030-01-02, session s-1 turns 0-3]\n"
        "- Collects first editions  [fact, 2030-01-02, explicit]\n"
        "- Profile: budget-conscious collector  [fact, 2030-01-02, from 2 memories]"
    )
    assert context.tokens == COUNTER.count(context.text)
    assert [i.memory_id for i in context.items] == ["p-1", "p-2", "m-1", "m-2", "m-3"]
    assert context.dropped == 0


def test_lowest_priority_goes_first_when_the_budget_is_tight() -> None:
    full = render(1000)
    budgets = sorted({COUNTER.count(render(b).text) for b in range(0, full.tokens + 1)})
    kept_by_budget = [[i.memory_id for i in render(b).items] for b in budgets]
    order = ["p-1", "p-2", "m-1", "m-2", "m-3"]
    for kept in kept_by_budget:
        assert kept == order[: len(kept)]  # always a prefix of the priority order
    # A budget one token short of the full block drops exactly the lowest-scored hit.
    short = render(full.tokens - 1)
    assert [i.memory_id for i in short.items] == order[:4]
    assert short.dropped == 1


@given(st.integers(min_value=0, max_value=200))
def test_the_budget_is_never_exceeded(budget: int) -> None:
    context = render(budget)
    assert context.tokens <= budget
    assert context.tokens == COUNTER.count(context.text)
    assert context.dropped + len(context.items) == len(PREFS) + len(HITS)


def test_empty_and_tiny_budgets() -> None:
    nothing = render(100, prefs=[], hits=[])
    assert (nothing.text, nothing.items) == (EMPTY_TEXT, ())
    assert nothing.tokens == COUNTER.count(EMPTY_TEXT)
    too_small = render(2)
    assert (too_small.text, too_small.tokens, too_small.items) == ("", 0, ())
    with pytest.raises(ValidationError, match="budget_tokens"):
        render(-1)


def test_duplicates_and_hits_without_records_are_skipped_and_long_lines_cut() -> None:
    long = record("m-9", "word " * 200)
    turn_hit = RecallHit(kind="turn", doc_id="s-1#4", text="a turn", score=0.9)
    context = render(2000, hits=[hit(PREFS[0], 0.99), turn_hit, hit(long, 0.1)])
    assert [i.memory_id for i in context.items] == ["p-1", "p-2", "m-9"]
    line = context.items[-1].line
    assert "…" in line
    assert len(line) < MAX_LINE_CHARS + 40


@pytest.mark.parametrize(
    ("provenance", "text"),
    [
        (Provenance(source="auto", session_id="s-1", turn_indexes=(3,)), "session s-1 turn 3"),
        (Provenance(session_id="s-1", turn_indexes=(5, 3)), "session s-1 turns 3, 5"),
        (Provenance(session_id="s-1", turn_indexes=(2, 3, 4)), "session s-1 turns 2-4"),
        (Provenance(session_id="s-1"), "session s-1"),
        (Provenance(memory_ids=("m-1",)), "from m-1"),
        (Provenance(memory_ids=("m-1", "m-2", "m-3")), "from 3 memories"),
        (Provenance(source="import"), "import"),
    ],
)
def test_describe_provenance(provenance: Provenance, text: str) -> None:
    assert describe_provenance(provenance) == text


# -- built from a backend ---------------------------------------------------------------------


async def test_build_user_context_with_the_real_recaller(durable: BackendUnderTest) -> None:
    index = InProcessIndex()
    lt = make_longterm(durable)
    lt.index = lt.memory.index = index
    lt.memory.recaller = Recaller(durable.durable, index, clock=durable.clock)
    m, u = lt.memory, lt.user
    await m.upsert_preference(u, "favorite_genre", "seinen", text="prefers seinen")
    lt.clock.advance(60)
    await m.upsert_preference(
        u,
        "favorite_genre",
        "shonen",
        text="prefers shonen",
        provenance=Provenance(source="auto", session_id="s-7", turn_indexes=(2,)),
    )
    old = await m.remember(u, "Is looking for Berserk volume 41")
    await m.supersede(u, old.memory_id, "Is looking for Berserk volume 42")
    await m.remember(u, "Lives in Osaka", provenance=Provenance(source="auto", session_id="s-7"))
    context = await m.build_user_context(u, "berserk volume", budget_tokens=200)
    assert context.text.splitlines() == [
        "Known about this user:",
        "Preferences:",
        "- prefers shonen  [pref, session s-7 turn 2]",
        "Relevant memories:",
        f"- Is looking for Berserk volume 42  [fact, {lt.clock.now().date()}, from "
        f"{old.memory_id}]",
    ]
    assert context.tokens <= 200
    tight = await m.build_user_context(u, "berserk volume", budget_tokens=25)
    assert tight.tokens <= 25
    assert [i.section for i in tight.items] == ["preference"]
    with pytest.raises(UnknownModelError):
        await m.build_user_context(u, "x", budget_tokens=100, model="no-such-model")


async def test_build_user_context_uses_the_model_margin_and_works_without_recall(
    durable: BackendUnderTest,
) -> None:
    fake = FakeRecaller()  # a fake: fixed hits with exact scores
    lt = make_longterm(durable, recaller=fake)
    m, u = lt.memory, lt.user
    assert (await m.build_user_context(u, "anything", budget_tokens=50)).text == EMPTY_TEXT
    pref = await m.upsert_preference(u, "addressed_as", "Ken", text="wants to be called Ken")
    facts = [await m.remember(u, f"Fact number {i} about the user") for i in range(6)]
    fake.hits = [hit(f, 1.0 - i / 10) for i, f in enumerate(facts)]
    full = await m.build_user_context(u, "facts", budget_tokens=500)
    assert full.dropped == 0
    assert fake.calls[-1]["types"] == [t for t in m.types.names() if t != "preference"]
    # claude-3-haiku's counts are estimates: 15% of the budget is kept back.
    budget = full.tokens
    estimated = await m.build_user_context(u, "facts", budget_tokens=budget, model="claude-3-haiku")
    assert estimated.budget_tokens == budget
    assert estimated.tokens <= int(budget * 0.85)
    assert estimated.dropped > 0
    assert estimated.items[0].memory_id == pref.memory_id
    # Without a recaller (or a query), only preferences.
    m.recaller = None
    bare = await m.build_user_context(u, "facts", budget_tokens=500)
    assert [i.memory_id for i in bare.items] == [pref.memory_id]
