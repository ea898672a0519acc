"""Review of the memory stores' tiered append entry (``append_built``): what the tiered
layer does not guarantee is still checked, a store that overrides ``append_through`` is not
gone around, collection runs at the same calls, and the shortcuts give exactly what the
general code gives (hypothesis)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.models import ActiveEntity, SessionMetadata
from tiermem.policies.ttl import FixedTtl
from tiermem.store.backends import memory
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.codec import encode_data
from tiermem.store.contract import DurableStore, EntityChange
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn
from tiermem.tiers.tiered import TieredSessionStore


def _tiers(
    clock: FakeClock, hot: MemoryHotStore | None = None
) -> tuple[TieredSessionStore, MemoryDurableStore]:
    durable = MemoryDurableStore(clock=clock)
    # FixedTtl checks nothing about the session: the store is the only check of its id.
    tiers = TieredSessionStore(
        hot or MemoryHotStore(clock=clock),
        durable,
        clock=clock,
        ttl_policy=FixedTtl(timedelta(hours=1)),
    )
    return tiers, durable


def _meta(clock: FakeClock, sid: str = "s-1") -> SessionMetadata:
    now = clock.now()
    return SessionMetadata(session_id=sid, user_id="u", created_at=now, last_activity=now)


# -- (1) what the tiered layer does not guarantee --------------------------------------------


async def test_an_invalid_session_id_is_refused_before_anything_is_written() -> None:
    # SessionMetadata takes any string as its id, and TieredSessionStore.append is public.
    clock = FakeClock()
    tiers, durable = _tiers(clock)
    with pytest.raises(ValidationError, match="session_id"):
        await tiers.append(_meta(clock, "bad\x00id"), [text_turn("hi")], turn_count_hint=0)
    assert durable._turns == {}


async def test_a_negative_count_hint_is_refused_as_before() -> None:
    # The hint pins the first index when an entity change rides along.
    clock = FakeClock()
    tiers, durable = _tiers(clock)
    change = EntityChange(
        upsert={"k": ActiveEntity(kind="k", value="v", turn_index=0, updated_at=clock.now())}
    )
    with pytest.raises(ValidationError, match="first_index"):
        await tiers.append(_meta(clock), [text_turn("hi")], turn_count_hint=-1, entities=change)
    assert durable._turns == {}


async def test_a_turn_that_is_not_a_new_turn_is_a_validation_error() -> None:
    clock = FakeClock()
    tiers, durable = _tiers(clock)
    bad: list[Any] = [{"role": "user", "text": "hi"}]
    with pytest.raises(ValidationError, match="NewTurn"):
        await tiers.append(_meta(clock), bad, turn_count_hint=0)
    assert durable._turns == {}


class _Faulty(MemoryHotStore):
    """A test store that takes the combined path (it says so) and injects a fault in
    ``append_through``: the tiered layer must not go around it through ``append_built``."""

    def can_append_through(self, durable: DurableStore) -> bool:
        return type(durable) is MemoryDurableStore

    async def append_through(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")


async def test_a_subclass_overriding_append_through_is_not_gone_around() -> None:
    clock = FakeClock()
    tiers, _ = _tiers(clock, _Faulty(clock=clock))
    with pytest.raises(RuntimeError, match="injected"):
        await tiers.append(_meta(clock), [text_turn("hi")], turn_count_hint=0)


async def test_the_exact_classes_take_the_built_entry() -> None:
    clock = FakeClock()
    tiers, _ = _tiers(clock)
    assert tiers._built is tiers.hot
    subclass_tiers, _ = _tiers(clock, _Faulty(clock=clock))
    assert subclass_tiers._combined is not None
    assert subclass_tiers._built is None


# -- (2) collection at the same calls ---------------------------------------------------------


async def test_an_expired_session_is_collected_by_the_first_write_past_its_grace() -> None:
    clock = FakeClock()
    grace = timedelta(minutes=5)
    hot, durable = MemoryHotStore(clock=clock, gc_grace=grace), MemoryDurableStore(clock=clock)
    ttl = timedelta(minutes=10)

    async def write(sid: str) -> None:
        now = clock.now()
        await hot.append_built(
            durable,
            sid,
            [text_turn("x")],
            window=5,
            hot_expires_at=now + ttl,
            durable_expires_at=now + ttl,
        )

    await write("old")
    clock.advance(ttl + grace - timedelta(microseconds=1))
    await write("other")  # "old" is expired but in its grace: kept
    assert "old" in hot._sessions
    assert "old" not in durable._headers
    clock.advance(timedelta(microseconds=1))
    await write("other")
    assert "old" not in hot._sessions
    # The session written just now is queued again for its own collection.
    assert "other" in hot._queued
    assert "other" in durable._queued


async def test_a_session_expired_in_grace_is_written_afresh() -> None:
    clock = FakeClock()
    hot, durable = MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock)
    now = clock.now()
    args: dict[str, Any] = {
        "window": 5,
        "hot_expires_at": now + timedelta(minutes=1),
        "durable_expires_at": now + timedelta(hours=1),
    }
    await hot.append_built(durable, "s", [text_turn("a")], **args)
    clock.advance(timedelta(minutes=2))  # hot expired (in grace), archive alive
    now = clock.now()
    args["hot_expires_at"] = now + timedelta(minutes=1)
    stored, version = await hot.append_built(durable, "s", [text_turn("b")], **args)
    assert [t.index for t in stored] == [1]
    assert version == 1  # a new hot session: the tiered layer rebuilds it
    loaded = await hot.load("s")
    assert loaded is not None
    assert [t.index for t in loaded.turns] == [1]


# -- (3) entity JSON against pydantic --------------------------------------------------------

_ZONES = st.sampled_from(
    [
        UTC,
        timezone.utc,  # noqa: UP017 -- the same object, said the other way
        timezone(timedelta(0)),
        timezone(timedelta(0), "UTC"),
        ZoneInfo("UTC"),
        ZoneInfo("Europe/Berlin"),
        timezone(timedelta(hours=-3, minutes=-30)),
    ]
)


class _Stamp(datetime):
    """A datetime subclass (a library's own type)."""


@st.composite
def _entities(draw: st.DrawFn) -> ActiveEntity:
    stamp = draw(st.datetimes(timezones=_ZONES, allow_imaginary=False))
    if draw(st.booleans()):
        stamp = stamp.replace(microsecond=0)
    if draw(st.booleans()):
        stamp = stamp.replace(fold=1)
    text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=6)
    kind, value = draw(text), draw(text)
    turn_index = draw(st.none() | st.integers(min_value=0, max_value=10**15))
    if draw(st.booleans()):
        # A caller's value kept as it is (model_construct, another zone, a subclass).
        if draw(st.booleans()):
            stamp = _Stamp.fromisoformat(stamp.isoformat())
        return ActiveEntity.model_construct(
            kind=kind, value=value, turn_index=turn_index, updated_at=stamp
        )
    return ActiveEntity(kind=kind, value=value, turn_index=turn_index, updated_at=stamp)


