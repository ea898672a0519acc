"""A DynamoDB append (or record write) that keeps losing to other processes backs off
(session 14, H3).

Appends of one process queue in a lane (test_dynamodb_append_lanes.py); a lost condition
then means another process wrote. The first loss on a header remembered from before the
call is only staleness and is retried at once; a loss on a header read during the call
means processes are racing right now, and each such retry waits first (capped
exponential backoff, full jitter) instead of meeting the others again in lockstep. The
pauses are injected (``retry_pause``), so nothing here waits. Runs against DynamoDB Local
(``TIERMEM_TEST_DYNAMODB_URL``), except the delay bounds.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.backends.dynamodb import dynamodb_session, shared_table
from tests.conftest import server_url
from tiermem.clock import FakeClock
from tiermem.errors import BackendError
from tiermem.store.backends.dynamodb import DynamoDBDurableStore
from tiermem.store.backends.dynamodb_table import MAX_ATTEMPTS, backoff_delay
from tiermem.testing.backend import fresh_id, text_turn

NOW = datetime(2030, 1, 1, tzinfo=UTC)


class _OtherProcess:
    """A client for store A that lets another store (another process) append to the same
    session just before each of A's next ``rounds`` transactions."""

    def __init__(self, client: Any, other: DynamoDBDurableStore, session_id: str) -> None:
        self._client = client
        self._other = other
        self._session = session_id
        self.rounds = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def transact_write_items(self, **kwargs: Any) -> Any:
        if self.rounds:
            self.rounds -= 1
            await self._other.append_turns(self._session, [text_turn("the other process")])
        return await self._client.transact_write_items(**kwargs)


class _Race:
    def __init__(
        self,
        store: DynamoDBDurableStore,
        other: _OtherProcess,
        other_store: DynamoDBDurableStore,
        session: str,
        pauses: list[int],
    ) -> None:
        self.store = store  # store A, whose pauses are recorded
        self.other = other
        self.other_store = other_store
        self.session = session
        self.pauses = pauses


@pytest.fixture
async def race() -> AsyncIterator[_Race]:
    endpoint = server_url("dynamodb")
    table = await shared_table(endpoint)
    clock = FakeClock(NOW)
    session = fresh_id("backoff")
    async with dynamodb_session().client("dynamodb", endpoint_url=endpoint) as client:
        other = DynamoDBDurableStore(table, clock=clock, wall_clock=clock, client=client)
        door = _OtherProcess(client, other, session)
        pauses: list[int] = []

        async def pause(attempt: int) -> None:
            pauses.append(attempt)

        store = DynamoDBDurableStore(
            table, clock=clock, wall_clock=clock, client=door, retry_pause=pause
        )
        yield _Race(store, door, other, session, pauses)


@pytest.mark.dynamodb
async def test_a_stale_header_is_retried_at_once(race: _Race) -> None:
    await race.store.append_turns(race.session, [text_turn("first")])  # remembered
    race.other.rounds = 1  # the other process appends once: the memory is stale
    (turn,) = await race.store.append_turns(race.session, [text_turn("mine")])
    assert turn.index == 2
    assert race.pauses == []


@pytest.mark.dynamodb
async def test_losing_again_on_a_fresh_header_pauses_with_growing_attempts(race: _Race) -> None:
    await race.store.append_turns(race.session, [text_turn("first")])
    race.other.rounds = 4  # stale once, then three losses on the header the loss returned
    (turn,) = await race.store.append_turns(race.session, [text_turn("mine")])
    assert turn.index == 5
    assert race.pauses == [1, 2, 3]
    texts = [t.text for t in await race.store.get_turns(race.session)]
    assert texts == ["first", *["the other process"] * 4, "mine"]


@pytest.mark.dynamodb
async def test_a_header_read_during_the_call_pauses_from_the_first_loss(race: _Race) -> None:
    # A never saw the session: it reads META first, so even its first loss is a race.
    await race.other_store.append_turns(race.session, [text_turn("first")])
    race.other.rounds = 2
    (turn,) = await race.store.append_turns(race.session, [text_turn("mine")])
    assert turn.index == 3
    assert race.pauses == [0, 1]


@pytest.mark.dynamodb
async def test_an_append_that_never_wins_gives_up_naming_the_session(race: _Race) -> None:
    await race.store.append_turns(race.session, [text_turn("first")])
    race.other.rounds = MAX_ATTEMPTS
    with pytest.raises(BackendError) as info:
        await race.store.append_turns(race.session, [text_turn("mine")])
    error = info.value
    assert error.retryable
    assert repr(race.session) in str(error)
    assert f"lost to concurrent writers {MAX_ATTEMPTS} times in a row" in str(error)
    assert "send each session's writes through one process" in str(error)
    assert race.pauses == list(range(1, MAX_ATTEMPTS - 1))  # none after the last attempt
    # Nothing of the failed append was written; the other process's turns all were.
    texts = [t.text for t in await race.store.get_turns(race.session)]
    assert texts == ["first", *["the other process"] * MAX_ATTEMPTS]


@pytest.mark.dynamodb
async def test_a_record_write_losing_again_to_appends_pauses(race: _Race) -> None:
    # The same rule for a record rewrite: the remembered META's loss goes again at once,
    # a loss on the META the cancellation returned waits first.
    await race.store.append_turns(race.session, [text_turn("first")])
    await race.store.put_record(race.session, "summary", {"n": 1})  # META and stamp known
    race.other.rounds = 3
    record = await race.store.put_record(race.session, "summary", {"n": 2})
    assert record.version == 2
    assert race.pauses == [1, 2]
    stored = await race.other_store.get_record(race.session, "summary")
    assert stored is not None
    assert stored.data == {"n": 2}
    assert len(await race.store.get_turns(race.session)) == 4


def test_backoff_delays_are_full_jitter_under_a_growing_cap() -> None:
    state = random.getstate()
    random.seed(14)
    try:
        for attempt, bound in [(0, 0.005), (1, 0.01), (3, 0.04), (6, 0.25), (40, 0.25)]:
            delays = [backoff_delay(attempt) for _ in range(400)]
            assert all(0.0 <= d <= bound for d in delays)
            # Full jitter: spread over the whole range, not clustered at the bound.
            assert min(delays) < 0.1 * bound
            assert max(delays) > 0.9 * bound
    finally:
        random.setstate(state)
