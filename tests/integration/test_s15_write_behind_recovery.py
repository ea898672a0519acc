"""Write-behind recovery after the hot tier lost or expired a session, on every backend.

Each test failed on the code before it (b54ac72), on every pairing:

* the rebuild after a loss read the hot session with ``include_expired`` and asked
  ``restore`` to replace that version, which the contract refuses for an expired session
  (it counts as absent: version 0): 32 conflicts with backoff sleeps, then a warning;
* past a :class:`~tiermem.policies.ttl.FixedTtl` deadline every hot write is expired on
  arrival, so that rebuild failed, fell back to writing the turn behind again, and looped
  for ever (32 sleeps a round, ~5 s each);
* a write-behind turn that re-created a lost hot session at the archive's own next index
  left a session without metadata, which the next read replaced with the durable view: the
  turn was gone, and the next turn got the same index;
* a read after the hot session expired, before the sweeper flushed it, reloaded from the
  durable tier and dropped the turns not flushed yet (the expired copy is held for the
  backend's gc grace precisely so that they can be);
* a keyed turn (written through: the durable tier numbers it) took the index of the first
  turn not flushed yet: that turn and the ones after it were lost or mixed with it;
* a plain turn after the hot session expired, before a sweep (``MemoryService`` runs
  none), started the hot session afresh over the held copy: the turns not flushed yet
  were dropped without a trace (``lost_turns`` stayed 0) and the turn took the index of
  the first of them (also on the commit that fixed the four above). Now the hot append
  keeps a held expired session (``keep_expired``, a conformance case of every backend),
  and the writer flushes it and reloads before appending.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import tiermem.tiers.tiered as tiered_module
from tests.integration.conftest import Pairing, open_composed_pairing, open_pairing
from tests.integration.test_session_integrity import SAME_BACKEND_PAIRINGS
from tiermem.clock import FakeClock
from tiermem.models import NewTurn, SessionMetadata, Turn
from tiermem.policies.ttl import FixedTtl, TtlPolicy
from tiermem.service import MemoryService
from tiermem.store.backends.dynamodb_hot import DynamoDBHotStore
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.backends.redis_hot import RedisHotStore
from tiermem.store.backends.sqlite import SQLiteHotStore
from tiermem.store.contract import Capability, EntityChange, HotAppendResult
from tiermem.testing.backend import fresh_id
from tiermem.testing.round_trips import RoundTrips
from tiermem.tiers import SessionTierConfig, WritePolicy

PAIRINGS = [*SAME_BACKEND_PAIRINGS, "memory+sqlite"]
MAX_PAUSES = 40
"""More backoff pauses than one version-checked loop takes: the old code's endless loop
past a fixed deadline is stopped here instead of hanging the run."""


@pytest.fixture(params=PAIRINGS)
async def every(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pairing]:
    async with open_pairing(request.param, tmp_path) as opened:
        yield opened


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counted: list[int] = []

    async def counted_pause(attempt: int, **_: float) -> None:
        counted.append(attempt)  # no real sleep
        if len(counted) > MAX_PAUSES:
            raise AssertionError(f"more than {MAX_PAUSES} backoff pauses: a retry loop")

    monkeypatch.setattr(tiered_module, "pause", counted_pause)
    return counted


def _write_behind(pairing: Pairing, ttl_policy: TtlPolicy | None = None) -> MemoryService:
    config = SessionTierConfig(
        window=10, write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5
    )
    return pairing.service(config, ttl_policy=ttl_policy, auto_detect=False, index_turns=False)


def _texts(turns: list[Turn] | tuple[Turn, ...]) -> list[str]:
    return [t.text for t in turns]


async def test_a_session_that_expires_before_its_rebuild_is_rebuilt_without_conflicts(
    every: Pairing,
    pauses: list[int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory = _write_behind(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(5):  # crosses write_behind_every: flushed
        await session.add_turn("user", f"before {i}")
    assert await every.durable.next_index(session.id) == 5
    await every.hot.delete(session.id)  # the hot tier lost the session
    real_append = every.hot.append_turns
    expired: list[int] = []

    async def append_then_expire(*args: object, **kwargs: object) -> HotAppendResult:
        result = await real_append(*args, **kwargs)  # type: ignore[arg-type]
        if result.version == 1 and not expired:
            # The re-created session expires before the writer rebuilds it (within the
            # gc grace: still held, readable with include_expired).
            held = await every.hot.load(session.id, include_expired=True)
            assert held is not None
            every.clock.advance(held.expires_at - every.clock.now() + timedelta(minutes=1))
            expired.append(result.version)
        return result

    monkeypatch.setattr(every.hot, "append_turns", append_then_expire)
    with caplog.at_level(logging.WARNING, logger=tiered_module.__name__):
        stored = await session.add_turn("user", "after the loss")
    monkeypatch.undo()

    assert expired == [1]
    assert pauses == []
    assert not [r for r in caplog.records if "kept changing" in r.getMessage()]
    assert stored.index == 5
    await session.close()
    archived = await every.durable.get_turns(session.id)
    assert _texts(archived) == [*(f"before {i}" for i in range(5)), "after the loss"]
    assert [t.index for t in archived] == list(range(6))
    assert _texts(await session.history()) == _texts(archived)


async def test_write_behind_past_a_fixed_deadline_archives_every_turn(
    every: Pairing, pauses: list[int]
) -> None:
    memory = _write_behind(every, FixedTtl(timedelta(minutes=30)))
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(7):  # 0-4 flushed; 5 and 6 only in the hot tier
        await session.add_turn("user", f"t{i}")
    assert await every.durable.next_index(session.id) == 5
    every.clock.advance(timedelta(minutes=31))  # past the deadline, within the gc grace

    late = await session.add_turn("user", "late")
    later = await session.add_turn("user", "later")

    assert pauses == []
    assert (late.index, later.index) == (7, 8)
    archived = await every.durable.get_turns(session.id)
    assert _texts(archived) == [*(f"t{i}" for i in range(7)), "late", "later"]
    assert [t.index for t in archived] == list(range(9))
    assert _texts(await session.history()) == _texts(archived)
    assert memory.metrics.lost_turns == 0


async def test_a_turn_that_recreates_a_lost_session_at_the_archive_index_is_kept(
    every: Pairing,
) -> None:
    memory = _write_behind(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(2):  # never flushed
        await session.add_turn("user", f"t{i}")
    await every.hot.delete(session.id)  # loses them (the documented loss window)

    after = await session.add_turn("user", "after the loss")
    assert after.index == 0  # the archive's next index: nothing had been flushed
    assert _texts(await session.history()) == ["after the loss"]
    again = await session.add_turn("user", "again")

    assert again.index == 1
    await session.close()
    archived = await every.durable.get_turns(session.id)
    assert _texts(archived) == ["after the loss", "again"]
    assert [t.index for t in archived] == [0, 1]


async def test_a_read_after_expiry_keeps_the_turns_not_flushed_yet(every: Pairing) -> None:
    memory = _write_behind(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(7):  # 0-4 flushed; 5 and 6 only in the hot tier
        await session.add_turn("user", f"t{i}")
    held = await every.hot.load(session.id, include_expired=True)
    assert held is not None
    # Expired, before any sweeper flushed it: held within the gc grace.
    every.clock.advance(held.expires_at - every.clock.now() + timedelta(minutes=1))

    history = await session.history()

    assert _texts(history) == [f"t{i}" for i in range(7)]
    after = await session.add_turn("user", "back")
    assert after.index == 7
    await session.close()
    archived = await every.durable.get_turns(session.id)
    assert _texts(archived) == [*(f"t{i}" for i in range(7)), "back"]
    assert [t.index for t in archived] == list(range(8))


async def test_a_keyed_turn_under_write_behind_keeps_the_unflushed_turns(every: Pairing) -> None:
    memory = _write_behind(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(7):  # 0-4 flushed; 5 and 6 only in the hot tier
        await session.add_turn("user", f"t{i}")

    keyed = await session.add_turn("user", "pay now", idempotency_key="pay-1")
    assert keyed.index == 7
    assert _texts(await session.history()) == [*(f"t{i}" for i in range(7)), "pay now"]
    after = await session.add_turn("assistant", "paid")
    retry = await session.add_turn("user", "pay now", idempotency_key="pay-1")

    assert after.index == 8
    assert retry == keyed
    await session.close()
    archived = await every.durable.get_turns(session.id)
    assert _texts(archived) == [*(f"t{i}" for i in range(7)), "pay now", "paid"]
    assert [t.index for t in archived] == list(range(9))
    assert _texts(await session.history()) == _texts(archived)


async def test_a_turn_to_a_session_the_durable_tier_forgot_is_not_written_twice(
    every: Pairing,
) -> None:
    config = SessionTierConfig(
        window=10,
        write_policy=WritePolicy.WRITE_BEHIND,
        write_behind_every=5,
        durable_ttl=timedelta(hours=1),
    )
    memory = every.service(config, auto_detect=False, index_turns=False, auto_summarize=False)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(6):
        await session.add_turn("user", f"t{i}")
    every.clock.advance(timedelta(days=40))  # both tiers' copies are gone

    await session.add_turn("user", "late")

    # Nothing to rebuild the hot session from: it keeps the turn once (it used to be
    # rebuilt from nothing and the turn written behind a second time).
    held = await every.hot.load(session.id)
    assert held is not None
    assert _texts(held.turns) == ["late"]


@pytest.mark.parametrize("written", [7, 3], ids=["some-flushed", "none-flushed"])
async def test_a_plain_turn_after_expiry_keeps_the_turns_not_flushed_yet(
    every: Pairing, pauses: list[int], written: int
) -> None:
    # No sweeper runs (MemoryService starts none): the next thing after the expiry is a
    # plain append. It used to start the hot session afresh over the held copy, dropping
    # the turns not flushed yet without a trace (lost_turns stayed 0), and rebuilt the
    # session from the archive.
    memory = _write_behind(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(written):  # flushed every 5: 0-4 archived, the rest only in the hot tier
        await session.add_turn("user", f"t{i}")
    assert await every.durable.next_index(session.id) == written // 5 * 5
    held = await every.hot.load(session.id, include_expired=True)
    assert held is not None
    every.clock.advance(held.expires_at - every.clock.now() + timedelta(minutes=1))
    assert await every.hot.load(session.id) is None  # expired; held within the gc grace

    back = await session.add_turn("user", "back")
    again = await session.add_turn("assistant", "again")

    assert (back.index, again.index) == (written, written + 1)
    assert pauses == []
    texts = [*(f"t{i}" for i in range(written)), "back", "again"]
    assert _texts(await session.history()) == texts
    await session.close()
    archived = await every.durable.get_turns(session.id)
    assert _texts(archived) == texts
    assert [t.index for t in archived] == list(range(written + 2))
    assert memory.metrics.lost_turns == 0


async def test_two_writers_after_expiry_keep_every_turn_once(
    every: Pairing, pauses: list[int]
) -> None:
    memory = _write_behind(every)
    sid, user = fresh_id("s"), fresh_id("u")
    first = await memory.session(sid, user_id=user)
    for i in range(7):  # 0-4 flushed; 5 and 6 only in the hot tier
        await first.add_turn("user", f"t{i}")
    second = await memory.session(sid, user_id=user)
    held = await every.hot.load(sid, include_expired=True)
    assert held is not None
    every.clock.advance(held.expires_at - every.clock.now() + timedelta(minutes=1))

    a, b = await asyncio.gather(first.add_turn("user", "a"), second.add_turn("user", "b"))

    assert sorted((a.index, b.index)) == [7, 8]
    await first.close()
    archived = await every.durable.get_turns(sid)
    assert _texts(archived)[:7] == [f"t{i}" for i in range(7)]
    assert sorted(_texts(archived)[7:]) == ["a", "b"]
    assert [t.index for t in archived] == list(range(9))
    assert memory.metrics.lost_turns == 0


@pytest.mark.parametrize(
    ("pairing_name", "expected"),
    [("memory+sqlite", 0), ("sqlite+sqlite", 1), ("redis+redis", 1), ("redis+dynamodb", 1)],
)
async def test_a_plain_write_behind_turn_is_still_one_hot_write(
    pairing_name: str, expected: int, tmp_path: Path
) -> None:
    # The hot append that keeps a held expired session costs nothing more on other turns
    # (Redis: a script of its own, still one EVALSHA).
    async with open_composed_pairing(pairing_name, tmp_path) as pairing:
        memory = _write_behind(pairing)
        session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
        await session.add_turn("user", "warm")
        await memory.drain()
        trips = RoundTrips()
        with trips.counting():
            await session.add_turn("user", "plain")
        await memory.aclose()
    assert trips.total == expected, dict(trips.counts)


class _HotStoreOfTheOldContract(MemoryHotStore):
    """A third-party hot store written before ``keep_expired``: its ``append_turns`` takes
    the arguments it took then, and it does not declare :attr:`Capability.KEEP_EXPIRED`."""

    capabilities = frozenset(MemoryHotStore.capabilities - {Capability.KEEP_EXPIRED})

    async def append_turns(  # type: ignore[override]
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        window: int,
        expires_at: datetime,
        first_index: int | None = None,
        metadata: SessionMetadata | None = None,
        expected_version: int | None = None,
        entities: EntityChange | None = None,
    ) -> HotAppendResult:
        return await super().append_turns(
            session_id,
            turns,
            window=window,
            expires_at=expires_at,
            first_index=first_index,
            metadata=metadata,
            expected_version=expected_version,
            entities=entities,
        )


async def test_write_behind_over_a_hot_store_without_keep_expired_still_appends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The tiers passed keep_expired to every hot store: one written to the contract before
    # it failed every write-behind turn with a TypeError. Now they pass it only to stores
    # declaring the capability, and say once what the store without it does not guard.
    clock = FakeClock()
    hot = _HotStoreOfTheOldContract(clock=clock)
    config = SessionTierConfig(
        window=10, write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5
    )
    with caplog.at_level(logging.WARNING, logger=tiered_module.__name__):
        memory = MemoryService(
            hot,
            MemoryDurableStore(clock=clock),
            clock=clock,
            config=config,
            auto_detect=False,
            index_turns=False,
        )
    assert [r for r in caplog.records if "does not declare keep_expired" in r.getMessage()]
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    stored = [await session.add_turn("user", f"t{i}") for i in range(7)]

    assert [t.index for t in stored] == list(range(7))
    assert _texts(await session.history()) == [f"t{i}" for i in range(7)]
    await session.close()
    await memory.aclose()


def test_every_built_in_hot_store_declares_keep_expired() -> None:
    # The tiers pass keep_expired only to stores declaring it: a built-in store that
    # stopped declaring it would lose write-behind turns after an expiry again.
    for store in (MemoryHotStore, SQLiteHotStore, RedisHotStore, DynamoDBHotStore):
        assert Capability.KEEP_EXPIRED in store.capabilities, store.__name__


@pytest.mark.parametrize("redacted", [3, 6], ids=["flushed", "not-flushed"])
async def test_redaction_under_write_behind_keeps_the_turns_not_flushed_yet(
    every: Pairing, redacted: int
) -> None:
    # The redaction rebuilt the hot window from the archive when it held the turn: the
    # turns not flushed yet were dropped (the next turn took the first of their indexes),
    # and a turn not flushed yet could not be redacted at all (the archive lacked it).
    memory = _write_behind(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(7):  # 0-4 flushed; 5 and 6 only in the hot tier
        await session.add_turn("user", f"t{i}")

    await session.redact_turn(redacted)
    after = await session.add_turn("user", "after")

    assert after.index == 7
    history = await session.history()
    assert [t.index for t in history] == list(range(8))
    assert [t.text for i, t in enumerate(history) if i != redacted] == [
        *(f"t{i}" for i in range(7) if i != redacted),
        "after",
    ]
    assert "t" + str(redacted) not in history[redacted].text
    await session.close()
    archived = await every.durable.get_turns(session.id)
    assert _texts(archived) == _texts(history)
    assert memory.metrics.lost_turns == 0
