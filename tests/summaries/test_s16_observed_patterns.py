"""Behavioural patterns observed across sessions (seed 000: ``behavioral_pattern``, 30 days,
"for trend detection"): the roll-up after each handoff keeps one memory per topic the user
brought up in 3 sessions within 30 days ("Often asks about Berserk (4 sessions from ...)"),
refreshes it when another session brings it up, and lets it lapse 30 days after the last
one; forgetting a supporting session takes it away. Every case failed before
src/tiermem/summaries/patterns.py (no such memory was ever written) except the guards that
say so. The core cases run on memory+memory, memory+sqlite and redis+dynamodb (the last
needs scripts/test.sh's servers).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import BackendUnderTest, open_backend
from tiermem.clock import FakeClock
from tiermem.composition import catalogue_engines
from tiermem.errors import ValidationError
from tiermem.models import MemoryRecord, Provenance
from tiermem.service import MemoryService
from tiermem.summaries.patterns import (
    PATTERN_KEY,
    PatternPolicy,
    observe_patterns,
    session_topics,
)
from tiermem.summaries.rollup import RollupPolicy

START = datetime(2030, 1, 1, 9, tzinfo=UTC)
TITLES = {"Berserk": "Berserk", "ベルセルク": "Berserk", "Vagabond": "Vagabond"}
BERSERK = [
    "Do you have Berserk vol 42 in stock?",
    "Is the new volume of Berserk out yet?",
    "ベルセルク42巻はありますか？",
    "What does the Berserk deluxe edition cost?",
    "Any news on Berserk?",
]


class World:
    def __init__(self, memory: MemoryService, clock: FakeClock) -> None:
        self.memory = memory
        self.clock = clock
        self.count = 0
        run = uuid.uuid4().hex[:8]  # Redis and one DynamoDB table serve every test
        self.user = f"u-habit-{run}"
        self.prefix = f"s-{run}"

    async def visit(self, *lines: str, intent: str | None = None, days: float = 1) -> str:
        """One closed session (handoff, then roll-up) saying ``lines``; then ``days`` pass."""
        self.count += 1
        session_id = f"{self.prefix}-{self.count}"
        session = await self.memory.session(session_id, user_id=self.user)
        for line in lines:
            await session.add_turn("user", line, intent=intent)
            await session.add_turn("assistant", "Let me check that for you.")
        await session.close()
        await self.memory.drain()
        assert self.memory.handoff.failures == 0
        self.clock.advance(timedelta(days=days))
        return session_id

    async def patterns(self, *, superseded: bool = False) -> list[MemoryRecord]:
        records = await self.memory.longterm.list(
            self.user, types=["behavioral_pattern"], include_superseded=superseded, limit=100
        )
        return [r for r in records if PATTERN_KEY in r.metadata]

    async def pattern(self) -> MemoryRecord:
        (only,) = await self.patterns()
        return only


def _service(
    hot: object, durable: object, clock: FakeClock, policy: RollupPolicy | None = None
) -> MemoryService:
    return MemoryService(
        hot,  # type: ignore[arg-type]
        durable,  # type: ignore[arg-type]
        clock=clock,
        auto_detect=False,
        rollup_policy=policy,
        **dict(catalogue_engines(TITLES)),
    )


@pytest.fixture(params=["memory+memory", "memory+sqlite", "redis+dynamodb"])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    clock = FakeClock(START)
    opened: list[BackendUnderTest] = []
    if request.param == "redis+dynamodb":
        opened = [
            await open_backend("redis", clock, tmp_path),
            await open_backend("dynamodb", clock, tmp_path),
        ]
        hot, durable = opened[0].hot, opened[1].durable
    else:
        opened = [await open_backend(request.param.split("+")[1], clock, tmp_path)]
        hot, durable = opened[0].hot, opened[0].durable
        if request.param == "memory+sqlite":
            from tiermem.store.backends.memory import MemoryHotStore

            await opened[0].hot.aclose()
            hot = MemoryHotStore(clock=clock)
    memory = _service(hot, durable, clock)
    try:
        yield World(memory, clock)
    finally:
        await memory.aclose()
        await hot.aclose()
        for backend in opened:
            await backend.durable.aclose()


@pytest.fixture
async def local() -> AsyncIterator[World]:
    clock = FakeClock(START)
    from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore

    memory = _service(MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock)
    try:
        yield World(memory, clock)
    finally:
        await memory.aclose()


# ---------------------------------------------------------------- found, refreshed, lapsed


async def test_three_sessions_on_a_series_make_one_pattern_and_a_fourth_refreshes_it(
    world: World,
) -> None:
    sessions = [await world.visit(line) for line in BERSERK[:2]]
    assert await world.patterns() == []  # two sessions are no habit
    sessions.append(await world.visit(BERSERK[2], days=0))
    pattern = await world.pattern()
    assert pattern.memory_type == "behavioral_pattern"
    assert pattern.content == "Often asks about Berserk (3 sessions from 2030-01-01 to 2030-01-03)."
    assert pattern.importance == pytest.approx(0.4)  # the type's default
    assert pattern.provenance.source == "observed"
    summaries = await world.memory.longterm.list(
        world.user, types=["interaction_summary"], include_superseded=True
    )
    by_session = {r.provenance.session_id: r.memory_id for r in summaries}
    assert set(pattern.provenance.memory_ids) == {by_session[s] for s in sessions}
    assert pattern.metadata["session_ids"] == sessions
    # Kept 30 days from the latest observation (the third session's handoff).
    assert pattern.expires_at == world.clock.now() + timedelta(days=30)
    # Idempotent: a roll-up with nothing new writes nothing.
    assert await world.memory.roll_up(world.user) == 0

    world.clock.advance(timedelta(days=10))
    await world.visit(BERSERK[3])
    refreshed = await world.pattern()  # one live pattern, not two
    assert refreshed.content == (
        "Often asks about Berserk (4 sessions from 2030-01-01 to 2030-01-13)."
    )
    assert refreshed.expires_at == world.clock.now() - timedelta(days=1) + timedelta(days=30)
    history = await world.patterns(superseded=True)
    assert {r.content for r in history} == {pattern.content, refreshed.content}
    old = next(r for r in history if r.memory_id == pattern.memory_id)
    assert old.metadata.get("superseded_by") == refreshed.memory_id
    # Recalled by what it is about.
    hits = await world.memory.longterm.recall(world.user, "Berserk", types=["behavioral_pattern"])
    assert [h.memory.memory_id for h in hits if h.memory] == [refreshed.memory_id]


async def test_the_pattern_lapses_30_days_after_the_last_session(world: World) -> None:
    for line in BERSERK[:3]:
        await world.visit(line, days=0.5)
    pattern = await world.pattern()
    world.clock.advance(timedelta(days=20))
    await world.visit("Do you have Vagabond?")  # an unrelated session: no change
    assert (await world.pattern()).content == pattern.content
    world.clock.advance(timedelta(days=9))  # 30 days after the third session's handoff
    assert await world.patterns() == []
    hits = await world.memory.longterm.recall(world.user, "Berserk", types=["behavioral_pattern"])
    assert hits == []
    await world.visit("Do you have Vagabond?")  # a roll-up after the lapse writes none
    assert await world.patterns() == []


async def test_forgetting_a_supporting_session_below_the_threshold_removes_it(
    world: World,
) -> None:
    sessions = [await world.visit(line) for line in BERSERK[:3]]
    assert await world.patterns()
    await world.memory.longterm.forget_session(world.user, sessions[1])
    assert await world.patterns(superseded=True) == []  # forgotten with the session
    assert await world.memory.roll_up(world.user) == 0  # two sessions left: nothing written
    assert await world.patterns() == []


async def test_forgetting_one_of_four_sessions_leaves_a_pattern_of_three(world: World) -> None:
    sessions = [await world.visit(line) for line in BERSERK[:4]]
    assert "4 sessions" in (await world.pattern()).content
    await world.memory.longterm.forget_session(world.user, sessions[0])
    await world.memory.roll_up(world.user)
    pattern = await world.pattern()
    assert pattern.content == "Often asks about Berserk (3 sessions from 2030-01-02 to 2030-01-04)."
    assert pattern.metadata["session_ids"] == sessions[1:]


async def test_redacting_a_supporting_turn_leaves_no_count_of_it(world: World) -> None:
    sessions = [await world.visit(line, "Thanks!") for line in BERSERK[:3]]
    sessions.append(await world.visit(BERSERK[3], "Thanks!", days=0))
    assert "4 sessions" in (await world.pattern()).content
    session = await world.memory.session(sessions[3], user_id=world.user)
    await session.redact_turn(0)  # the only turn of that session naming Berserk
    await world.memory.drain()
    pattern = await world.pattern()
    assert pattern.content == "Often asks about Berserk (3 sessions from 2030-01-01 to 2030-01-03)."
    # No version, current or superseded, still counts the redacted session.
    history = await world.patterns(superseded=True)
    assert [r.content for r in history] == [pattern.content]


async def test_context_recalls_the_pattern_but_the_profile_does_not_hold_it(
    local: World,
) -> None:
    for line in BERSERK[:3]:
        await local.visit(line)
    pattern = await local.pattern()
    session = await local.memory.session(f"{local.prefix}-now", user_id=local.user)
    await session.add_turn("user", "Anything new on Berserk?")
    window = await session.context(query="Anything new on Berserk?")
    recalled = " ".join(i.text for i in window.items if i.kind == "recall")
    profile = " ".join(i.text for i in window.items if i.kind == "profile")
    assert pattern.content.removesuffix(".") in recalled
    assert "Often asks about" not in profile


async def test_a_pattern_rewritten_late_still_ends_30_days_after_its_last_session(
    local: World,
) -> None:
    sessions = [await local.visit(line) for line in BERSERK[:4]]  # days 0-3
    local.clock.advance(timedelta(days=16))  # day 20
    await local.memory.longterm.forget_session(local.user, sessions[0])
    await local.memory.roll_up(local.user)  # written again at day 20
    pattern = await local.pattern()
    assert "3 sessions" in pattern.content
    # Its expiry counts from the last session's end, not from the write (session 17:
    # before, it expired at day 50 unless a roll-up after day 33 forgot it).
    assert pattern.expires_at is not None
    assert pattern.expires_at - datetime.fromisoformat(str(pattern.metadata["last_seen"])) == (
        timedelta(days=30)
    )
    local.clock.advance(timedelta(days=13))  # day 33: 30 days after the last session
    assert await local.patterns() == []  # with no roll-up in between
    await local.visit("Do you have Vagabond?")  # nor does a roll-up write it again
    assert await local.patterns() == []


# ---------------------------------------------------------------- what counts


async def test_sessions_older_than_30_days_do_not_count(local: World) -> None:
    await local.visit(BERSERK[0], days=1)
    await local.visit(BERSERK[1], days=39)
    await local.visit(BERSERK[2], days=25)  # day 40: the first two are 39 and 40 days back
    assert await local.patterns() == []
    await local.visit(BERSERK[3], days=0)  # day 65: day 40 and day 65, two within 30 days
    assert await local.patterns() == []
    await local.visit(BERSERK[4], days=0)  # a third within 30 days of day 65
    assert "3 sessions from 2030-02-10 to 2030-03-07" in (await local.pattern()).content


async def test_a_genre_counts_but_not_a_disliked_one(local: World) -> None:
    for _ in range(3):
        await local.visit("I don't like horror.")
    assert await local.patterns() == []
    for line in ["Recommend me some horror", "Any new horror this week?", "ホラーのおすすめは？"]:
        await local.visit(line)
    assert (await local.pattern()).content.startswith("Often asks about horror (3 sessions")


async def test_an_intent_counts_and_slot_names_and_stop_words_do_not(local: World) -> None:
    for amount in ("¥5,000", "¥6,000", "¥7,000"):
        await local.visit(f"My budget is {amount}.", intent="manga")
    assert await local.patterns() == []  # "budget" is a slot, "manga" too general
    for _ in range(3):
        await local.visit("Where is my parcel?", intent="order_tracking")
    pattern = await local.pattern()
    assert pattern.content.startswith("Recurring request: order tracking (3 sessions")
    assert pattern.metadata[PATTERN_KEY] == "intent:order_tracking"


async def test_a_described_habit_is_left_alone(local: World) -> None:
    # A guard (the old roll-up never touched behavioral_pattern records either).
    described = await local.memory.longterm.remember(
        local.user, "habit: always buys the whole set", memory_type="behavioral_pattern"
    )
    for line in BERSERK[:3]:
        await local.visit(line)
    await local.memory.roll_up(local.user)
    live = await local.memory.longterm.list(local.user, types=["behavioral_pattern"])
    assert described.memory_id in {r.memory_id for r in live}
    assert len(live) == 2


async def test_purging_the_user_leaves_no_pattern(local: World) -> None:
    for line in BERSERK[:3]:
        await local.visit(line)
    assert await local.patterns()
    await local.memory.purge_user(local.user)
    assert await local.patterns(superseded=True) == []


async def test_patterns_can_be_turned_off_and_bad_policies_are_refused() -> None:
    # No such policy before.
    with pytest.raises(ValidationError, match="min_sessions"):
        PatternPolicy(min_sessions=1)
    with pytest.raises(ValidationError, match="days"):
        PatternPolicy(days=0)
    with pytest.raises(ValidationError, match="max_patterns"):
        PatternPolicy(max_patterns=0)
    clock = FakeClock(START)
    from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore

    memory = _service(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock,
        RollupPolicy(patterns=None),
    )
    try:
        world = World(memory, clock)
        for line in BERSERK[:3]:
            await world.visit(line)
        assert await world.patterns() == []
    finally:
        await memory.aclose()


# ---------------------------------------------------------------- the pure part


def _summary(
    n: int, ended: datetime, topics: list[str], facts: dict[str, str] | None = None
) -> MemoryRecord:
    return MemoryRecord(
        memory_id=f"m-{n}",
        user_id="u",
        memory_type="interaction_summary",
        content=f"Session {n}",
        created_at=ended,
        metadata={
            "topics": list(topics),
            "facts": dict(facts or {}),
            "session_ended": ended.isoformat(),
        },
        provenance=Provenance(source="handoff", session_id=f"s-{n}"),
    )


@pytest.mark.parametrize(
    ("topics", "facts", "expected"),
    [
        (["Berserk", "budget"], {"series": "Berserk", "budget": "¥5,000"}, {"series:berserk"}),
        (["horror", "opinion:genre:horror"],
         {"genre": "horror", "preference:opinion:genre:horror": "dislikes"}, set()),
        (["dark fantasy"], {"genre": "dark fantasy"}, {"genre:dark fantasy"}),
        (["a@example.com", "order_tracking"], {"email": "a@example.com"},
         {"intent:order_tracking"}),
        (["manga", "Manga", "x", "42", "favorite genre"],
         {"preference:favorite_genre": "seinen"}, set()),
        (["bad\x00topic", "y" * 65], {}, set()),
        (["ベルセルク"], {"series": "ベルセルク"}, {"series:ベルセルク"}),
    ],
)  # fmt: skip
def test_session_topics(topics: list[str], facts: dict[str, str], expected: set[str]) -> None:
    assert set(session_topics(_summary(0, START, topics, facts), PatternPolicy())) == expected


def _ended(record: MemoryRecord) -> datetime:
    return datetime.fromisoformat(str(record.metadata["session_ended"]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 120), st.sampled_from(["Berserk", "Vagabond", "Monster"])),
        max_size=30,
    ),
    st.integers(0, 150),
    st.integers(2, 4),
    st.integers(1, 40),
)
def test_observed_patterns_hold_the_policy(
    visits: list[tuple[int, str]], today: int, min_sessions: int, days: int
) -> None:
    policy = PatternPolicy(min_sessions=min_sessions, days=days, max_patterns=2)
    now = START + timedelta(days=today)
    sessions = [
        _summary(i, START + timedelta(days=day), [title], {"series": title})
        for i, (day, title) in enumerate(visits)
        if day <= today
    ]
    found = observe_patterns(sessions, now, policy, ended=_ended)
    assert len(found) <= 2
    window = timedelta(days=days)
    for pattern in found:
        assert len({s.memory_id for s in pattern.sessions}) >= min_sessions
        assert now - pattern.last < window
        assert all(pattern.last - end < window for end in pattern.ends)
        title = pattern.topic
        # Every session of the topic inside the window is counted.
        inside = [s for s in sessions if title in s.metadata["topics"]]
        inside = [s for s in inside if timedelta(0) <= pattern.last - _ended(s) < window]
        assert len(pattern.sessions) == len(inside)
    # Exactly the topics with enough sessions in a window ending at their newest (within
    # the cap: then the best supported).
    qualifying = set()
    for title in ("Berserk", "Vagabond", "Monster"):
        ends = sorted(_ended(s) for s in sessions if title in s.metadata["topics"])
        recent = bool(ends) and now - ends[-1] < window
        if recent and sum(ends[-1] - e < window for e in ends) >= min_sessions:
            qualifying.add(title)
    topics = {p.topic for p in found}
    assert topics <= qualifying
    assert len(topics) == min(2, len(qualifying))
