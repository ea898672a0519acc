"""Moves and derived facts of the environment layer, as pure functions.

The environment is read-mostly: it is written when an external system reports a change
(the user service, the cart service, the promotions feed), through
:func:`refresh_environment`. Each report names its ``source`` and may carry an
``event_id`` and the time it ``occurred_at``; a redelivered event (same id) and an event
older than the last one applied from that source change nothing, so at-least-once,
out-of-order delivery (SNS, EventBridge, a retrying webhook) is safe.

The user's local time is derived, never stored: :func:`local_time` reads the injected
clock's ``now`` in the user's time zone (set explicitly, or derived from the locale's
region when that region has a single zone, else UTC).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tiermem.errors import ValidationError
from tiermem.state.models import EnvironmentState, SourceMark

__all__ = [
    "ENVIRONMENT_FIELDS",
    "MAX_SOURCES",
    "REGION_ZONES",
    "LocalTime",
    "local_time",
    "part_of_day",
    "refresh_environment",
    "zone_of",
]

ENVIRONMENT_FIELDS = frozenset({"profile", "tier", "locale", "timezone", "cart", "promotions"})
"""What a refresh may change. Each is replaced as a whole: a refresh carries a snapshot."""
MAX_SOURCES = 32

REGION_ZONES: Mapping[str, str] = {
    "JP": "Asia/Tokyo",
    "KR": "Asia/Seoul",
    "CN": "Asia/Shanghai",
    "TW": "Asia/Taipei",
    "HK": "Asia/Hong_Kong",
    "SG": "Asia/Singapore",
    "IN": "Asia/Kolkata",
    "TH": "Asia/Bangkok",
    "VN": "Asia/Ho_Chi_Minh",
    "PH": "Asia/Manila",
    "GB": "Europe/London",
    "IE": "Europe/Dublin",
    "FR": "Europe/Paris",
    "DE": "Europe/Berlin",
    "IT": "Europe/Rome",
    "NL": "Europe/Amsterdam",
    "BE": "Europe/Brussels",
    "CH": "Europe/Zurich",
    "AT": "Europe/Vienna",
    "SE": "Europe/Stockholm",
    "NO": "Europe/Oslo",
    "DK": "Europe/Copenhagen",
    "FI": "Europe/Helsinki",
    "PL": "Europe/Warsaw",
    "NZ": "Pacific/Auckland",
}
"""Regions with a single time zone. Others (US, CA, AU, BR, RU, MX...) need ``timezone``."""


@dataclass(frozen=True)
class LocalTime:
    """The user's local time, derived from the clock and the user's zone."""

    local: datetime
    zone: str
    part_of_day: str
    zone_known: bool
    """False when neither the environment nor the locale says where the user is (UTC)."""


def part_of_day(hour: int) -> str:
    """``morning`` 5-11, ``afternoon`` 12-16, ``evening`` 17-21, ``night`` otherwise."""
    if 5 <= hour < 12:
        return "morning"
    if 12 <= hour < 17:
        return "afternoon"
    if 17 <= hour < 22:
        return "evening"
    return "night"


def _zone(name: str) -> tzinfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def zone_of(env: EnvironmentState) -> tuple[str, tzinfo, bool]:
    """The user's zone name, zone, and whether it is known (explicit or from the locale).
    A zone this machine cannot load counts as unknown."""
    region = env.locale.split("-")[-1].upper() if "-" in env.locale else ""
    for name in (env.timezone, REGION_ZONES.get(region)):
        zone = _zone(name) if name else None
        if name and zone is not None:
            return name, zone, True
    return "UTC", UTC, False


def local_time(env: EnvironmentState, now: datetime) -> LocalTime:
    name, zone, known = zone_of(env)
    local = now.astimezone(zone)
    return LocalTime(local=local, zone=name, part_of_day=part_of_day(local.hour), zone_known=known)


def refresh_environment(
    env: EnvironmentState,
    source: str,
    changes: Mapping[str, object],
    *,
    now: datetime,
    event_id: str | None = None,
    occurred_at: datetime | None = None,
) -> EnvironmentState:
    """Apply what ``source`` reports: each field in ``changes`` (:data:`ENVIRONMENT_FIELDS`)
    replaces the held one. Returns ``env`` itself for a redelivered or out-of-date event.

    Raises:
        ValidationError: a blank source, an unknown field, a value of the wrong shape, an
            unknown time zone, or more than :data:`MAX_SOURCES` sources.
    """
    if not source.strip():
        raise ValidationError("name the source of an environment refresh (e.g. 'cart')")
    unknown = set(changes) - ENVIRONMENT_FIELDS
    if unknown:
        raise ValidationError(
            f"cannot refresh {', '.join(sorted(unknown))}; the environment holds "
            f"{', '.join(sorted(ENVIRONMENT_FIELDS))}"
        )
    zone = changes.get("timezone")
    if zone is not None and (not isinstance(zone, str) or _zone(zone) is None):
        raise ValidationError(
            f"unknown time zone {zone!r}; use an IANA name such as 'Asia/Tokyo' (install "
            "the tzdata package where the system has no time zone database)"
        )
    when = occurred_at or now
    if when.tzinfo is None:
        raise ValidationError("occurred_at must be timezone-aware")
    mark = env.sources.get(source)
    if mark is not None:
        if event_id is not None and mark.event_id == event_id:
            return env
        if when < mark.occurred_at:
            return env
    if mark is None and len(env.sources) >= MAX_SOURCES:
        raise ValidationError(f"the environment already tracks {MAX_SOURCES} sources")
    sources = {**env.sources, source: SourceMark(event_id=event_id, occurred_at=when)}
    try:
        fresh = EnvironmentState.model_validate({**env.model_dump(), **changes, "sources": sources})
    except ValueError as exc:
        raise ValidationError(f"bad environment refresh from {source!r}: {exc}") from exc
    return env if fresh == env else fresh
