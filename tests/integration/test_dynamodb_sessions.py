"""What the DynamoDB backend does for session lifetimes that the conformance suite cannot see.

Native TTL attributes of records and keys over a long-lived session, the horizon raise in
and outside the append's transaction, a session's next life, round trips, purges of
re-registered ids, and a hot restore whose turns end before ``next_index``. Runs against
DynamoDB Local (``TIERMEM_TEST_DYNAMODB_URL``).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.backends.dynamodb import dynamodb_session, shared_table
from tests.conftest import server_url
from tiermem.clock import FakeClock
from tiermem.errors import ConflictError, ValidationError
from tiermem.models import ActiveEntity, SessionMetadata, SessionRef, StateBlob
from tiermem.store.backends.dynamodb import (
    TTL_ATTRIBUTE,
    DynamoDBDurableStore,
    DynamoDBHotStore,
)
from tiermem.store.backends.dynamodb_header import HORIZON_SLACK_MAX
from tiermem.store.contract import DEFAULT_GC_GRACE, ENTITIES_RECORD, EntityChange
from tiermem.testing.backend import fresh_id, text_turn

pytestmark = pytest.mark.dynamodb

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


class _Clocks:
    """The store's clock and the wall clock DynamoDB's TTL compares with, moving together
    (as in production), so TTL attributes can be checked exactly."""

    def __init__(self) -> None:
        self.store = FakeClock(datetime(2030, 1, 1, tzinfo=UTC))
        self.wall = FakeClock(datetime(2026, 6, 1, tzinfo=UTC))

    def advance(self, delta: timedelta) -> None:
        self.store.advance(delta)
        self.wall.advance(delta)

    def wall_ttl(self, expires_at: datetime) -> int:
        """The TTL (epoch seconds) of something that expires at ``expires_at`` (store time)."""
        return int(
            (self.wall.now() + (expires_at - self.store.now()) + DEFAULT_GC_GRACE).timestamp()
        )


class _Spy:
    """Records the name of every client method used, delegating to a real client."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self._client, name)

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def clocks() -> _Clocks:
    return _Clocks()


@pytest.fixture
async def table() -> str:
    return await shared_table(server_url("dynamodb"))


@pytest.fixture
async def raw_client() -> AsyncIterator[Any]:
    async with dynamodb_session().client("dynamodb", endpoint_url=server_url("dynamodb")) as client:
        yield client


@pytest.fixture
def spy(raw_client: Any) -> _Spy:
    return _Spy(raw_client)


@pytest.fixture
def durable(table: str, clocks: _Clocks, spy: _Spy) -> DynamoDBDurableStore:
    # The spy's client is the fixture's: the store does not close it.
    return DynamoDBDurableStore(table, clock=clocks.store, wall_clock=clocks.wall, client=spy)


@pytest.fixture
def hot(table: str, clocks: _Clocks, raw_client: Any) -> DynamoDBHotStore:
    return DynamoDBHotStore(table, clock=clocks.store, wall_clock=clocks.wall, client=raw_client)


async def _items(client: Any, table: str, pk: str) -> dict[str, dict[str, Any]]:
    response = await client.query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": pk}},
        ConsistentRead=True,
    )
    return {item["sk"]["S"]: item for item in response["Items"]}


def _ttl(item: dict[str, Any]) -> int | None:
    value = item.get(TTL_ATTRIBUTE)
    return int(value["N"]) if value is not None else None


