"""The circuit breaker of one tool, as pure functions over a small frozen state.

Nothing here does I/O or reads a clock: every function takes ``now`` and returns a new
:class:`BreakerState` (inside a :class:`Transition` that says what happened), so the whole
state machine is tested with tables of cases. :mod:`tiermem.tools.breaker_store` keeps the
state in the hot store's shared keyspace, where every worker of a deployment sees it.

::

                 failure_threshold failures within window
      ┌────────┐ ─────────────────────────────────────────▶ ┌──────┐
      │ CLOSED │                                            │ OPEN │ ◀──┐
      └────────┘ ◀──────────┐                               └──────┘    │ probe failed
          ▲                 │ probe succeeded                 │         │ (retry after
          │                 │                  now ≥ retry_at │ one     │  reset_timeout)
          │            ┌───────────┐ ◀────────────────────────┘ caller  │
          └────────────│ HALF_OPEN │ ───────────────────────────────────┘
                       └───────────┘  exactly one probe, holding a lease;
                                      when the lease runs out (the prober crashed)
                                      the next caller takes the probe over

Rules the tests pin down:

* **Closed**: every call goes through. A failure is recorded with its time; failures older
  than ``window`` no longer count. The failure that makes ``failure_threshold`` count opens
  the breaker. A success changes nothing (the window counts failures, not a streak), so a
  healthy tool costs one read per call and no write.
* **Open**: calls are rejected until ``retry_at`` (``reset_timeout`` after the breaker
  opened). From then on, the first caller becomes the probe: the state turns HALF_OPEN with
  that caller's ``probe_id`` and a lease until ``now + probe_lease``.
* **Half-open**: only the probe runs; everyone else is rejected. Its success closes the
  breaker (failures forgotten), its failure re-opens it for another ``reset_timeout``
  (``opened_at`` keeps the start of the outage). Once the lease has run out, the next caller
  takes the probe over with a new ``probe_id``; the old prober's late outcome is ignored.
* Outcomes of calls admitted earlier (a call let through while closed that fails after the
  breaker opened, a probe that lost its lease) never move an open or half-open breaker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from tiermem.errors import CorruptDataError, ValidationError
from tiermem.models import JsonValue

__all__ = [
    "CLOSED_STATE",
    "MAX_ERROR_CHARS",
    "Admission",
    "BreakerEvent",
    "BreakerPolicy",
    "BreakerState",
    "BreakerStatus",
    "Decision",
    "ToolHealth",
    "Transition",
    "admit",
    "decode_state",
    "encode_state",
    "recent_failures",
    "record_failure",
    "record_success",
    "tool_health",
]

MAX_ERROR_CHARS = 300
"""How much of the last error a breaker keeps for degradation messages."""

_STATE_FORMAT = 1


class BreakerStatus(StrEnum):
    CLOSED = "closed"
    """Calls go through."""
    OPEN = "open"
    """Calls are rejected until ``retry_at``."""
    HALF_OPEN = "half_open"
    """One probe is in flight; other calls are rejected."""


class ToolHealth(StrEnum):
    """What an agent needs to know about a tool, derived from its breaker."""

    HEALTHY = "healthy"
    """Closed, with fewer recent failures than the policy's ``degraded_failures``."""
    DEGRADED = "degraded"
    """Closed, but failing: at least ``degraded_failures`` failures within the window."""
    UNAVAILABLE = "unavailable"
    """Open or half-open: calls are rejected (fallbacks are used)."""


class Admission(StrEnum):
    CALL = "call"
    """Call the tool as usual."""
    PROBE = "probe"
    """Call the tool as the breaker's one recovery probe."""
    REJECT = "reject"
    """Do not call the tool: use a fallback or report it unavailable."""


class BreakerEvent(StrEnum):
    FAILURE_RECORDED = "failure_recorded"
    OPENED = "opened"
    PROBE_STARTED = "probe_started"
    PROBE_TAKEN_OVER = "probe_taken_over"
    """The previous probe's lease ran out and a new caller took the probe."""
    CLOSED = "closed"
    REOPENED = "reopened"


def _positive(value: timedelta, what: str) -> None:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValidationError(f"{what} must be a positive timedelta, got {value!r}")