@settings(max_examples=600, deadline=None)
@given(_entities())
def test_entity_json_is_pydantics_dump(entity: ActiveEntity) -> None:
    expected = entity.model_dump(mode="json")
    got = memory._entity_json(entity)
    assert got == expected
    assert json.dumps(got) == json.dumps(expected)  # key order too


# -- (4) flat sizes against encode_data ----------------------------------------------------

_ANY_TEXT = st.text(
    st.sampled_from(["a", " ", '"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "日", "😀"])
    | st.characters(),
    max_size=8,
)
_SCALARS = (
    _ANY_TEXT
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | st.booleans()
    | st.none()
)
_VALUES = (
    _SCALARS
    | st.dictionaries(_ANY_TEXT | st.integers(), _SCALARS, max_size=4)
    | st.dictionaries(
        _ANY_TEXT,
        st.lists(_SCALARS, max_size=2) | st.dictionaries(_ANY_TEXT, _SCALARS, max_size=1),
        max_size=2,
    )
    | st.just({})
)


def _reference(kind: str, value: Any) -> int | None:
    """The member's bytes inside the object encode_data writes (None: it cannot)."""
    try:
        whole = encode_data({kind: value}, what="entities")
    except ValidationError:
        return None
    return len(whole.encode()) - 2


@settings(max_examples=1500, deadline=None)
@given(_ANY_TEXT, _VALUES)
def test_member_size_is_what_encode_data_writes(kind: str, value: Any) -> None:
    expected = _reference(kind, value)
    assert memory._member_size(kind, value) == expected


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_ANY_TEXT, _VALUES, max_size=4))
def test_object_size_is_what_encode_data_writes(data: dict[str, Any]) -> None:
    sizes = memory._member_sizes(data)
    try:
        whole = encode_data(data, what="entities")
    except ValidationError:
        assert sizes is None
        return
    assert sizes is not None
    assert memory._object_size(sizes) == len(whole.encode())


# -- (5) the header read once -----------------------------------------------------------------


async def test_an_append_that_collects_keeps_its_own_live_header() -> None:
    # Collection runs inside the append (something is due) and the appended session's
    # header, read before it, must stay the live one: its lifetime is raised, not lost.
    clock = FakeClock()
    hot, durable = MemoryHotStore(clock=clock), MemoryDurableStore(clock=clock)
    now = clock.now()
    for sid in ("dead-1", "dead-2"):
        await durable.append_turns(sid, [text_turn("x")], expires_at=now + timedelta(minutes=1))
    await durable.append_turns("s", [text_turn("x")], expires_at=now + timedelta(minutes=30))
    clock.advance(timedelta(minutes=2))
    now = clock.now()
    stored, _ = await hot.append_built(
        durable,
        "s",
        [text_turn("y")],
        window=5,
        hot_expires_at=now + timedelta(minutes=5),
        durable_expires_at=now + timedelta(hours=2),
        entities=EntityChange(
            upsert={"k": ActiveEntity(kind="k", value="v", turn_index=1, updated_at=now)}
        ),
    )
    assert [t.index for t in stored] == [1]
    assert "dead-1" not in durable._headers
    assert durable._headers["s"].lifetime == now + timedelta(hours=2)
    assert [t.index for t in await durable.get_turns("s", 0)] == [0, 1]
    record = await durable.get_record("s", "entities")
    assert record is not None
    assert record.data["k"]["value"] == "v"  # type: ignore[index,call-overload]


async def test_an_int_past_the_conversion_limit_is_a_validation_error() -> None:
    # Python refuses int-to-text past 4,300 digits: json cannot write it, so the entity
    # change is refused as encode_data refuses it, not with a bare ValueError.
    clock = FakeClock()
    durable = MemoryDurableStore(clock=clock)
    huge = ActiveEntity(kind="k", value="v", turn_index=10**5000, updated_at=clock.now())
    with pytest.raises(ValidationError, match="JSON-serializable"):
        await durable.append_turns(
            "s", [text_turn("x")], expires_at=None, entities=EntityChange(upsert={"k": huge})
        )
    assert durable._turns == {}
    assert memory._member_size("k", {"n": 10**5000}) is None