def _long_lived(items: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The record items (parts included) and key items of a durable partition."""
    return {sk: i for sk, i in items.items() if sk.startswith(("REC#", "KEY#"))}


def _ref(sid: str, user: str, clocks: _Clocks) -> SessionRef:
    return SessionRef(session_id=sid, user_id=user, created_at=clocks.store.now())


async def test_records_and_keys_outlive_a_long_lived_session_and_their_ttl_moves_rarely(
    durable: DynamoDBDurableStore, raw_client: Any, table: str, clocks: _Clocks
) -> None:
    """Forty days of a turn every 12 hours, each keeping the session alive for one more day:
    the records and keys written on day 0 always carry a TTL at or past META's (the
    lifetime + gc_grace), and it was rewritten only a handful of times."""
    sid, user = fresh_id("s"), fresh_id("u")
    await durable.register_session(_ref(sid, user, clocks), expires_at=clocks.store.now() + DAY)
    await durable.put_record(sid, "summary", {"s": 1}, expires_at=clocks.store.now() + DAY)
    await durable.append_turns(
        sid, [text_turn("first")], expires_at=clocks.store.now() + DAY, idempotency_key="k-0"
    )
    seen: set[int | None] = set()
    for _ in range(80):
        clocks.advance(12 * HOUR)
        lifetime = clocks.store.now() + DAY
        await durable.append_turns(sid, [text_turn("more")], expires_at=lifetime)
        items = await _items(raw_client, table, f"S#{sid}")
        meta_ttl = _ttl(items["META"])
        assert meta_ttl == clocks.wall_ttl(lifetime)
        for sk, item in _long_lived(items).items():
            ttl = _ttl(item)
            assert ttl is not None, sk
            assert ttl >= meta_ttl, sk
            # ...and not so far past it that a dead session would linger for long.
            assert ttl <= meta_ttl + HORIZON_SLACK_MAX.total_seconds() + DAY.total_seconds(), sk
        seen.add(_ttl(items["REC#summary"]))
    # The slack doubles with the session's age (1, 2, 4... days, at most 30).
    assert 3 <= len(seen) <= 8, seen
    record = await durable.get_record(sid, "summary")
    assert record is not None
    assert record.data == {"s": 1}
    # The day-0 key still stops a duplicate, though its turn expired long ago.
    assert await durable.append_turns(sid, [text_turn("first")], idempotency_key="k-0") == []


async def test_a_session_that_comes_to_live_forever_loses_its_record_ttls(
    durable: DynamoDBDurableStore, raw_client: Any, table: str, clocks: _Clocks
) -> None:
    sid = fresh_id("s")
    await durable.put_record(sid, "summary", {"s": 1}, expires_at=clocks.store.now() + DAY)
    await durable.append_turns(
        sid, [text_turn("a")], expires_at=clocks.store.now() + DAY, idempotency_key="k"
    )
    items = await _items(raw_client, table, f"S#{sid}")
    assert all(_ttl(i) is not None for i in [items["META"], *_long_lived(items).values()])
    await durable.append_turns(sid, [text_turn("kept forever")])
    items = await _items(raw_client, table, f"S#{sid}")
    assert [sk for sk, i in items.items() if _ttl(i) is not None] == ["TURN#000000000000"]


async def test_a_horizon_raise_too_big_for_the_transaction_goes_item_by_item(
    durable: DynamoDBDurableStore, raw_client: Any, table: str, clocks: _Clocks, spy: _Spy
) -> None:
    sid = fresh_id("s")
    for i in range(100):
        await durable.append_turns(
            sid, [text_turn(f"t{i}")], expires_at=clocks.store.now() + HOUR, idempotency_key=f"k{i}"
        )
    spy.take()
    lifetime = clocks.store.now() + 90 * DAY
    await durable.append_turns(sid, [text_turn("far")], expires_at=lifetime)
    calls = spy.take()
    assert calls.count("update_item") == 100
    items = await _items(raw_client, table, f"S#{sid}")
    meta_ttl = _ttl(items["META"])
    assert meta_ttl == clocks.wall_ttl(lifetime)
    keys = _long_lived(items)
    assert len(keys) == 100
    assert all((_ttl(i) or 0) >= meta_ttl for i in keys.values())


async def test_a_horizon_raise_skips_a_record_that_is_gone(
    durable: DynamoDBDurableStore, raw_client: Any, table: str, clocks: _Clocks
) -> None:
    """A delete that stopped halfway can leave META listing a record that is gone: raising
    the others' TTL must neither fail forever nor bring the record back as an empty item."""
    sid = fresh_id("s")
    await durable.put_record(sid, "summary", {"s": 1}, expires_at=clocks.store.now() + DAY)
    await durable.put_record(sid, "watermarks", {"w": 1}, expires_at=clocks.store.now() + DAY)
    await raw_client.delete_item(
        TableName=table, Key={"pk": {"S": f"S#{sid}"}, "sk": {"S": "REC#summary"}}
    )
    lifetime = clocks.store.now() + 60 * DAY
    await durable.append_turns(sid, [text_turn("a")], expires_at=lifetime)
    items = await _items(raw_client, table, f"S#{sid}")
    assert "REC#summary" not in items
    assert (_ttl(items["REC#watermarks"]) or 0) >= clocks.wall_ttl(lifetime)
    assert await durable.get_record(sid, "summary") is None


