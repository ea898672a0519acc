"""TTL policies: fixed, sliding, activity (seed 000's tier table) and hybrid; all pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.models import UserTier
from tiermem.policies import (
    SEED_TTL_TABLE,
    ActivityTtl,
    FixedTtl,
    HybridTtl,
    SlidingTtl,
    TierTtl,
    TierTtlTable,
    TtlPolicy,
)

CREATED = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
NOW = CREATED + timedelta(minutes=20)
MIN = timedelta(minutes=1)


def decide(
    policy: TtlPolicy,
    *,
    event: str = "write",
    now: datetime = NOW,
    turns: int = 1,
    tier: UserTier | str = UserTier.STANDARD,
    current: datetime | None = None,
) -> datetime | None:
    return policy.expires_at(
        now=now,
        created_at=CREATED,
        turn_count=turns,
        user_tier=tier,  # type: ignore[arg-type]
        event=event,  # type: ignore[arg-type]
        current_expires_at=current,
    )


# ---------------------------------------------------------------- fixed


def test_fixed_ttl_counts_from_creation_and_is_never_refreshed() -> None:
    policy = FixedTtl(30 * MIN)
    deadline = CREATED + 30 * MIN
    assert decide(policy, event="write") == deadline
    assert decide(policy, event="write", current=deadline) is None
    assert decide(policy, event="read", current=deadline) is None
    assert decide(policy, event="read") == deadline  # no expiry yet: set one
    # A changed configuration moves the deadline, still from creation.
    assert decide(policy, event="read", current=CREATED + 10 * MIN) == deadline


@given(st.integers(0, 10_000), st.sampled_from(["read", "write"]))
def test_fixed_ttl_ignores_activity(minutes_later: int, event: str) -> None:
    later = CREATED + timedelta(minutes=minutes_later)
    assert decide(FixedTtl(30 * MIN), event=event, now=later) == CREATED + 30 * MIN


# ---------------------------------------------------------------- sliding


def test_sliding_ttl_refreshes_on_read_and_write() -> None:
    policy = SlidingTtl(30 * MIN)
    assert decide(policy, event="write", current=NOW) == NOW + 30 * MIN
    assert decide(policy, event="read", current=NOW) == NOW + 30 * MIN


def test_sliding_ttl_can_count_writes_only() -> None:
    policy = SlidingTtl(30 * MIN, refresh_on_read=False)
    assert decide(policy, event="read", current=NOW + MIN) is None
    assert decide(policy, event="read") == NOW + 30 * MIN
    assert decide(policy, event="write", current=NOW + MIN) == NOW + 30 * MIN


def test_sliding_ttl_defaults_to_seed_000s_thirty_minutes() -> None:
    assert decide(SlidingTtl()) == NOW + 30 * MIN


@given(
    st.datetimes(
        min_value=datetime(2000, 1, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.just(UTC),
    ),
    st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=30)),
    st.sampled_from(["read", "write"]),
)
def test_a_sliding_refresh_never_ends_before_now(now: datetime, ttl: timedelta, event: str) -> None:
    expiry = decide(SlidingTtl(ttl), event=event, now=now, current=now - ttl)
    assert expiry is not None
    assert expiry > now
    assert expiry - now == ttl


# ---------------------------------------------------------------- activity and hybrid

SEED_ROWS = [
    (UserTier.STANDARD, 9, 1800),
    (UserTier.STANDARD, 10, 2700),
    (UserTier.PREMIUM, 7, 2700),
    (UserTier.PREMIUM, 8, 3600),
    (UserTier.VIP, 4, 3600),
    (UserTier.VIP, 5, 7200),
    (UserTier.VIP, 500, 7200),
    (UserTier.STANDARD, 0, 1800),
]


@pytest.mark.parametrize(("tier", "turns", "seconds"), SEED_ROWS)
def test_activity_ttl_follows_seed_000s_table_on_write(
    tier: UserTier, turns: int, seconds: int
) -> None:
    expiry = decide(ActivityTtl(), event="write", tier=tier, turns=turns, current=NOW)
    assert expiry == NOW + timedelta(seconds=seconds)


def test_activity_ttl_is_not_extended_by_reads() -> None:
    policy = ActivityTtl()
    assert decide(policy, event="read", tier=UserTier.VIP, turns=6, current=NOW + MIN) is None
    # ...unless the session has no expiry yet.
    assert decide(policy, event="read", tier=UserTier.VIP, turns=6) == NOW + 120 * MIN


@pytest.mark.parametrize(("tier", "turns", "seconds"), SEED_ROWS)
@pytest.mark.parametrize("event", ["read", "write"])
def test_hybrid_ttl_slides_on_both_events_with_the_table_window(
    tier: UserTier, turns: int, seconds: int, event: str
) -> None:
    expiry = decide(HybridTtl(), event=event, tier=tier, turns=turns, current=NOW)
    assert expiry == NOW + timedelta(seconds=seconds)


def test_user_tier_may_be_given_as_its_string_value() -> None:
    assert decide(HybridTtl(), tier="vip", turns=5) == NOW + 120 * MIN


def test_a_custom_table() -> None:
    row = TierTtl(base=5 * MIN, extended=10 * MIN, extend_after_turns=2)
    policy = HybridTtl(TierTtlTable(standard=row, premium=row, vip=row))
    assert decide(policy, turns=1) == NOW + 5 * MIN
    assert decide(policy, turns=2) == NOW + 10 * MIN


@given(
    st.sampled_from(list(UserTier)),
    st.integers(0, 50),
    st.integers(0, 50),
)
def test_more_turns_never_shorten_the_window(tier: UserTier, a: int, b: int) -> None:
    fewer, more = sorted((a, b))
    assert SEED_TTL_TABLE.ttl_for(tier, fewer) <= SEED_TTL_TABLE.ttl_for(tier, more)


@given(st.integers(0, 50))
def test_higher_tiers_never_get_a_shorter_window_in_the_seed_table(turns: int) -> None:
    windows = [SEED_TTL_TABLE.ttl_for(tier, turns) for tier in UserTier]
    assert windows == sorted(windows)


def test_the_table_rejects_an_unknown_tier() -> None:
    with pytest.raises(ValidationError, match="unknown user tier 'gold'"):
        SEED_TTL_TABLE.ttl_for("gold", 1)  # type: ignore[arg-type]


def test_an_aware_now_in_another_zone_gives_the_same_instant() -> None:
    tokyo = NOW.astimezone(timezone(timedelta(hours=9)))
    assert decide(HybridTtl(), now=tokyo) == NOW + 30 * MIN


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: FixedTtl(timedelta(0)), "FixedTtl.ttl must be positive"),
        (lambda: SlidingTtl(-MIN), "SlidingTtl.ttl must be positive"),
        (lambda: SlidingTtl(1800), "must be a timedelta, got int"),  # type: ignore[arg-type]
        (lambda: TierTtl(timedelta(0), MIN, 1), "TierTtl.base must be positive"),
        (lambda: TierTtl(10 * MIN, 5 * MIN, 1), "extended .* is shorter than base"),
        (lambda: TierTtl(MIN, MIN, -1), "extend_after_turns must be >= 0"),
        (lambda: TierTtlTable(vip=None), "TierTtlTable.vip must be a TierTtl"),  # type: ignore[arg-type]
    ],
)
def test_bad_configuration_is_rejected(build: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        build()


POLICIES = [FixedTtl(MIN), SlidingTtl(), ActivityTtl(), HybridTtl()]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: type(p).__name__)
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"now": datetime(2030, 1, 1)}, "now has no timezone"),
        ({"current": datetime(2030, 1, 1)}, "current_expires_at has no timezone"),
        ({"turns": -1}, "turn_count must be >= 0"),
        ({"event": "delete"}, "event must be 'read' or 'write'"),
        ({"tier": "gold"}, "unknown user tier 'gold'; use one of standard, premium, vip"),
    ],
)
def test_bad_arguments_are_rejected(
    policy: TtlPolicy, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        decide(policy, **arguments)
