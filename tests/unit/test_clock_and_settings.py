"""Injected clock and ids; settings from the environment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tiermem import FakeClock, TierMemSettings, UlidFactory


def test_fake_clock_moves_only_forward() -> None:
    clock = FakeClock(datetime(2030, 1, 1, tzinfo=UTC))
    assert clock.advance(90) == datetime(2030, 1, 1, 0, 1, 30, tzinfo=UTC)
    assert clock.advance(timedelta(hours=1)).hour == 1
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)


def test_ulids_are_unique_and_time_ordered() -> None:
    factory = UlidFactory()
    ids = [factory.new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 26 for i in ids)
    # The first 10 characters encode the millisecond, so ids sort by creation time.
    assert [i[:10] for i in ids] == sorted(i[:10] for i in ids)


def test_settings_defaults_are_embedded() -> None:
    settings = TierMemSettings()
    assert (settings.hot_backend, settings.durable_backend) == ("memory", "sqlite")
    assert settings.hot_window == 20


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_HOT_BACKEND", "redis")
    monkeypatch.setenv("TIERMEM_HOT_WINDOW", "40")
    settings = TierMemSettings()
    assert settings.hot_backend == "redis"
    assert settings.hot_window == 40


def test_bad_settings_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_HOT_BACKEND", "postgres")
    with pytest.raises(ValueError, match="hot_backend"):
        TierMemSettings()
