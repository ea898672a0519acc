"""Session 17: the in-memory durable store keeps the ``entities`` record its appends write
pending (entities as themselves, measured by arithmetic) and builds it on the first read.
These compare it with a reference copy of the eager code it replaced (the record dumped
and measured on every append): the same records, versions, times and errors, after any
sequence of appends, ``put_record`` calls, reads and expiries."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiermem.clock import FakeClock
from tiermem.errors import TierMemError
from tiermem.models import ActiveEntity, JsonValue, SessionRecord, TextBlock
from tiermem.models.turns import NewTurn, Turn
from tiermem.store.backends import memory as memory_module
from tiermem.store.backends.memory import (
    MemoryDurableStore,
    _check_turn_size,
    _entity_json,
    _entity_member_size,
    _EntitySizes,
    _member_size,
    _member_sizes,
    _numbered,
    _object_size,
)
from tiermem.store.codec import encode_data
from tiermem.store.contract import ENTITIES_RECORD, MAX_RECORD_BYTES, EntityChange

T0 = datetime(2030, 1, 1, tzinfo=UTC)


# -- the reference: the eager record of 437cd81 ---------------------------------------


class EagerDurableStore(MemoryDurableStore):
    """:class:`MemoryDurableStore` with the ``entities`` record merged, dumped and
    stored on every append, as before session 17 (``_append_checked``,
    ``_merged_entities`` and ``_set_record``'s caller copied from 437cd81)."""

    def _append_checked(
        self,
        session_id: str,
        turns: Any,
        first_index: int | None,
        expires_at: datetime | None,
        key: str | None,
        entities: EntityChange | None,
        *,
        now: datetime | None = None,
    ) -> tuple[list[Turn], bool]:
        if now is None:
            now = self._clock.now()
        header = self._header(session_id, now)
        if key is not None and header is not None and key in header.keys:
            start, count = header.keys[key]
            return self._live_range(session_id, start, start + count, now), True
        start = self._next.get(session_id, 0)
        assert first_index is None or first_index == start
        indexed = _numbered(turns, start)
        for turn in indexed:
            _check_turn_size(turn)
        merged = None if entities is None else self._eager_merged(session_id, entities)
        heap = self._by_lifetime
        if heap and heap[0][0] <= now:
            self._collect_some(now)
        header = self._extend_header(session_id, header, expires_at)
        if merged is not None:
            data, sizes = merged
            record = self._set_record(session_id, ENTITIES_RECORD, data, header, now)
            if sizes is None:
                self._entity_sizes.pop(session_id, None)
            else:
                self._entity_sizes[session_id] = _EntitySizes(record=record, sizes=sizes)
        if key is not None:
            header.keys[key] = (start, len(indexed))
        archive = self._turns.get(session_id)
        if archive is None:
            archive = self._turns[session_id] = {}
            expiry = self._turn_expiry[session_id] = {}
        else:
            expiry = self._turn_expiry[session_id]
        for turn in indexed:
            archive[turn.index] = turn
            expiry[turn.index] = expires_at
        self._next[session_id] = start + len(indexed)
        return indexed, False

    def _eager_merged(
        self, session_id: str, change: EntityChange | None
    ) -> tuple[dict[str, JsonValue], dict[str, int] | None] | None:
        if change is None or (not change.upsert and not change.remove):
            return None
        current = self._records.get(session_id, {}).get(ENTITIES_RECORD)
        data: dict[str, JsonValue] = dict(current.data) if current is not None else {}
        cached = self._entity_sizes.get(session_id)
        sizes: dict[str, int] | None
        if current is None:
            sizes = {}
        elif cached is not None and cached.record is current:
            sizes = dict(cached.sizes)
        else:
            sizes = _member_sizes(data)
        for kind in change.remove:
            data.pop(kind, None)
            if sizes is not None:
                sizes.pop(kind, None)
        for kind, entity in change.upsert.items():
            value = _entity_json(entity)
            data[kind] = value
            if sizes is not None:
                size = _member_size(kind, value)
                if size is None:
                    sizes = None
                else:
                    sizes[kind] = size
        if sizes is None or _object_size(sizes) > MAX_RECORD_BYTES:
            encode_data(data, what=f"record {ENTITIES_RECORD!r}")
            sizes = _member_sizes(data)
        return data, sizes


# -- generated inputs -----------------------------------------------------------------

KINDS = ["series", "volume", "order", "genre", "日本", 'q"k', "b\\k", "k\x7f"]
texts = st.one_of(
    st.sampled_from(["Berserk", "42", "ORD-12345", "ベルセルク", "", 'a "quoted" one']),
    st.text(max_size=12),
    st.text(alphabet=st.sampled_from(['"', "\\", "\n", "\x00", "\x7f", "é", "\ud800", "a"])),
)
times = st.one_of(
    st.datetimes(
        min_value=datetime(1, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)
    ),
    st.datetimes(timezones=st.just(timezone(timedelta(hours=9)))),
    st.just(T0),
    st.just(T0.replace(microsecond=1)),
)
turn_indexes = st.one_of(st.none(), st.integers(0, 10**6), st.integers(10**18, 10**19))


@st.composite
def entities(draw: st.DrawFn) -> ActiveEntity:
    """Mostly as the library builds them (``trusted``: a non-UTC time kept as given),
    sometimes validated, sometimes a subclass."""
    values = {
        "kind": draw(st.sampled_from(KINDS)),
        "value": draw(texts),
        "turn_index": draw(turn_indexes),
        "updated_at": draw(times),
    }
    how = draw(st.sampled_from(["trusted", "trusted", "validated", "subclass"]))
    if how == "trusted":
        return ActiveEntity.trusted(values)
    try:
        built = ActiveEntity(**values)
    except Exception:  # noqa: BLE001 -- a surrogate pydantic refuses: build it as trusted
        return ActiveEntity.trusted(values)
    if how == "subclass":
        return _Sub.trusted(dict(built.__dict__))
    return built


class _Sub(ActiveEntity):
    pass


def _json_member_size(kind: str, entity: ActiveEntity) -> int | None:
    """The truth: bytes of ``"kind":<entity's JSON>`` as encode_data writes it."""
    try:
        text = json.dumps(
            {kind: entity.model_dump(mode="json")},
            ensure_ascii=False,
            separators=(",", ":"),
            allow_nan=False,
        )
        return len(text.encode()) - 2
    except (TypeError, ValueError):
        return None


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(kind=st.sampled_from(KINDS), entity=entities())
def test_the_arithmetic_size_is_the_dumped_members_size(kind: str, entity: ActiveEntity) -> None:
    old = _member_size(kind, _entity_json(entity))  # what the eager store measured
    assert _entity_member_size(kind, entity) == old
    if old is not None:
        assert old == _json_member_size(kind, entity)


# -- the store, operation by operation -------------------------------------------------


def _turn(text: str = "hi") -> NewTurn:
    return NewTurn(role="user", content=[TextBlock(text=text)], timestamp=T0)


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.sampled_from(["s1", "s2"]),
            st.dictionaries(st.sampled_from(KINDS), entities(), max_size=3),
            st.lists(st.sampled_from(KINDS), max_size=2),
            st.sampled_from([None, timedelta(seconds=30), timedelta(hours=1)]),
        ),
        st.tuples(st.just("big"), st.sampled_from(["s1", "s2"]), st.sampled_from(KINDS)),
        st.tuples(
            st.just("put"),
            st.sampled_from(["s1", "s2"]),
            st.dictionaries(st.sampled_from(KINDS), st.one_of(texts, st.integers()), max_size=3),
        ),
        st.tuples(st.just("get"), st.sampled_from(["s1", "s2"])),
        st.tuples(st.just("tick"), st.integers(1, 90)),
    ),
    max_size=25,
)


