"""Round trips on the response path of a turn, counted per pairing (issue #8).

Not timed: each client's door is wrapped (:class:`tiermem.testing.round_trips.RoundTrips`)
and the calls of one ``add_turn`` and one ``history()`` are counted, background work
(indexing, detection) drained apart. A change that adds a round trip to a turn fails here.

Each expectation is an upper bound (an improvement passes); where a pairing is not at the
issue's target yet, the target is written beside it. The pairings are built as the
composition root builds them (one server or file when both roles use the same backend).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from tests.integration.conftest import open_composed_pairing
from tiermem.testing.round_trips import RoundTrips

PLAIN = "ok thanks"
WARM_ENTITY = "Your order ORD-12345 ships tomorrow."
ENTITY = "Do you have Berserk vol 42 in stock?"

# pairing → (plain add_turn, add_turn changing an entity, history()) round trips.
EXPECTED: dict[str, tuple[int, int, int]] = {
    # At target: one SQLite write (the archive append carries the entity record; group
    # commit may share its transaction), the hot tier in process.
    "memory+sqlite": (1, 1, 0),
    # At target: one EVALSHA archives the turn, appends it to the hot session and merges
    # the entity change (CombinedAppend); one EVALSHA reads the session.
    "redis+redis": (1, 1, 1),
    # Plain turn at target: one conditional TransactWriteItems at the handle's index (no
    # GetItem first) + one EVALSHA. Target for an entity turn: the same 2; today the
    # DynamoDB store may read the entities record first (a Query) to merge the change.
    "redis+dynamodb": (2, 3, 1),
    # Two stores on one file, one write each (not a deployment the issue targets).
    "sqlite+sqlite": (2, 2, 1),
}


async def _count(pairing_name: str, tmp_path: Path) -> tuple[Counter[str], ...]:
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = pairing.service()
        session = await memory.session(user_id="u-round-trips")
        # Warm both paths first: scripts loaded, statements prepared, first-write work done.
        await session.add_turn("user", "Hello!")
        await session.add_turn("assistant", WARM_ENTITY)
        await memory.drain()
        trips = RoundTrips()
        with trips.counting():
            await session.add_turn("assistant", PLAIN)
            plain = trips.reset()
            await memory.drain()
            trips.reset()
            await session.history()
            history = trips.reset()
            await session.add_turn("user", ENTITY)
            entity = trips.reset()
            await memory.drain()
        assert await session.active_entities(), "the entity turn changed no entity"
        await memory.aclose()
    return plain, entity, history


@pytest.mark.parametrize("pairing_name", list(EXPECTED))
async def test_round_trips_per_turn(pairing_name: str, tmp_path: Path) -> None:
    plain, entity, history = await _count(pairing_name, tmp_path)
    got = (sum(plain.values()), sum(entity.values()), sum(history.values()))
    expected = EXPECTED[pairing_name]
    detail = f"plain {dict(plain)}, entity {dict(entity)}, history {dict(history)}"
    assert got[0] <= expected[0], f"plain turn: {got[0]} round trips > {expected[0]}: {detail}"
    assert got[1] <= expected[1], f"entity turn: {got[1]} round trips > {expected[1]}: {detail}"
    assert got[2] <= expected[2], f"history(): {got[2]} round trips > {expected[2]}: {detail}"
    # The counter sees every call: a pairing with a server is never counted as free.
    assert got[0] >= 1


@pytest.mark.parametrize("pairing_name", list(EXPECTED))
async def test_a_deep_session_is_read_without_a_refresh_write(
    pairing_name: str, tmp_path: Path
) -> None:
    # The seed's table gives a standard session 45 minutes from its 10th turn. The append
    # must set that expiry itself; one set for a shallower session would make every read
    # refresh it, a write per read.
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = pairing.service()
        session = await memory.session(user_id="u-deep")
        for i in range(12):
            await session.add_turn("user", f"turn {i}")
        await memory.drain()
        trips = RoundTrips()
        with trips.counting():
            await session.history()
        assert trips.total <= EXPECTED[pairing_name][2], dict(trips.counts)
        stats = await session.stats()
        assert stats.expires_at == pairing.clock.now() + timedelta(minutes=45)
        await memory.aclose()
