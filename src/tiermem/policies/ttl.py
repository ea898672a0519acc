"""Session TTL policies: when a session's hot state expires, decided on every read and write.

A policy is pure: the caller passes the current time and the session's facts and gets back
the new expiry, or ``None`` for "leave the stored expiry as it is". Stores keep the result as
a logical ``expires_at`` (native TTLs only collect garbage). Seed 000 §1.3 compares the
strategies; tiermem offers all four:

=================  ==========================================  ===========================
policy             expiry                                      refreshed on
=================  ==========================================  ===========================
:class:`FixedTtl`     ``created_at + ttl``                        never
:class:`SlidingTtl`   ``now + ttl``                               write, and read by default
:class:`ActivityTtl`  ``now + table[tier](turn_count)``           write only
:class:`HybridTtl`    ``now + table[tier](turn_count)``           read and write (default)
=================  ==========================================  ===========================

Every policy sets an expiry when the session has none yet (``current_expires_at=None``),
whatever the event, so a session never lives forever by accident.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from tiermem.errors import ValidationError
from tiermem.models.session import UserTier

__all__ = [
    "SEED_TTL_TABLE",
    "ActivityTtl",
    "FixedTtl",
    "HybridTtl",
    "SlidingTtl",
    "TierTtl",
    "TierTtlTable",
    "TrustedExpiry",
    "TtlEvent",
    "TtlPolicy",
    "trusted_expiry",
]

TtlEvent = Literal["read", "write"]


class TtlPolicy(Protocol):
    """Decides a session's expiry on each read or write.

    Returns the new ``expires_at`` (timezone-aware), or ``None`` to keep
    ``current_expires_at`` unchanged. ``turn_count`` is the number of turns in the session
    after this event. Implementations raise :class:`~tiermem.errors.ValidationError` for a
    naive datetime, a negative turn count, an unknown tier or an unknown event.
    """

    def expires_at(
        self,
        *,
        now: datetime,
        created_at: datetime,
        turn_count: int,
        user_tier: UserTier,
        event: TtlEvent,
        current_expires_at: datetime | None,
    ) -> datetime | None: ...


def _positive(value: timedelta, what: str) -> None:
    if not isinstance(value, timedelta):
        raise ValidationError(f"{what} must be a timedelta, got {type(value).__name__}")
    if value <= timedelta(0):
        raise ValidationError(f"{what} must be positive, got {value}; e.g. timedelta(minutes=30)")


def _check(
    *,
    now: datetime,
    created_at: datetime,
    turn_count: int,
    user_tier: UserTier,
    event: str,
    current_expires_at: datetime | None,
) -> UserTier:
    """The checked tier of a policy call, or ValidationError naming the bad argument."""
    try:
        if (  # what the tiers pass on every read and write, tested without a call
            now.tzinfo is UTC
            and created_at.tzinfo is UTC
            and (current_expires_at is None or current_expires_at.tzinfo is UTC)
            and type(user_tier) is UserTier
            and type(turn_count) is int
            and turn_count >= 0
            and (event == "write" or event == "read")
        ):
            return user_tier
    except AttributeError:  # not a datetime: the full checks say what is wrong
        pass
    return _check_fully(
        now=now, created_at=created_at, turn_count=turn_count, user_tier=user_tier,
        event=event, current_expires_at=current_expires_at,
    )  # fmt: skip


def _check_fully(
    *,
    now: datetime,
    created_at: datetime,
    turn_count: int,
    user_tier: UserTier,
    event: str,
    current_expires_at: datetime | None,
) -> UserTier:
    if (  # one test for the usual case; the loop names the culprit
        (now is not None and now.utcoffset() is None)
        or (created_at is not None and created_at.utcoffset() is None)
        or (current_expires_at is not None and current_expires_at.utcoffset() is None)
    ):
        for name, value in (
            ("now", now),
            ("created_at", created_at),
            ("current_expires_at", current_expires_at),
        ):
            if value is not None and value.utcoffset() is None:
                raise ValidationError(
                    f"{name} has no timezone; pass an aware datetime, e.g. datetime.now(UTC)"
                )
    if turn_count < 0:
        raise ValidationError(f"turn_count must be >= 0, got {turn_count}")
    if event not in ("read", "write"):
        raise ValidationError(f"event must be 'read' or 'write', got {event!r}")
    return _tier(user_tier)


def _tier(user_tier: UserTier | str) -> UserTier:
    if type(user_tier) is UserTier:  # the usual case, every read and write: no enum lookup
        return user_tier
    try:
        return UserTier(user_tier)
    except ValueError:
        tiers = ", ".join(t.value for t in UserTier)
        raise ValidationError(f"unknown user tier {user_tier!r}; use one of {tiers}") from None


class _Checked:
    """``expires_at`` of the built-in policies: the arguments checked once (:func:`_check`),
    then the policy's ``_unchecked``, which :func:`trusted_expiry` hands to callers whose
    arguments are valid already."""

    __slots__ = ()

    def expires_at(
        self,
        *,
        now: datetime,
        created_at: datetime,
        turn_count: int,
        user_tier: UserTier,
        event: TtlEvent,
        current_expires_at: datetime | None,
    ) -> datetime | None:
        tier = _check(
            now=now, created_at=created_at, turn_count=turn_count, user_tier=user_tier,
            event=event, current_expires_at=current_expires_at,
        )  # fmt: skip
        return self._unchecked(now, created_at, turn_count, tier, event, current_expires_at)

    def _unchecked(
        self,
        now: datetime,
        created_at: datetime,
        turn_count: int,
        user_tier: UserTier,
        event: TtlEvent,
        current_expires_at: datetime | None,
    ) -> datetime | None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class FixedTtl(_Checked):
    """Expires ``ttl`` after the session was created, however active it is.

    Returns ``created_at + ttl`` when that differs from ``current_expires_at``, else ``None``.
    Seed 000 uses it alone nowhere: active users lose their context mid-conversation.
    """

    ttl: timedelta

    def __post_init__(self) -> None:
        _positive(self.ttl, "FixedTtl.ttl")

    def _unchecked(
        self,
        now: datetime,
        created_at: datetime,
        turn_count: int,
        user_tier: UserTier,
        event: TtlEvent,
        current_expires_at: datetime | None,
    ) -> datetime | None:
        deadline = created_at + self.ttl
        return None if current_expires_at == deadline else deadline


@dataclass(frozen=True, slots=True)
class SlidingTtl(_Checked):
    """Expires ``ttl`` after the last write, or the last read when ``refresh_on_read``.

    Seed 000's primary strategy (30 minutes). Its weakness: a session whose last operation
    was a read lingers for a whole window; set ``refresh_on_read=False`` to count writes only.
    """

    ttl: timedelta = timedelta(minutes=30)
    refresh_on_read: bool = True

    def __post_init__(self) -> None:
        _positive(self.ttl, "SlidingTtl.ttl")

    def _unchecked(
        self,
        now: datetime,
        created_at: datetime,
        turn_count: int,
        user_tier: UserTier,
        event: TtlEvent,
        current_expires_at: datetime | None,
    ) -> datetime | None:
        if event == "read" and not self.refresh_on_read and current_expires_at is not None:
            return None
        return now + self.ttl


@dataclass(frozen=True, slots=True)
class TierTtl:
    """One tier's row: ``base`` until ``extend_after_turns`` turns, then ``extended``.

    Raises :class:`~tiermem.errors.ValidationError` unless both durations are positive,
    ``extended >= base`` (a longer conversation never gets a shorter window) and
    ``extend_after_turns >= 0``.
    """

    base: timedelta
    extended: timedelta
    extend_after_turns: int

    def __post_init__(self) -> None:
        _positive(self.base, "TierTtl.base")
        _positive(self.extended, "TierTtl.extended")
        if self.extended < self.base:
            raise ValidationError(
                f"TierTtl.extended ({self.extended}) is shorter than base ({self.base}); "
                "the extension must not shorten a session"
            )
        if self.extend_after_turns < 0:
            raise ValidationError(
                f"TierTtl.extend_after_turns must be >= 0, got {self.extend_after_turns}"
            )

    def ttl_for(self, turn_count: int) -> timedelta:
        """The window for a session with ``turn_count`` turns."""
        return self.extended if turn_count >= self.extend_after_turns else self.base


@dataclass(frozen=True, slots=True)
class TierTtlTable:
    """A :class:`TierTtl` row for every :class:`~tiermem.models.UserTier`.

    The defaults are seed 000's table: standard 30 min, 45 min from 10 turns; premium
    45 min, 60 min from 8 turns; VIP 60 min, 2 h from 5 turns.
    """

    standard: TierTtl = field(
        default_factory=lambda: TierTtl(timedelta(seconds=1800), timedelta(seconds=2700), 10)
    )
    premium: TierTtl = field(
        default_factory=lambda: TierTtl(timedelta(seconds=2700), timedelta(seconds=3600), 8)
    )
    vip: TierTtl = field(
        default_factory=lambda: TierTtl(timedelta(seconds=3600), timedelta(seconds=7200), 5)
    )
    _rows: dict[UserTier, TierTtl] = field(init=False, repr=False, compare=False)
    """The rows by tier, built once: looked up on every read and write."""

    def __post_init__(self) -> None:
        rows: dict[UserTier, TierTtl] = {}
        for tier in UserTier:
            row = getattr(self, tier.value, None)
            if not isinstance(row, TierTtl):
                raise ValidationError(f"TierTtlTable.{tier.value} must be a TierTtl, got {row!r}")
            rows[tier] = row
        object.__setattr__(self, "_rows", rows)

    def ttl_for(self, user_tier: UserTier, turn_count: int) -> timedelta:
        """The window for a session of ``user_tier`` with ``turn_count`` turns.

        Raises :class:`~tiermem.errors.ValidationError` for an unknown tier.
        """
        row = self._rows[user_tier if type(user_tier) is UserTier else _tier(user_tier)]
        return row.ttl_for(turn_count)


SEED_TTL_TABLE = TierTtlTable()
"""Seed 000's table of windows by user tier and conversation depth."""


