"""A resync finds the hot session expired but not yet collected: it rebuilds it at once.

A keyed retry (``idempotency_key`` already stored) resyncs the hot tier from the durable
one. When the hot session's expiry had passed (still held: within the grace period before
the backend collects it), the resync used to read the expired session's version and ask
``restore`` to replace exactly that version, which the contract answers with a conflict
(an expired session counts as absent: version 0). All 32 version-checked attempts failed,
each after a real backoff sleep (~5 s in all), with the warning "hot copy of session ...
kept changing during resync", and the hot tier was left expired. Found by the suite's
timings: tests/unit/test_s10_turnpath_write.py's seeds 2 and 3 spent ~20 s asleep there.
The in-process pairing takes that path (its combined append answers a retry with no hot
result, so the tier resyncs); the SQLite one rebuilds through its hot append and is here
to keep the same promise.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import tiermem.tiers.tiered as tiered_module
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.testing import FakeClock


@pytest.mark.parametrize(("hot_backend", "durable"), [("memory", "memory"), ("sqlite", "sqlite")])
async def test_a_keyed_retry_after_the_hot_session_expired_resyncs_without_conflicts(
    hot_backend: str,
    durable: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pauses: list[int] = []

    async def counted_pause(attempt: int, **_: float) -> None:
        pauses.append(attempt)  # no real sleep: the old code would sleep ~5 s here

    monkeypatch.setattr(tiered_module, "pause", counted_pause)
    clock = FakeClock(datetime(2026, 3, 10, 12, tzinfo=UTC))
    settings = TierMemSettings(
        hot_backend=hot_backend, durable_backend=durable, sqlite_path=tmp_path / "t.db"
    )
    async with MemoryService.from_settings(settings, clock=clock, auto_summarize=False) as memory:
        session = await memory.session(user_id="u1", session_id="s1")
        first = await session.add_turn("user", "my order ORD-12345", idempotency_key="k1")
        await session.add_turn("assistant", "it ships tomorrow")
        hot = memory.tiers.hot
        held = await hot.load("s1", include_expired=True)
        assert held is not None
        # Past the hot session's expiry, within the grace before it is collected.
        clock.advance(held.expires_at - clock.now() + timedelta(minutes=1))
        assert await hot.load("s1") is None
        assert await hot.load("s1", include_expired=True) is not None

        with caplog.at_level(logging.WARNING, logger=tiered_module.__name__):
            again = await session.add_turn("user", "my order ORD-12345", idempotency_key="k1")

        assert again.index == first.index == 0
        assert pauses == []
        assert not [r for r in caplog.records if "kept changing" in r.getMessage()]
        rebuilt = await hot.load("s1")  # live again, with both turns
        assert rebuilt is not None
        assert [t.index for t in rebuilt.turns] == [0, 1]
        assert [t.index for t in await session.history()] == [0, 1]
