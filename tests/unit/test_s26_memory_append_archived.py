"""``MemoryHotStore.append_archived``: the hot half of a write-through append over a durable
store of another kind (the embedded default: memory hot tier, SQLite archive), which takes
the turns the archive numbered without checking them again and returns only the version.

* Random sequences against ``append_turns(first_index=...)`` on a second store: the same
  versions, the same conflicts (nothing written by either), the same sessions after each
  step, with entity changes, windows, and the clock moving past expiries.
* The tiered layer takes it for the memory store itself, and not for a subclass that
  overrides ``append_turns`` (a test's fault injection is not gone around).
* The embedded default, end to end: turns reach the hot tier at the archive's indexes, and
  a hot tier that lost the session is rebuilt from the archive.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tiermem.errors import ConflictError
from tiermem.models import ActiveEntity, Turn
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.store.contract import EntityChange, HotAppendResult
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

START = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)


def _turns(first: int, count: int, rng: random.Random) -> list[Turn]:
    return [
        text_turn(f"turn {first + i} {rng.random():.6f}").with_index(first + i)
        for i in range(count)
    ]


def _change(rng: random.Random, index: int, now: datetime) -> EntityChange | None:
    roll = rng.random()
    if roll < 0.5:
        return None
    kinds = ["series", "genre", "volume"]
    upsert = {
        kind: ActiveEntity(
            kind=kind, value=f"{kind}-{rng.randrange(4)}", turn_index=index, updated_at=now
        )
        for kind in rng.sample(kinds, rng.randrange(1, 3))
    }
    remove = tuple(k for k in kinds if k not in upsert and rng.random() < 0.3)
    return EntityChange(upsert=upsert, remove=remove)


async def _snapshot(store: MemoryHotStore, sid: str) -> Any:
    snap = await store.load(sid, include_expired=True)
    return None if snap is None else snap.model_dump()


@pytest.mark.parametrize("seed", range(6))
async def test_the_same_sessions_versions_and_conflicts_as_append_turns(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(START)
    reference, archived = MemoryHotStore(clock=clock), MemoryHotStore(clock=clock)
    sids = ["a", "b"]
    next_index = dict.fromkeys(sids, 0)
    seen = {"ok": 0, "conflict": 0}
    for _ in range(120):
        sid = rng.choice(sids)
        roll = rng.random()
        if roll < 0.1:
            clock.advance(timedelta(minutes=rng.choice([1, 30, 90])))  # past some expiries
            continue
        # Mostly the hot session's next index; sometimes a stale or a future one.
        first = next_index[sid] + (0 if roll < 0.8 else rng.choice([-2, -1, 1, 3]))
        first = max(first, 0)
        turns = _turns(first, rng.randrange(1, 4), rng)
        window = rng.choice([2, 5, 50])
        expires_at = clock.now() + timedelta(minutes=rng.choice([10, 60]))
        change = _change(rng, first, clock.now())
        outcomes: list[tuple[str, object]] = []
        for store in (reference, archived):
            try:
                if store is reference:
                    result: HotAppendResult = await store.append_turns(
                        sid, turns, window=window, expires_at=expires_at,
                        first_index=first, entities=change,
                    )  # fmt: skip
                    outcomes.append(("ok", result.version))
                else:
                    version = store.append_archived(
                        sid, turns, window=window, expires_at=expires_at, entities=change
                    )
                    outcomes.append(("ok", version))
            except ConflictError as exc:
                outcomes.append(("conflict", (exc.expected, exc.actual)))
        assert outcomes[0] == outcomes[1], (seed, sid, first, outcomes)
        seen[outcomes[0][0]] += 1
        if outcomes[0][0] == "ok":
            next_index[sid] = turns[-1].index + 1
        else:
            # After an expiry the session starts again wherever the archive says.
            live = await reference.load(sid)
            next_index[sid] = live.next_index if live is not None else first
        for other in sids:
            assert await _snapshot(reference, other) == await _snapshot(archived, other)
    assert seen["ok"] > 40, seen
    assert seen["conflict"] > 3, seen


async def test_a_conflict_writes_nothing() -> None:
    clock = FakeClock(START)
    hot = MemoryHotStore(clock=clock)
    rng = random.Random(1)
    hot.append_archived("s", _turns(0, 2, rng), window=10, expires_at=START + timedelta(hours=1))
    before = await _snapshot(hot, "s")
    for first in (0, 1, 3):
        with pytest.raises(ConflictError) as caught:
            hot.append_archived(
                "s", _turns(first, 1, rng), window=10, expires_at=START + timedelta(hours=2)
            )
        assert (caught.value.expected, caught.value.actual) == (first, 2)
    assert await _snapshot(hot, "s") == before


class _CountingHot(MemoryHotStore):
    """Overrides append_turns: the tiered layer must call it, not append_archived."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.appends = 0

    async def append_turns(
        self, session_id: str, turns: Sequence[Any], **options: Any
    ) -> HotAppendResult:
        self.appends += 1
        return await super().append_turns(session_id, turns, **options)


def _embedded(tmp_path: Path) -> MemoryService:
    settings = TierMemSettings(
        hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp_path / "t.db"
    )
    return MemoryService.from_settings(settings, auto_summarize=False)


async def test_the_tiered_layer_takes_it_for_the_memory_store_only(tmp_path: Path) -> None:
    async with _embedded(tmp_path) as memory:
        taken: object = memory.tiers._append_archived
        assert taken is memory.tiers.hot
    clock = FakeClock(START)
    counting = _CountingHot(clock=clock)
    # A durable store of another class than the hot one's pair: no combined append.
    durable = MemoryDurableStore(clock=clock)
    async with MemoryService(counting, durable, clock=clock) as memory:
        assert memory.tiers._append_archived is None
        session = await memory.session(user_id="u")
        for text in ("one", "two", "three"):
            await session.add_turn("user", text)
        assert counting.appends == 3
        assert [t.text for t in await session.history()] == ["one", "two", "three"]


async def test_embedded_turns_reach_the_hot_tier_and_a_lost_session_is_rebuilt(
    tmp_path: Path,
) -> None:
    async with _embedded(tmp_path) as memory:
        session = await memory.session(user_id="u")
        for i in range(5):
            await session.add_turn("user", f"message {i} about Berserk volume {i + 1}")
        hot = memory.tiers.hot
        assert isinstance(hot, MemoryHotStore)
        snap = await hot.load(session.id)
        assert snap is not None
        assert [t.index for t in snap.turns] == list(range(5))
        archived = await memory.tiers.durable.get_turns(session.id, 0, None)
        assert list(snap.turns) == archived
        await hot.delete(session.id)  # the hot tier loses the session
        await session.add_turn("user", "after the loss")
        snap = await hot.load(session.id)
        assert snap is not None
        assert [t.index for t in snap.turns] == list(range(6))
        assert snap.turns[-1].text == "after the loss"
        assert snap.metadata is not None  # rebuilt from the archive, not half-built
        view = await memory.tiers.durable_view(session.id)
        assert view is not None
        assert snap.entities == view.entities
