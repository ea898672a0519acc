"""Task-execution transitions: every move as a table, time budgets on a fake clock,
idempotent repeats, and properties over random move sequences and crashes; all pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import BudgetExceededError, ConflictError, TierMemError, ValidationError
from tiermem.state import tasks as tsk
from tiermem.state.models import Step, StepStatus, TaskState, TaskStatus
from tiermem.testing import FakeClock

CLOCK = FakeClock()
T0 = CLOCK.now()
SECOND = timedelta(seconds=1)
PLAN = (
    Step(step_id="find", tool="orders.get", description="find the order"),
    Step(step_id="track", tool="shipping.track", max_retries=1),
    Step(step_id="reply"),
)
W1, W2 = "worker-1", "worker-2"


def at(seconds: float) -> FakeClock:
    clock = FakeClock(T0)
    clock.advance(seconds)
    return clock


def planned() -> TaskState:
    return tsk.create_task(TaskState(), "t", PLAN, now=T0, goal="track a parcel", budget=3 * SECOND)


def running_find() -> TaskState:
    return tsk.start_step(planned(), "t", "find", worker=W1, now=at(0.1).now())


def found() -> TaskState:
    return tsk.complete_step(running_find(), "t", "find", {"order": "ORD-1"}, now=at(0.2).now())


def running_track() -> TaskState:
    return tsk.start_step(found(), "t", "track", worker=W1, now=at(0.3).now())


def track_failed_once() -> TaskState:
    return tsk.fail_step(running_track(), "t", "track", "timeout", now=at(0.4).now())


def track_failed_for_good() -> TaskState:
    again = tsk.start_step(track_failed_once(), "t", "track", worker=W1, now=at(0.5).now())
    return tsk.fail_step(again, "t", "track", "timeout", now=at(0.6).now())


def all_done() -> TaskState:
    state = tsk.complete_step(running_track(), "t", "track", "in transit", now=at(0.4).now())
    state = tsk.start_step(state, "t", "reply", worker=W1, now=at(0.5).now())
    return tsk.complete_step(state, "t", "reply", None, now=at(0.6).now())


def checkpointed() -> TaskState:
    return tsk.checkpoint(found(), "t", "after-find", now=at(0.25).now())


def timed_out() -> TaskState:
    return tsk.expire_overdue(running_track(), at(3).now())


Move = Callable[[TaskState], TaskState]


def finish_find(state: TaskState) -> TaskState:
    state = tsk.start_step(state, "t", "find", worker=W1, now=T0)
    return tsk.complete_step(state, "t", "find", 1, now=T0)


def statuses(state: TaskState) -> tuple[str, list[str]]:
    task = state.task("t")
    assert task is not None
    return task.status.value, [s.status.value for s in task.steps]


def step(state: TaskState, step_id: str) -> Step:
    task = state.task("t")
    assert task is not None
    found_step = task.step(step_id)
    assert found_step is not None
    return found_step


# (case, start, move, task status and step statuses after)
LEGAL: list[tuple[str, Callable[[], TaskState], Move, tuple[str, list[str]]]] = [
    ("create", TaskState, lambda s: planned(), ("active", ["queued", "queued", "queued"])),
    (
        "start the first step",
        planned,
        lambda s: running_find(),
        ("active", ["in_progress", "queued", "queued"]),
    ),
    ("complete it", running_find, lambda s: found(), ("active", ["completed", "queued", "queued"])),
    (
        "start the next",
        found,
        lambda s: running_track(),
        ("active", ["completed", "in_progress", "queued"]),
    ),
    (
        "a failure with retries left goes back to the queue",
        running_track,
        lambda s: track_failed_once(),
        ("active", ["completed", "queued", "queued"]),
    ),
    (
        "a failure with no retries left fails the step and the task",
        track_failed_once,
        lambda s: track_failed_for_good(),
        ("failed", ["completed", "failed", "queued"]),
    ),
    (
        "a failure without retry fails at once",
        running_track,
        lambda s: tsk.fail_step(s, "t", "track", "not found", now=at(0.4).now(), retry=False),
        ("failed", ["completed", "failed", "queued"]),
    ),
    (
        "the last step completes the task",
        running_track,
        lambda s: all_done(),
        ("completed", ["completed"] * 3),
    ),
    (
        "the deadline times out queued and running steps",
        running_track,
        lambda s: timed_out(),
        ("timed_out", ["completed", "timed_out", "timed_out"]),
    ),
    (
        "a late result is kept on the timed-out step",
        timed_out,
        lambda s: tsk.complete_step(s, "t", "track", "in transit", now=at(3.5).now()),
        ("timed_out", ["completed", "timed_out", "timed_out"]),
    ),
    (
        "rollback puts the steps back as the checkpoint saw them",
        checkpointed,
        lambda s: tsk.rollback(
            tsk.fail_step(
                tsk.start_step(s, "t", "track", worker=W1, now=at(0.3).now()),
                "t",
                "track",
                "bad",
                now=at(0.4).now(),
                retry=False,
            ),
            "t",
            "after-find",
            now=at(0.5).now(),
        ),
        ("active", ["completed", "queued", "queued"]),
    ),
    (
        "rollback with a new budget revives a timed-out task",
        lambda: tsk.expire_overdue(
            tsk.start_step(checkpointed(), "t", "track", worker=W1, now=at(1).now()), at(4).now()
        ),
        lambda s: tsk.rollback(s, "t", "after-find", now=at(4).now(), budget=2 * SECOND),
        ("active", ["completed", "queued", "queued"]),
    ),
    (
        "another worker takes over a step with takeover",
        running_track,
        lambda s: tsk.start_step(s, "t", "track", worker=W2, now=at(1).now(), takeover=True),
        ("active", ["completed", "in_progress", "queued"]),
    ),
    (
        "cancel",
        running_track,
        lambda s: tsk.cancel_task(s, "t", "the user changed their mind", now=at(1).now()),
        ("cancelled", ["completed", "in_progress", "queued"]),
    ),
]


@pytest.mark.parametrize(
    ("start", "move", "after"), [c[1:] for c in LEGAL], ids=[c[0] for c in LEGAL]
)
def test_legal_moves(
    start: Callable[[], TaskState], move: Move, after: tuple[str, list[str]]
) -> None:
    assert statuses(move(start())) == after


# (case, start, move, error type, what the message says)
ILLEGAL: list[tuple[str, Callable[[], TaskState], Move, type[TierMemError], str]] = [
    (
        "completing a step that is not in progress",
        planned,
        lambda s: tsk.complete_step(s, "t", "find", 1, now=T0),
        ValidationError,
        "queued, not in progress; start it",
    ),
    (
        "completing a completed step with another result",
        found,
        lambda s: tsk.complete_step(s, "t", "find", {"order": "ORD-2"}, now=T0),
        ValidationError,
        "a step is completed once",
    ),
    (
        "a late result that differs from the late result kept",
        lambda: tsk.complete_step(timed_out(), "t", "track", "a", now=at(4).now()),
        lambda s: tsk.complete_step(s, "t", "track", "b", now=at(4).now()),
        ValidationError,
        "different result",
    ),
    (
        "starting a step out of order",
        planned,
        lambda s: tsk.start_step(s, "t", "track", worker=W1, now=T0),
        ValidationError,
        "cannot start before step 'find'",
    ),
    (
        "starting a completed step",
        found,
        lambda s: tsk.start_step(s, "t", "find", worker=W1, now=T0),
        ValidationError,
        "already completed",
    ),
    (
        "starting a step another worker holds",
        running_track,
        lambda s: tsk.start_step(s, "t", "track", worker=W2, now=at(1).now()),
        ConflictError,
        "takeover=True",
    ),
    (
        "starting a step at the deadline",
        found,
        lambda s: tsk.start_step(s, "t", "track", worker=W1, now=at(3).now()),
        BudgetExceededError,
        "ran out of its 3 s budget",
    ),
    (
        "starting a step in a timed-out task",
        timed_out,
        lambda s: tsk.start_step(s, "t", "track", worker=W1, now=at(3).now()),
        BudgetExceededError,
        "rollback with a new budget",
    ),
    (
        "starting a step of a failed task",
        track_failed_for_good,
        lambda s: tsk.start_step(s, "t", "track", worker=W1, now=at(1).now()),
        ValidationError,
        "task 't' is failed",
    ),
    (
        "failing a queued step",
        planned,
        lambda s: tsk.fail_step(s, "t", "find", "boom", now=T0),
        ValidationError,
        "only a running step can fail",
    ),
    (
        "failing without a reason",
        running_find,
        lambda s: tsk.fail_step(s, "t", "find", " ", now=T0),
        ValidationError,
        "why",
    ),
    (
        "an unknown task",
        planned,
        lambda s: tsk.complete_step(s, "x", "find", now=T0),
        ValidationError,
        "create_task it first",
    ),
    (
        "an unknown step",
        planned,
        lambda s: tsk.start_step(s, "t", "x", worker=W1, now=T0),
        ValidationError,
        "has no step 'x'",
    ),
    (
        "a task of the same id with another plan",
        planned,
        lambda s: tsk.create_task(s, "t", PLAN[:1], now=T0),
        ValidationError,
        "exists with another plan",
    ),
    (
        "a task without steps",
        TaskState,
        lambda s: tsk.create_task(s, "t", [], now=T0),
        ValidationError,
        "at least one step",
    ),
    (
        "a plan with a started step",
        TaskState,
        lambda s: tsk.create_task(s, "t", [Step(step_id="a", status=StepStatus.COMPLETED)], now=T0),
        ValidationError,
        "must be a plan",
    ),
    (
        "two steps of one id",
        TaskState,
        lambda s: tsk.create_task(s, "t", [PLAN[0], PLAN[0]], now=T0),
        ValidationError,
        "unique",
    ),
    (
        "a zero budget",
        TaskState,
        lambda s: tsk.create_task(s, "t", PLAN, now=T0, budget=timedelta(0)),
        ValidationError,
        "positive",
    ),
    (
        "a checkpoint while a step runs",
        running_find,
        lambda s: tsk.checkpoint(s, "t", "c", now=T0),
        ValidationError,
        "between steps",
    ),
    (
        "a checkpoint name taken by other steps",
        lambda: tsk.checkpoint(planned(), "t", "c", now=T0),
        lambda s: tsk.checkpoint(finish_find(s), "t", "c", now=T0),
        ValidationError,
        "use another name",
    ),
    (
        "rollback to an unknown checkpoint",
        found,
        lambda s: tsk.rollback(s, "t", "nope", now=T0),
        ValidationError,
        "no checkpoint 'nope'",
    ),
]


@pytest.mark.parametrize(
    ("start", "move", "error", "message"), [c[1:] for c in ILLEGAL], ids=[c[0] for c in ILLEGAL]
)
def test_illegal_moves_are_refused_with_a_clear_error(
    start: Callable[[], TaskState], move: Move, error: type[TierMemError], message: str
) -> None:
    with pytest.raises(error, match=message):
        move(start())


REPEATABLE: list[tuple[str, Callable[[], TaskState], Move]] = [
    (
        "create the same task",
        planned,
        lambda s: tsk.create_task(s, "t", PLAN, now=at(9).now(), goal="track a parcel"),
    ),
    (
        "start a step this worker holds",
        running_find,
        lambda s: tsk.start_step(s, "t", "find", worker=W1, now=at(1).now()),
    ),
    (
        "complete with the same result",
        found,
        lambda s: tsk.complete_step(s, "t", "find", {"order": "ORD-1"}, now=at(1).now()),
    ),
    (
        "fail again (back in the queue)",
        track_failed_once,
        lambda s: tsk.fail_step(s, "t", "track", "timeout", now=at(1).now()),
    ),
    (
        "fail again (failed)",
        track_failed_for_good,
        lambda s: tsk.fail_step(s, "t", "track", "timeout", now=at(1).now()),
    ),
    (
        "take the same checkpoint",
        checkpointed,
        lambda s: tsk.checkpoint(s, "t", "after-find", now=at(1).now()),
    ),
    (
        "roll back twice",
        checkpointed,
        lambda s: tsk.rollback(s, "t", "after-find", now=at(1).now()),
    ),
    (
        "cancel a finished task",
        all_done,
        lambda s: tsk.cancel_task(s, "t", "late", now=at(1).now()),
    ),
    ("discard an unknown task", planned, lambda s: tsk.discard_task(s, "x")),
    ("expire before the deadline", running_track, lambda s: tsk.expire_overdue(s, at(2.999).now())),
    (
        "next step when all are done",
        all_done,
        lambda s: tsk.next_step(s, "t", worker=W1, now=at(1).now())[0],
    ),
]


@pytest.mark.parametrize(
    ("start", "move"), [c[1:] for c in REPEATABLE], ids=[c[0] for c in REPEATABLE]
)
def test_repeated_moves_change_nothing(start: Callable[[], TaskState], move: Move) -> None:
    state = start()
    assert move(state) == state


def test_step_bookkeeping() -> None:
    state = track_failed_once()
    track = step(state, "track")
    assert (track.retries, track.error, track.attempts, track.worker) == (1, "timeout", 1, None)
    state = tsk.start_step(state, "t", "track", worker=W2, now=at(0.5).now())
    track = step(state, "track")
    assert (track.attempts, track.worker, track.started_at) == (2, W2, at(0.5).now())
    done = tsk.complete_step(state, "t", "track", [1, 2], now=at(0.7).now())
    track = step(done, "track")
    assert (track.status, track.result, track.error, track.finished_at) == (
        StepStatus.COMPLETED,
        [1, 2],
        None,
        at(0.7).now(),
    )


def test_takeover_counts_an_attempt() -> None:
    taken = tsk.start_step(running_track(), "t", "track", worker=W2, now=at(1).now(), takeover=True)
    assert (step(taken, "track").attempts, step(taken, "track").worker) == (2, W2)


def test_next_step_starts_the_first_open_step_and_keeps_the_running_one() -> None:
    state, chosen = tsk.next_step(found(), "t", worker=W1, now=at(1).now())
    assert chosen == "track"
    assert tsk.next_step(state, "t", worker=W1, now=at(1.1).now()) == (state, "track")


@pytest.mark.parametrize(
    ("elapsed", "startable"), [(0, True), (2.999, True), (3.0, False), (3.001, False), (60, False)]
)
def test_the_time_budget_is_enforced_with_the_clock(elapsed: float, startable: bool) -> None:
    now = at(elapsed).now()
    if startable:
        assert (
            statuses(tsk.start_step(planned(), "t", "find", worker=W1, now=now))[1][0]
            == "in_progress"
        )
    else:
        with pytest.raises(BudgetExceededError):
            tsk.start_step(planned(), "t", "find", worker=W1, now=now)
        assert statuses(tsk.expire_overdue(planned(), now))[0] == "timed_out"


def test_a_task_without_budget_never_times_out() -> None:
    state = tsk.create_task(TaskState(), "t", PLAN, now=T0)
    far = at(10**7).now()
    assert tsk.expire_overdue(state, far) is state
    assert statuses(tsk.start_step(state, "t", "find", worker=W1, now=far))[1][0] == "in_progress"


def test_rollback_drops_later_checkpoints() -> None:
    state = tsk.checkpoint(planned(), "t", "start", now=T0)
    state = tsk.complete_step(
        tsk.start_step(state, "t", "find", worker=W1, now=T0), "t", "find", 1, now=T0
    )
    state = tsk.checkpoint(state, "t", "after-find", now=T0)
    back = tsk.rollback(state, "t", "start", now=at(1).now())
    task = back.task("t")
    assert task is not None
    assert [c.name for c in task.checkpoints] == ["start"]
    assert statuses(back)[1] == ["queued"] * 3


def test_finished_tasks_are_pruned_oldest_first() -> None:
    state = TaskState()
    for n in range(tsk.KEEP_FINISHED + 3):
        state = tsk.create_task(state, f"t{n}", PLAN[:1], now=at(n).now())
        state = tsk.cancel_task(state, f"t{n}", "done", now=at(n).now())
    state = tsk.create_task(state, "new", PLAN[:1], now=at(100).now())
    ids = [t.task_id for t in state.tasks]
    assert len(ids) == tsk.KEEP_FINISHED + 1
    assert ids[0] == "t3"
    assert ids[-1] == "new"


def test_active_tasks_are_bounded() -> None:
    state = TaskState()
    for n in range(tsk.MAX_TASKS):
        state = tsk.create_task(state, f"t{n}", PLAN[:1], now=T0)
    with pytest.raises(ValidationError, match="finish or cancel some first"):
        tsk.create_task(state, "one-more", PLAN[:1], now=T0)


# ---------------------------------------------------------------- properties

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["next", "complete", "fail", "fail_hard", "checkpoint", "rollback", "tick", "takeover"]
        ),
        st.sampled_from(["find", "track", "reply"]),
        st.integers(0, 3),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_any_sequence_of_moves_keeps_the_task_invariants(ops: list[tuple[str, str, int]]) -> None:
    clock = FakeClock(T0)
    state = tsk.create_task(TaskState(), "t", PLAN, now=clock.now(), budget=10 * SECOND)
    for op, step_id, n in ops:
        now = clock.now()
        try:
            if op == "next":
                state, _ = tsk.next_step(state, "t", worker=W1, now=now)
            elif op == "takeover":
                state, _ = tsk.next_step(state, "t", worker=W2, now=now, takeover=True)
            elif op == "complete":
                state = tsk.complete_step(state, "t", step_id, n, now=now)
            elif op in ("fail", "fail_hard"):
                state = tsk.fail_step(state, "t", step_id, f"e{n}", now=now, retry=op == "fail")
            elif op == "checkpoint":
                state = tsk.checkpoint(state, "t", f"c{n}", now=now)
            elif op == "rollback":
                state = tsk.rollback(state, "t", f"c{n}", now=now, budget=10 * SECOND)
            else:
                clock.advance(n)
                state = tsk.expire_overdue(state, clock.now())
        except (ValidationError, ConflictError, BudgetExceededError):
            pass
        task = state.task("t")
        assert task is not None
        kinds = [s.status for s in task.steps]
        # Steps run in order: nothing past the first open step has started.
        first_open = next(
            (i for i, k in enumerate(kinds) if k is not StepStatus.COMPLETED), len(kinds)
        )
        assert all(k is StepStatus.QUEUED for k in kinds[first_open + 1 :]) or task.status in (
            TaskStatus.TIMED_OUT,
            TaskStatus.FAILED,
        )
        assert kinds.count(StepStatus.IN_PROGRESS) <= 1
        assert (task.status is TaskStatus.COMPLETED) == all(
            k is StepStatus.COMPLETED for k in kinds
        )
        assert all(s.retries <= task.retries_allowed(s) for s in task.steps)
        assert all(s.worker is not None for s in task.steps if s.status is StepStatus.IN_PROGRESS)
        assert TaskState.model_validate_json(state.model_dump_json()) == state


CRASH_POINTS = st.lists(
    st.sampled_from(["after_start", "after_effect", "after_complete", "none"]),
    min_size=6,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(CRASH_POINTS)
def test_a_worker_that_crashes_anywhere_never_redoes_a_recorded_step(crashes: list[str]) -> None:
    """The recovery protocol on pure values: a worker claims a step (start), does its side
    effect, records it (complete); it may crash at any point, and a new worker resumes with
    takeover. A step recorded as completed is never done again; only the one step whose
    effect happened without being recorded may be done twice."""
    plan = [Step(step_id=f"s{n}") for n in range(6)]
    state = tsk.create_task(TaskState(), "t", plan, now=T0)
    effects: Counter[str] = Counter()
    unrecorded: set[str] = set()
    crash_iter = iter(crashes)
    for worker in range(1, 100):
        crashed = False
        while True:
            state, chosen = tsk.next_step(state, "t", worker=f"w{worker}", now=T0, takeover=True)
            if chosen is None:
                break
            where = next(crash_iter, "none")
            if where == "after_start":
                crashed = True
                break
            effects[chosen] += 1
            if where == "after_effect":
                unrecorded.add(chosen)
                crashed = True
                break
            state = tsk.complete_step(state, "t", chosen, f"done by w{worker}", now=T0)
            if where == "after_complete":
                crashed = True
                break
        if not crashed:
            break
    task = state.task("t")
    assert task is not None
    assert task.status is TaskStatus.COMPLETED
    assert set(effects) == {f"s{n}" for n in range(6)}
    assert {s for s, n in effects.items() if n > 1} <= unrecorded
    assert all(n <= 1 + crashes.count("after_effect") for n in effects.values())