async def test_a_dead_session_starts_a_new_life_without_its_old_records_or_keys(
    durable: DynamoDBDurableStore, raw_client: Any, table: str, clocks: _Clocks
) -> None:
    sid = fresh_id("s")
    await durable.put_record(sid, "summary", {"old": True}, expires_at=clocks.store.now() + HOUR)
    await durable.append_turns(
        sid, [text_turn("old")], expires_at=clocks.store.now() + HOUR, idempotency_key="k"
    )
    clocks.advance(2 * HOUR)
    # META is still there (its TTL has not fired): the numbering goes on.
    again = await durable.append_turns(
        sid, [text_turn("new")], expires_at=clocks.store.now() + HOUR, idempotency_key="k"
    )
    assert [t.index for t in again] == [1]
    assert [t.text for t in await durable.get_turns(sid)] == ["new"]
    assert await durable.get_record(sid, "summary") is None
    written = await durable.put_record(sid, "summary", {"new": True}, expected_version=0)
    assert written.version == 1


async def test_numbering_restarts_once_meta_is_collected_and_old_parts_are_ignored(
    durable: DynamoDBDurableStore, raw_client: Any, table: str, clocks: _Clocks
) -> None:
    """What DynamoDB's TTL leaves for a while: an old life's split turn at the slot the
    new life writes first, and old turns past it."""
    sid = fresh_id("s")
    rng = random.Random(7)
    big = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(700_000))
    await durable.append_turns(
        sid,
        [text_turn(big), text_turn("old 1"), text_turn("old 2")],
        expires_at=clocks.store.now() + HOUR,
    )
    items = await _items(raw_client, table, f"S#{sid}")
    assert "TURN#000000000000#P0001" in items
    clocks.advance(2 * HOUR)
    await raw_client.delete_item(
        TableName=table, Key={"pk": {"S": f"S#{sid}"}, "sk": {"S": "META"}}
    )
    assert await durable.next_index(sid) == 0
    new = await durable.append_turns(sid, [text_turn("new")], expires_at=clocks.store.now() + HOUR)
    assert [t.index for t in new] == [0]
    assert [t.text for t in await durable.get_turns(sid)] == ["new"]
    assert [t.text for t in await durable.tail_turns(sid, 5)] == ["new"]
    assert (await durable.get_turn(sid, 0)).text == "new"


async def test_round_trips_of_the_session_operations(
    durable: DynamoDBDurableStore, clocks: _Clocks, spy: _Spy
) -> None:
    sid, owner, other = fresh_id("s"), fresh_id("u"), fresh_id("u")
    later = clocks.store.now() + DAY
    ref = _ref(sid, owner, clocks)
    assert await durable.register_session(ref, expires_at=later) == ref
    assert spy.take() == ["transact_write_items"]
    # Another user's attempt is refused by the same single transaction: its cancellation
    # carries META, so there is nothing to read.
    assert await durable.register_session(_ref(sid, other, clocks), expires_at=later) == ref
    assert spy.take() == ["transact_write_items"]
    # The store remembers META from its last write: the append goes out at once.
    await durable.append_turns(sid, [text_turn("q")], expires_at=later, idempotency_key="r1")
    assert spy.take() == ["transact_write_items"]
    # A repeat: the cancellation returns the key item, one Query reads its turns.
    await durable.append_turns(sid, [text_turn("q")], expires_at=later, idempotency_key="r1")
    assert spy.take() == ["transact_write_items", "query"]
    await durable.put_record(sid, "summary", {"s": 1}, expires_at=later)
    assert sorted(spy.take()) == ["get_item", "get_item", "transact_write_items"]
    await durable.get_record(sid, "summary")
    assert spy.take() == ["batch_get_item"]
    await durable.get_session(sid)
    assert spy.take() == ["get_item"]


