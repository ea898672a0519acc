"""A hot read derives a view's metadata lazily, with the same result as deriving it at once.

``TieredSessionStore.view`` leaves ``turn_count``/``last_activity`` to be derived when the
view's ``metadata`` is first read (most reads never look at them). These tests run random
conversations (timestamps out of order, as imports give them; the clock moving or not) and
compare every view a session handle holds with the metadata the old, eager code derived:
:func:`_reference_derive` is a copy of ``derive_metadata`` as it was, applied to the hot
snapshot the view was read from, and an append keeps the metadata of the view before it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.models import SessionMetadata, Turn
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing import FakeClock
from tiermem.tiers.tiered import SessionView

START = datetime(2030, 1, 1, tzinfo=UTC)


def _reference_derive(
    metadata: SessionMetadata, turns: Sequence[Turn], next_index: int
) -> SessionMetadata:
    """``derive_metadata`` before the lazy views (the validating ``model_copy``)."""
    last = metadata.last_activity
    for turn in turns:
        if turn.timestamp > last:
            last = turn.timestamp
    if metadata.turn_count == next_index and last == metadata.last_activity:
        return metadata
    return metadata.model_copy(update={"turn_count": next_index, "last_activity": last})


def _service(clock: FakeClock) -> MemoryService:
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_summarize=False,
    )


@pytest.mark.parametrize("seed", range(6))
async def test_lazily_derived_metadata_matches_the_eager_derivation(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(START)
    async with _service(clock) as memory:
        session = await memory.session(user_id="u-lazy")
        hot = memory.tiers.hot
        for i in range(60):
            if rng.random() < 0.5:
                clock.advance(rng.choice([0.001, 1, 30, 400]))
            options = {}
            if rng.random() < 0.3:  # an import: any time in the last two days
                options["timestamp"] = START - timedelta(minutes=rng.randrange(2_880))
            before = session._view
            expected_before = before.metadata if rng.random() < 0.5 else None
            await session.add_turn(rng.choice(["user", "assistant"]), f"turn {i}", **options)
            # An append keeps the view's metadata (derived from the view before it).
            kept = session._view.metadata
            if expected_before is not None:
                assert kept == expected_before
            if rng.random() < 0.7:
                turns = await session.history()
                snap = await hot.load(session.id)
                assert snap is not None
                assert snap.metadata is not None
                assert turns == snap.turns
                expected = _reference_derive(snap.metadata, snap.turns, snap.next_index)
                view = session._view
                assert view.stored_metadata.session_id == expected.session_id
                assert view.metadata == expected
                assert view.metadata.turn_count == snap.next_index == i + 1
        final = await session.view()
        assert final.metadata.turn_count == 60


async def test_a_lazy_view_behaves_as_a_plain_dataclass() -> None:
    clock = FakeClock(START)
    async with _service(clock) as memory:
        session = await memory.session(user_id="u-lazy")
        await session.add_turn("user", "hello", timestamp=START + timedelta(hours=1))
        lazy = await memory.tiers.view(session.id)
        eager = await memory.tiers.view(session.id)
        assert lazy is not None
        assert eager is not None
        derived = eager.metadata  # derived now; ``lazy`` not yet
        assert "metadata" not in vars(lazy)
        assert lazy.stored_metadata.turn_count == 0  # as stored: never derived
        assert lazy == eager  # compares the metadata too (deriving it)
        assert lazy.metadata is lazy.metadata  # derived once
        assert lazy.metadata.last_activity == START + timedelta(hours=1)
        replaced = dataclasses.replace(lazy, source="reload")
        assert replaced.metadata == derived
        assert replaced.source == "reload"
        assert dataclasses.asdict(lazy)["metadata"].turn_count == 1
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            _ = lazy.nope  # type: ignore[attr-defined]
        plain = SessionView(derived, (), {}, {}, 1, None, "hot")
        assert plain.stored_metadata is derived
        assert plain.after_append(2, {}).metadata is derived
