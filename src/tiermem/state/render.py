"""The state layers as a short, human-readable block for the agent's prompt.

:func:`render_agent_context` is pure: layers, the time and a budget in, an
:class:`AgentContext` out. It writes only what the agent can act on, as sentences, never
raw JSON (seed 000: "serialized JSON state wastes tokens and confuses the model"):

===  ===========================================================================
 0   a task failed or ran out of time: the agent must decide what to tell the user
 1   missing required slots, with the question to ask; inferred values to confirm
 2   the next pending clarification; the running step and what is left
 3   steps being retried (error, retries left); time left in a task's budget
 4   intent, agent and phase; further pending clarifications
 5   slot values already known
 6   user tier, locale and local time; cart; results of a task that just completed
 7   results of completed steps of a running task; profile; active promotions
 8   older finished tasks; "no intent yet"
===  ===========================================================================

When the block does not fit ``budget_tokens``, lines go from the bottom of that table up
(within a rank, the later line first) until it fits; if not even one line fits, the text is
empty. The result says which layer blobs (and versions) its remaining lines came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from tiermem.errors import ValidationError
from tiermem.models.base import FrozenModel, JsonValue, UtcDatetime
from tiermem.state.environment import local_time
from tiermem.state.models import (
    CONVERSATION,
    ENVIRONMENT,
    TASK,
    ConversationState,
    EnvironmentState,
    Slot,
    SlotStatus,
    Step,
    StepStatus,
    Task,
    TaskState,
    TaskStatus,
)
from tiermem.tokens import TokenCounter

__all__ = ["HEADER", "AgentContext", "StateSource", "describe", "render_agent_context"]

HEADER = "Session state:"
MAX_LINE_CHARS = 300
MAX_VALUE_CHARS = 80
FINISHED_SHOWN = 3


class StateSource(FrozenModel):
    """One layer blob a context was rendered from."""

    layer: str
    version: int
    """The blob's version; 0 when the layer was never written (its defaults)."""
    updated_at: UtcDatetime | None = None


class AgentContext(FrozenModel):
    """The state block for the prompt, with its token count and provenance."""

    session_id: str
    text: str
    tokens: int
    sources: tuple[StateSource, ...]
    """The layer blobs behind the lines that made it into ``text``."""
    omitted: int = 0
    """Lines left out to fit the budget."""


@dataclass(frozen=True)
class _Line:
    rank: int
    layer: str
    text: str


