"""The SQLite durable store's parsed ``entities`` records (issue #8, session 13): an append
that changes entities merges into the record it last wrote without parsing its JSON again,
and what it writes is exactly what the old merge (kept here as a reference copy) wrote
from the file's JSON, whoever wrote the record in between."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tiermem.clock import FakeClock
from tiermem.errors import ValidationError
from tiermem.models import ActiveEntity, JsonValue, SessionRecord
from tiermem.store.backends.sqlite import _durable
from tiermem.store.backends.sqlite._durable import (
    SQLiteDurableStore,
    _EntitiesCache,
    _entity_rows,
    _EntityRows,
    _Header,
    _lifetime_after,
)
from tiermem.store.backends.sqlite._mapping import from_epoch_us, to_epoch_us
from tiermem.store.codec import encode_data
from tiermem.store.contract import ENTITIES_RECORD, EntityChange
from tiermem.testing.backend import text_turn

KINDS = ["order_id", "series", "genre", "名前", "x" * 40]
VALUES = ["ORD-1", "Berserk", "seinen", "ベルセルク", "é" * 30, "", "a\u2028b", '"quoted"']


def _reference_merged_entities(
    held: Sequence[object],
    change: _EntityRows,
    now: datetime,
    lifetime_us: int | None,
) -> SessionRecord:
    """``_durable._merged_entities`` as it was at 10b85d4 (parses the stored JSON)."""
    version, payload = held
    data: dict[str, JsonValue] = {}
    if isinstance(payload, str):
        stored = json.loads(payload).get("data")
        if isinstance(stored, dict):
            data = stored
    for kind in change.remove:
        data.pop(kind, None)
    data.update(change.upsert)
    encode_data(data, what=f"record {ENTITIES_RECORD!r}")
    return SessionRecord(
        kind=ENTITIES_RECORD,
        data=data,
        version=(version if isinstance(version, int) else 0) + 1,
        updated_at=now,
        expires_at=None if lifetime_us is None else from_epoch_us(lifetime_us),
    )


def _file_state(path: Path, session_id: str) -> tuple[_Header | None, tuple[object, object]]:
    with sqlite3.connect(path) as conn:
        header = conn.execute(
            "SELECT next_index, expires_at_us FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        record = conn.execute(
            "SELECT version, payload FROM session_records WHERE session_id = ? AND kind = ?",
            (session_id, ENTITIES_RECORD),
        ).fetchone()
    conn.close()
    return (
        None if header is None else _Header(header[0], header[1], None),
        (None, None) if record is None else (record[0], record[1]),
    )


def _random_change(rng: random.Random, now: datetime) -> EntityChange:
    upsert = {
        kind: ActiveEntity(
            kind=kind,
            value=rng.choice(VALUES) + str(rng.randrange(100)),
            turn_index=rng.choice([None, rng.randrange(1000)]),
            updated_at=now,
        )
        for kind in rng.sample(KINDS, rng.randrange(0, 3))
    }
    remove = tuple(k for k in rng.sample(KINDS, rng.randrange(0, 2)) if k not in upsert)
    if not upsert and not remove:
        remove = (rng.choice(KINDS),)
    return EntityChange(upsert=upsert, remove=remove)


@pytest.mark.parametrize("seed", range(6))
async def test_entity_merges_write_what_the_old_merge_wrote(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "tiermem.db"
    clock = FakeClock()
    store = SQLiteDurableStore(path, clock=clock)
    other = SQLiteDurableStore(path, clock=clock, busy_timeout=timedelta(seconds=6))
    sessions = ["s-1", "s-2"]
    merges = 0
    try:
        await store.next_index("s-0")  # opens (and migrates) the file
        for _ in range(60):
            clock.advance(timedelta(seconds=rng.choice([1, 30, 4000])))
            now = clock.now()
            session_id = rng.choice(sessions)
            step = rng.random()
            expires = rng.choice([None, now + timedelta(hours=1), now + timedelta(seconds=90)])
            if step < 0.15:  # someone else rewrites the record (another store, its own cache)
                writer = rng.choice([store, other])
                await writer.put_record(
                    session_id,
                    ENTITIES_RECORD,
                    {rng.choice(KINDS): {"kind": "k", "value": rng.choice(VALUES), "n": 1.5}},
                    expires_at=expires,
                )
                continue
            if step < 0.22:  # another store appends entities to the session
                await other.append_turns(
                    session_id,
                    [text_turn("other")],
                    expires_at=expires,
                    entities=_random_change(rng, now),
                )
                continue
            if step < 0.25:
                await store.delete_session(session_id)
                continue
            if step < 0.35:  # an append that leaves entities alone
                await store.append_turns(session_id, [text_turn("plain")], expires_at=expires)
                continue
            change = _random_change(rng, now)
            header, held = _file_state(path, session_id)
            now_us = to_epoch_us(now)
            live = header is not None and header.live(now_us)
            expected = _reference_merged_entities(
                held if live else (None, None),
                _entity_rows(change),  # type: ignore[arg-type]  # a change is never empty here
                now,
                _lifetime_after(header, now_us, None if expires is None else to_epoch_us(expires)),
            )
            await store.append_turns(
                session_id, [text_turn("with entities")], expires_at=expires, entities=change
            )
            _, (version, payload) = _file_state(path, session_id)
            assert (version, payload) == (expected.version, expected.model_dump_json())
            merges += 1
        assert merges > 20
    finally:
        await other.aclose()
        await store.aclose()


async def test_a_merge_over_the_size_limit_is_refused_as_before(tmp_path: Path) -> None:
    store = SQLiteDurableStore(tmp_path / "tiermem.db", clock=FakeClock())
    now = FakeClock().now()
    try:
        small = ActiveEntity(kind="a", value="v", updated_at=now)
        await store.append_turns("s", [text_turn("t")], entities=EntityChange(upsert={"a": small}))
        big = ActiveEntity(kind="b", value="x" * (1024 * 1024), updated_at=now)
        with pytest.raises(ValidationError, match="bytes serialized"):
            await store.append_turns(
                "s", [text_turn("t")], entities=EntityChange(upsert={"b": big})
            )
        # Nothing of the refused append was written; the next merge starts from the file.
        await store.append_turns("s", [text_turn("t")], entities=EntityChange(remove=("a",)))
        record = await store.get_record("s", ENTITIES_RECORD)
        assert record is not None
        assert record.data == {}
        assert record.version == 2
        assert await store.next_index("s") == 2
    finally:
        await store.aclose()


async def test_an_append_merges_into_the_record_it_wrote_without_parsing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteDurableStore(tmp_path / "tiermem.db", clock=FakeClock())
    now = FakeClock().now()
    parsed: list[str] = []
    real_loads = json.loads

    def counting_loads(text: str | bytes, **kwargs: object) -> object:
        parsed.append(str(text))
        return real_loads(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_durable.json, "loads", counting_loads)
    try:
        for i in range(5):
            entity = ActiveEntity(kind=f"k{i}", value=f"v{i}", updated_at=now)
            await store.append_turns(
                "s", [text_turn("t")], entities=EntityChange(upsert={f"k{i}": entity})
            )
        assert parsed == []  # every merge after the first used the record it had written
        await store.put_record("s", ENTITIES_RECORD, {"k0": {"kind": "k0", "value": "new"}})
        parsed.clear()
        entity = ActiveEntity(kind="k9", value="v9", updated_at=now)
        await store.append_turns(
            "s", [text_turn("t")], entities=EntityChange(upsert={"k9": entity})
        )
        assert len(parsed) == 1  # rewritten by put_record: parsed from the file
        record = await store.get_record("s", ENTITIES_RECORD)
        assert record is not None
        assert sorted(record.data) == ["k0", "k9"]
        assert record.data["k0"] == {"kind": "k0", "value": "new"}
    finally:
        await store.aclose()


async def test_a_deletion_or_a_purge_leaves_no_parsed_record_behind(tmp_path: Path) -> None:
    store = SQLiteDurableStore(tmp_path / "tiermem.db", clock=FakeClock())
    now = FakeClock().now()
    change = EntityChange(upsert={"name": ActiveEntity(kind="name", value="Ada", updated_at=now)})
    try:
        await store.append_turns("s", [text_turn("t")], entities=change)
        assert len(store._entities) == 1
        await store.delete_session("s")
        assert len(store._entities) == 0
        await store.append_turns("s", [text_turn("t")], entities=change)
        await store.purge_user("u")
        assert len(store._entities) == 0
    finally:
        await store.aclose()


def test_the_cache_is_bounded_and_hands_out_copies() -> None:
    cache = _EntitiesCache(max_sessions=3)
    for i in range(5):
        cache.put(f"s{i}", f"p{i}", {"k": i})
    assert len(cache) == 3
    assert cache.data("s0", "p0") is None  # first in, first out
    assert cache.data("s4", "other payload") is None
    copy = cache.data("s4", "p4")
    assert copy == {"k": 4}
    assert copy is not None
    copy["k"] = 99
    assert cache.data("s4", "p4") == {"k": 4}


def test_the_cache_keeps_a_bounded_amount_of_record_json() -> None:
    cache = _EntitiesCache(max_sessions=100, max_chars=10)
    cache.put("big", "x" * 11, {"k": 0})
    assert len(cache) == 0  # larger than the whole bound: not kept
    for i in range(4):
        cache.put(f"s{i}", "abcd", {"k": i})
    assert len(cache) == 2  # 8 of 10 characters
    assert cache.data("s3", "abcd") == {"k": 3}
    assert cache.data("s1", "abcd") is None
    cache.put("s3", "ab", {"k": 5})  # replacing an entry gives its characters back
    cache.put("s9", "abcdef", {"k": 9})
    assert cache.data("s3", "ab") == {"k": 5}
    assert cache.data("s9", "abcdef") == {"k": 9}
    cache.clear()
    cache.put("s0", "x" * 10, {})
    assert len(cache) == 1
