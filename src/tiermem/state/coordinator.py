"""StateCoordinator: one session's three state layers, stored and changed safely.

::

    coord = await StateCoordinator.load(session)
    await coord.set_intent("track_order", agent="OrderAgent",
                           slots=[Slot(name="order_id", required=True,
                                       prompt="What is your order number?")])
    await coord.create_task("lookup", [Step(step_id="find", tool="orders.get")],
                            budget=timedelta(seconds=3))
    while (step := await coord.next_step("lookup")) is not None:
        await coord.complete_step("lookup", step.step_id, await call_tool(step))
    block = coord.to_agent_context(budget_tokens=300, tokens=memory.tokens)

Storage: each layer is a named state blob of the session (``conversation``, ``task``,
``environment``), so a write to one never contends with a write to another. Every change
is a read-modify-write of one blob: the pure transition (:mod:`~tiermem.state.conversation`,
:mod:`~tiermem.state.tasks`, :mod:`~tiermem.state.environment`) is applied to the version
this coordinator holds, and written with ``put_state(expected_version=...)``. If another
writer got there first, the blob is re-read *from the durable tier* (the source of truth
for versions: a writer that died between its durable write and its hot copy leaves the hot
copy behind) and the transition is applied again, up to ``attempts`` times with
:func:`tiermem.retry.pause` in between; then :class:`~tiermem.errors.ConflictError`.
A transition that changes nothing writes nothing.

Recovery: the blobs are versioned in the durable tier and restored with their versions
after a hot loss, so a new process (``StateCoordinator.load``) continues where the last one
stopped. A step recorded as completed is never run again; a step that was in progress when
its worker died is started again only with ``takeover=True`` (at-least-once for that one
step: tools should use the step id as an idempotency key). Every decision to run a step is
a successful compare-and-set, so a stale read can never make two workers run it.

Reads (properties, :meth:`to_agent_context`) show the state as of this coordinator's last
load or write; :meth:`refresh` re-reads.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from pydantic import ValidationError as PydanticValidationError

from tiermem.clock import Clock
from tiermem.errors import BudgetExceededError, ConflictError, CorruptDataError, ValidationError
from tiermem.models import JsonValue, SessionMetadata, StateBlob
from tiermem.models.base import problems
from tiermem.retry import CAS_ATTEMPTS, pause
from tiermem.state import conversation as conv
from tiermem.state import environment as env
from tiermem.state import tasks as tsk
from tiermem.state.models import (
    CONVERSATION,
    ENVIRONMENT,
    SCHEMA_VERSION,
    TASK,
    ConversationState,
    DialoguePhase,
    EnvironmentState,
    LayerState,
    Slot,
    SlotValue,
    Step,
    Task,
    TaskState,
    TaskStatus,
)
from tiermem.state.render import AgentContext, StateSource, render_agent_context
from tiermem.tokens import TokenCounter

__all__ = ["StateCoordinator", "StateSession", "StateView"]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=LayerState)

_counter = itertools.count(1)


class StateView(Protocol):
    """What the coordinator reads of a session view (:class:`tiermem.tiers.SessionView`)."""

    @property
    def metadata(self) -> SessionMetadata: ...

    @property
    def state(self) -> Mapping[str, StateBlob]: ...


@runtime_checkable
class StateSession(Protocol):
    """What the coordinator needs of a session; :class:`tiermem.session.Session` has it."""

    @property
    def id(self) -> str: ...

    @property
    def clock(self) -> Clock: ...

    async def view(self) -> StateView: ...

    async def get_state(self, name: str, *, fresh: bool = False) -> StateBlob | None: ...

    async def put_state(
        self, name: str, data: Mapping[str, JsonValue], *, expected_version: int | None = None
    ) -> StateBlob: ...


@dataclass(frozen=True)
class _Held(Generic[M]):
    value: M
    version: int
    updated_at: datetime | None


def _default_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{next(_counter)}"


class StateCoordinator:
    """The conversation, task and environment state of one session.

    Construct with :meth:`load` (one read of the session); the constructor alone holds
    empty layers until :meth:`refresh`. ``worker`` names this coordinator as the holder of
    the steps it starts (default: host, process id and a counter, unique per instance);
    ``attempts`` bounds each compare-and-set loop.

    Every move raises what its pure transition raises (``ValidationError`` for an illegal
    move, with what to do instead), ``ConflictError`` when its compare-and-set loop gives
    up, and ``CorruptDataError`` when a stored layer cannot be read.
    """

    def __init__(
        self, session: StateSession, *, worker: str | None = None, attempts: int = CAS_ATTEMPTS
    ) -> None:
        if not isinstance(session, StateSession):
            raise ValidationError(
                f"a StateCoordinator works on a Session (memory.session(...)), got "
                f"{type(session).__name__}"
            )
        if type(attempts) is not int or attempts < 1:
            raise ValidationError(f"attempts must be an integer >= 1, got {attempts!r}")
        if worker is not None:
            _text(worker, "worker")
        self._session = session
        self._clock = session.clock
        self.worker = worker or _default_worker()
        self._attempts = attempts
        self._defaults: Mapping[str, object] = {}
        self._conversation = _Held(ConversationState(), 0, None)
        self._tasks = _Held(TaskState(), 0, None)
        self._environment = _Held(EnvironmentState(), 0, None)

    @classmethod
    async def load(
        cls, session: StateSession, *, worker: str | None = None, attempts: int = CAS_ATTEMPTS
    ) -> StateCoordinator:
        """A coordinator with the session's current state (one read of the session).

        Raises:
            CorruptDataError: a layer blob cannot be read (see :meth:`refresh`).
        """
        coordinator = cls(session, worker=worker, attempts=attempts)
        await coordinator.refresh()
        return coordinator

    # -- reading ----------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self._session.id

    @property
    def conversation(self) -> ConversationState:
        return self._conversation.value

    @property
    def tasks(self) -> TaskState:
        return self._tasks.value

    @property
    def environment(self) -> EnvironmentState:
        return self._environment.value

    @property
    def versions(self) -> dict[str, int]:
        """Each layer blob's version as this coordinator last saw it (0: never written)."""
        return {
            CONVERSATION: self._conversation.version,
            TASK: self._tasks.version,
            ENVIRONMENT: self._environment.version,
        }

    def task(self, task_id: str) -> Task:
        """A task as last seen. Raises ValidationError if there is none."""
        found = self.tasks.task(task_id)
        if found is None:
            raise ValidationError(f"no task {task_id!r} in this session; create_task it first")
        return found

    def time_left(self, task_id: str) -> timedelta | None:
        """What is left of a task's time budget now (None: no budget)."""
        return self.task(task_id).time_left(self._clock.now())

    async def refresh(self) -> None:
        """Re-read all three layers in one read of the session (hot tier, reloaded from the
        durable tier on a miss).

        Raises:
            CorruptDataError: a layer blob that does not decode (written by a broken client,
                or with a value this release does not know).
        """
        view = await self._session.view()
        self._defaults = _environment_defaults(view.metadata)
        self._conversation = self._decode(
            ConversationState, CONVERSATION, view.state.get(CONVERSATION)
        )
        self._tasks = self._decode(TaskState, TASK, view.state.get(TASK))
        self._environment = self._decode(EnvironmentState, ENVIRONMENT, view.state.get(ENVIRONMENT))

    def _decode(self, model: type[M], name: str, blob: StateBlob | None) -> _Held[M]:
        if blob is None:
            defaults = self._defaults if model is EnvironmentState else {}
            return _Held(model.model_validate(defaults), 0, None)
        try:
            value = model.model_validate(blob.data)
        except PydanticValidationError as exc:
            raise CorruptDataError(
                f"state {name!r} of session {self.session_id!r} (version {blob.version}) "
                f"cannot be read by this release: {exc.errors()[0]['msg']} at "
                f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}. It was written by a "
                "newer or broken client; upgrade, or overwrite the layer"
            ) from exc
        return _Held(value, blob.version, blob.updated_at)

    # -- the one read-modify-write loop ----------------------------------------------------

    def _held(self, name: str) -> _Held[Any]:
        if name == CONVERSATION:
            return self._conversation
        return self._tasks if name == TASK else self._environment

    def _keep(self, name: str, held: _Held[Any]) -> None:
        if name == CONVERSATION:
            self._conversation = held
        elif name == TASK:
            self._tasks = held
        else:
            self._environment = held

    async def _change(self, model: type[M], name: str, change: Callable[[M], M]) -> M:
        """Apply ``change`` to the layer and store it, compare-and-set with retries."""
        held: _Held[M] = self._held(name)
        for attempt in range(self._attempts):
            new = change(held.value)
            if new == held.value:
                return held.value
            if held.value.schema_version > SCHEMA_VERSION:
                raise ValidationError(
                    f"state {name!r} of session {self.session_id!r} was written with schema "
                    f"{held.value.schema_version} (this release writes {SCHEMA_VERSION}); "
                    "upgrade this worker before it changes that state"
                )
            try:
                blob = await self._session.put_state(
                    name, new.model_dump(mode="json"), expected_version=held.version
                )
            except ConflictError as exc:
                logger.debug(
                    "state %s of session %s moved on (held %s, now %s); re-reading",
                    name,
                    self.session_id,
                    held.version,
                    exc.actual,
                )
                if attempt + 1 < self._attempts:
                    await pause(attempt)
                held = self._decode(model, name, await self._session.get_state(name, fresh=True))
                self._keep(name, held)
                continue
            held = _Held(new, blob.version, blob.updated_at)
            self._keep(name, held)
            return new
        raise ConflictError(
            f"state {name!r} of session {self.session_id!r} kept changing under "
            f"{self._attempts} attempts; try again",
            expected=held.version,
        )

    def _now(self) -> datetime:
        return self._clock.now()

    # -- conversation -------------------------------------------------------------------------

    async def set_phase(self, phase: str) -> ConversationState:
        """Move the dialogue to ``phase`` (see :func:`tiermem.state.conversation.set_phase`)."""
        _text(phase, "phase")
        return await self._change(
            ConversationState, CONVERSATION, lambda s: conv.set_phase(s, phase)
        )

    async def set_intent(
        self, intent: str, *, agent: str | None = None, slots: Sequence[Slot] = ()
    ) -> ConversationState:
        """Make ``intent`` active (see :func:`tiermem.state.conversation.set_intent`).
        ``slots`` are :class:`Slot` objects or mappings of their fields."""
        _text(intent, "intent")
        _optional_text(agent, "agent")
        slots = _slots(slots)
        return await self._change(
            ConversationState,
            CONVERSATION,
            lambda s: conv.set_intent(s, intent, agent=agent, slots=slots),
        )

    async def set_agent(self, agent: str | None) -> ConversationState:
        _optional_text(agent, "agent")
        return await self._change(
            ConversationState, CONVERSATION, lambda s: conv.set_agent(s, agent)
        )

    async def define_slot(self, slot: Slot | Mapping[str, Any]) -> ConversationState:
        slot = _slot(slot, "slot")
        return await self._change(
            ConversationState, CONVERSATION, lambda s: conv.define_slot(s, slot)
        )

    async def infer_slot(
        self, name: str, value: SlotValue, *, turn_index: int | None = None
    ) -> ConversationState:
        _text(name, "slot name")
        _slot_value(value)
        _turn_index(turn_index)
        return await self._change(
            ConversationState,
            CONVERSATION,
            lambda s: conv.infer_slot(s, name, value, turn_index=turn_index),
        )

    async def confirm_slot(
        self, name: str, value: SlotValue | None = None, *, turn_index: int | None = None
    ) -> ConversationState:
        _text(name, "slot name")
        if value is not None:
            _slot_value(value)
        _turn_index(turn_index)
        return await self._change(
            ConversationState,
            CONVERSATION,
            lambda s: conv.confirm_slot(s, name, value, turn_index=turn_index),
        )

    async def clear_slot(self, name: str) -> ConversationState:
        _text(name, "slot name")
        return await self._change(
            ConversationState, CONVERSATION, lambda s: conv.clear_slot(s, name)
        )

    async def ask_clarification(
        self, clarification_id: str, question: str, *, slot: str | None = None
    ) -> ConversationState:
        _text(clarification_id, "clarification_id")
        _text(question, "question")
        _optional_text(slot, "slot")
        now = self._now()
        return await self._change(
            ConversationState,
            CONVERSATION,
            lambda s: conv.ask_clarification(s, clarification_id, question, now=now, slot=slot),
        )

    async def resolve_clarification(self, clarification_id: str) -> ConversationState:
        _text(clarification_id, "clarification_id")
        return await self._change(
            ConversationState,
            CONVERSATION,
            lambda s: conv.resolve_clarification(s, clarification_id),
        )

    async def finish_intent(
        self, *, phase: str = DialoguePhase.FOLLOW_UP.value
    ) -> ConversationState:
        _text(phase, "phase")
        return await self._change(
            ConversationState, CONVERSATION, lambda s: conv.finish_intent(s, phase=phase)
        )

    # -- tasks --------------------------------------------------------------------------------

    async def _task_change(self, change: Callable[[TaskState, datetime], TaskState]) -> TaskState:
        """Every task move first times out overdue tasks, with the same clock reading."""
        now = self._now()
        return await self._change(
            TaskState, TASK, lambda s: change(tsk.expire_overdue(s, now), now)
        )

    async def create_task(
        self,
        task_id: str,
        steps: Sequence[Step],
        *,
        goal: str = "",
        budget: timedelta | None = None,
        max_retries: int = 2,
    ) -> Task:
        """Plan a task (idempotent: the same plan again changes nothing); see
        :func:`tiermem.state.tasks.create_task`. ``steps`` are :class:`Step` objects or
        mappings of their fields."""
        _text(task_id, "task_id")
        _text(goal, "goal")
        _duration(budget, "budget")
        if type(max_retries) is not int or not 0 <= max_retries <= MAX_RETRIES:
            raise ValidationError(
                f"max_retries must be an integer from 0 to {MAX_RETRIES}, got {max_retries!r}"
            )
        plan = [
            s.model_copy(update={"params": _as_json(s.params, f"params of step {s.step_id!r}")})
            for s in _steps(steps)
        ]
        state = await self._task_change(
            lambda s, now: tsk.create_task(
                s, task_id, plan, now=now, goal=goal, budget=budget, max_retries=max_retries
            )
        )
        return _found(state, task_id)

    async def start_step(self, task_id: str, step_id: str, *, takeover: bool = False) -> Step:
        """Start a step, held by this coordinator's worker, and return it.

        Raises:
            BudgetExceededError: the task's time budget ran out (its timeout is stored).
            ConflictError: another worker holds the step and ``takeover`` is False.
            ValidationError: see :func:`tiermem.state.tasks.start_step`.
        """
        _ids(task_id, step_id)
        _flag(takeover, "takeover")
        state = await self._task_change(
            lambda s, now: _or_timed_out(
                s,
                task_id,
                lambda: tsk.start_step(
                    s, task_id, step_id, worker=self.worker, now=now, takeover=takeover
                ),
            )
        )
        task = _found(state, task_id)
        _raise_if_timed_out(task)
        step = task.step(step_id)
        assert step is not None
        return step

    async def next_step(self, task_id: str, *, takeover: bool = False) -> Step | None:
        """Start the task's next step (or keep the one this worker runs) and return it;
        None when every step is completed. Errors as for :meth:`start_step`; a failed or
        cancelled task is a ValidationError."""
        _text(task_id, "task_id")
        _flag(takeover, "takeover")
        chosen: list[str | None] = [None]

        def change(s: TaskState, now: datetime) -> TaskState:
            chosen[0] = None

            def start() -> TaskState:
                moved, chosen[0] = tsk.next_step(
                    s, task_id, worker=self.worker, now=now, takeover=takeover
                )
                return moved

            return _or_timed_out(s, task_id, start)

        state = await self._task_change(change)
        task = _found(state, task_id)
        _raise_if_timed_out(task)
        return None if chosen[0] is None else task.step(chosen[0])

    async def complete_step(self, task_id: str, step_id: str, result: JsonValue = None) -> Step:
        """Record a step's result and return the step (``timed_out`` if the result came
        after the task's deadline: it is kept, the task stays timed out). Idempotent: the
        result is compared as JSON, the way it is stored (a tuple equals its list).

        Raises:
            ValidationError: a result that is not JSON, or an illegal move (see
                :func:`tiermem.state.tasks.complete_step`).
        """
        _ids(task_id, step_id)
        result = _as_json(result, f"the result of step {step_id!r}")
        state = await self._task_change(
            lambda s, now: tsk.complete_step(s, task_id, step_id, result, now=now)
        )
        step = _found(state, task_id).step(step_id)
        assert step is not None
        return step

    async def fail_step(
        self, task_id: str, step_id: str, error: str, *, retry: bool = True
    ) -> Step:
        """Record a failed attempt: back to the queue while retries are left, else the step
        and its task fail. Returns the step. Idempotent."""
        _ids(task_id, step_id)
        _text(error, "error")
        _flag(retry, "retry")
        state = await self._task_change(
            lambda s, now: tsk.fail_step(s, task_id, step_id, error, now=now, retry=retry)
        )
        step = _found(state, task_id).step(step_id)
        assert step is not None
        return step

    async def checkpoint(self, task_id: str, name: str) -> Task:
        _text(task_id, "task_id")
        _text(name, "checkpoint name")
        state = await self._task_change(lambda s, now: tsk.checkpoint(s, task_id, name, now=now))
        return _found(state, task_id)

    async def rollback(self, task_id: str, name: str, *, budget: timedelta | None = None) -> Task:
        """Return a task to a checkpoint (see :func:`tiermem.state.tasks.rollback`)."""
        _text(task_id, "task_id")
        _text(name, "checkpoint name")
        _duration(budget, "budget")
        now = self._now()
        # No expire_overdue first: a rollback with a new budget revives a timed-out task.
        state = await self._change(
            TaskState, TASK, lambda s: tsk.rollback(s, task_id, name, now=now, budget=budget)
        )
        return _found(state, task_id)

    async def cancel_task(self, task_id: str, reason: str = "") -> Task:
        _text(task_id, "task_id")
        _text(reason, "reason")
        state = await self._task_change(lambda s, now: tsk.cancel_task(s, task_id, reason, now=now))
        return _found(state, task_id)

    async def discard_task(self, task_id: str) -> TaskState:
        _text(task_id, "task_id")
        return await self._change(TaskState, TASK, lambda s: tsk.discard_task(s, task_id))

    async def expire_overdue(self) -> TaskState:
        """Store the timeout of every task past its deadline (task moves do this anyway)."""
        return await self._task_change(lambda s, now: s)

    # -- environment -----------------------------------------------------------------------

    async def refresh_environment(
        self,
        source: str,
        *,
        event_id: str | None = None,
        occurred_at: datetime | None = None,
        **changes: Any,
    ) -> EnvironmentState:
        """Apply an external system's report (``profile``, ``tier``, ``locale``,
        ``timezone``, ``cart``, ``promotions``); a redelivered or older event of that
        source changes nothing. See :func:`tiermem.state.environment.refresh_environment`."""
        _text(source, "source")
        _optional_text(event_id, "event_id")
        if occurred_at is not None and not isinstance(occurred_at, datetime):
            raise ValidationError(
                f"occurred_at must be an aware datetime, got {type(occurred_at).__name__}"
            )
        if "profile" in changes:
            changes["profile"] = _as_json(changes["profile"], "the profile")
        now = self._now()
        return await self._change(
            EnvironmentState,
            ENVIRONMENT,
            lambda s: env.refresh_environment(
                s, source, changes, now=now, event_id=event_id, occurred_at=occurred_at
            ),
        )

    def local_time(self) -> env.LocalTime:
        """The user's local time now, from the service clock and the user's zone."""
        return env.local_time(self.environment, self._now())

    # -- the agent's view -----------------------------------------------------------------------

    def to_agent_context(self, *, budget_tokens: int, tokens: TokenCounter) -> AgentContext:
        """The state as a short, human-readable block within ``budget_tokens``, with the
        layer blobs and versions it came from (see :mod:`tiermem.state.render`). No I/O:
        it renders what this coordinator last loaded or wrote."""
        if type(budget_tokens) is not int or budget_tokens < 0:
            raise ValidationError(
                f"budget_tokens must be an integer >= 0 (tokens), got {budget_tokens!r}"
            )
        sources = {
            name: StateSource(layer=name, version=held.version, updated_at=held.updated_at)
            for name, held in (
                (CONVERSATION, self._conversation),
                (TASK, self._tasks),
                (ENVIRONMENT, self._environment),
            )
        }
        return render_agent_context(
            self.conversation,
            self.tasks,
            self.environment,
            now=self._now(),
            budget_tokens=budget_tokens,
            tokens=tokens,
            session_id=self.session_id,
            sources=sources,
        )


