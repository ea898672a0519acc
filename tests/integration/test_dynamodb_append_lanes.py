"""Appends of one session from one process take turns instead of racing (issue #8's
concurrency test lost 60 rounds in a row on a loaded machine). Runs against DynamoDB Local.

Before the lane, eight tasks appending to one session through one store sent their
transactions at once: each round one won and the other seven lost their condition and
resent, so the store sent far more TransactWriteItems than it committed appends, and one
unlucky task could lose every round until it gave up. With the lane each append is sent
once; only another process's write can fail its condition.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
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

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every TransactWriteItems sent, counted at aiobotocore's one door."""
    from aiobotocore.client import AioBaseClient

    sent: list[str] = []
    original = AioBaseClient._make_api_call

    async def counted(self: Any, operation: str, params: Any) -> Any:
        if operation == "TransactWriteItems":
            sent.append(operation)
        return await original(self, operation, params)

    monkeypatch.setattr(AioBaseClient, "_make_api_call", counted)
    return sent


@pytest.fixture
async def store() -> AsyncIterator[DynamoDBDurableStore]:
    table = await shared_table(server_url("dynamodb"))
    clock = FakeClock(NOW)
    async with dynamodb_session().client("dynamodb", endpoint_url=server_url("dynamodb")) as c:
        yield DynamoDBDurableStore(table, clock=clock, wall_clock=clock, client=c)


async def test_concurrent_appends_of_one_session_send_one_transaction_each(
    store: DynamoDBDurableStore, transactions: list[str]
) -> None:
    session = fresh_id("lanes")
    await store.append_turns(session, [text_turn("first")])  # the header is known from here
    transactions.clear()

    async def writer(w: int) -> list[int]:
        indexes = []
        for i in range(6):
            (turn,) = await store.append_turns(session, [text_turn(f"writer {w} turn {i}")])
            indexes.append(turn.index)
        return indexes

    results = await asyncio.gather(*(writer(w) for w in range(8)))
    assert sorted(i for r in results for i in r) == list(range(1, 49))
    assert len(transactions) == 48  # one per append: no in-process race was lost
    assert len(store._lanes) == 0  # nothing kept once no append is in flight
    turns = await store.get_turns(session)
    assert [t.index for t in turns] == list(range(49))


async def test_appends_with_entity_changes_queue_too(
    store: DynamoDBDurableStore, transactions: list[str]
) -> None:
    session = fresh_id("lanes-entities")
    await store.append_turns(session, [text_turn("first")])
    transactions.clear()

    async def writer(w: int) -> None:
        entity = ActiveEntity(kind=f"k{w}", value=str(w), turn_index=0, updated_at=NOW)
        change = EntityChange(upsert={f"k{w}": entity})
        await store.append_turns(session, [text_turn(f"writer {w}")], entities=change)

    await asyncio.gather(*(writer(w) for w in range(6)))
    record = await store.get_record(session, ENTITIES_RECORD)
    assert record is not None
    assert {kind: e["value"] for kind, e in record.data.items()} == {
        f"k{w}": str(w) for w in range(6)
    }
    assert len(transactions) == 6


async def test_another_process_still_wins_by_condition(
    store: DynamoDBDurableStore, transactions: list[str]
) -> None:
    """The lane is per store: a second store (another process) still races, and its lost
    condition is resolved by the optimistic retry, never by the lane."""
    session = fresh_id("lanes-two")
    table = store._table
    other = DynamoDBDurableStore(
        table.name, clock=store._clock, wall_clock=store._wall_clock, client=table._client
    )
    await store.append_turns(session, [text_turn("first")])
    await other.append_turns(session, [text_turn("second")])  # store's header is now stale
    transactions.clear()
    (turn,) = await store.append_turns(session, [text_turn("third")])
    assert turn.index == 2
    assert len(transactions) == 2  # lost once to the other store, then committed
