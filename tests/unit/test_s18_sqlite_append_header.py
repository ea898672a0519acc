"""An append to a live SQLite session moves its header first (a plain ``UPDATE``, then a
read of where it put it) instead of reading it and then upserting it (issue #8, session
18): cheaper statements, as many of them.

What is stored must not change. Generated sequences of appends (retried and reused keys,
expected indexes right and wrong, entity changes, lifetimes that pass, collection, turns
and entities over the size limit, bad arguments), record writes, registrations,
deletions and clock moves run on the store and on a copy of ``append_turns`` as it was at
07fccef. Both give the same answers and errors, and leave every table with the same rows.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit._sqlite_helpers import traced
from tiermem.clock import FakeClock
from tiermem.errors import ConflictError, TierMemError, ValidationError
from tiermem.models import ActiveEntity, NewTurn, SessionRef, Turn
from tiermem.store.backends.sqlite._durable import (
    _APPEND_READ,
    _APPEND_READ_ENTITIES,
    _UPSERT_LIVE_HEADER,
    _UPSERT_NEW_HEADER,
    SQLiteDurableStore,
    _entity_rows,
    _Header,
    _lifetime_after,
    _merged_entities,
    _optional_us,
    _start_afresh,
    _stored_turns,
    _upsert_record,
)
from tiermem.store.backends.sqlite._mapping import to_epoch_us
from tiermem.store.codec import check_append, check_idempotency_key, encode_turn
from tiermem.store.contract import ENTITIES_RECORD, MAX_RECORD_BYTES, MAX_TURN_BYTES, EntityChange
from tiermem.testing.backend import text_turn


class RefStore(SQLiteDurableStore):
    """The durable store with ``append_turns`` as it was at 07fccef: read the header, then
    write it."""

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        first_index: int | None = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
        entities: EntityChange | None = None,
    ) -> list[Turn]:
        check_append(session_id, turns, first_index=first_index)
        check_idempotency_key(idempotency_key)
        change = _entity_rows(entities)
        expires_at_us = _optional_us(expires_at)

        def op(conn: sqlite3.Connection) -> list[Turn]:
            now = self._clock.now()
            now_us = to_epoch_us(now, what="clock.now()")
            if change is None:
                row = conn.execute(_APPEND_READ, (idempotency_key, session_id)).fetchone()
            else:
                row = conn.execute(
                    _APPEND_READ_ENTITIES, (idempotency_key, ENTITIES_RECORD, session_id)
                ).fetchone()
            header = None if row is None else _Header(row[0], row[1], None)
            live = header is not None and header.live(now_us)
            if live and row[2] is not None:
                return _stored_turns(conn, session_id, row[2], row[2] + row[3], now_us)
            if header is not None and not live:
                _start_afresh(conn, session_id)
            start = header.next_index if header else 0
            if first_index is not None and first_index != start:
                raise ConflictError(
                    f"session {session_id!r}: next archived turn index is {start}, "
                    f"not {first_index}",
                    expected=first_index,
                    actual=start,
                )
            indexed = [turn.with_index(start + i) for i, turn in enumerate(turns)]
            rows = [(session_id, turn.index, encode_turn(turn), expires_at_us) for turn in indexed]
            lifetime_us = _lifetime_after(header, now_us, expires_at_us)
            record = None
            if change is not None:
                held = row[4:6] if live and row is not None else (None, None)
                parsed = None if held[1] is None else self._entities.data(session_id, held[1])
                record = _merged_entities(held, change, now, lifetime_us, parsed)
            conn.executemany(
                "INSERT INTO turns (session_id, idx, payload, expires_at_us) VALUES (?, ?, ?, ?)",
                rows,
            )
            conn.execute(
                _UPSERT_LIVE_HEADER if live else _UPSERT_NEW_HEADER,
                (session_id, start + len(indexed), lifetime_us, lifetime_us),
            )
            if idempotency_key is not None:
                conn.execute(
                    "INSERT INTO idempotency_keys "
                    "(session_id, idempotency_key, first_index, turn_count) VALUES (?, ?, ?, ?)",
                    (session_id, idempotency_key, start, len(indexed)),
                )
            if record is not None:
                written = _upsert_record(conn, session_id, record)
                self._entities.put(session_id, written, record.data)
            self._collect_garbage(conn, now_us)
            return indexed

        return await self._db.write(op, direct=self._db.alone(session_id))


START = datetime(2030, 1, 1, tzinfo=UTC)
SESSIONS = ["s-0", "s-1", "s-2"]
KEYS = ["k-0", "k-1", "k-2"]
KINDS = ["order_id", "series", "名前"]
GC_GRACE = timedelta(minutes=20)  # so that collection removes dead sessions mid-sequence


# One step: ("append", session, turns, first_index, key, entity change, lifetime in
# minutes (None: forever), oversize: 0 none, 1 a turn, 2 the entities record),
# ("advance", minutes), ("record", session, lifetime), ("register", session, lifetime),
# ("delete", session) or ("bad", which).
# first_index: None, "next" (the session's next index, read first) or a number.
_CHANGES = st.none() | st.tuples(
    st.lists(st.sampled_from(KINDS), max_size=2, unique=True),
    st.lists(st.sampled_from(KINDS), max_size=2, unique=True),
    st.integers(min_value=0, max_value=9),
)
# Small lifetimes and clock moves of whole minutes: appends land exactly on the instant a
# session dies (which is dead) and a minute either side.
_LIFETIMES = st.none() | st.sampled_from([-1, 0, 1, 2]) | st.integers(min_value=-3, max_value=90)
_STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.sampled_from(SESSIONS),
            st.integers(min_value=1, max_value=3),
            st.none() | st.just("next") | st.integers(min_value=0, max_value=6),
            st.none() | st.sampled_from(KEYS),
            _CHANGES,
            _LIFETIMES,
            st.sampled_from([0] * 12 + [1, 2]),
        ),
        st.tuples(
            st.just("advance"), st.sampled_from([1, 2]) | st.integers(min_value=0, max_value=60)
        ),
        st.tuples(st.just("record"), st.sampled_from(SESSIONS), _LIFETIMES),
        st.tuples(st.just("register"), st.sampled_from(SESSIONS), _LIFETIMES),
        st.tuples(st.just("delete"), st.sampled_from(SESSIONS)),
        st.tuples(st.just("bad"), st.integers(min_value=0, max_value=4)),
    ),
    min_size=1,
    max_size=40,
)


def _random_steps(rng: random.Random, count: int) -> list[tuple[Any, ...]]:
    """A long sequence (past several collection passes), drawn like :data:`_STEPS`."""
    steps: list[tuple[Any, ...]] = []
    for _ in range(count):
        roll = rng.random()
        lifetime = rng.choice([None, None, -1, 1, 2, 5, 30, 90])
        session = rng.choice(SESSIONS)
        if roll < 0.7:
            change = None
            if rng.random() < 0.4:
                upsert = rng.sample(KINDS, rng.randrange(3))
                remove = rng.sample(KINDS, rng.randrange(2))
                change = (upsert, remove, rng.randrange(10))
            steps.append(
                (
                    "append",
                    session,
                    rng.randint(1, 3),
                    rng.choice([None, None, "next", "next", rng.randrange(8)]),
                    rng.choice([None, None, None, *KEYS]),
                    change,
                    lifetime,
                    rng.choice([0] * 30 + [1, 2]),
                )
            )
        elif roll < 0.85:
            steps.append(("advance", rng.choice([0, 1, 1, 2, 10, 40])))
        elif roll < 0.9:
            steps.append(("record", session, lifetime))
        elif roll < 0.94:
            steps.append(("register", session, lifetime))
        elif roll < 0.97:
            steps.append(("delete", session))
        else:
            steps.append(("bad", rng.randrange(5)))
    return steps


def _change(spec: Any, now: datetime, big: bool) -> EntityChange | None:
    if spec is None:
        return None
    upsert, remove, salt = spec
    value = "v" * (MAX_RECORD_BYTES + 1) if big else f"value-{salt}"
    return EntityChange(
        upsert={
            kind: ActiveEntity(kind=kind, value=value, turn_index=salt, updated_at=now)
            for kind in upsert
        },
        remove=tuple(kind for kind in remove if kind not in upsert),
    )


_BAD: list[dict[str, Any]] = [
    {"session_id": "bad id!"},
    {"turns": []},
    {"first_index": -1},
    {"idempotency_key": ""},
    {"entities": {"series": "x"}},
]


def _outcome(result: Any) -> Any:
    if isinstance(result, list):
        return [turn.model_dump(mode="json") for turn in result]
    if result is None:
        return None
    return result.model_dump(mode="json")


async def _apply(
    store: SQLiteDurableStore, clock: FakeClock, steps: Sequence[tuple[Any, ...]]
) -> list[Any]:
    outcomes: list[Any] = []
    for step in steps:
        now = clock.now()
        try:
            if step[0] == "advance":
                clock.advance(timedelta(minutes=step[1]))
                result: Any = None
            elif step[0] == "append":
                _, session, count, first, key, spec, lifetime, oversize = step
                text = "x" * (MAX_TURN_BYTES + 1) if oversize == 1 else f"turn at {now}"
                turns = [text_turn(f"{text} {i}", at=now) for i in range(count)]
                if first == "next":
                    first = await store.next_index(session)
                result = await store.append_turns(
                    session,
                    turns,
                    first_index=first,
                    expires_at=None if lifetime is None else now + timedelta(minutes=lifetime),
                    idempotency_key=key,
                    entities=_change(spec, now, oversize == 2),
                )
            elif step[0] == "record":
                _, session, lifetime = step
                result = await store.put_record(
                    session,
                    ENTITIES_RECORD,
                    {"series": {"kind": "series", "value": f"put at {now}"}},
                    expires_at=None if lifetime is None else now + timedelta(minutes=lifetime),
                )
            elif step[0] == "register":
                _, session, lifetime = step
                result = await store.register_session(
                    SessionRef(session_id=session, user_id="u-1", created_at=now),
                    expires_at=None if lifetime is None else now + timedelta(minutes=lifetime),
                )
            elif step[0] == "delete":
                result = await store.delete_session(step[1])
            else:
                arguments: dict[str, Any] = {
                    "session_id": "s-0",
                    "turns": [text_turn("bad")],
                    **_BAD[step[1]],
                }
                session_id = arguments.pop("session_id")
                result = await store.append_turns(session_id, arguments.pop("turns"), **arguments)
        except ConflictError as exc:
            outcomes.append(("conflict", exc.expected, exc.actual, str(exc)))
        except TierMemError as exc:
            outcomes.append((type(exc).__name__, str(exc)))
        else:
            outcomes.append(_outcome(result))
    return outcomes


def _tables(path: Path) -> dict[str, str]:
    """Every table's rows, in primary key order (rowid included where there is one), as
    their repr: a change of value or of type (1 against 1.0 or '1') shows."""
    with closing(sqlite3.connect(path)) as conn:
        tables: dict[str, str] = {}
        for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall():
            columns = len(conn.execute(f"SELECT * FROM {name} LIMIT 0").description)  # noqa: S608
            order = ", ".join(str(i) for i in range(1, columns + 1))
            rowid = "" if "WITHOUT ROWID" in sql.upper() else "rowid, "
            if name.startswith("sqlite_"):
                rowid = ""
            rows = conn.execute(f"SELECT {rowid}* FROM {name} ORDER BY {order}").fetchall()  # noqa: S608
            tables[name] = repr(rows)
    return tables


async def _run(
    base: Path, steps: Sequence[tuple[Any, ...]]
) -> list[tuple[list[Any], dict[str, str]]]:
    results = []
    for cls in (SQLiteDurableStore, RefStore):
        clock = FakeClock(START)
        path = base / f"{cls.__name__}.db"
        store = cls(path, clock=clock, gc_grace=GC_GRACE)
        try:
            outcomes = await _apply(store, clock, steps)
        finally:
            await store.aclose()
        results.append((outcomes, _tables(path)))
    return results


@settings(max_examples=80, deadline=None)
@given(_STEPS)
def test_appends_store_what_they_stored(tmp_path_factory: Any, steps: Any) -> None:
    base = tmp_path_factory.mktemp("append")
    new, reference = asyncio.run(_run(base, steps))
    assert new == reference


@pytest.mark.parametrize("seed", range(4))
def test_long_sequences_store_what_they_stored(tmp_path: Path, seed: int) -> None:
    """Hundreds of writes: several collection passes (one every 64 writes), sessions
    collected and started again under the same id."""
    steps = _random_steps(random.Random(seed), 400)
    new, reference = asyncio.run(_run(tmp_path, steps))
    assert new == reference
    appended = [o for o, s in zip(new[0], steps, strict=True) if s[0] == "append"]
    assert sum(isinstance(o, list) for o in appended) > 100  # most appends wrote
    assert any(isinstance(o, tuple) and o[0] == "conflict" for o in appended)


def _entity(now: datetime) -> EntityChange:
    return EntityChange(
        upsert={"series": ActiveEntity(kind="series", value="Berserk", updated_at=now)}
    )


async def test_an_append_to_a_live_session_updates_its_header_first(tmp_path: Path) -> None:
    clock = FakeClock(START)
    store = SQLiteDurableStore(tmp_path / "t.db", clock=clock)
    try:
        later = START + timedelta(hours=1)
        await store.append_turns("s-1", [text_turn("first")], expires_at=later)
        statements = await traced(store, words=4)
        await store.append_turns("s-1", [text_turn("a")], expires_at=later)
        await store.append_turns("s-1", [text_turn("b")], first_index=2, expires_at=later)
        await store.append_turns(
            "s-1", [text_turn("c")], expires_at=later, idempotency_key="k", entities=_entity(START)
        )
        moved = "SELECT next_index, expires_at_us FROM"
        assert statements == [
            "BEGIN IMMEDIATE",
            "UPDATE sessions SET next_index",
            moved,
            "INSERT INTO turns (session_id,",
            "COMMIT",
            # Told the first index (OPTIMISTIC_APPEND), a plain append reads nothing: the
            # update matched, so the turns start there.
            "BEGIN IMMEDIATE",
            "UPDATE sessions SET next_index",
            "INSERT INTO turns (session_id,",
            "COMMIT",
            "BEGIN IMMEDIATE",
            "UPDATE sessions SET next_index",
            "SELECT s.next_index, s.expires_at_us, r.version,",  # with the entities record
            "INSERT INTO turns (session_id,",
            "INSERT INTO idempotency_keys (session_id,",
            "INSERT INTO session_records (session_id,",
            "COMMIT",
        ]
        statements.clear()
        # The retry, a wrong index and an expired session each read the header first:
        # the update matched no row, so it changed nothing.
        retried = await store.append_turns(
            "s-1", [text_turn("c")], expires_at=later, idempotency_key="k"
        )
        assert [t.index for t in retried] == [3]
        with pytest.raises(ConflictError) as raised:
            await store.append_turns("s-1", [text_turn("d")], first_index=9)
        assert (raised.value.expected, raised.value.actual) == (9, 4)
        read = "SELECT s.next_index, s.expires_at_us, k.first_index,"
        assert statements == [
            "BEGIN IMMEDIATE",
            "UPDATE sessions SET next_index",
            read,
            "SELECT payload FROM turns",
            "COMMIT",
            "BEGIN IMMEDIATE",
            "UPDATE sessions SET next_index",
            read,
            "ROLLBACK",
        ]
        clock.advance(timedelta(hours=2))
        fresh = await store.append_turns("s-1", [text_turn("e")], first_index=4)
        assert [t.index for t in fresh] == [4]
        assert await store.get_record("s-1", ENTITIES_RECORD) is None  # started afresh
    finally:
        await store.aclose()


async def test_an_append_over_the_limit_leaves_the_header_alone(tmp_path: Path) -> None:
    """The header moves before the turns are encoded; the size error rolls it back."""
    store = SQLiteDurableStore(tmp_path / "t.db", clock=FakeClock(START))
    try:
        later = START + timedelta(hours=1)
        await store.append_turns("s-1", [text_turn("first")], expires_at=later)
        with pytest.raises(ValidationError, match="turn 1"):
            await store.append_turns(
                "s-1",
                [text_turn("x" * (MAX_TURN_BYTES + 1))],
                expires_at=later + timedelta(hours=1),
            )
        big = EntityChange(
            upsert={
                "series": ActiveEntity(
                    kind="series", value="v" * (MAX_RECORD_BYTES + 1), updated_at=START
                )
            }
        )
        with pytest.raises(ValidationError, match="entities"):
            await store.append_turns("s-1", [text_turn("ok")], expires_at=None, entities=big)
        assert await store.next_index("s-1") == 1
        with closing(sqlite3.connect(tmp_path / "t.db")) as conn:
            header = conn.execute(
                "SELECT next_index, expires_at_us FROM sessions WHERE session_id = 's-1'"
            ).fetchone()
        assert header == (1, to_epoch_us(later))  # neither the index nor the lifetime moved
        appended = await store.append_turns("s-1", [text_turn("next")], first_index=1)
        assert [t.index for t in appended] == [1]
    finally:
        await store.aclose()