# -- checks of the caller's arguments (the pure transitions trust their types) ----------------

MAX_RETRIES = 100
"""The most failures a task sends back to the queue per step (the Step model's bound)."""


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _optional_text(value: object, what: str) -> None:
    if value is not None:
        _text(value, what)


def _ids(task_id: object, step_id: object) -> None:
    _text(task_id, "task_id")
    _text(step_id, "step_id")


def _flag(value: object, what: str) -> None:
    if not isinstance(value, bool):
        raise ValidationError(f"{what} must be True or False, got {value!r}")


def _duration(value: object, what: str) -> None:
    if value is not None and not isinstance(value, timedelta):
        raise ValidationError(
            f"{what} must be a timedelta (e.g. timedelta(seconds=30)) or None, got {value!r}"
        )


def _turn_index(value: object) -> None:
    if value is not None and (type(value) is not int or value < 0):
        raise ValidationError(f"turn_index must be a turn index (an integer >= 0), got {value!r}")


def _slot_value(value: object) -> None:
    if not isinstance(value, str | int | float) or (
        isinstance(value, float) and not math.isfinite(value)
    ):
        raise ValidationError(
            f"a slot holds a string, number or boolean, got {type(value).__name__} {value!r}"
        )


def _parsed(model: type[Any], value: object, what: str) -> Any:
    """``value`` as ``model``: the model itself, or a mapping of its fields."""
    if isinstance(value, model):
        return value
    if not isinstance(value, Mapping):
        raise ValidationError(
            f"{what} must be a {model.__name__} or a mapping of its fields, got "
            f"{type(value).__name__}"
        )
    try:
        return model.model_validate(value)
    except PydanticValidationError as exc:
        raise ValidationError(f"{what} is not a valid {model.__name__}: {problems(exc)}") from None


