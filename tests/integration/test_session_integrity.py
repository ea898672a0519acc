"""Session integrity through the public API (issue #7): ownership and lifetimes over time,
state versions across hot reloads, concurrent writers with a hot loss in the middle,
write-behind after a loss, idempotent retries.

Each test runs on every backend in both roles (memory, sqlite, redis, dynamodb) and on the
production pairing; time moves only through the fake clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.integration.conftest import Pairing, open_pairing
from tiermem.errors import ConflictError, NotFoundError, ValidationError
from tiermem.service import MemoryService
from tiermem.testing.backend import fresh_id
from tiermem.tiers import SessionTierConfig, WritePolicy
from tiermem.tiers.tiered import LOST_TURN_TEXT

SAME_BACKEND_PAIRINGS = [
    "memory+memory",
    "sqlite+sqlite",
    "redis+redis",
    "dynamodb+dynamodb",
    "redis+dynamodb",
    "redis-cluster+redis-cluster",
]


@pytest.fixture(params=SAME_BACKEND_PAIRINGS)
async def every(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pairing]:
    async with open_pairing(request.param, tmp_path) as opened:
        yield opened


def _service(pairing: Pairing, **config: object) -> MemoryService:
    return pairing.service(SessionTierConfig(**config), auto_detect=False, index_turns=False)  # type: ignore[arg-type]


# -- 1. ownership and record outlive the turns' retention ---------------------------------


async def test_a_session_used_for_26_hours_closes_and_keeps_its_owner(every: Pairing) -> None:
    memory = _service(every)
    sid, owner = fresh_id("s"), fresh_id("u")
    session = await memory.session(sid, user_id=owner)
    for i in range(78):  # a turn every 20 minutes for 26 hours
        every.clock.advance(20 * 60)
        await session.add_turn("user", f"message {i}")
    closed = await session.close()
    assert closed.closed_at is not None
    assert closed.turn_count == 78
    # Two hours later the hot copy has expired and so has the metadata record's original
    # retention; the session's latest turns are still archived, so it still belongs to its
    # owner and nobody else may open it.
    every.clock.advance(2 * 3600)
    with pytest.raises(ValidationError, match="another user"):
        await memory.session(sid, user_id=fresh_id("u"))
    again = await memory.session(sid, user_id=owner)
    history = await again.history()
    assert history[-1].text == "message 77"
    assert (await again.metadata()).user_id == owner
    # Once everything of it has expired, the id is free again: its summaries and handoff
    # record are the last to go (SummaryPolicy.record_retention, 30 days: docs/summaries.md).
    every.clock.advance(31 * 24 * 3600)
    stranger = fresh_id("u")
    fresh = await memory.session(sid, user_id=stranger)
    assert await fresh.get_turns() == []
    assert await fresh.history() == ()


async def test_two_users_opening_one_id_at_once_get_one_owner(every: Pairing) -> None:
    memory = _service(every)
    sid = fresh_id("s")
    users = [fresh_id("u") for _ in range(4)]
    results = await asyncio.gather(
        *(memory.session(sid, user_id=u) for u in users), return_exceptions=True
    )
    opened = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, ValidationError)]
    assert len(opened) == 1
    assert len(refused) == 3
    winner = opened[0].user_id
    for user in users:
        listed = await memory.list_sessions(user)
        assert [r.session_id for r in listed] == ([sid] if user == winner else [])


# -- 2. state versions survive a hot reload -------------------------------------------------


async def test_state_versions_continue_across_hot_reloads(every: Pairing) -> None:
    memory = _service(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    blob = None
    for n in range(5):
        blob = await session.put_state(
            "dialogue", {"step": n}, expected_version=blob.version if blob else 0
        )
    assert blob is not None
    assert blob.version == 5
    await every.hot.delete(session.id)  # the hot tier loses the session
    reloaded = await session.get_state("dialogue")
    assert reloaded == blob
    with pytest.raises(ConflictError):
        await session.put_state("dialogue", {"step": "stale"}, expected_version=1)
    six = await session.put_state("dialogue", {"step": 5}, expected_version=5)
    assert six.version == 6
    await every.hot.delete(session.id)
    assert await session.get_state("dialogue") == six
    assert memory.metrics.reloads == 2


# -- 3. concurrent writers with a hot loss in the middle ---------------------------------------


async def test_concurrent_writers_and_a_hot_loss_lose_nothing(every: Pairing) -> None:
    memory = _service(every, window=8)
    sid, user = fresh_id("s"), fresh_id("u")
    await memory.session(sid, user_id=user)
    acknowledged: list[int] = []

    async def writer(w: int) -> None:
        handle = await memory.session(sid, user_id=user)
        for i in range(6):
            turn = await handle.add_turn("user", f"writer {w} says {i}: Berserk vol {w}{i}")
            acknowledged.append(turn.index)
            await handle.set_entities({f"kind{w}": str(i)})
            await handle.update_metadata(attributes={f"w{w}": i})

    async def lose_hot() -> None:
        for _ in range(3):
            await asyncio.sleep(0.01)
            await every.hot.delete(sid)
            await memory.session(sid, user_id=user)  # a reader reloads meanwhile

    await asyncio.gather(*(writer(w) for w in range(4)), lose_hot())
    archived = await every.durable.get_turns(sid)
    assert [t.index for t in archived] == list(range(24))
    assert sorted(acknowledged) == list(range(24))
    view = await memory.tiers.view(sid)
    assert view is not None
    assert [t.index for t in view.turns] == list(range(16, 24))
    assert list(view.turns) == archived[-8:]
    assert {k: e.value for k, e in view.entities.items() if k.startswith("kind")} == {
        f"kind{w}": "5" for w in range(4)
    }
    assert view.metadata.attributes == {f"w{w}": 5 for w in range(4)}


# -- write-behind keeps flushing after the hot tier lost unflushed turns -------------------


async def test_write_behind_flush_continues_after_a_loss(every: Pairing) -> None:
    memory = _service(every, window=5, write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    for i in range(3):
        await session.add_turn("user", f"t{i}")
    assert await every.durable.next_index(session.id) == 0
    # The hot tier loses the two oldest unflushed turns (what a durable outage longer than
    # the window would cause): rebuild its copy without them.
    snap = await every.hot.load(session.id)
    assert snap is not None
    assert snap.metadata is not None
    await every.hot.restore(
        session.id,
        turns=snap.turns[2:],
        next_index=snap.next_index,
        metadata=snap.metadata,
        entities=snap.entities,
        state=snap.state,
        window=5,
        expires_at=snap.expires_at,
    )
    for i in range(3, 12):
        await session.add_turn("user", f"t{i}")
    await session.close()
    archived = await every.durable.get_turns(session.id)
    assert [t.index for t in archived] == list(range(12))
    assert [t.text for t in archived[:2]] == [LOST_TURN_TEXT, LOST_TURN_TEXT]
    assert [t.text for t in archived[2:]] == [f"t{i}" for i in range(2, 12)]
    assert memory.metrics.lost_turns == 2


# -- 4. retries never duplicate a turn ---------------------------------------------------------


async def test_a_retried_add_turn_returns_the_stored_turn(every: Pairing) -> None:
    memory = _service(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    await session.add_turn("user", "hello")
    first = await session.add_turn("user", "is vol 42 in stock?", idempotency_key="req-7")
    await every.hot.delete(session.id)  # the retry meets a reloaded hot tier
    retry = await session.add_turn("user", "is vol 42 in stock?", idempotency_key="req-7")
    assert retry == first
    results = await asyncio.gather(
        *(session.add_turn("assistant", "yes", idempotency_key="req-8") for _ in range(6))
    )
    assert len({t.index for t in results}) == 1
    texts = [t.text for t in await session.get_turns()]
    assert texts == ["hello", "is vol 42 in stock?", "yes"]
    assert [t.text for t in await session.history()] == texts


async def test_keyed_appends_are_written_through_under_write_behind(every: Pairing) -> None:
    memory = _service(every, window=5, write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    turn = await session.add_turn("user", "pay now", idempotency_key="pay-1")
    assert await every.durable.next_index(session.id) == 1
    again = await session.add_turn("user", "pay now", idempotency_key="pay-1")
    assert again == turn
    assert len(await session.get_turns()) == 1


async def test_keys_outlive_the_turn_retention_while_the_session_lives(every: Pairing) -> None:
    memory = _service(every, durable_ttl=timedelta(hours=1))
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    await session.add_turn("user", "once", idempotency_key="k")
    for i in range(4):
        every.clock.advance(30 * 60)
        await session.add_turn("user", f"later {i}")
    assert await every.durable.next_index(session.id) == 5
    with pytest.raises(NotFoundError, match="expired"):
        await session.add_turn("user", "once", idempotency_key="k")
    assert await every.durable.next_index(session.id) == 5


async def test_concurrent_write_behind_with_a_hot_loss_stays_gap_free(every: Pairing) -> None:
    memory = _service(every, window=10, write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5)
    sid, user = fresh_id("s"), fresh_id("u")
    await memory.session(sid, user_id=user)

    async def writer(w: int, count: int) -> None:
        handle = await memory.session(sid, user_id=user)
        for i in range(count):
            await handle.add_turn("user", f"w{w} t{i}")

    await asyncio.gather(*(writer(w, 4) for w in range(3)))
    await every.hot.delete(sid)  # loses whatever was not flushed yet (the documented window)
    await asyncio.gather(*(writer(w, 4) for w in range(3, 6)))
    handle = await memory.session(sid, user_id=user)
    await handle.close()
    archived = await every.durable.get_turns(sid)
    assert [t.index for t in archived] == list(range(len(archived)))
    lost = [t for t in archived if t.text == LOST_TURN_TEXT]
    assert len(lost) == memory.metrics.lost_turns
    written_after = {f"w{w} t{i}" for w in range(3, 6) for i in range(4)}
    assert written_after <= {t.text for t in archived}
    view = await memory.tiers.view(sid)
    assert view is not None
    assert list(view.turns) == archived[-10:]


async def test_a_turn_written_while_a_lost_hot_session_is_renumbered_is_kept(
    every: Pairing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministic form of the race above: after a hot loss, writer A's append re-creates
    the hot session (numbered from 0, not from the archive's next index); writer B appends
    on top of it before A rebuilds the session. B's turn must survive A's rebuild and be
    flushed with the archive's numbering."""
    memory = _service(every, window=10, write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5)
    sid, user = fresh_id("s"), fresh_id("u")
    first = await memory.session(sid, user_id=user)
    for i in range(5):  # crosses write_behind_every: flushed
        await first.add_turn("user", f"before {i}")
    assert await every.durable.next_index(sid) == 5
    a = await memory.session(sid, user_id=user)
    b = await memory.session(sid, user_id=user)
    await every.hot.delete(sid)
    real_append = every.hot.append_turns
    piled: list[int] = []

    async def append_then_pile(*args: object, **kwargs: object) -> object:
        result = await real_append(*args, **kwargs)  # type: ignore[arg-type]
        if result.version == 1 and not piled:
            piled.append(1)
            await b.add_turn("user", "from b")  # lands on the re-created session
        return result

    monkeypatch.setattr(every.hot, "append_turns", append_then_pile)
    stored = await a.add_turn("user", "from a")
    monkeypatch.undo()
    assert piled == [1]
    assert stored.index == 5
    await memory.tiers.flush(sid)
    archived = await every.durable.get_turns(sid)
    assert [t.text for t in archived] == [*(f"before {i}" for i in range(5)), "from a", "from b"]
    assert [t.index for t in archived] == list(range(7))
    assert memory.metrics.lost_turns == 0
    view = await memory.tiers.view(sid)
    assert view is not None
    assert list(view.turns) == archived