@dataclass(frozen=True, slots=True)
class ActivityTtl(_Checked):
    """Expires a tier- and depth-dependent window after the last write.

    Only writes (new turns) extend the session: reading an abandoned session, e.g. from an
    inspector or a sweeper, does not keep it alive. Returns ``None`` on a read unless the
    session has no expiry yet.
    """

    table: TierTtlTable = SEED_TTL_TABLE

    def _unchecked(
        self,
        now: datetime,
        created_at: datetime,
        turn_count: int,
        user_tier: UserTier,
        event: TtlEvent,
        current_expires_at: datetime | None,
    ) -> datetime | None:
        if event == "read" and current_expires_at is not None:
            return None
        # The table's row, looked up directly (ttl_for's call and tier test, per turn).
        rows = self.table._rows
        row = rows.get(user_tier) or rows[_tier(user_tier)]
        return now + row.ttl_for(turn_count)


@dataclass(frozen=True, slots=True)
class HybridTtl(_Checked):
    """A sliding window, refreshed on every read and write, whose length is the table's.

    The production default: seed 000's "Hybrid (MangaAssist)" row combines the sliding
    window (the user never loses context while active) with the activity extension (long
    conversations and higher tiers get longer windows, per its tier table).
    """

    table: TierTtlTable = SEED_TTL_TABLE

    def _unchecked(
        self,
        now: datetime,
        created_at: datetime,
        turn_count: int,
        user_tier: UserTier,
        event: TtlEvent,
        current_expires_at: datetime | None,
    ) -> datetime | None:
        # The table's row, looked up directly (ttl_for's call and tier test, per turn).
        rows = self.table._rows
        row = rows.get(user_tier) or rows[_tier(user_tier)]
        return now + row.ttl_for(turn_count)


