"""Environment layer: refreshes from external events (ordered, idempotent) and the user's
local time derived from the clock; all pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.state.environment import local_time, part_of_day, refresh_environment
from tiermem.state.models import Cart, CartItem, EnvironmentState, Promotion

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)  # 21:00 in Tokyo, 07:00 in New York
CART = Cart(
    items=(CartItem(sku="b42", title="Berserk 42", quantity=2, unit_price=Decimal("1650")),),
    currency="JPY",
)


def test_a_refresh_replaces_the_fields_it_carries() -> None:
    env = refresh_environment(
        EnvironmentState(), "user-service", {"tier": "premium", "profile": {"name": "Aki"}}, now=NOW
    )
    assert (env.tier, env.profile, env.locale) == ("premium", {"name": "Aki"}, "en-US")
    env = refresh_environment(env, "user-service", {"profile": {"genres": ["seinen"]}}, now=NOW)
    assert env.profile == {"genres": ["seinen"]}  # a snapshot, not a merge


def test_the_cart_total_is_exact() -> None:
    env = refresh_environment(EnvironmentState(), "cart", {"cart": CART}, now=NOW)
    assert (env.cart.item_count, env.cart.total) == (2, Decimal("3300"))
    assert EnvironmentState.model_validate_json(env.model_dump_json()) == env


# (case, first event (id, seconds after NOW), second event, does the second apply?)
EVENTS = [
    ("a redelivered event", ("e1", 0), ("e1", 0), False),
    ("a redelivered event, even with another time", ("e1", 0), ("e1", 5), False),
    ("an older event arriving late", ("e2", 10), ("e1", 0), False),
    ("a newer event", ("e1", 0), ("e2", 10), True),
    ("events without ids, in order", (None, 0), (None, 1), True),
    ("an event without id older than the last", (None, 5), (None, 1), False),
]


@pytest.mark.parametrize(
    ("first", "second", "applies"), [e[1:] for e in EVENTS], ids=[e[0] for e in EVENTS]
)
def test_refreshes_are_ordered_and_idempotent_per_source(
    first: tuple[str | None, int], second: tuple[str | None, int], applies: bool
) -> None:
    env = refresh_environment(
        EnvironmentState(),
        "cart",
        {"cart": CART},
        now=NOW,
        event_id=first[0],
        occurred_at=NOW + timedelta(seconds=first[1]),
    )
    after = refresh_environment(
        env,
        "cart",
        {"cart": Cart()},
        now=NOW,
        event_id=second[0],
        occurred_at=NOW + timedelta(seconds=second[1]),
    )
    assert (after.cart == Cart()) is applies
    assert (after is env) is not applies


def test_sources_are_independent() -> None:
    env = refresh_environment(
        EnvironmentState(), "cart", {"cart": CART}, now=NOW, occurred_at=NOW + timedelta(hours=1)
    )
    promo = Promotion(promotion_id="p1", title="Summer sale")
    env = refresh_environment(env, "promotions", {"promotions": [promo]}, now=NOW, occurred_at=NOW)
    assert env.promotions == (promo,)
    assert env.cart == CART


ILLEGAL = [
    ("an unknown field", {"shoe_size": 42}, "cannot refresh shoe_size"),
    ("an unknown time zone", {"timezone": "Mars/Olympus"}, "unknown time zone"),
    ("a malformed locale", {"locale": "not a locale"}, "bad environment refresh"),
    (
        "a negative price",
        {"cart": {"items": [{"sku": "x", "unit_price": "-1"}]}},
        "bad environment refresh",
    ),
    ("a bad currency", {"cart": {"currency": "yen"}}, "bad environment refresh"),
]


@pytest.mark.parametrize(
    ("changes", "message"), [c[1:] for c in ILLEGAL], ids=[c[0] for c in ILLEGAL]
)
def test_bad_refreshes_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        refresh_environment(EnvironmentState(), "user-service", changes, now=NOW)


def test_a_blank_source_is_refused() -> None:
    with pytest.raises(ValidationError, match="name the source"):
        refresh_environment(EnvironmentState(), " ", {"tier": "vip"}, now=NOW)


# (case, locale, timezone, local hour, part of day, zone, known)
ZONES = [
    ("explicit zone", "en-US", "America/New_York", 7, "morning", "America/New_York", True),
    ("derived from a one-zone region", "ja-JP", None, 21, "evening", "Asia/Tokyo", True),
    (
        "explicit zone wins over the locale",
        "ja-JP",
        "Europe/London",
        12,
        "afternoon",
        "Europe/London",
        True,
    ),
    ("a region with many zones is unknown", "en-US", None, 12, "afternoon", "UTC", False),
    ("a language-only locale is unknown", "ja", None, 12, "afternoon", "UTC", False),
    (
        "a zone this machine does not know is unknown",
        "en-US",
        "Nowhere/Zone",
        12,
        "afternoon",
        "UTC",
        False,
    ),
]


@pytest.mark.parametrize(
    ("locale", "zone", "hour", "part", "name", "known"),
    [z[1:] for z in ZONES],
    ids=[z[0] for z in ZONES],
)
def test_local_time_comes_from_the_clock_and_the_users_zone(
    locale: str, zone: str | None, hour: int, part: str, name: str, known: bool
) -> None:
    # Built directly: a stored zone may be one this machine cannot load.
    env = EnvironmentState(locale=locale, timezone=zone)
    local = local_time(env, NOW)
    assert (local.local.hour, local.part_of_day, local.zone, local.zone_known) == (
        hour,
        part,
        name,
        known,
    )


@given(st.integers(0, 23))
def test_every_hour_has_a_part_of_day(hour: int) -> None:
    expected = "morning" if 5 <= hour < 12 else "afternoon" if hour < 17 and hour >= 12 else None
    part = part_of_day(hour)
    assert part in {"morning", "afternoon", "evening", "night"}
    if expected:
        assert part == expected


def test_promotions_are_active_between_their_dates() -> None:
    promo = Promotion(
        promotion_id="p", title="Sale", starts_at=NOW, ends_at=NOW + timedelta(days=1)
    )
    assert not promo.active_at(NOW - timedelta(seconds=1))
    assert promo.active_at(NOW)
    assert not promo.active_at(NOW + timedelta(days=1))