@dataclass(frozen=True)
class BreakerPolicy:
    """How a tool's breaker trips and recovers.

    Raises:
        ValidationError: a threshold below 1 or a non-positive duration.
    """

    failure_threshold: int = 5
    """Failures within ``window`` that open the breaker."""
    window: timedelta = timedelta(seconds=60)
    """How long a failure counts."""
    reset_timeout: timedelta = timedelta(seconds=30)
    """How long an open breaker rejects calls before it lets one probe through."""
    probe_lease: timedelta = timedelta(seconds=30)
    """How long a probe holds the half-open breaker. Must outlast the tool's timeout, so a
    live probe never loses its lease; a crashed prober blocks recovery for at most this."""
    degraded_failures: int | None = None
    """Recent failures from which a closed breaker reports DEGRADED; None: half the
    threshold, at least 1."""

    def __post_init__(self) -> None:
        if type(self.failure_threshold) is not int or self.failure_threshold < 1:
            raise ValidationError(
                f"failure_threshold must be an int >= 1, got {self.failure_threshold!r}"
            )
        _positive(self.window, "window")
        _positive(self.reset_timeout, "reset_timeout")
        _positive(self.probe_lease, "probe_lease")
        if self.degraded_failures is not None and (
            type(self.degraded_failures) is not int
            or not 1 <= self.degraded_failures <= self.failure_threshold
        ):
            raise ValidationError(
                f"degraded_failures must be between 1 and failure_threshold "
                f"({self.failure_threshold}), got {self.degraded_failures!r}"
            )

    @property
    def degraded_after(self) -> int:
        """Recent failures from which a closed breaker is DEGRADED."""
        if self.degraded_failures is not None:
            return self.degraded_failures
        return max(1, self.failure_threshold // 2)


@dataclass(frozen=True)
class BreakerState:
    """One tool's breaker. Fields other than ``status`` and ``failures`` are None while
    closed; ``probe_id`` and ``probe_until`` are set only while half-open."""

    status: BreakerStatus = BreakerStatus.CLOSED
    failures: tuple[datetime, ...] = ()
    """Times of failures not yet out of the window (closed only), oldest first."""
    opened_at: datetime | None = None
    """When the current outage began (kept across failed probes)."""
    retry_at: datetime | None = None
    """When an open breaker lets the next probe through."""
    probe_id: str | None = None
    probe_until: datetime | None = None
    """When the probe's lease runs out."""
    last_error: str | None = None
    """The last recorded failure, shortened to :data:`MAX_ERROR_CHARS`."""


CLOSED_STATE = BreakerState()
"""A breaker nobody has recorded a failure on."""


@dataclass(frozen=True)
class Transition:
    """What an event did to a breaker; ``event`` None means nothing changed (no write)."""

    before: BreakerState
    after: BreakerState
    event: BreakerEvent | None = None

    @property
    def changed(self) -> bool:
        return self.event is not None


@dataclass(frozen=True)
class Decision:
    """Whether a caller may call the tool, and the state to write if it became the probe."""

    admission: Admission
    transition: Transition = field(repr=False)

    @property
    def admitted(self) -> bool:
        return self.admission is not Admission.REJECT


def _unchanged(state: BreakerState) -> Transition:
    return Transition(before=state, after=state)


def recent_failures(
    state: BreakerState, policy: BreakerPolicy, now: datetime
) -> tuple[datetime, ...]:
    """The failures that still count at ``now`` (newer than ``now - window``)."""
    horizon = now - policy.window
    return tuple(t for t in state.failures if t > horizon)


def admit(
    state: BreakerState,
    policy: BreakerPolicy,
    now: datetime,
    *,
    new_probe_id: Callable[[], str],
) -> Decision:
    """Decide whether a call may go through at ``now``.

    ``new_probe_id`` makes a fresh unique id, called only when the caller is chosen as the
    probe (a PROBE decision, so a healthy tool's check draws no id). The transition's state
    must then be written with compare-and-set; only the writer that wins is the probe.
    """
    if state.status is BreakerStatus.CLOSED:
        return Decision(Admission.CALL, _unchanged(state))
    if state.status is BreakerStatus.OPEN:
        if state.retry_at is not None and now < state.retry_at:
            return Decision(Admission.REJECT, _unchanged(state))
        event = BreakerEvent.PROBE_STARTED
    else:
        if state.probe_until is not None and now < state.probe_until:
            return Decision(Admission.REJECT, _unchanged(state))
        event = BreakerEvent.PROBE_TAKEN_OVER
    after = replace(
        state,
        status=BreakerStatus.HALF_OPEN,
        probe_id=new_probe_id(),
        probe_until=now + policy.probe_lease,
    )
    return Decision(Admission.PROBE, Transition(before=state, after=after, event=event))


def _is_current_probe(state: BreakerState, probe_id: str | None) -> bool:
    return (
        probe_id is not None
        and state.status is BreakerStatus.HALF_OPEN
        and state.probe_id == probe_id
    )


def record_success(
    state: BreakerState, policy: BreakerPolicy, now: datetime, *, probe_id: str | None = None
) -> Transition:
    """A call succeeded; ``probe_id`` is the probe's id if the call was admitted as one.

    Only the current probe's success changes anything: it closes the breaker.
    """
    if _is_current_probe(state, probe_id):
        return Transition(before=state, after=CLOSED_STATE, event=BreakerEvent.CLOSED)
    return _unchanged(state)


def record_failure(
    state: BreakerState,
    policy: BreakerPolicy,
    now: datetime,
    *,
    error: str,
    probe_id: str | None = None,
) -> Transition:
    """A call failed at ``now`` with ``error``; ``probe_id`` as for :func:`record_success`.

    Closed: the failure is counted, and the one that reaches the threshold within the window
    opens the breaker. The current probe's failure re-opens it. Anything else is ignored.
    """
    last_error = error[:MAX_ERROR_CHARS]
    if _is_current_probe(state, probe_id):
        after = BreakerState(
            status=BreakerStatus.OPEN,
            opened_at=state.opened_at or now,
            retry_at=now + policy.reset_timeout,
            last_error=last_error,
        )
        return Transition(before=state, after=after, event=BreakerEvent.REOPENED)
    if state.status is not BreakerStatus.CLOSED:
        return _unchanged(state)
    failures = (*recent_failures(state, policy, now), now)
    if len(failures) >= policy.failure_threshold:
        after = BreakerState(
            status=BreakerStatus.OPEN,
            opened_at=now,
            retry_at=now + policy.reset_timeout,
            last_error=last_error,
        )
        return Transition(before=state, after=after, event=BreakerEvent.OPENED)
    after = BreakerState(failures=tuple(sorted(failures)), last_error=last_error)
    return Transition(before=state, after=after, event=BreakerEvent.FAILURE_RECORDED)


def tool_health(state: BreakerState, policy: BreakerPolicy, now: datetime) -> ToolHealth:
    """Healthy, degraded or unavailable (see :class:`ToolHealth`)."""
    if state.status is not BreakerStatus.CLOSED:
        return ToolHealth.UNAVAILABLE
    if len(recent_failures(state, policy, now)) >= policy.degraded_after:
        return ToolHealth.DEGRADED
    return ToolHealth.HEALTHY


# -- codec: the JSON a shared blob holds ------------------------------------------------


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def encode_state(state: BreakerState) -> dict[str, JsonValue]:
    """The JSON object stored for a breaker (readable in any store inspector)."""
    data: dict[str, JsonValue] = {"format": _STATE_FORMAT, "status": state.status.value}
    if state.failures:
        data["failures"] = [t.isoformat() for t in state.failures]
    for key, value in (
        ("opened_at", _time(state.opened_at)),
        ("retry_at", _time(state.retry_at)),
        ("probe_id", state.probe_id),
        ("probe_until", _time(state.probe_until)),
        ("last_error", state.last_error),
    ):
        if value is not None:
            data[key] = value
    return data


def _parse_time(value: JsonValue, what: str) -> datetime:
    if not isinstance(value, str):
        raise TypeError(f"{what} is {type(value).__name__}, not an ISO timestamp")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"{what} has no timezone")
    return parsed


