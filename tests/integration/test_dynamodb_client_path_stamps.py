"""A record write and an append that cross keep what the store knows of the session's
records (issue #8). Runs against DynamoDB Local (``TIERMEM_TEST_DYNAMODB_URL``).

When a background record write (a summary) and a turn's append cross, one of the two
transactions fails on META and its cancellation returns the new META. The store used to
forget its record stamps then, so the next ``put_record`` of the session read META and the
record first (2 GetItems); it now keeps them (a stale stamp still costs only one failed
write, never a lost update: the write is conditioned on the record's tag).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.backends.dynamodb import dynamodb_session, shared_table
from tests.conftest import server_url
from tiermem.clock import FakeClock
from tiermem.models import ActiveEntity
from tiermem.store.backends.dynamodb import DynamoDBDurableStore
from tiermem.store.contract import ENTITIES_RECORD, EntityChange
from tiermem.testing.backend import fresh_id, text_turn

pytestmark = pytest.mark.dynamodb

DAY = timedelta(days=1)


class _Requests:
    """DynamoDB requests by operation, counted at aiobotocore's one door."""

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


@pytest.fixture
async def table() -> str:
    return await shared_table(server_url("dynamodb"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2030, 1, 1, tzinfo=UTC))


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    async with dynamodb_session().client("dynamodb", endpoint_url=server_url("dynamodb")) as c:
        yield c


def _store(table: str, clock: FakeClock, client: Any) -> DynamoDBDurableStore:
    """A store of its own: another process (or another task's view), with its own memory."""
    return DynamoDBDurableStore(table, clock=clock, wall_clock=clock, client=client)


async def test_a_record_write_that_an_append_overtook_goes_again_without_reads(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.put_record(sid, "summary", {"n": 1}, expires_at=later)
    await theirs.append_turns(sid, [text_turn("moves META on")], expires_at=later)
    requests.take()
    # Mine's transaction fails on META only; the cancellation carries META and the
    # record's stamp still holds: the retry needs no read.
    record = await mine.put_record(sid, "summary", {"n": 2})
    assert requests.take() == ["TransactWriteItems", "TransactWriteItems"]
    assert (record.version, record.data) == (2, {"n": 2})
    got = await theirs.get_record(sid, "summary")
    assert got is not None
    assert (got.version, got.data) == (2, {"n": 2})
    turns = await theirs.get_turns(sid)
    assert [t.index for t in turns] == [0]
    assert await mine.next_index(sid) == 1


async def test_an_append_that_a_record_write_overtook_keeps_the_record_stamps(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.put_record(sid, "summary", {"n": 1}, expires_at=later)
    await mine.append_turns(sid, [text_turn("first")], expires_at=later)
    await theirs.put_record(sid, "structured", {"s": 1}, expires_at=later)
    requests.take()
    appended = await mine.append_turns(sid, [text_turn("second")], expires_at=later)
    assert [t.index for t in appended] == [1]
    assert requests.take() == ["TransactWriteItems", "TransactWriteItems"]
    # The summary's stamp survived the failed append: one request, no reads.
    record = await mine.put_record(sid, "summary", {"n": 2})
    assert requests.take() == ["TransactWriteItems"]
    assert record.version == 2
    structured = await mine.get_record(sid, "structured")
    assert structured is not None
    assert (structured.version, structured.data) == (1, {"s": 1})


async def test_a_kept_stamp_that_went_stale_never_loses_the_other_write(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.put_record(sid, "summary", {"by": "mine"}, expires_at=later)
    await mine.append_turns(sid, [text_turn("first")], expires_at=later)
    await theirs.put_record(sid, "summary", {"by": "theirs"}, expires_at=later)
    # Mine's append fails on META and keeps its (now stale) stamp of the summary.
    await mine.append_turns(sid, [text_turn("second")], expires_at=later)
    requests.take()
    record = await mine.put_record(sid, "summary", {"by": "mine again"}, expected_version=2)
    assert record.version == 3
    assert "GetItem" in requests.take()  # the stale stamp failed, then it read
    got = await theirs.get_record(sid, "summary")
    assert got is not None
    assert (got.version, got.data) == (3, {"by": "mine again"})


def _change(clock: FakeClock, kind: str, value: str, index: int) -> EntityChange:
    entity = ActiveEntity(kind=kind, value=value, turn_index=index, updated_at=clock.now())
    return EntityChange(upsert={kind: entity})


async def test_an_entity_change_after_a_crossed_append_merges_without_a_query(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.append_turns(
        sid, [text_turn("Berserk")], expires_at=later, entities=_change(clock, "series", "B", 0)
    )
    await theirs.put_record(sid, "summary", {"n": 1}, expires_at=later)
    requests.take()
    # META moved (a summary), the entities record did not: the retry merges into the
    # remembered record, no Query.
    await mine.append_turns(
        sid, [text_turn("vol 42")], expires_at=later, entities=_change(clock, "volume", "42", 1)
    )
    assert requests.take() == ["TransactWriteItems", "TransactWriteItems"]
    record = await theirs.get_record(sid, ENTITIES_RECORD)
    assert record is not None
    assert (record.version, sorted(record.data)) == (2, ["series", "volume"])


async def test_a_remembered_entities_record_that_went_stale_is_read_again_not_lost(
    table: str, clock: FakeClock, client: Any, requests: _Requests
) -> None:
    mine, theirs = _store(table, clock, client), _store(table, clock, client)
    sid, later = fresh_id("s"), clock.now() + DAY
    await mine.append_turns(
        sid, [text_turn("Berserk")], expires_at=later, entities=_change(clock, "series", "B", 0)
    )
    # Theirs changes the entities record itself (and so META).
    await theirs.append_turns(
        sid, [text_turn("Guts")], expires_at=later, entities=_change(clock, "hero", "Guts", 1)
    )
    await mine.append_turns(
        sid, [text_turn("vol 42")], expires_at=later, entities=_change(clock, "volume", "42", 2)
    )
    assert "Query" in requests.take()  # the remembered record was stale: read, then merged
    record = await theirs.get_record(sid, ENTITIES_RECORD)
    assert record is not None
    assert (record.version, sorted(record.data)) == (3, ["hero", "series", "volume"])
