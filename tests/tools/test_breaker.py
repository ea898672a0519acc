"""The breaker state machine, case by case: every transition of the pure functions."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import CorruptDataError, ValidationError
from tiermem.tools.breaker import (
    CLOSED_STATE,
    Admission,
    BreakerEvent,
    BreakerPolicy,
    BreakerState,
    BreakerStatus,
    ToolHealth,
    admit,
    decode_state,
    encode_state,
    record_failure,
    record_success,
    tool_health,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(
    failure_threshold=3,
    window=timedelta(seconds=60),
    reset_timeout=timedelta(seconds=30),
    probe_lease=timedelta(seconds=10),
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def closed(*failure_seconds: float) -> BreakerState:
    return BreakerState(failures=tuple(at(s) for s in failure_seconds), last_error="boom")


OPEN = BreakerState(status=BreakerStatus.OPEN, opened_at=at(0), retry_at=at(30), last_error="boom")
HALF_OPEN = replace(OPEN, status=BreakerStatus.HALF_OPEN, probe_id="p1", probe_until=at(40))


# -- admission ------------------------------------------------------------------------

ADMIT_CASES = [
    # (name, state, now, admission, event, state after)
    ("closed lets calls through", CLOSED_STATE, 0, Admission.CALL, None, CLOSED_STATE),
    ("closed with failures too", closed(1, 2), 3, Admission.CALL, None, closed(1, 2)),
    ("open rejects before retry_at", OPEN, 29.999, Admission.REJECT, None, OPEN),
    (
        "open at retry_at: the caller is the probe",
        OPEN,
        30,
        Admission.PROBE,
        BreakerEvent.PROBE_STARTED,
        replace(OPEN, status=BreakerStatus.HALF_OPEN, probe_id="new", probe_until=at(40)),
    ),
    (
        "open long after retry_at: still one probe",
        OPEN,
        500,
        Admission.PROBE,
        BreakerEvent.PROBE_STARTED,
        replace(OPEN, status=BreakerStatus.HALF_OPEN, probe_id="new", probe_until=at(510)),
    ),
    (
        "half-open rejects while the lease runs",
        HALF_OPEN,
        39.999,
        Admission.REJECT,
        None,
        HALF_OPEN,
    ),
    (
        "half-open with a lapsed lease: taken over",
        HALF_OPEN,
        40,
        Admission.PROBE,
        BreakerEvent.PROBE_TAKEN_OVER,
        replace(HALF_OPEN, probe_id="new", probe_until=at(50)),
    ),
]


@pytest.mark.parametrize(
    ("state", "now", "admission", "event", "after"),
    [case[1:] for case in ADMIT_CASES],
    ids=[case[0] for case in ADMIT_CASES],
)
def test_admit(
    state: BreakerState,
    now: float,
    admission: Admission,
    event: BreakerEvent | None,
    after: BreakerState,
) -> None:
    drawn: list[str] = []

    def new_id() -> str:
        drawn.append("new")
        return "new"

    decision = admit(state, POLICY, at(now), new_probe_id=new_id)
    assert decision.admission is admission
    assert decision.transition.event is event
    assert decision.transition.after == after
    assert decision.transition.before == state
    # A probe id is drawn only for a probe: a healthy tool's check costs nothing more.
    assert drawn == (["new"] if admission is Admission.PROBE else [])


# -- failures -------------------------------------------------------------------------

FAILURE_CASES = [
    # (name, state, now, probe_id, event, state after)
    (
        "first failure is counted",
        CLOSED_STATE,
        5,
        None,
        BreakerEvent.FAILURE_RECORDED,
        BreakerState(failures=(at(5),), last_error="err"),
    ),
    (
        "second failure within the window",
        closed(5),
        20,
        None,
        BreakerEvent.FAILURE_RECORDED,
        BreakerState(failures=(at(5), at(20)), last_error="err"),
    ),
    (
        "threshold reached within the window opens",
        closed(5, 20),
        50,
        None,
        BreakerEvent.OPENED,
        BreakerState(
            status=BreakerStatus.OPEN, opened_at=at(50), retry_at=at(80), last_error="err"
        ),
    ),
    (
        "failures older than the window no longer count",
        closed(5, 20),
        66,
        None,
        BreakerEvent.FAILURE_RECORDED,
        BreakerState(failures=(at(20), at(66)), last_error="err"),
    ),
    (
        "a failure exactly one window old has left it",
        closed(5, 20),
        65,
        None,
        BreakerEvent.FAILURE_RECORDED,
        BreakerState(failures=(at(20), at(65)), last_error="err"),
    ),
    (
        "a late probe's failure while closed is still a failure",
        closed(5),
        6,
        "old-probe",
        BreakerEvent.FAILURE_RECORDED,
        BreakerState(failures=(at(5), at(6)), last_error="err"),
    ),
    ("open ignores failures of calls admitted earlier", OPEN, 10, None, None, OPEN),
    (
        "the probe's failure re-opens, keeping the outage start",
        HALF_OPEN,
        35,
        "p1",
        BreakerEvent.REOPENED,
        BreakerState(status=BreakerStatus.OPEN, opened_at=at(0), retry_at=at(65), last_error="err"),
    ),
    ("half-open ignores another prober's failure", HALF_OPEN, 35, "p0", None, HALF_OPEN),
    ("half-open ignores a non-probe failure", HALF_OPEN, 35, None, None, HALF_OPEN),
]


@pytest.mark.parametrize(
    ("state", "now", "probe_id", "event", "after"),
    [case[1:] for case in FAILURE_CASES],
    ids=[case[0] for case in FAILURE_CASES],
)
def test_record_failure(
    state: BreakerState,
    now: float,
    probe_id: str | None,
    event: BreakerEvent | None,
    after: BreakerState,
) -> None:
    transition = record_failure(state, POLICY, at(now), error="err", probe_id=probe_id)
    assert transition.event is event
    assert transition.changed is (event is not None)
    assert transition.after == after


def test_failure_keeps_a_short_error() -> None:
    transition = record_failure(CLOSED_STATE, POLICY, at(0), error="x" * 10_000)
    assert transition.after.last_error == "x" * 300


# -- successes ------------------------------------------------------------------------

SUCCESS_CASES = [
    # (name, state, probe_id, event, state after)
    ("closed: success writes nothing", CLOSED_STATE, None, None, CLOSED_STATE),
    ("closed with failures: still nothing", closed(1, 2), None, None, closed(1, 2)),
    ("the probe's success closes", HALF_OPEN, "p1", BreakerEvent.CLOSED, CLOSED_STATE),
    ("another prober's success is ignored", HALF_OPEN, "p0", None, HALF_OPEN),
    ("a non-probe success while half-open is ignored", HALF_OPEN, None, None, HALF_OPEN),
    ("a late success while open is ignored", OPEN, None, None, OPEN),
]


@pytest.mark.parametrize(
    ("state", "probe_id", "event", "after"),
    [case[1:] for case in SUCCESS_CASES],
    ids=[case[0] for case in SUCCESS_CASES],
)
def test_record_success(
    state: BreakerState, probe_id: str | None, event: BreakerEvent | None, after: BreakerState
) -> None:
    transition = record_success(state, POLICY, at(35), probe_id=probe_id)
    assert transition.event is event
    assert transition.after == after


# -- health ---------------------------------------------------------------------------

HEALTH_CASES = [
    ("no failures", CLOSED_STATE, 0, POLICY, ToolHealth.HEALTHY),
    ("one recent failure of threshold 3", closed(1), 2, POLICY, ToolHealth.DEGRADED),
    ("failures out of the window", closed(1), 62, POLICY, ToolHealth.HEALTHY),
    (
        "below an explicit degraded count",
        closed(1),
        2,
        replace(POLICY, degraded_failures=2),
        ToolHealth.HEALTHY,
    ),
    (
        "at an explicit degraded count",
        closed(1, 2),
        3,
        replace(POLICY, degraded_failures=2),
        ToolHealth.DEGRADED,
    ),
    ("open", OPEN, 10, POLICY, ToolHealth.UNAVAILABLE),
    ("open past retry_at, not yet probed", OPEN, 100, POLICY, ToolHealth.UNAVAILABLE),
    ("half-open", HALF_OPEN, 35, POLICY, ToolHealth.UNAVAILABLE),
]


@pytest.mark.parametrize(
    ("state", "now", "policy", "health"),
    [case[1:] for case in HEALTH_CASES],
    ids=[case[0] for case in HEALTH_CASES],
)
def test_tool_health(
    state: BreakerState, now: float, policy: BreakerPolicy, health: ToolHealth
) -> None:
    assert tool_health(state, policy, at(now)) is health


def test_default_degraded_count_is_half_the_threshold() -> None:
    assert BreakerPolicy(failure_threshold=5).degraded_after == 2
    assert BreakerPolicy(failure_threshold=1).degraded_after == 1


@pytest.mark.parametrize(
    "options",
    [
        {"failure_threshold": 0},
        {"window": timedelta(0)},
        {"reset_timeout": timedelta(seconds=-1)},
        {"probe_lease": 5},
        {"degraded_failures": 6},
        {"degraded_failures": 0},
    ],
)
def test_bad_policies_are_rejected(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        BreakerPolicy(**options)  # type: ignore[arg-type]


# -- codec ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [CLOSED_STATE, closed(1, 2), OPEN, HALF_OPEN],
    ids=["closed", "failing", "open", "half"],
)
def test_state_round_trips_through_json(state: BreakerState) -> None:
    assert decode_state(encode_state(state)) == state


def test_decoding_ignores_unknown_fields() -> None:
    data = {**encode_state(OPEN), "added_in_a_later_release": [1, 2]}
    assert decode_state(data) == OPEN


@pytest.mark.parametrize(
    "data",
    [
        {"status": "melted"},
        {"status": "open"},
        {"status": "half_open", "retry_at": at(1).isoformat()},
        {"status": "closed", "failures": "yesterday"},
        {"status": "closed", "failures": [None]},
        {"status": "closed", "failures": ["2030-01-01T00:00:00"]},
        {"status": "open", "retry_at": 5},
        {"status": "open", "retry_at": at(1).isoformat(), "last_error": 7},
    ],
)
def test_undecodable_states_raise_corrupt_data(data: dict[str, object]) -> None:
    with pytest.raises(CorruptDataError, match="delete the blob"):
        decode_state(data)


# -- property: whatever happens, at most one live probe --------------------------------

EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["check", "success", "failure"]),
        st.floats(min_value=0, max_value=40),
        st.integers(min_value=0, max_value=5),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_never_two_live_probes_and_states_stay_well_formed(
    events: list[tuple[str, float, int]],
) -> None:
    state, now = CLOSED_STATE, T0
    probes: list[str] = []  # every probe id ever granted, oldest first
    leases: dict[str, datetime] = {}
    for kind, step, pick in events:
        now += timedelta(seconds=step)
        probe_id = probes[pick % len(probes)] if probes and pick else None
        if kind == "check":
            decision = admit(state, POLICY, now, new_probe_id=lambda: f"p{len(probes)}")
            if decision.admission is Admission.PROBE:
                live = [p for p, until in leases.items() if until > now]
                assert not live, f"a probe was granted while {live} held a live lease"
                new = decision.transition.after.probe_id
                assert new is not None
                probes.append(new)
                leases[new] = now + POLICY.probe_lease
            state = decision.transition.after
        elif kind == "success":
            state = record_success(state, POLICY, now, probe_id=probe_id).after
        else:
            state = record_failure(state, POLICY, now, error="e", probe_id=probe_id).after
        if state.status is not BreakerStatus.HALF_OPEN:
            leases.clear()  # the probe's outcome ended its lease
        if state.status is BreakerStatus.CLOSED:
            assert len(state.failures) < POLICY.failure_threshold
            assert state.probe_id is None
            assert state.retry_at is None
        else:
            assert state.retry_at is not None
            assert state.opened_at is not None
            assert (state.status is BreakerStatus.HALF_OPEN) == (state.probe_id is not None)
        assert decode_state(encode_state(state)) == state
