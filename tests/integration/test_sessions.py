"""The session tier end to end, on every pairing users run (memory+sqlite, redis+dynamodb,
redis+sqlite): concurrency, reload, TTL policies, lifecycle, expiry handoff."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from tests.integration.conftest import Pairing
from tiermem.errors import ConflictError, NotFoundError, ValidationError
from tiermem.models import REDACTED_TEXT, SessionMetadata
from tiermem.policies.ttl import FixedTtl, SlidingTtl
from tiermem.tiers import SessionTierConfig, SessionView, WritePolicy


async def test_concurrent_turns_from_eight_tasks(pairing: Pairing) -> None:
    # 8 writers contend for the next index 40 times each (320 turns; 1,000 took 22-60 s
    # on DynamoDB Local and proved nothing more): indexes stay gap-free and unique, no
    # turn is lost, the hot window holds the latest 20 (the last write-behind flushes
    # included).
    memory = pairing.service()
    session = await memory.session(user_id="u-concurrency")
    writers, each = 8, 40
    total = writers * each

    async def writer(w: int) -> None:
        for i in range(each):
            await session.add_turn("user" if i % 2 else "assistant", f"writer {w} turn {i}")

    await asyncio.gather(*(writer(w) for w in range(writers)))
    turns = await session.get_turns()
    assert [t.index for t in turns] == list(range(total))
    texts = [t.text for t in turns]
    assert len(set(texts)) == total
    assert sorted(texts) == sorted(
        f"writer {w} turn {i}" for w in range(writers) for i in range(each)
    )
    history = await session.history()
    assert [t.index for t in history] == list(range(total - 20, total))
    assert (await session.metadata()).turn_count == total


async def test_add_turn_scores_counts_and_extracts(pairing: Pairing) -> None:
    memory = pairing.service()
    session = await memory.session("s-pipeline-" + pairing.name, user_id="u-1")
    greeting = await session.add_turn("user", "Hello!")
    pref = await session.add_turn("user", "I prefer seinen. Do you have vol. 42 in stock?")
    ja = await session.add_turn("user", "好きなジャンルはセイネンです")
    pinned = await session.add_turn("assistant", "Noted.", importance=0.95, pinned=True)
    assert [greeting.importance, pref.importance, ja.importance] == [0.1, 0.9, 0.9]
    assert (pinned.importance, pinned.pinned) == (0.95, True)
    assert pref.token_count > greeting.token_count > 0
    assert {(e.kind, e.value) for e in pref.entities} >= {("genre", "seinen"), ("volume", "42")}
    active = await session.active_entities()
    assert active["volume"].value == "42"
    assert active["volume"].turn_index == pref.index
    # A new value of a kind replaces the old one.
    await session.add_turn("user", "Actually, show me volume 7 instead")
    assert (await session.active_entities())["volume"].value == "7"


async def test_timestamps_supplied_by_caller_are_kept(pairing: Pairing) -> None:
    from datetime import UTC, datetime

    memory = pairing.service()
    session = await memory.session(user_id="u-import")
    at = datetime(2024, 10, 16, 10, 30, tzinfo=UTC)
    turn = await session.add_turn("user", "imported", timestamp=at)
    assert (await session.get_turn(turn.index)).timestamp == at


async def test_hot_miss_reloads_everything_from_durable(pairing: Pairing) -> None:
    memory = pairing.service(SessionTierConfig(window=5))
    session = await memory.session(user_id="u-reload")
    for i in range(8):
        await session.add_turn("user", f"I prefer seinen, message {i}")
    await session.update_metadata(active_intent="recommendation", cart_item_count=3)
    await session.put_state("dialogue", {"phase": "slot_filling"})
    await pairing.hot.delete(session.id)  # the hot tier forgets (eviction, restart, expiry)

    view = await session.view()
    assert view.source == "reload"
    assert [t.index for t in view.turns] == [3, 4, 5, 6, 7]
    assert view.metadata.active_intent == "recommendation"
    assert view.metadata.cart_item_count == 3
    assert view.metadata.turn_count == 8
    assert view.entities["genre"].value == "seinen"
    assert view.state["dialogue"].data == {"phase": "slot_filling"}
    assert memory.metrics.reloads == 1
    # The hot tier was rebuilt: the next read is a hit.
    assert (await session.view()).source == "hot"
    stats = await session.stats()
    assert stats.reloads == 1
    assert stats.turn_count == 8


async def test_appending_after_hot_loss_restores_the_window(pairing: Pairing) -> None:
    memory = pairing.service(SessionTierConfig(window=4))
    session = await memory.session(user_id="u-heal")
    for i in range(6):
        await session.add_turn("user", f"t{i}")
    await pairing.hot.delete(session.id)
    await session.add_turn("user", "t6")
    snap = await pairing.hot.load(session.id)
    assert snap is not None
    assert [t.text for t in snap.turns] == ["t3", "t4", "t5", "t6"]


async def test_two_devices_never_lose_a_metadata_update(pairing: Pairing) -> None:
    memory = pairing.service()
    phone = await memory.session("s-devices-" + pairing.name, user_id="u-1")
    laptop = await memory.session("s-devices-" + pairing.name, user_id="u-1")
    await asyncio.gather(
        *(phone.update_metadata(attributes={f"phone{i}": i}) for i in range(5)),
        *(laptop.update_metadata(attributes={f"laptop{i}": i}) for i in range(5)),
        phone.update_metadata(active_intent="order_tracking"),
        laptop.update_metadata(locale="ja-JP"),
    )
    for device in (phone, laptop):
        meta = await device.metadata()
        assert meta.active_intent == "order_tracking"
        assert meta.locale == "ja-JP"
        assert set(meta.attributes) == {f"{d}{i}" for d in ("phone", "laptop") for i in range(5)}
    await pairing.hot.delete(phone.id)
    reloaded = await phone.metadata()
    assert set(reloaded.attributes) == {f"{d}{i}" for d in ("phone", "laptop") for i in range(5)}


async def test_state_compare_and_set_through_the_tiers(pairing: Pairing) -> None:
    memory = pairing.service()
    session = await memory.session(user_id="u-state")
    first = await session.put_state("task", {"step": 0}, expected_version=0)
    with pytest.raises(ConflictError):
        await session.put_state("task", {"step": 9}, expected_version=0)
    second = await session.put_state("task", {"step": 1}, expected_version=first.version)
    assert (await session.get_state("task")) == second
    await pairing.hot.delete(session.id)
    assert (await session.get_state("task")).data == {"step": 1}  # type: ignore[union-attr]


async def test_reference_tracking_and_redaction(pairing: Pairing) -> None:
    memory = pairing.service(SessionTierConfig(window=3))
    session = await memory.session(user_id="u-refs")
    for i in range(10):
        await session.add_turn("user", f"message {i}")
    assert (await session.get_turn(2)).text == "message 2"
    assert [t.index for t in await session.get_turns(4, 7)] == [4, 5, 6]
    with pytest.raises(NotFoundError):
        await session.get_turn(10)
    redacted = await session.redact_turn(8)
    assert (redacted.index, redacted.redacted) == (8, True)
    assert (await session.get_turn(8)).text == REDACTED_TEXT
    history = await session.history()
    assert [t.index for t in history] == [7, 8, 9]
    assert history[1].text == REDACTED_TEXT


async def test_list_sessions_of_a_user(pairing: Pairing) -> None:
    memory = pairing.service()
    user = "u-list-" + pairing.name
    ids = []
    for _ in range(3):
        ids.append((await memory.session(user_id=user)).id)
        pairing.clock.advance(60)
    listed = await memory.list_sessions(user)
    assert [r.session_id for r in listed] == list(reversed(ids))
    with pytest.raises(ValidationError, match="another user"):
        await memory.session(ids[0], user_id="someone-else")


async def test_vip_ttl_extends_after_five_turns(pairing: Pairing) -> None:
    memory = pairing.service()
    session = await memory.session(user_id="u-vip", user_tier="vip")
    start = pairing.clock.now()
    for _ in range(4):
        await session.add_turn("user", "hello again")
    assert (await session.view()).expires_at == start + timedelta(hours=1)
    await session.add_turn("user", "and one more")
    assert (await session.view()).expires_at == start + timedelta(hours=2)


async def test_sliding_ttl_refreshes_on_read(pairing: Pairing) -> None:
    memory = pairing.service(ttl_policy=SlidingTtl(timedelta(minutes=30)))
    session = await memory.session(user_id="u-sliding")
    await session.add_turn("user", "hi")
    pairing.clock.advance(25 * 60)
    await session.history()  # a read refreshes the window
    pairing.clock.advance(25 * 60)
    assert (await pairing.hot.load(session.id)) is not None
    pairing.clock.advance(31 * 60)
    assert (await pairing.hot.load(session.id)) is None
    # The durable tier still has it: the next read reloads.
    assert (await session.view()).source == "reload"


async def test_fixed_ttl_ignores_activity(pairing: Pairing) -> None:
    memory = pairing.service(ttl_policy=FixedTtl(timedelta(minutes=30)))
    session = await memory.session(user_id="u-fixed")
    for _ in range(3):
        await session.add_turn("user", "still here")
        pairing.clock.advance(10 * 60)
    assert (await pairing.hot.load(session.id)) is None


async def test_close_and_clear(pairing: Pairing) -> None:
    memory = pairing.service()
    session = await memory.session(user_id="u-close")
    await session.add_turn("user", "bye")
    closed = await session.close()
    assert closed.closed_at == pairing.clock.now()
    await session.clear()
    assert await pairing.hot.load(session.id) is None
    assert await pairing.durable.get_turns(session.id) == []
    assert session.id not in [r.session_id for r in await memory.list_sessions("u-close")]


async def test_hundred_sessions_three_sweepers_each_handed_off_once(pairing: Pairing) -> None:
    memory = pairing.service()
    user = "u-sweep-" + pairing.name
    ids = set()
    for i in range(100):
        session = await memory.session(user_id=user)
        await session.add_turn("user", f"session {i}")
        ids.add(session.id)
    pairing.clock.advance(timedelta(hours=3))
    handed: list[str] = []

    async def handoff(view: SessionView) -> None:
        handed.append(view.metadata.session_id)
        await asyncio.sleep(0)  # let the other sweepers interleave

    sweepers = [memory.sweeper(handoff, owner=f"worker-{w}") for w in range(3)]
    for _ in range(5):
        await asyncio.gather(*(s.sweep_once(limit=10_000) for s in sweepers))
    mine = [sid for sid in handed if sid in ids]
    assert sorted(mine) == sorted(ids)
    assert len(mine) == len(set(mine)) == 100


async def test_sweeper_retries_after_a_crashed_worker(pairing: Pairing) -> None:
    memory = pairing.service()
    session = await memory.session(user_id="u-crash")
    await session.add_turn("user", "hi")
    pairing.clock.advance(timedelta(hours=3))

    async def crash(view: SessionView) -> None:
        raise ConflictError("worker died mid-handoff")

    first = await memory.sweeper(crash, owner="crashy").sweep_once(limit=10_000)
    assert session.id in first.failed
    got: list[str] = []

    async def record(view: SessionView) -> None:
        got.append(view.metadata.session_id)

    survivor = memory.sweeper(record, owner="survivor")
    assert session.id not in (await survivor.sweep_once(limit=10_000)).handed_off
    pairing.clock.advance(memory.tiers.config.sweep_lease + timedelta(seconds=1))
    assert session.id in (await survivor.sweep_once(limit=10_000)).handed_off
    assert got.count(session.id) == 1


async def test_write_behind_flushes_every_n_and_at_close(pairing: Pairing) -> None:
    config = SessionTierConfig(write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5)
    memory = pairing.service(config)
    session = await memory.session(user_id="u-wb")
    for i in range(7):
        await session.add_turn("user", f"t{i}")
    assert await pairing.durable.next_index(session.id) == 5
    await session.close()
    assert [t.text for t in await pairing.durable.get_turns(session.id)] == [
        f"t{i}" for i in range(7)
    ]


async def test_write_behind_loss_window_is_the_unflushed_turns(pairing: Pairing) -> None:
    config = SessionTierConfig(write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5)
    memory = pairing.service(config)
    session = await memory.session(user_id="u-wb-loss")
    for i in range(8):
        await session.add_turn("user", f"t{i}")
    await pairing.hot.delete(session.id)  # the hot tier loses the session before a flush
    view = await session.view()
    assert [t.text for t in view.turns] == [f"t{i}" for i in range(5)]  # t5..t7 lost
    turn = await session.add_turn("user", "after loss")
    assert turn.index == 5  # numbering continues the archive, gap-free


async def test_write_behind_expiry_sweep_saves_unflushed_turns(pairing: Pairing) -> None:
    config = SessionTierConfig(write_policy=WritePolicy.WRITE_BEHIND, write_behind_every=5)
    memory = pairing.service(config)
    session = await memory.session(user_id="u-wb-sweep")
    for i in range(3):
        await session.add_turn("user", f"t{i}")
    assert await pairing.durable.next_index(session.id) == 0
    # Expired (30 min idle) but within the hot tier's grace period: a sweeper running every
    # few minutes gets here long before the data is collected.
    pairing.clock.advance(timedelta(minutes=40))
    views: list[SessionView] = []

    async def handoff(view: SessionView) -> None:
        views.append(view)

    await memory.sweeper(handoff).sweep_once(limit=10_000)
    mine = [v for v in views if v.metadata.session_id == session.id]
    assert len(mine) == 1
    assert [t.text for t in mine[0].turns] == ["t0", "t1", "t2"]


async def test_metadata_is_derived_not_stored_per_turn(pairing: Pairing) -> None:
    memory = pairing.service()
    session = await memory.session(user_id="u-meta")
    await session.add_turn("user", "one")
    pairing.clock.advance(30)
    await session.add_turn("user", "two")
    meta = await session.metadata()
    assert isinstance(meta, SessionMetadata)
    assert meta.turn_count == 2
    assert meta.last_activity == pairing.clock.now()


async def test_add_turns_splits_long_batches(pairing: Pairing) -> None:
    from tiermem.service import TurnInput

    memory = pairing.service()
    session = await memory.session(user_id="u-batch")
    stored = await session.add_turns(
        [TurnInput(role="user", content=f"bulk {i}") for i in range(120)]
    )
    assert [t.index for t in stored] == list(range(120))
    assert len(await session.get_turns()) == 120