def _sequence(values: object, what: str) -> Sequence[Any]:
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Sequence):
        raise ValidationError(f"{what} must be a list, got {type(values).__name__}")
    return values


def _slot(value: object, what: str) -> Slot:
    slot: Slot = _parsed(Slot, value, what)
    return slot


def _slots(values: object) -> list[Slot]:
    return [_slot(v, f"slots[{i}]") for i, v in enumerate(_sequence(values, "slots"))]


def _steps(values: object) -> list[Step]:
    return [_parsed(Step, v, f"steps[{i}]") for i, v in enumerate(_sequence(values, "steps"))]


def _environment_defaults(metadata: SessionMetadata) -> Mapping[str, object]:
    """A session's environment before any refresh: the tier and locale it was opened with."""
    return {"tier": str(metadata.user_tier), "locale": metadata.locale}


def _as_json(value: JsonValue, what: str) -> JsonValue:
    """``value`` as it reads back from storage (tuples become lists), so that comparing a
    repeated call with what is stored is exact."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"{what} must be JSON (dicts with string keys, lists, strings, numbers, "
            f"booleans, None): {exc}"
        ) from exc


def _found(state: TaskState, task_id: str) -> Task:
    task = state.task(task_id)
    if task is None:
        raise ValidationError(f"no task {task_id!r} in this session; create_task it first")
    return task


def _or_timed_out(state: TaskState, task_id: str, move: Callable[[], TaskState]) -> TaskState:
    """``move()``, unless the task has just timed out: then keep (and store) the timeout,
    and let the caller raise."""
    task = state.task(task_id)
    if task is not None and task.status is TaskStatus.TIMED_OUT:
        return state
    return move()


def _raise_if_timed_out(task: Task) -> None:
    if task.status is TaskStatus.TIMED_OUT:
        raise BudgetExceededError(tsk.timeout_message(task))
