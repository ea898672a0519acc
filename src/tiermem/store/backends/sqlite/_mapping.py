"""How tiermem's values map onto SQLite's: timestamps as integer microseconds, sqlite3
errors as tiermem errors, and the ``synchronous`` and busy-timeout settings a connection
is opened with.

Pure functions and constants, with no connection or thread of their own, so that the
stores, the worker thread and the direct runs all map the same way.

**Durability.** ``synchronous=NORMAL`` (the default) in WAL mode syncs only at checkpoints:
a committed write survives the process being killed (``kill -9``, a crash), but a power
loss or an OS crash can drop the last transactions. ``FULL`` syncs the WAL on every commit
and survives both, at the cost of one fsync per batch.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Literal

from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ValidationError,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_SYNCHRONOUS",
    "Synchronous",
    "caller_error",
    "check_synchronous",
    "from_epoch_us",
    "is_busy",
    "map_sqlite_error",
    "to_epoch_us",
]

Synchronous = Literal["NORMAL", "FULL"]

DEFAULT_BUSY_TIMEOUT = timedelta(seconds=5)
"""How long a write waits for another connection's write lock before giving up."""
DEFAULT_SYNCHRONOUS: Synchronous = "NORMAL"
"""Survives a process crash, not a power loss (module docstring)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Primary result codes (the low byte of an extended code) that mean "someone else holds it".
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CANTOPEN = 5, 6, 14
_SYNCHRONOUS_MODES: tuple[Synchronous, ...] = ("NORMAL", "FULL")


def to_epoch_us(value: datetime, *, what: str = "timestamp") -> int:
    """Microseconds since the epoch, exactly (integer arithmetic, no float rounding).

    Columns use microseconds, the resolution of :class:`datetime`, so that comparing
    columns gives the same answer as comparing the datetimes themselves; milliseconds
    would merge two instants of the same millisecond.

    Raises:
        ValidationError: ``value`` has no timezone.
    """
    # UTC (every datetime tiermem's models hold) is aware: no utcoffset() call, which
    # costs as much as the rest; the days, seconds and microseconds of the difference
    # give the same integer as dividing it by one microsecond, at half the cost.
    if value.tzinfo is not UTC and (value.tzinfo is None or value.utcoffset() is None):
        raise ValidationError(
            f"{what} has no timezone; pass an aware datetime, e.g. datetime.now(UTC)"
        )
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_epoch_us(value: int) -> datetime:
    """Invert :func:`to_epoch_us` (the result is in UTC)."""
    return _EPOCH + timedelta(microseconds=value)


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` means another connection holds what we asked for."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(exc)


def map_sqlite_error(exc: sqlite3.Error, *, path: str, busy_timeout: timedelta) -> BackendError:
    """The tiermem error for a sqlite3 error; the caller raises it ``from exc``."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    message = str(exc)
    locked = primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or (
        primary is None and "database is locked" in message
    )
    if locked:
        return BackendTimeoutError(
            f"SQLite database {path} stayed locked by another writer for more than "
            f"{busy_timeout.total_seconds():g}s ({message}). Retry, or look for a "
            "long-running transaction in another process.",
            backend="sqlite",
        )
    if primary == _SQLITE_CANTOPEN:
        return BackendUnavailableError(
            f"cannot open SQLite database {path} ({message}). Check that its directory "
            "exists and is writable by this user.",
            backend="sqlite",
            retryable=False,
        )
    return BackendError(f"SQLite failed on {path}: {message}", backend="sqlite")


def caller_error(exc: BaseException, *, path: str, busy_timeout: timedelta) -> BaseException:
    """What the caller of an operation gets: sqlite3 errors mapped (with the original as
    ``__cause__``), others as they are."""
    if isinstance(exc, sqlite3.Error):
        mapped = map_sqlite_error(exc, path=path, busy_timeout=busy_timeout)
        mapped.__cause__ = exc
        return mapped
    return exc


def check_synchronous(value: str) -> Synchronous:
    """``value`` as a :data:`Synchronous` mode (case-insensitive).

    Raises:
        ValidationError: it is neither NORMAL nor FULL.
    """
    for mode in _SYNCHRONOUS_MODES:
        if isinstance(value, str) and value.upper() == mode:
            return mode
    raise ValidationError(
        f"sqlite synchronous must be 'NORMAL' or 'FULL', got {value!r}: NORMAL survives "
        "a process crash, FULL a power loss too"
    )
