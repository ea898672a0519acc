"""Round trips of ``Session.context()`` without a query, per pairing (issue #10).

Not timed: each client's door is wrapped (:class:`tiermem.testing.round_trips.RoundTrips`)
and one warm ``context()`` of a summarized session is counted (the hot window plus the
summary, structured-memory and watermark records). A change that adds a round trip to the
read path fails here. Each expectation is an upper bound; where a pairing is not at one
round trip, the reason is written beside it. Pairings are built as the composition root
builds them (one server, one key prefix when both roles use the same backend).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Pairing, open_composed_pairing
from tiermem.service import MemoryService
from tiermem.session import Session, TurnInput
from tiermem.summaries import SummaryPolicy
from tiermem.testing.round_trips import RoundTrips

EXPECTED: dict[str, int] = {
    # The hot tier in process; one SQLite read per record (three hand-offs to the store's
    # thread). Target: one read for the three.
    "memory+sqlite": 3,
    # At target: one pipeline holds the hot load script and the three record reads
    # (RedisHotStore.load_with_records).
    "redis+redis": 1,
    # One EVALSHA, and the three record reads, started together, share one BatchGetItem
    # (the header and the records) in the DynamoDB store: two requests, sent concurrently.
    "redis+dynamodb": 2,
    # Two stores on one file (not a deployment the issue targets): the hot read + 3.
    "sqlite+sqlite": 4,
}


async def _summarized(memory: MemoryService) -> Session:
    session = await memory.session(user_id="u-context-trips")
    await session.add_turns(
        [
            TurnInput(
                role="user" if i % 2 == 0 else "assistant",
                content=f"Turn {i}: my budget for the Vagabond box set is 120 EUR.",
            )
            for i in range(24)
        ]
    )
    await memory.drain()
    await session.summaries(wait_through=23)
    return session


def _service(pairing: Pairing) -> MemoryService:
    return pairing.service(
        summary_policy=SummaryPolicy(min_preservation=0.0, recover_preservation=0.0),
        auto_detect=False,
    )


@pytest.mark.parametrize("pairing_name", list(EXPECTED))
async def test_context_without_a_query_round_trips(pairing_name: str, tmp_path: Path) -> None:
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = _service(pairing)
        session = await _summarized(memory)
        await session.context()  # warm: scripts loaded, snapshot and sections cached
        trips = RoundTrips()
        with trips.counting():
            window = await session.context()
        await memory.aclose()
    assert any(i.kind == "summary" for i in window.items), "the records were not read"
    assert any(i.kind == "turn" for i in window.items)
    assert trips.total >= 1, "a pairing with a server or a file is never free"
    assert trips.total <= EXPECTED[pairing_name], dict(trips.counts)


# Redis Cluster: the same combined pipeline (the session's hot and durable keys share a
# hash tag, hence a slot); the counter cannot see a cluster pipeline, so it is checked for
# what it returns only.
@pytest.mark.parametrize(
    "pairing_name", ["redis+redis", "redis-cluster+redis-cluster", "memory+sqlite"]
)
async def test_context_after_a_hot_miss_is_the_same_window(
    pairing_name: str, tmp_path: Path
) -> None:
    # The combined read answers a lost hot session with the records alone: the window is
    # rebuilt from the durable tier, summaries included, exactly as before the loss.
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = _service(pairing)
        session = await _summarized(memory)
        before = await session.context()
        await pairing.hot.delete(session.id)
        after = await session.context()
        stats = await session.stats()
        await memory.aclose()
    assert memory.tiers.metrics.reloads >= 1
    assert stats.served_from == "hot"  # restored by the reload
    assert after.items == before.items