def describe(value: JsonValue, limit: int = MAX_VALUE_CHARS) -> str:
    """A JSON value as words: ``a, b and 3 more``, ``key: value; key: value``."""
    if value is None:
        text = "nothing"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, int | float | Decimal):
        text = f"{value:g}" if isinstance(value, float) else str(value)
    elif isinstance(value, str):
        text = " ".join(value.split())
    elif isinstance(value, Mapping):
        text = "; ".join(f"{k}: {describe(v, limit)}" for k, v in value.items()) or "nothing"
    elif isinstance(value, Sequence):
        items = [describe(v, limit) for v in value[:5]]
        more = f" and {len(value) - 5} more" if len(value) > 5 else ""
        text = (", ".join(items) + more) if items else "none"
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _seconds(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _name(step: Step) -> str:
    return f"{step.step_id} ({step.tool})" if step.tool else step.step_id


def _task_label(task: Task) -> str:
    return f"Task {task.task_id}" + (f" ({describe(task.goal)})" if task.goal else "")


# ---------------------------------------------------------------- conversation


def _ask(slot: Slot) -> str:
    choices = ""
    if slot.valid_values and len(slot.valid_values) <= 8:
        choices = f" (one of: {describe(list(slot.valid_values), 120)})"
    if slot.status is SlotStatus.INFERRED:
        return f"Confirm with the user: {slot.name} is probably {describe(slot.value)}{choices}."
    if slot.prompt:
        return f'Ask the user for {slot.name}{choices}: "{describe(slot.prompt, 160)}"'
    return f"Ask the user for {slot.name}{choices}."


def _conversation_lines(state: ConversationState) -> Iterator[_Line]:
    if state.intent:
        agent = f", handled by {state.agent}" if state.agent else ""
        yield _Line(4, CONVERSATION, f"Intent: {state.intent}{agent} (phase: {state.phase}).")
    else:
        yield _Line(8, CONVERSATION, f"No intent detected yet (phase: {state.phase}).")
    for slot in state.missing_slots:
        yield _Line(1, CONVERSATION, _ask(slot))
    for n, question in enumerate(state.clarifications):
        yield _Line(2 if n == 0 else 4, CONVERSATION, f"Pending question: {question.question}")
    known = [
        f"{s.name} {describe(s.value)}"
        + (" (inferred, confirm before relying on it)" if s.status is SlotStatus.INFERRED else "")
        for s in state.slots
        if s.value is not None and not s.missing
    ]
    if known:
        yield _Line(5, CONVERSATION, "Known: " + "; ".join(known) + ".")


# ---------------------------------------------------------------- tasks


def _running_lines(task: Task, now: datetime) -> Iterator[_Line]:
    done = [s for s in task.steps if s.status is StepStatus.COMPLETED]
    open_steps = [s for s in task.steps if s.status is not StepStatus.COMPLETED]
    progress = f"{len(done)} of {len(task.steps)} steps done"
    current = open_steps[0] if open_steps else None
    left = ", ".join(_name(s) for s in open_steps[1:6])
    left += f" and {len(open_steps) - 6} more" if len(open_steps) > 6 else ""
    then = f"; then {left}" if left else "; it is the last step"
    if current is not None and current.status is StepStatus.IN_PROGRESS:
        what = f": {describe(current.description)}" if current.description else ""
        attempt = f", attempt {current.attempts}" if current.attempts > 1 else ""
        now_doing = f"running {_name(current)}{what}{attempt}"
    elif current is not None:
        now_doing = f"next is {_name(current)}"
    else:
        now_doing = "finishing"
    yield _Line(2, TASK, f"{_task_label(task)}: {progress}; {now_doing}{then}.")
    for step in open_steps:
        if step.retries and step.error:
            left_n = task.retries_allowed(step) - step.retries
            yield _Line(
                3,
                TASK,
                f"Step {_name(step)} failed ({describe(step.error)}); retrying, "
                f"{left_n} {'retry' if left_n == 1 else 'retries'} left.",
            )
    remaining = task.time_left(now)
    if remaining is not None and task.budget_ms is not None:
        budget = _seconds(timedelta(milliseconds=task.budget_ms))
        if remaining > timedelta(0):
            yield _Line(
                3, TASK, f"Time left for {task.task_id}: {_seconds(remaining)} of {budget}."
            )
        else:
            yield _Line(
                0,
                TASK,
                f"{task.task_id} has used its {budget} time budget: answer with what is done.",
            )
    results = [f"{_name(s)} → {describe(s.result)}" for s in done if s.result is not None]
    if results:
        yield _Line(7, TASK, f"Done in {task.task_id}: " + "; ".join(results) + ".")


def _finished_line(task: Task, rank_shift: int) -> _Line:
    done = [s for s in task.steps if s.status is StepStatus.COMPLETED]
    results = "; ".join(f"{_name(s)} → {describe(s.result)}" for s in done if s.result is not None)
    if task.status is TaskStatus.COMPLETED:
        text = f"{_task_label(task)} completed" + (f": {results}." if results else ".")
        return _Line(6 + rank_shift, TASK, text)
    if task.status is TaskStatus.FAILED:
        failed = next((s for s in task.steps if s.status is StepStatus.FAILED), None)
        where = f" at {_name(failed)} ({describe(failed.error)})" if failed else ""
        text = f"{_task_label(task)} failed{where} with no retries left"
        text += f"; done: {results}" if results else ""
        return _Line(0 + rank_shift, TASK, text + ". Tell the user, or try another way.")
    if task.status is TaskStatus.TIMED_OUT:
        budget = _seconds(timedelta(milliseconds=task.budget_ms or 0))
        not_done = ", ".join(_name(s) for s in task.steps if s.status is not StepStatus.COMPLETED)
        text = f"{_task_label(task)} ran out of its {budget} budget; not done: {not_done}"
        text += f"; done: {results}" if results else ""
        return _Line(0 + rank_shift, TASK, text + ".")
    reason = f": {describe(task.note)}" if task.note else ""
    return _Line(8, TASK, f"{_task_label(task)} was cancelled{reason}.")


def _task_lines(state: TaskState, now: datetime) -> Iterator[_Line]:
    for task in state.active:
        yield from _running_lines(task, now)
    finished = sorted(
        (t for t in state.tasks if t.finished),
        key=lambda t: t.finished_at or t.created_at,
        reverse=True,
    )
    for n, task in enumerate(finished[:FINISHED_SHOWN]):
        # Only the latest outcome is news; older ones rank with history.
        line = _finished_line(task, 0 if n == 0 else 8)
        yield _Line(min(line.rank, 8), line.layer, line.text)


# ---------------------------------------------------------------- environment


def _environment_lines(env: EnvironmentState, now: datetime) -> Iterator[_Line]:
    local = local_time(env, now)
    when = (
        f"local time {local.local:%a %H:%M} ({local.part_of_day}, {local.zone})"
        if local.zone_known
        else f"time zone unknown (UTC {local.local:%a %H:%M})"
    )
    yield _Line(6, ENVIRONMENT, f"User: {env.tier} tier, locale {env.locale}, {when}.")
    cart = env.cart
    if cart.items:
        items = ", ".join(
            f"{describe(i.title or i.sku, 40)}" + (f" ×{i.quantity}" if i.quantity > 1 else "")
            for i in cart.items[:5]
        )
        more = f" and {len(cart.items) - 5} more" if len(cart.items) > 5 else ""
        count = cart.item_count
        yield _Line(
            6,
            ENVIRONMENT,
            f"Cart: {count} {'item' if count == 1 else 'items'} ({items}{more}), "
            f"total {cart.total:f} {cart.currency}.",
        )
    if env.profile:
        yield _Line(7, ENVIRONMENT, f"Profile: {describe(env.profile, 200)}.")
    active = [p for p in env.promotions if p.active_at(now)]
    if active:
        promos = "; ".join(
            describe(p.title, 60)
            + (f" ({describe(p.detail, 60)})" if p.detail else "")
            + (f", until {p.ends_at:%Y-%m-%d}" if p.ends_at else "")
            for p in active[:5]
        )
        yield _Line(7, ENVIRONMENT, f"Active promotions: {promos}.")


# ---------------------------------------------------------------- assembly


def _clip(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1].rstrip() + "…"


def render_agent_context(
    conversation: ConversationState,
    tasks: TaskState,
    environment: EnvironmentState,
    *,
    now: datetime,
    budget_tokens: int,
    tokens: TokenCounter,
    session_id: str,
    sources: Mapping[str, StateSource],
) -> AgentContext:
    """Render the three layers within ``budget_tokens`` (see the module docstring).

    ``sources`` gives each layer's blob version for the provenance.

    Raises:
        ValidationError: a negative budget.
    """
    if budget_tokens < 0:
        raise ValidationError(f"budget_tokens must be 0 or more, got {budget_tokens}")
    lines = [
        *_conversation_lines(conversation),
        *_task_lines(tasks, now),
        *_environment_lines(environment, now),
    ]
    lines = [_Line(line.rank, line.layer, _clip(line.text)) for line in lines]
    kept = list(range(len(lines)))

    def text_of(indexes: list[int]) -> str:
        return "\n".join([HEADER, *(f"- {lines[i].text}" for i in indexes)]) if indexes else ""

    text = text_of(kept)
    count = tokens.count(text) if text else 0
    while kept and count > budget_tokens:
        drop = max(kept, key=lambda i: (lines[i].rank, i))
        kept.remove(drop)
        text = text_of(kept)
        count = tokens.count(text) if text else 0
    layers = {lines[i].layer for i in kept}
    return AgentContext(
        session_id=session_id,
        text=text,
        tokens=count,
        sources=tuple(sources[name] for name in sources if name in layers),
        omitted=len(lines) - len(kept),
    )
