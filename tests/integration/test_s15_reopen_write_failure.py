"""The first turn after a close reopens the session (a3d5497): a failure of that metadata
write must not leave the turn stored behind an error.

The reopen ran after the append: when its write failed (the durable tier unreachable for
a moment, or under write-behind, where the turn itself only reaches the hot tier), the
turn was stored yet ``add_turn`` raised, so a caller retrying it stored it twice (and the
turn's background work, indexing and detection, was never queued). The reopen now comes
first: a failure raises before anything is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import pytest

from tiermem.clock import FakeClock
from tiermem.errors import BackendUnavailableError
from tiermem.models import JsonValue, SessionRecord
from tiermem.service import MemoryService
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing.backend import fresh_id
from tiermem.tiers import SessionTierConfig, WritePolicy


class _FlakyRecords(MemoryDurableStore):
    """Refuses record writes while ``down`` (turn appends still go through)."""

    down = False

    async def put_record(
        self,
        session_id: str,
        kind: str,
        data: Mapping[str, JsonValue],
        *,
        expected_version: int | None = None,
        expires_at: datetime | None = None,
    ) -> SessionRecord:
        if self.down:
            raise BackendUnavailableError("record writes are down", backend="memory")
        return await super().put_record(
            session_id, kind, data, expected_version=expected_version, expires_at=expires_at
        )


def _service(policy: WritePolicy) -> tuple[MemoryService, _FlakyRecords]:
    clock = FakeClock()
    durable = _FlakyRecords(clock=clock)
    memory = MemoryService(
        MemoryHotStore(clock=clock),
        durable,
        clock=clock,
        config=SessionTierConfig(window=10, write_policy=policy, write_behind_every=5),
        auto_detect=False,
        index_turns=False,
        auto_summarize=False,
    )
    return memory, durable


@pytest.mark.parametrize("policy", [WritePolicy.WRITE_THROUGH, WritePolicy.WRITE_BEHIND])
async def test_a_failed_reopen_stores_nothing_and_a_retry_stores_the_turn_once(
    policy: WritePolicy,
) -> None:
    memory, durable = _service(policy)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    await session.add_turn("user", "hello")
    await session.close()

    durable.down = True
    with pytest.raises(BackendUnavailableError):
        await session.add_turn("user", "back again")
    assert [t.text for t in await session.history()] == ["hello"]

    durable.down = False
    back = await session.add_turn("user", "back again")
    assert back.index == 1
    assert [t.text for t in await session.history()] == ["hello", "back again"]
    reopened = await session.close()
    assert reopened.turn_count == 2
    assert [t.text for t in await durable.get_turns(session.id)] == ["hello", "back again"]
    await memory.aclose()


@pytest.mark.parametrize("policy", [WritePolicy.WRITE_THROUGH, WritePolicy.WRITE_BEHIND])
async def test_a_failed_reopen_of_a_batch_stores_nothing(policy: WritePolicy) -> None:
    """``add_turns`` reopens before its appends too (it reopened after them)."""
    memory, durable = _service(policy)
    session = await memory.session(fresh_id("s"), user_id=fresh_id("u"))
    await session.add_turn("user", "hello")
    await session.close()

    durable.down = True
    batch = [{"role": "user", "content": "back"}, {"role": "assistant", "content": "welcome"}]
    with pytest.raises(BackendUnavailableError):
        await session.add_turns(batch)
    assert [t.text for t in await session.history()] == ["hello"]

    durable.down = False
    stored = await session.add_turns(batch)
    assert [t.index for t in stored] == [1, 2]
    assert (await session.metadata()).closed_at is None
    assert [t.text for t in await session.history()] == ["hello", "back", "welcome"]
    await session.close()
    assert [t.text for t in await durable.get_turns(session.id)] == ["hello", "back", "welcome"]
    await memory.aclose()