TrustedExpiry = Callable[
    [datetime, datetime, int, UserTier, TtlEvent, datetime | None], datetime | None
]
"""A policy's ``expires_at`` taking its arguments by position: ``(now, created_at,
turn_count, user_tier, event, current_expires_at)``."""

_BUILT_IN = (FixedTtl, SlidingTtl, ActivityTtl, HybridTtl)


def trusted_expiry(policy: TtlPolicy) -> TrustedExpiry:
    """``policy.expires_at`` for a caller whose arguments are valid already: the tiered
    store, which passes a validated session's creation time and tier, a count it keeps
    itself and its clock's time (one call per read and per write).

    For the built-in policies (exact classes) it skips the argument checks and the keyword
    call: validation belongs at the edge, and these values come from inside. Any other
    policy keeps its own ``expires_at``, called as the protocol says (by keyword), so a
    custom policy sees no change. The result is the policy's answer for the same
    arguments; what invalid arguments do is left undefined (the checked method raises
    :class:`~tiermem.errors.ValidationError` for them).
    """
    if type(policy) in _BUILT_IN:
        unchecked: TrustedExpiry = policy._unchecked  # type: ignore[attr-defined]
        return unchecked

    def checked(
        now: datetime,
        created_at: datetime,
        turn_count: int,
        user_tier: UserTier,
        event: TtlEvent,
        current_expires_at: datetime | None,
    ) -> datetime | None:
        return policy.expires_at(
            now=now, created_at=created_at, turn_count=turn_count, user_tier=user_tier,
            event=event, current_expires_at=current_expires_at,
        )  # fmt: skip

    return checked