class _Requests:
    """Counts DynamoDB requests by operation at aiobotocore's one door
    (``AioBaseClient._make_api_call``), whichever client a store uses."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> _Requests:
    from aiobotocore.client import AioBaseClient

    counter = _Requests()
    original = AioBaseClient._make_api_call

    async def counted(self: Any, operation: str, params: Any) -> Any:
        counter.calls.append(operation)
        return await original(self, operation, params)

    monkeypatch.setattr(AioBaseClient, "_make_api_call", counted)
    return counter


def _store(table: str, clocks: _Clocks, client: Any) -> DynamoDBDurableStore:
    """Another store on the same table: another process, with its own memory of META."""
    return DynamoDBDurableStore(table, clock=clocks.store, wall_clock=clocks.wall, client=client)


def _entity(kind: str, value: str, index: int, clocks: _Clocks) -> ActiveEntity:
    return ActiveEntity(kind=kind, value=value, turn_index=index, updated_at=clocks.store.now())


async def test_a_turn_is_one_request_with_its_entity_change(
    table: str, clocks: _Clocks, raw_client: Any, requests: _Requests
) -> None:
    durable = _store(table, clocks, raw_client)
    sid, later = fresh_id("s"), clocks.store.now() + DAY
    await durable.register_session(_ref(sid, fresh_id("u"), clocks), expires_at=later)
    assert requests.take() == ["TransactWriteItems"]
    for i in range(3):
        stored = await durable.append_turns(
            sid, [text_turn(f"plain {i}")], first_index=i, expires_at=later
        )
        assert [t.index for t in stored] == [i]
        assert requests.take() == ["TransactWriteItems"]
    # No first_index: the remembered counter is used all the same.
    await durable.append_turns(sid, [text_turn("unpinned")], expires_at=later)
    assert requests.take() == ["TransactWriteItems"]
    # An entity change rides in the append's transaction, the first one (the record is
    # created) and the next ones (it is merged, from what this store wrote last).
    series = _entity("series", "Berserk", 4, clocks)
    await durable.append_turns(
        sid,
        [text_turn("Berserk")],
        first_index=4,
        expires_at=later,
        entities=EntityChange(upsert={"series": series}),
    )
    assert requests.take() == ["TransactWriteItems"]
    volume = _entity("volume", "42", 5, clocks)
    await durable.append_turns(
        sid,
        [text_turn("vol 42")],
        first_index=5,
        expires_at=later,
        entities=EntityChange(upsert={"volume": volume}),
    )
    assert requests.take() == ["TransactWriteItems"]
    record = await durable.get_record(sid, ENTITIES_RECORD)
    assert record is not None
    assert record.version == 2
    assert record.data == {
        "series": series.model_dump(mode="json"),
        "volume": volume.model_dump(mode="json"),
    }
    assert [t.index for t in await durable.get_turns(sid)] == list(range(6))
    requests.take()
    # A store that has never seen the session reads META first, once.
    fresh = _store(table, clocks, raw_client)
    await fresh.append_turns(sid, [text_turn("cold")], first_index=6, expires_at=later)
    assert requests.take() == ["GetItem", "TransactWriteItems"]
    await fresh.append_turns(sid, [text_turn("warm")], first_index=7, expires_at=later)
    assert requests.take() == ["TransactWriteItems"]


async def test_a_stale_counter_costs_one_request_and_the_conflict_says_the_index(
    table: str, clocks: _Clocks, raw_client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clocks, raw_client), _store(table, clocks, raw_client)
    sid, later = fresh_id("s"), clocks.store.now() + DAY
    await mine.append_turns(sid, [text_turn("0")], first_index=0, expires_at=later)
    await theirs.append_turns(sid, [text_turn("1")], first_index=1, expires_at=later)
    requests.take()
    # Mine remembers next index 1; the failed transaction returns META, which says 2.
    with pytest.raises(ConflictError) as conflict:
        await mine.append_turns(sid, [text_turn("x")], first_index=1, expires_at=later)
    assert conflict.value.actual == 2
    assert requests.take() == ["TransactWriteItems"]
    stored = await mine.append_turns(sid, [text_turn("2")], first_index=2, expires_at=later)
    assert [t.index for t in stored] == [2]
    assert requests.take() == ["TransactWriteItems"]
    # Unpinned, a stale memory is one failed transaction and one that succeeds.
    await theirs.append_turns(sid, [text_turn("3")], expires_at=later)
    requests.take()
    stored = await mine.append_turns(sid, [text_turn("4")], expires_at=later)
    assert [t.index for t in stored] == [4]
    assert requests.take() == ["TransactWriteItems", "TransactWriteItems"]
    assert [t.text for t in await mine.get_turns(sid)] == ["0", "1", "2", "3", "4"]


async def test_an_entity_change_never_merges_into_a_stale_copy_of_the_record(
    table: str, clocks: _Clocks, raw_client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clocks, raw_client), _store(table, clocks, raw_client)
    sid, later = fresh_id("s"), clocks.store.now() + DAY
    series = _entity("series", "Berserk", 0, clocks)
    await mine.append_turns(
        sid, [text_turn("a")], expires_at=later, entities=EntityChange(upsert={"series": series})
    )
    order = _entity("order", "ORD-1", 1, clocks)
    await theirs.append_turns(
        sid, [text_turn("b")], expires_at=later, entities=EntityChange(upsert={"order": order})
    )
    requests.take()
    # Mine remembers the record without "order": its transaction fails on META, the
    # record is read again, and the merge keeps the other store's kind.
    volume = _entity("volume", "42", 2, clocks)
    await mine.append_turns(
        sid, [text_turn("c")], expires_at=later, entities=EntityChange(upsert={"volume": volume})
    )
    assert requests.take() == ["TransactWriteItems", "Query", "TransactWriteItems"]
    # Records written with put_record are merged the same way, one version up each.
    got = await theirs.get_record(sid, ENTITIES_RECORD)
    assert got is not None
    assert got.version == 3
    assert sorted(got.data) == ["order", "series", "volume"]
    await theirs.put_record(
        sid, ENTITIES_RECORD, {"series": got.data["series"]}, expected_version=3
    )
    await mine.append_turns(
        sid, [text_turn("d")], expires_at=later, entities=EntityChange(remove=("series",))
    )
    final = await mine.get_record(sid, ENTITIES_RECORD)
    assert final is not None
    assert (final.version, final.data) == (5, {})


async def test_a_hot_append_carries_its_entity_change(
    hot: DynamoDBHotStore, clocks: _Clocks, requests: _Requests
) -> None:
    sid, later = fresh_id("s"), clocks.store.now() + HOUR
    await hot.append_turns(sid, [text_turn("a")], window=5, expires_at=later)
    requests.take()
    series = _entity("series", "Berserk", 1, clocks)
    result = await hot.append_turns(
        sid,
        [text_turn("Berserk")],
        window=5,
        expires_at=later,
        entities=EntityChange(upsert={"series": series}),
    )
    assert result.version == 2
    assert requests.take() == ["GetItem", "TransactWriteItems"]
    snap = await hot.load(sid)
    assert snap is not None
    assert snap.entities == {"series": series}


async def test_purge_leaves_a_session_that_another_user_owns_now(
    durable: DynamoDBDurableStore, raw_client: Any, table: str, clocks: _Clocks
) -> None:
    sid, first, second = fresh_id("s"), fresh_id("u"), fresh_id("u")
    await durable.register_session(_ref(sid, first, clocks), expires_at=clocks.store.now() + HOUR)
    clocks.advance(2 * HOUR)
    taken = _ref(sid, second, clocks)
    assert await durable.register_session(taken, expires_at=clocks.store.now() + DAY) == taken
    await durable.append_turns(sid, [text_turn("second's")], expires_at=clocks.store.now() + DAY)
    await durable.put_record(sid, "summary", {"by": "second"})
    assert await durable.purge_user(first) == 1
    assert await durable.get_session(sid) == taken
    assert [t.text for t in await durable.get_turns(sid)] == ["second's"]
    assert await durable.get_record(sid, "summary") is not None
    assert await durable.list_sessions(first) == []
    assert [r.session_id for r in await durable.list_sessions(second)] == [sid]
    items = await _items(raw_client, table, f"S#{sid}")
    assert f"USER#{first}" not in items
    assert await durable.purge_user(second) == 1
    assert await _items(raw_client, table, f"S#{sid}") == {}


async def test_restore_whose_turns_end_before_next_index_keeps_the_gap(
    hot: DynamoDBHotStore, raw_client: Any, table: str, clocks: _Clocks
) -> None:
    sid = fresh_id("s")
    now = clocks.store.now()
    metadata = SessionMetadata(session_id=sid, user_id="u", created_at=now, last_activity=now)
    turns = [text_turn(f"t{i}").with_index(i) for i in range(3)]
    await hot.restore(
        sid,
        turns=turns,
        next_index=5,
        metadata=metadata,
        entities={},
        state={},
        window=5,
        expires_at=now + HOUR,
    )
    snap = await hot.load(sid)
    assert snap is not None
    assert [t.index for t in snap.turns] == [0, 1, 2]
    assert snap.next_index == 5
    windows = []
    for text in ("t5", "t6", "t7", "t8", "t9"):
        result = await hot.append_turns(
            sid, [text_turn(text)], window=5, expires_at=clocks.store.now() + HOUR
        )
        assert result.turns[0].text == text
        snap = await hot.load(sid)
        assert snap is not None
        windows.append([t.index for t in snap.turns])
    assert windows == [
        [0, 1, 2, 5],
        [0, 1, 2, 5, 6],
        [1, 2, 5, 6, 7],
        [2, 5, 6, 7, 8],
        [5, 6, 7, 8, 9],
    ]
    items = await _items(raw_client, table, f"H#{sid}")
    assert "gl" not in items["META"]
    assert sorted(sk for sk in items if sk.startswith("T#")) == [
        f"T#{i:012d}" for i in range(5, 10)
    ]


async def test_the_owner_registering_a_dead_session_again_is_listed_once(
    durable: DynamoDBDurableStore, clocks: _Clocks, spy: _Spy
) -> None:
    sid, user = fresh_id("s"), fresh_id("u")
    first = _ref(sid, user, clocks)
    await durable.register_session(first, expires_at=clocks.store.now() + HOUR)
    clocks.advance(2 * HOUR)
    spy.take()
    again = _ref(sid, user, clocks)
    assert await durable.register_session(again, expires_at=clocks.store.now() + HOUR) == again
    # The blind attempt's cancellation returned META and said the user is listed already:
    # one more write (META alone, so a PutItem), no read.
    assert spy.take() == ["transact_write_items", "put_item"]
    assert await durable.get_session(sid) == again
    assert await durable.list_sessions(user) == [first]


async def test_hot_writes_that_never_start_a_session_leave_an_expired_one_untouched(
    hot: DynamoDBHotStore, raw_client: Any, table: str, clocks: _Clocks
) -> None:
    sid = fresh_id("s")
    now = clocks.store.now()
    await hot.append_turns(sid, [text_turn("a")], window=5, expires_at=now + HOUR)
    clocks.advance(2 * HOUR)
    before = await _items(raw_client, table, f"H#{sid}")
    entity = ActiveEntity(kind="series", value="Berserk", updated_at=clocks.store.now())
    later = clocks.store.now() + HOUR
    assert await hot.update_entities(sid, {"series": entity}, expires_at=later) is None
    blob = StateBlob(name="dialogue", data={"p": 1}, version=3, updated_at=clocks.store.now())
    assert await hot.copy_state(sid, blob, expires_at=later) is False
    assert await _items(raw_client, table, f"H#{sid}") == before
    assert await hot.load(sid) is None


async def test_a_restore_too_big_for_one_transaction_writes_nothing(
    hot: DynamoDBHotStore, clocks: _Clocks
) -> None:
    sid = fresh_id("s")
    now = clocks.store.now()
    rng = random.Random(9)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    # 20 incompressible turns of 300 KB: over DynamoDB's 4 MB per transaction.
    turns = [
        text_turn("".join(rng.choice(alphabet) for _ in range(300_000))).with_index(i)
        for i in range(20)
    ]
    metadata = SessionMetadata(session_id=sid, user_id="u", created_at=now, last_activity=now)
    with pytest.raises(ValidationError, match="smaller window"):
        await hot.restore(
            sid,
            turns=turns,
            next_index=20,
            metadata=metadata,
            entities={},
            state={},
            window=20,
            expires_at=now + HOUR,
        )
    assert await hot.load(sid) is None