def _read_time(data: dict[str, JsonValue], key: str) -> datetime | None:
    value = data.get(key)
    return None if value is None else _parse_time(value, key)


def decode_state(data: dict[str, JsonValue]) -> BreakerState:
    """Read a stored breaker; unknown keys (a newer writer's) are ignored.

    Raises:
        CorruptDataError: the object is not a breaker state this release can read.
    """
    try:
        status = BreakerStatus(data.get("status", "closed"))
        raw_failures = data.get("failures") or []
        if not isinstance(raw_failures, list):
            raise TypeError("failures is not a list")
        failures = tuple(sorted(_parse_time(value, "a failure time") for value in raw_failures))
        probe_id = data.get("probe_id")
        last_error = data.get("last_error")
        if probe_id is not None and not isinstance(probe_id, str):
            raise TypeError("probe_id is not a string")
        if last_error is not None and not isinstance(last_error, str):
            raise TypeError("last_error is not a string")
        state = BreakerState(
            status=status,
            failures=failures,
            opened_at=_read_time(data, "opened_at"),
            retry_at=_read_time(data, "retry_at"),
            probe_id=probe_id,
            probe_until=_read_time(data, "probe_until"),
            last_error=last_error,
        )
    except (TypeError, ValueError) as exc:
        raise CorruptDataError(
            f"stored breaker state cannot be read ({exc}); delete the blob to reset the breaker"
        ) from exc
    if status is not BreakerStatus.CLOSED and state.retry_at is None:
        raise CorruptDataError(
            f"stored breaker state is {status.value} without retry_at; "
            "delete the blob to reset the breaker"
        )
    if status is BreakerStatus.HALF_OPEN and (state.probe_id is None or state.probe_until is None):
        raise CorruptDataError(
            "stored breaker state is half-open without a probe lease; "
            "delete the blob to reset the breaker"
        )
    return state