# -- 5. index documents of archived turns live as long as the turns ----------------------------


async def test_turn_documents_expire_with_their_turns_and_are_collected(every: Pairing) -> None:
    memory = every.service(SessionTierConfig(durable_ttl=timedelta(hours=2)), auto_detect=False)
    user = fresh_id("u")
    session = await memory.session(fresh_id("s"), user_id=user)
    await session.add_turn("user", "my order ORD-77123 never arrived")
    await memory.drain()
    hits = await memory.longterm.recall(user, "order never arrived", scope=("turn",))
    assert [h.provenance.turn_indexes for h in hits] == [(0,)]
    every.clock.advance(2 * 3600)
    assert await memory.longterm.recall(user, "order never arrived", scope=("turn",)) == []
    swept = await memory.sweeper(lambda view: asyncio.sleep(0)).sweep_once()
    assert swept.failed == ()
    assert await memory.longterm.index.collect_expired(1000) == 0  # the sweep took it


async def test_a_stale_hot_state_copy_is_repaired_by_the_conflict(every: Pairing) -> None:
    """A writer that died between its durable write and its hot copy leaves the hot copy a
    version behind; the caller's conflicting write repairs it, so a re-read succeeds."""
    memory = _service(every)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    one = await session.put_state("dialogue", {"step": 1}, expected_version=0)
    # The crash: the durable tier took version 2, the hot copy never did.
    await memory.tiers.durable.put_record(
        session.id,
        "state",
        {"dialogue": {"version": 2, "data": {"step": 2}, "updated_at": one.updated_at.isoformat()}},
        expires_at=memory.tiers.durable_expiry(),
    )
    stale = await session.get_state("dialogue")
    assert stale is not None
    assert stale.version == 1
    with pytest.raises(ConflictError):
        await session.put_state("dialogue", {"step": "x"}, expected_version=stale.version)
    fresh = await session.get_state("dialogue")
    assert fresh is not None
    assert fresh.version == 2
    three = await session.put_state("dialogue", {"step": 3}, expected_version=fresh.version)
    assert three.version == 3