async def _outcome(call: Any) -> Any:
    try:
        result = await call
    except TierMemError as exc:
        return ("error", type(exc).__name__, str(exc))
    if isinstance(result, SessionRecord):
        return ("record", result.model_dump(), result.model_dump(mode="json"))
    if isinstance(result, list):
        return ("turns", [t.index for t in result])
    return ("value", result)


async def _run(store: MemoryDurableStore, clock: FakeClock, steps: list[Any]) -> list[Any]:
    seen: list[Any] = []
    for step in steps:
        op = step[0]
        if op == "append":
            _, sid, upsert, remove, ttl = step
            change = EntityChange.trusted({"upsert": upsert, "remove": tuple(remove)})
            expires = None if ttl is None else clock.now() + ttl
            seen.append(
                await _outcome(
                    store.append_turns(sid, [_turn()], entities=change, expires_at=expires)
                )
            )
        elif op == "big":
            _, sid, kind = step
            entity = ActiveEntity(kind=kind, value="x" * (MAX_RECORD_BYTES // 2), updated_at=T0)
            change = EntityChange(upsert={kind: entity})
            seen.append(await _outcome(store.append_turns(sid, [_turn()], entities=change)))
            other = ActiveEntity(kind="other", value="y" * (MAX_RECORD_BYTES // 2), updated_at=T0)
            change = EntityChange(upsert={"other": other})
            seen.append(await _outcome(store.append_turns(sid, [_turn()], entities=change)))
        elif op == "put":
            _, sid, data = step
            seen.append(await _outcome(store.put_record(sid, ENTITIES_RECORD, data)))
        elif op == "get":
            seen.append(await _outcome(store.get_record(step[1], ENTITIES_RECORD)))
        else:
            clock.advance(step[1])
    for sid in ("s1", "s2"):
        seen.append(await _outcome(store.get_record(sid, ENTITIES_RECORD)))
        seen.append(await _outcome(store.next_index(sid)))
    return seen


@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(steps=ops)
async def test_the_store_gives_what_the_eager_store_gave(steps: list[Any]) -> None:
    new_clock, old_clock = FakeClock(T0), FakeClock(T0)
    new = await _run(MemoryDurableStore(clock=new_clock), new_clock, steps)
    old = await _run(EagerDurableStore(clock=old_clock), old_clock, steps)
    assert new == old


async def test_a_pending_record_is_built_once_and_kept() -> None:
    store = MemoryDurableStore(clock=FakeClock(T0))
    entity = ActiveEntity(kind="series", value="Berserk", turn_index=0, updated_at=T0)
    change = EntityChange(upsert={"series": entity})
    await store.append_turns("s1", [_turn()], entities=change)
    first = await store.get_record("s1", ENTITIES_RECORD)
    assert first is not None
    assert first.data == {"series": entity.model_dump(mode="json")}
    assert await store.get_record("s1", ENTITIES_RECORD) is first  # built once
    # The next append merges into the built record: one version up, sizes kept.
    other = ActiveEntity(kind="volume", value="42", turn_index=1, updated_at=T0)
    await store.append_turns("s1", [_turn()], entities=EntityChange(upsert={"volume": other}))
    second = await store.get_record("s1", ENTITIES_RECORD)
    assert second is not None
    assert second.version == 2
    assert list(second.data) == ["series", "volume"]


@pytest.mark.parametrize("seconds", [0, 1])
def test_the_usual_entitys_size_needs_no_dump(
    seconds: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The arithmetic path is the one taken for the library's own entities (no dump)."""
    entity = ActiveEntity(kind="series", value="Berserk", turn_index=3, updated_at=T0)
    entity = ActiveEntity.trusted(
        {**entity.__dict__, "updated_at": T0.replace(microsecond=seconds)}
    )
    expected = _member_size("series", _entity_json(entity))

    def refuse(_: ActiveEntity) -> dict[str, JsonValue]:
        raise AssertionError("dumped")

    monkeypatch.setattr(memory_module, "_entity_json", refuse)
    assert _entity_member_size("series", entity) == expected
