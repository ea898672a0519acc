"""Moves of the task-execution layer: pure functions from a state to the next state.

The life of a step::

    queued ──start──▶ in_progress ──complete──▶ completed
      ▲                   │ ╲
      └──fail, retries left╯  ╲──fail, none left──▶ failed (the task fails)
    queued / in_progress ──the task's deadline passes──▶ timed_out (the task times out)

Steps run in order: a step starts once every step before it is completed. A task
completes with its last step. ``rollback`` puts a task's steps back as a checkpoint saw
them (the agent undoes side effects itself, if any need undoing).

Moves a retry may repeat are idempotent: starting a step this worker holds, completing a
completed step with the same result, failing it again with the same error, creating the
same task again, taking the same checkpoint again. They return the state they were given.

The time budget is enforced with the ``now`` the caller passes (the injected clock): no
step starts at or after the task's deadline (:class:`~tiermem.errors.BudgetExceededError`),
and :func:`expire_overdue` marks overdue tasks ``timed_out``. A result that arrives after
the deadline is kept on its timed-out step, for the record.

A step in progress belongs to the worker that started it. Another worker starts it again
only with ``takeover=True`` (the holder crashed): that is at-least-once for the step that
was in flight, so tools should treat the step id as an idempotency key.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from tiermem.errors import BudgetExceededError, ConflictError, ValidationError
from tiermem.models.base import JsonValue
from tiermem.state.models import (
    Checkpoint,
    Step,
    StepStatus,
    Task,
    TaskState,
    TaskStatus,
)

__all__ = [
    "KEEP_FINISHED",
    "MAX_CHECKPOINTS",
    "MAX_STEPS",
    "MAX_TASKS",
    "cancel_task",
    "checkpoint",
    "complete_step",
    "create_task",
    "discard_task",
    "expire_overdue",
    "fail_step",
    "next_step",
    "rollback",
    "start_step",
    "timeout_message",
]

MAX_STEPS = 100
MAX_TASKS = 32
"""Active tasks per session; finished ones beyond :data:`KEEP_FINISHED` are dropped."""
KEEP_FINISHED = 4
"""Finished tasks kept (newest first) so the agent can still report their results."""
MAX_CHECKPOINTS = 8


def _task(state: TaskState, task_id: str) -> Task:
    task = state.task(task_id)
    if task is None:
        raise ValidationError(f"no task {task_id!r} in this session; create_task it first")
    return task


def _step(task: Task, step_id: str) -> Step:
    step = task.step(step_id)
    if step is None:
        known = ", ".join(s.step_id for s in task.steps)
        raise ValidationError(f"task {task.task_id!r} has no step {step_id!r} (steps: {known})")
    return step


def _put(state: TaskState, task: Task) -> TaskState:
    tasks = tuple(task if t.task_id == task.task_id else t for t in state.tasks)
    return state.model_copy(update={"tasks": tasks})


def _put_step(task: Task, step: Step) -> Task:
    steps = tuple(step if s.step_id == step.step_id else s for s in task.steps)
    return task.model_copy(update={"steps": steps})


def _at(value: datetime) -> str:
    return value.strftime("%H:%M:%SZ")


def timeout_message(task: Task) -> str:
    """What to tell the caller when a task has run out of time."""
    budget = f"{task.budget_ms / 1000:g} s" if task.budget_ms else "time"
    at = f" at {_at(task.deadline)}" if task.deadline else ""
    return (
        f"task {task.task_id!r} ran out of its {budget} budget{at}; its unfinished steps "
        "are timed_out. Answer with what is done, or rollback with a new budget"
    )


def _check_open(task: Task, now: datetime) -> None:
    """Refuse to start work in a task that is over, or past its deadline."""
    if task.status is TaskStatus.TIMED_OUT or (
        task.status is TaskStatus.ACTIVE and task.deadline is not None and now >= task.deadline
    ):
        raise BudgetExceededError(timeout_message(task))
    if task.status is not TaskStatus.ACTIVE:
        raise ValidationError(
            f"task {task.task_id!r} is {task.status.value}; rollback to a checkpoint or "
            "create a new task"
        )


def create_task(
    state: TaskState,
    task_id: str,
    steps: Sequence[Step],
    *,
    now: datetime,
    goal: str = "",
    budget: timedelta | None = None,
    max_retries: int = 2,
) -> TaskState:
    """Plan a task: its step queue, a time budget counted from ``now``, a retry limit.

    Creating the same task again (same id, goal and step definitions) changes nothing, so
    a worker that restarts may simply plan again. Finished tasks beyond
    :data:`KEEP_FINISHED` are dropped, oldest first.

    Raises:
        ValidationError: no steps, too many steps or tasks, steps that are not fresh
            plans, duplicate step ids, a non-positive budget, or an existing task of that
            id with another plan.
    """
    if not steps:
        raise ValidationError(f"task {task_id!r} needs at least one step")
    if len(steps) > MAX_STEPS:
        raise ValidationError(f"a task may have at most {MAX_STEPS} steps, got {len(steps)}")
    fresh = [s.model_copy(update={"params": dict(s.params)}) for s in steps]
    for step in fresh:
        if step.status is not StepStatus.QUEUED or step.attempts or step.retries:
            raise ValidationError(
                f"step {step.step_id!r} must be a plan (queued, never started); "
                "pass only step_id, tool, description, params and max_retries"
            )
    if budget is not None and budget <= timedelta(0):
        raise ValidationError(f"budget must be positive, got {budget}")
    held = state.task(task_id)
    if held is not None:
        same = held.goal == goal and [s.definition() for s in held.steps] == [
            s.definition() for s in fresh
        ]
        if same:
            return state
        raise ValidationError(
            f"task {task_id!r} exists with another plan; use a new task id, or "
            "discard_task the old one first"
        )
    if len(state.active) >= MAX_TASKS:
        raise ValidationError(
            f"{MAX_TASKS} tasks are active in this session; finish or cancel some first"
        )
    budget_ms = None if budget is None else max(1, round(budget.total_seconds() * 1000))
    try:
        task = Task(
            task_id=task_id,
            goal=goal,
            steps=tuple(fresh),
            max_retries=max_retries,
            budget_ms=budget_ms,
            created_at=now,
            deadline=None if budget is None else now + budget,
        )
    except ValueError as exc:
        raise ValidationError(f"bad task {task_id!r}: {exc}") from exc
    finished = sorted(
        (t for t in state.tasks if t.finished),
        key=lambda t: t.finished_at or t.created_at,
        reverse=True,
    )
    dropped = {t.task_id for t in finished[KEEP_FINISHED:]}
    kept = tuple(t for t in state.tasks if t.task_id not in dropped)
    return state.model_copy(update={"tasks": (*kept, task)})


def expire_overdue(state: TaskState, now: datetime) -> TaskState:
    """Time out every active task whose deadline has passed: its queued and in-progress
    steps become ``timed_out``. Returns ``state`` itself when nothing was overdue."""
    changed = False
    tasks: list[Task] = []
    for task in state.tasks:
        if task.status is TaskStatus.ACTIVE and task.deadline is not None and now >= task.deadline:
            changed = True
            steps = tuple(
                s.model_copy(
                    update={
                        "status": StepStatus.TIMED_OUT,
                        "finished_at": now,
                        "error": s.error or "the task's time budget ran out",
                    }
                )
                if s.status in (StepStatus.QUEUED, StepStatus.IN_PROGRESS)
                else s
                for s in task.steps
            )
            task = task.model_copy(
                update={"steps": steps, "status": TaskStatus.TIMED_OUT, "finished_at": now}
            )
        tasks.append(task)
    return state.model_copy(update={"tasks": tuple(tasks)}) if changed else state


def start_step(
    state: TaskState,
    task_id: str,
    step_id: str,
    *,
    worker: str,
    now: datetime,
    takeover: bool = False,
) -> TaskState:
    """Mark a step in progress, held by ``worker``.

    A step ``worker`` already holds is left as it is (a repeated call). A step another
    worker holds is taken over only with ``takeover=True``: use it when that worker is
    known to be gone (a restart after a crash); the step counts one more attempt.

    Raises:
        BudgetExceededError: the task is past its deadline (or timed out already).
        ConflictError: another worker holds the step and ``takeover`` is False.
        ValidationError: no such task or step, the task is over, an earlier step is not
            completed, or the step is completed or failed already.
    """
    task = _task(state, task_id)
    step = _step(task, step_id)
    if step.status is StepStatus.COMPLETED:
        raise ValidationError(
            f"step {step_id!r} of task {task_id!r} is already completed (its result is "
            "kept on the step): use the result, do not run it again"
        )
    _check_open(task, now)
    if step.status is StepStatus.FAILED:
        raise ValidationError(
            f"step {step_id!r} of task {task_id!r} failed with no retries left "
            f"({step.error}); rollback to a checkpoint or cancel the task"
        )
    if step.status is StepStatus.IN_PROGRESS:
        if step.worker == worker:
            return state
        if not takeover:
            raise ConflictError(
                f"step {step_id!r} of task {task_id!r} is in progress in worker "
                f"{step.worker!r} since {_at(step.started_at or now)}; if that worker is "
                "gone, start it again with takeover=True",
                expected=worker,
                actual=step.worker,
            )
    else:
        blocking = next(s for s in task.steps if s.status is not StepStatus.COMPLETED)
        if blocking.step_id != step_id:
            raise ValidationError(
                f"step {step_id!r} of task {task_id!r} cannot start before step "
                f"{blocking.step_id!r} ({blocking.status.value}) is completed; steps run "
                "in order"
            )
    started = step.model_copy(
        update={
            "status": StepStatus.IN_PROGRESS,
            "worker": worker,
            "attempts": step.attempts + 1,
            "started_at": now,
            "finished_at": None,
        }
    )
    return _put(state, _put_step(task, started))


def next_step(
    state: TaskState, task_id: str, *, worker: str, now: datetime, takeover: bool = False
) -> tuple[TaskState, str | None]:
    """Start the task's next step (or keep the one in progress) and return its id; None
    when every step is completed. The errors are those of :func:`start_step`."""
    task = _task(state, task_id)
    step = task.next_open_step
    if step is None:
        return state, None
    return start_step(state, task_id, step.step_id, worker=worker, now=now, takeover=takeover), (
        step.step_id
    )


def complete_step(
    state: TaskState, task_id: str, step_id: str, result: JsonValue = None, *, now: datetime
) -> TaskState:
    """Record a step's result; the task completes with its last step.

    Completing a completed step again with the same result changes nothing; a result
    that arrives after the task timed out is kept on the timed-out step.

    Raises:
        ValidationError: no such task or step, the step is not in progress (queued, or
            failed), or it was completed (or given a late result) with a different one.
    """
    task = _task(state, task_id)
    step = _step(task, step_id)
    if step.status in (StepStatus.COMPLETED, StepStatus.TIMED_OUT):
        if step.result == result:
            return state
        if step.status is StepStatus.COMPLETED or step.result is not None:
            raise ValidationError(
                f"step {step_id!r} of task {task_id!r} already has a different result; a "
                "step is completed once (rollback to a checkpoint to run it again)"
            )
        late = step.model_copy(update={"result": result, "error": "finished after the deadline"})
        return _put(state, _put_step(task, late))
    if step.status is not StepStatus.IN_PROGRESS:
        raise ValidationError(
            f"step {step_id!r} of task {task_id!r} is {step.status.value}, not in progress; "
            "start it before completing it"
        )
    done = step.model_copy(
        update={"status": StepStatus.COMPLETED, "result": result, "error": None, "finished_at": now}
    )
    task = _put_step(task, done)
    if all(s.status is StepStatus.COMPLETED for s in task.steps):
        task = task.model_copy(update={"status": TaskStatus.COMPLETED, "finished_at": now})
    return _put(state, task)


def fail_step(
    state: TaskState,
    task_id: str,
    step_id: str,
    error: str,
    *,
    now: datetime,
    retry: bool = True,
) -> TaskState:
    """Record a failed attempt. With ``retry`` and retries left, the step goes back to the
    queue; otherwise it fails, and the task with it.

    Failing it again with the same error (a repeated call) changes nothing.

    Raises:
        ValidationError: no such task or step, a blank error, or the step is not in
            progress (and was not just failed with this error).
    """
    if not error.strip():
        raise ValidationError("say why the step failed: error must not be blank")
    task = _task(state, task_id)
    step = _step(task, step_id)
    repeated = step.error == error and (
        step.status in (StepStatus.FAILED, StepStatus.TIMED_OUT)
        or (step.status is StepStatus.QUEUED and step.retries > 0)
    )
    if repeated:
        return state
    if step.status is not StepStatus.IN_PROGRESS:
        raise ValidationError(
            f"step {step_id!r} of task {task_id!r} is {step.status.value}, not in progress; "
            "only a running step can fail"
        )
    if retry and step.retries < task.retries_allowed(step):
        queued = step.model_copy(
            update={
                "status": StepStatus.QUEUED,
                "error": error,
                "retries": step.retries + 1,
                "worker": None,
                "started_at": None,
            }
        )
        return _put(state, _put_step(task, queued))
    failed = step.model_copy(
        update={"status": StepStatus.FAILED, "error": error, "finished_at": now}
    )
    task = _put_step(task, failed).model_copy(
        update={
            "status": TaskStatus.FAILED,
            "finished_at": now,
            "note": f"step {step_id!r} failed: {error}",
        }
    )
    return _put(state, task)


def checkpoint(state: TaskState, task_id: str, name: str, *, now: datetime) -> TaskState:
    """Remember the task's steps as they are now, to :func:`rollback` to later. Taking the
    same checkpoint again (nothing changed since) changes nothing.

    Raises:
        ValidationError: no such task, a step is in progress (checkpoint between steps),
            a checkpoint of that name holds other steps, or :data:`MAX_CHECKPOINTS`.
    """
    task = _task(state, task_id)
    running = next((s for s in task.steps if s.status is StepStatus.IN_PROGRESS), None)
    if running is not None:
        raise ValidationError(
            f"step {running.step_id!r} of task {task_id!r} is in progress; take checkpoints "
            "between steps"
        )
    held = next((c for c in task.checkpoints if c.name == name), None)
    if held is not None:
        if held.steps == task.steps:
            return state
        raise ValidationError(
            f"task {task_id!r} already has a checkpoint {name!r}; use another name"
        )
    if len(task.checkpoints) >= MAX_CHECKPOINTS:
        raise ValidationError(f"task {task_id!r} has {MAX_CHECKPOINTS} checkpoints already")
    try:
        mark = Checkpoint(name=name, created_at=now, steps=task.steps)
    except ValueError as exc:
        raise ValidationError(f"bad checkpoint name {name!r}: {exc}") from exc
    return _put(state, task.model_copy(update={"checkpoints": (*task.checkpoints, mark)}))


def rollback(
    state: TaskState,
    task_id: str,
    name: str,
    *,
    now: datetime,
    budget: timedelta | None = None,
) -> TaskState:
    """Put the task's steps back as checkpoint ``name`` saw them and make the task active
    again; later checkpoints are dropped. ``budget`` starts a new time budget from ``now``
    (a timed-out task needs one to run again).

    Raises:
        ValidationError: no such task or checkpoint, or a non-positive budget.
    """
    task = _task(state, task_id)
    names = [c.name for c in task.checkpoints]
    if name not in names:
        raise ValidationError(
            f"task {task_id!r} has no checkpoint {name!r} (checkpoints: "
            f"{', '.join(names) or 'none'})"
        )
    if budget is not None and budget <= timedelta(0):
        raise ValidationError(f"budget must be positive, got {budget}")
    mark = task.checkpoints[names.index(name)]
    update: dict[str, object] = {
        "steps": mark.steps,
        "status": TaskStatus.ACTIVE,
        "finished_at": None,
        "note": None,
        "checkpoints": task.checkpoints[: names.index(name) + 1],
    }
    if budget is not None:
        update["budget_ms"] = max(1, round(budget.total_seconds() * 1000))
        update["deadline"] = now + budget
    restored = task.model_copy(update=update)
    return state if restored == task else _put(state, restored)


def cancel_task(state: TaskState, task_id: str, reason: str, *, now: datetime) -> TaskState:
    """Stop a task (the user changed their mind). A finished task is left as it is."""
    task = _task(state, task_id)
    if task.finished:
        return state
    note = reason.strip() or "cancelled"
    return _put(
        state,
        task.model_copy(update={"status": TaskStatus.CANCELLED, "finished_at": now, "note": note}),
    )


def discard_task(state: TaskState, task_id: str) -> TaskState:
    """Forget a task entirely; an unknown task changes nothing."""
    tasks = tuple(t for t in state.tasks if t.task_id != task_id)
    return state if len(tasks) == len(state.tasks) else state.model_copy(update={"tasks": tasks})
