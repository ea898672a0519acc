"""Session 11, the write path and history() (issue #8): the faster ``NewTurn.with_index``,
``_numbered``'s one-turn path and the hot read's inline expiry refresh give exactly what
the code before them gave (reference copies of the old functions below, compared on
generated inputs), and a read still moves the hot expiry as the TTL policy says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.models import Entity, NewTurn, SessionMetadata, TextBlock, Turn
from tiermem.models.base import fields_with
from tiermem.models.turns import TURN_SCHEMA_VERSION
from tiermem.policies.ttl import FixedTtl, HybridTtl
from tiermem.store.backends import memory
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn
from tiermem.tiers.tiered import TieredSessionStore

_INDEX = frozenset({"index"})


# -- reference copies of the code before session 11 ----------------------------------------


def _old_with_index(turn: NewTurn, index: int) -> Turn:
    if type(index) is not int or index < 0:
        fields = turn.model_dump(exclude={"schema_version", "index"}, round_trip=True)
        return Turn(index=index, **fields)
    values = {**turn.__dict__, "schema_version": TURN_SCHEMA_VERSION, "index": index}
    return Turn.trusted(values, fields_with(turn.__pydantic_fields_set__, _INDEX))


def _old_numbered(turns: list[NewTurn], start: int) -> list[Turn]:
    return [
        turn if type(turn) is Turn and turn.index == start + i else _old_with_index(turn, start + i)
        for i, turn in enumerate(turns)
    ]


def _old_read_touch(
    tiers: TieredSessionStore,
    metadata: SessionMetadata,
    turn_count: int,
    current: datetime | None,
) -> datetime | None:
    """The expiry the old ``_refresh_on_read`` touched the session to (None: no touch)."""
    new = tiers.hot_expiry(metadata, turn_count, "read", current)
    if new is not None and (
        current is None or abs(new - current) >= tiers.config.read_refresh_granularity
    ):
        return new
    return None


# -- generated turns --------------------------------------------------------------------------

_T0 = datetime(2026, 3, 1, tzinfo=UTC)
_text = st.text(max_size=40)


@st.composite
def _turns(draw: st.DrawFn) -> NewTurn:
    options: dict[str, Any] = {}
    for name, strategy in (
        ("token_count", st.integers(0, 500)),
        ("importance", st.floats(0.0, 1.0)),
        ("pinned", st.booleans()),
        ("agent_name", st.none() | _text),
        ("intent", st.none() | _text),
        ("latency_ms", st.none() | st.floats(0.0, 1e6)),
        ("entities", st.lists(st.builds(Entity, kind=_text, value=_text), max_size=3)),
        ("metadata", st.dictionaries(_text, st.integers() | _text, max_size=3)),
    ):
        if draw(st.booleans()):  # set or left to its default: the fields set differs
            options[name] = draw(strategy)
    turn = NewTurn(
        role=draw(st.sampled_from(["user", "assistant"])),
        content=tuple(TextBlock(text=t) for t in draw(st.lists(_text, min_size=1, max_size=3))),
        timestamp=_T0 + timedelta(seconds=draw(st.integers(0, 10**6))),
        **options,
    )
    if draw(st.booleans()):  # as the turn analysis builds it: trusted, every field set
        turn = NewTurn.trusted(dict(turn.__dict__))
    if draw(st.booleans()):  # an archived turn (the hot copy of one, a redaction)
        turn = _old_with_index(turn, draw(st.integers(0, 100)))
    return turn


def _same(new: Turn, old: Turn) -> None:
    assert type(new) is type(old) is Turn
    assert new == old
    assert list(new.__dict__.items()) == list(old.__dict__.items())  # keys in the same order
    assert new.__pydantic_fields_set__ == old.__pydantic_fields_set__
    assert new.__pydantic_extra__ is old.__pydantic_extra__ is None
    assert new.__pydantic_private__ is old.__pydantic_private__ is None
    assert new.model_dump(mode="json") == old.model_dump(mode="json")


@settings(max_examples=300, deadline=None)
@given(turn=_turns(), index=st.integers(0, 10**9))
def test_with_index_gives_what_the_old_one_gave(turn: NewTurn, index: int) -> None:
    _same(turn.with_index(index), _old_with_index(turn, index))


@settings(max_examples=200, deadline=None)
@given(turns=st.lists(_turns(), min_size=1, max_size=4), start=st.integers(0, 100))
def test_numbered_gives_what_the_old_one_gave(turns: list[NewTurn], start: int) -> None:
    new, old = memory._numbered(turns, start), _old_numbered(turns, start)
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        _same(a, b)
    # A turn that already has its index is kept as it is, not copied.
    for given_turn, a, b in zip(turns, new, old, strict=True):
        assert (a is given_turn) == (b is given_turn)


@pytest.mark.parametrize("index", [-1, -7, True, 1.0, "3"])
def test_an_index_not_a_plain_int_takes_validation_as_before(index: Any) -> None:
    turn = text_turn("hi")
    try:
        old = _old_with_index(turn, index)
    except Exception as exc:  # noqa: BLE001 - whatever it was, the new code raises it too
        with pytest.raises(type(exc), match="index"):
            turn.with_index(index)
        return
    _same(turn.with_index(index), old)


def test_the_fields_set_cache_is_bounded() -> None:
    from tiermem.models import turns as turns_module

    for i in range(3 * turns_module._INDEXED_KEPT):
        NewTurn.trusted(dict(text_turn(f"t{i}").__dict__), {f"x{i}", "role"}).with_index(0)
    assert len(turns_module._INDEXED) <= turns_module._INDEXED_KEPT


# -- the hot read's expiry refresh --------------------------------------------------------------


def _tiers(clock: FakeClock, policy: Any) -> TieredSessionStore:
    return TieredSessionStore(
        MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock), clock=clock, ttl_policy=policy
    )


@settings(max_examples=200, deadline=None)
@given(
    policy=st.sampled_from([HybridTtl(), FixedTtl(timedelta(minutes=30))]),
    turn_count=st.integers(0, 40),
    tier=st.sampled_from(["standard", "premium", "vip"]),
    offset=st.none() | st.integers(-4000, 8000),
)
def test_read_expiry_is_the_old_refresh_decision(
    policy: Any, turn_count: int, tier: str, offset: int | None
) -> None:
    clock = FakeClock(_T0)
    tiers = _tiers(clock, policy)
    metadata = SessionMetadata(
        session_id="s", user_id="u", created_at=_T0, last_activity=_T0, user_tier=tier
    )
    current = None if offset is None else _T0 + timedelta(seconds=offset)
    assert tiers._read_expiry(metadata, turn_count, current) == _old_read_touch(
        tiers, metadata, turn_count, current
    )


async def test_a_read_moves_the_hot_expiry_only_past_the_granularity() -> None:
    clock = FakeClock(_T0)
    tiers = _tiers(clock, HybridTtl())
    meta = await tiers.create(
        SessionMetadata(session_id="s", user_id="u", created_at=_T0, last_activity=_T0)
    )
    await tiers.append(meta.metadata, [text_turn("hi")], turn_count_hint=0)
    written = (await tiers.hot.load("s")).expires_at  # type: ignore[union-attr]
    clock.advance(timedelta(seconds=5))  # under the 10 s granularity: no write
    view = await tiers.view("s")
    assert view is not None
    assert view.turns[0].text == "hi"
    assert (await tiers.hot.load("s")).expires_at == written  # type: ignore[union-attr]
    clock.advance(timedelta(seconds=60))
    await tiers.view("s")
    moved = (await tiers.hot.load("s")).expires_at  # type: ignore[union-attr]
    assert moved == written + timedelta(seconds=65)
    clock.advance(timedelta(seconds=60))
    await tiers.view("s", refresh_ttl=False)  # the sweeper's read moves nothing
    assert (await tiers.hot.load("s")).expires_at == moved  # type: ignore[union-attr]


async def test_a_bad_session_id_read_is_still_refused() -> None:
    tiers = _tiers(FakeClock(_T0), HybridTtl())
    with pytest.raises(ValidationError):
        await tiers.view("bad\x00id")
