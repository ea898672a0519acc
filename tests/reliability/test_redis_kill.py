"""kill -9 of the hot tier's redis-server during a 10,000-turn load, write-through.

Extends tests/integration/test_hot_failure.py (a clean stop between two single turns) to
the hard case: a redis-server of the test's own dies by SIGKILL while many sessions are
appending at once (commands in flight, connections reset), stays down while the load goes
on, and comes back empty (no persistence), as a crashed cache does. What must hold:

* every acknowledged turn is in the durable tier, under the index it was acknowledged
  with, and every session's indexes are gap-free (0 acknowledged turns lost);
* while Redis is down the service answers from the durable tier (reads and writes);
* after the restart sessions reload from the durable tier and are hot again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.integration.conftest import open_role
from tests.reliability.conftest import KillableRedis
from tiermem.models import Turn
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.store.backends.redis import RedisHotStore
from tiermem.testing import FakeClock
from tiermem.tiers import SessionTierConfig, WritePolicy

pytestmark = pytest.mark.slow

TOTAL_TURNS = {"sqlite": 10_000, "dynamodb": 600}
"""Turns per load. DynamoDB Local takes ~10 ms a transaction on a shared 2-core runner, so
its run is shorter; the 10k run is on SQLite (the fault is Redis's, not the archive's)."""
SESSIONS = 16
WINDOW = 10


@pytest.fixture(params=["sqlite", "dynamodb"])
def durable_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_kill_9_redis_during_a_10k_turn_load_loses_no_acknowledged_turn(
    own_redis: KillableRedis, durable_name: str, tmp_path: Path
) -> None:
    total = TOTAL_TURNS[durable_name]
    clock = FakeClock()
    hot = RedisHotStore.from_url(own_redis.url, clock=clock, prefix="kill9")
    durable = await open_role(durable_name, "durable", clock, tmp_path)
    memory = MemoryService(
        hot,
        durable,
        clock=clock,
        config=SessionTierConfig(window=WINDOW, write_policy=WritePolicy.WRITE_THROUGH),
        # The fault is in the session tier: keep the background jobs out of the way.
        index_turns=False,
        auto_detect=False,
        auto_summarize=False,
    )
    acked: dict[str, list[Turn]] = {}
    failed: list[BaseException] = []
    per_session = total // SESSIONS
    killed, restarted = asyncio.Event(), asyncio.Event()
    # Set when that share of the load is acknowledged: the fault's cue.
    milestones = {0.3: asyncio.Event(), 0.6: asyncio.Event()}

    async def load(session: Session) -> None:
        mine = acked.setdefault(session.id, [])
        for n in range(per_session):
            try:
                turn = await session.add_turn("user", f"{session.id} turn {n}")
            except Exception as exc:  # noqa: BLE001 -- an unacknowledged turn may fail; count it
                failed.append(exc)
                continue
            mine.append(turn)
            done = acked_count() / total
            for share, reached in milestones.items():
                if done >= share:
                    reached.set()
            await asyncio.sleep(0)

    def acked_count() -> int:
        return sum(len(turns) for turns in acked.values())

    async def fault() -> None:
        await milestones[0.3].wait()
        own_redis.kill()
        killed.set()
        # Down for a good part of the load: the service must carry on without it.
        await milestones[0.6].wait()
        down_probe = await memory.session(probe.id, user_id="u-probe")
        view = await down_probe.view()
        assert view.source == "durable"
        assert [t.text for t in view.turns] == [t.text for t in probe_turns[-WINDOW:]]
        probe_turns.append(await down_probe.add_turn("user", "probe during the outage"))
        own_redis.start()  # empty: SIGKILL took everything it had
        restarted.set()

    try:
        probe = await memory.session(user_id="u-probe")
        probe_turns = [await probe.add_turn("user", f"probe {i}") for i in range(15)]
        sessions = [await memory.session(user_id=f"u-{n % 4}") for n in range(SESSIONS)]
        await asyncio.gather(fault(), *(load(s) for s in sessions))
        assert killed.is_set()
        assert restarted.is_set()

        bypasses = memory.metrics.bypasses
        assert bypasses > 0, "the load never met the outage"
        # Every acknowledged turn is in the durable tier, at its index, with nothing between.
        lost = 0
        for session_id, turns in [*acked.items(), (probe.id, probe_turns)]:
            archived = await durable.get_turns(session_id, 0, None)
            assert [t.index for t in archived] == list(range(len(archived))), session_id
            by_index = {t.index: t.text for t in archived}
            lost += sum(by_index.get(t.index) != t.text for t in turns)
            # A turn the caller saw fail may or may not have been stored; an acknowledged
            # one always is, and nothing is stored twice.
            assert len({t.text for t in archived}) == len(archived), session_id
        assert lost == 0

        # After the restart: the probe (untouched since) reloads from the durable tier,
        # then reads hot; its window is exactly its last acknowledged turns.
        reloads = memory.metrics.reloads
        reopened = await memory.session(probe.id, user_id="u-probe")
        view = await reopened.view()
        assert view.source in ("reload", "hot")
        assert [t.text for t in view.turns] == [t.text for t in probe_turns[-WINDOW:]]
        assert memory.metrics.reloads > reloads or view.source == "hot"
        assert (await reopened.view()).source == "hot"
        for session in sessions:
            view = await (await memory.session(session.id, user_id=session.user_id)).view()
            assert view.source in ("reload", "hot")
            expected = acked[session.id][-WINDOW:]
            assert [t.index for t in view.turns][-len(expected) :] == [t.index for t in expected]
        print(  # the figures docs/reliability.md reports
            f"\n{durable_name}: {acked_count()} acknowledged, {len(failed)} refused, "
            f"{bypasses} bypasses, 0 lost"
        )
    finally:
        await memory.aclose()
