"""The state coordinator and the tool layer refuse bad arguments with tiermem's
ValidationError, saying what was wrong, and change nothing (session 14's audit of the SDK
edge). Before, some raised AttributeError / TypeError from deep inside (``'int' object has
no attribute 'strip'``, ``'dict' object has no attribute 'status'``), and some were stored
as they were, so that the layer no longer loaded: ``finish_intent(phase=5)`` and
``infer_slot("vol", [1, 2])`` wrote a blob every later ``StateCoordinator.load`` refused
with CorruptDataError. ``takeover="no"`` took the step over."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tiermem.errors import ValidationError
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings
from tiermem.state import Slot, StateCoordinator, Step
from tiermem.store.backends.memory import MemoryHotStore
from tiermem.testing import FakeClock
from tiermem.tokens import TiktokenCounter
from tiermem.tools import (
    BreakerPolicy,
    SharedBreakers,
    ToolDispatcher,
    ToolOutput,
    ToolRegistry,
    ToolSpec,
)
from tiermem.tools.invoker import PartialSink

Call = Callable[[StateCoordinator], Awaitable[Any]]


def _sync(value: Any) -> Awaitable[Any]:
    async def done() -> Any:
        return value

    return done()


STATE_REFUSED: list[tuple[str, Call, str]] = [
    ("set_phase(5)", lambda c: c.set_phase(5), "phase must be a string, got int"),
    ("set_intent(5)", lambda c: c.set_intent(5), "intent must be a string"),
    ("set_intent(slots='vol')", lambda c: c.set_intent("x", slots="vol"), "slots must be a list"),
    (
        "set_intent(slots=[5])",
        lambda c: c.set_intent("x", slots=[5]),
        "slots\\[0\\] must be a Slot or a mapping of its fields, got int",
    ),
    (
        "set_intent(slots=[{'nam': 'a'}])",
        lambda c: c.set_intent("x", slots=[{"nam": "a"}]),
        "slots\\[0\\] is not a valid Slot: name: Field required",
    ),
    ("set_agent(5)", lambda c: c.set_agent(5), "agent must be a string"),
    ("define_slot('vol')", lambda c: c.define_slot("vol"), "slot must be a Slot or a mapping"),
    ("infer_slot(5, 'x')", lambda c: c.infer_slot(5, "x"), "slot name must be a string"),
    (
        "infer_slot('vol', [1, 2])",
        lambda c: c.infer_slot("vol", [1, 2]),
        "a slot holds a string, number or boolean, got list",
    ),
    (
        "infer_slot('vol', nan)",
        lambda c: c.infer_slot("vol", float("nan")),
        "a slot holds a string, number or boolean",
    ),
    (
        "infer_slot('vol', '42', turn_index='3')",
        lambda c: c.infer_slot("vol", "42", turn_index="3"),
        "turn_index must be a turn index",
    ),
    (
        "confirm_slot('vol', '42', turn_index=True)",
        lambda c: c.confirm_slot("vol", "42", turn_index=True),
        "turn_index must be a turn index",
    ),
    ("clear_slot(None)", lambda c: c.clear_slot(None), "slot name must be a string"),
    ("ask_clarification('q', 5)", lambda c: c.ask_clarification("q", 5), "question must be"),
    ("resolve_clarification(5)", lambda c: c.resolve_clarification(5), "clarification_id"),
    ("finish_intent(phase=5)", lambda c: c.finish_intent(phase=5), "phase must be a string"),
    (
        "create_task('t2', 'ab')",
        lambda c: c.create_task("t2", "ab"),
        "steps must be a list, got str",
    ),
    (
        "create_task('t2', [{'step': 'a'}])",
        lambda c: c.create_task("t2", [{"step": "a"}]),
        "steps\\[0\\] is not a valid Step: step_id: Field required",
    ),
    (
        "create_task(budget=30)",
        lambda c: c.create_task("t2", [Step(step_id="a")], budget=30),
        "budget must be a timedelta",
    ),
    (
        "create_task(max_retries='2')",
        lambda c: c.create_task("t2", [Step(step_id="a")], max_retries="2"),
        "max_retries must be an integer from 0 to 100",
    ),
    (
        "create_task('t1', same plan, max_retries=-1)",
        lambda c: c.create_task("t1", [Step(step_id="a"), Step(step_id="b")], max_retries=-1),
        "max_retries must be an integer",
    ),
    ("create_task(goal=5)", lambda c: c.create_task("t2", [Step(step_id="a")], goal=5), "goal"),
    (
        "start_step(takeover='no')",
        lambda c: c.start_step("t1", "a", takeover="no"),
        "takeover must be True or False",
    ),
    ("fail_step(error=5)", lambda c: c.fail_step("t1", "a", 5), "error must be a string"),
    ("fail_step(retry='no')", lambda c: c.fail_step("t1", "a", "x", retry="no"), "retry"),
    ("cancel_task(reason=5)", lambda c: c.cancel_task("t1", reason=5), "reason must be"),
    ("discard_task(5)", lambda c: c.discard_task(5), "task_id must be a string"),
    ("rollback(budget=5)", lambda c: c.rollback("t1", "x", budget=5), "budget must be"),
    ("refresh_environment(5)", lambda c: c.refresh_environment(5, tier="x"), "source must be"),
    (
        "refresh_environment(occurred_at='2024-01-01')",
        lambda c: c.refresh_environment("crm", occurred_at="2024-01-01", tier="x"),
        "occurred_at must be an aware datetime, got str",
    ),
    (
        "refresh_environment(event_id=5)",
        lambda c: c.refresh_environment("crm", event_id=5, tier="x"),
        "event_id must be a string",
    ),
    (
        "to_agent_context(budget_tokens='5')",
        lambda c: _sync(c.to_agent_context(budget_tokens="5", tokens=TiktokenCounter())),
        "budget_tokens must be an integer",
    ),
]


@pytest.fixture
async def session() -> AsyncIterator[Session]:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings) as memory:
        yield await memory.session(user_id="u-state-edges")


async def _busy(session: Session) -> StateCoordinator:
    coord = await StateCoordinator.load(session)
    await coord.set_intent("buy", slots=[Slot(name="vol", required=True)])
    await coord.infer_slot("vol", "41", turn_index=0)
    await coord.create_task("t1", [Step(step_id="a"), Step(step_id="b")])
    await coord.next_step("t1")
    await coord.refresh_environment("crm", event_id="e1", tier="premium")
    return coord


async def _stored(session: Session) -> tuple[Any, ...]:
    blobs = [
        await session.get_state(n, fresh=True) for n in ("conversation", "task", "environment")
    ]
    reloaded = await StateCoordinator.load(session)  # before: CorruptDataError for some
    return (
        tuple(b.version if b else 0 for b in blobs),
        reloaded.conversation,
        reloaded.tasks,
        reloaded.environment,
    )


@pytest.mark.parametrize(
    ("label", "call", "message"), STATE_REFUSED, ids=[r[0] for r in STATE_REFUSED]
)
async def test_a_bad_state_move_is_refused_and_changes_nothing(
    session: Session, label: str, call: Call, message: str
) -> None:
    coord = await _busy(session)
    before = await _stored(session)
    with pytest.raises(ValidationError, match=message):
        await call(coord)
    assert await _stored(session) == before


async def test_slots_and_steps_may_be_given_as_mappings(session: Session) -> None:
    """Parsed at the edge, like turns given as mappings; before: AttributeError."""
    coord = await StateCoordinator.load(session)
    await coord.set_intent("buy", slots=[{"name": "vol", "required": True}])
    await coord.define_slot({"name": "series"})
    task = await coord.create_task("t", [{"step_id": "a", "tool": "orders.get"}])
    assert [s.name for s in coord.conversation.slots] == ["vol", "series"]
    assert task.steps[0].tool == "orders.get"
    assert (await StateCoordinator.load(session)).conversation == coord.conversation


CONSTRUCTION_REFUSED: list[tuple[str, Callable[[Session], Any], str]] = [
    ("attempts='3'", lambda s: StateCoordinator(s, attempts="3"), "attempts must be an integer"),
    ("attempts=True", lambda s: StateCoordinator(s, attempts=True), "attempts must be"),
    ("worker=5", lambda s: StateCoordinator(s, worker=5), "worker must be a string"),
    ("a session id", lambda s: StateCoordinator(s.id), "works on a Session"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    ("label", "make", "message"), CONSTRUCTION_REFUSED, ids=[r[0] for r in CONSTRUCTION_REFUSED]
)
async def test_a_coordinator_with_bad_options_is_refused(
    session: Session, label: str, make: Callable[[Session], Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        make(session)


# -- tools ------------------------------------------------------------------------------


class EchoInvoker:
    """Answers every call with its arguments; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def invoke(
        self, tool: str, arguments: Any, *, request_id: str, emit: PartialSink
    ) -> ToolOutput:
        self.calls += 1
        return ToolOutput.of_text(f"{tool}: {arguments}")


TOOL_SPEC_REFUSED: list[tuple[str, Callable[[], Any], str]] = [
    ("description=5", lambda: ToolSpec("t", description=5), "description of tool 't' must be"),
    ("fallbacks='abc'", lambda: ToolSpec("t", fallbacks="abc"), "fallbacks of tool 't' must be"),
    ("breaker={}", lambda: ToolSpec("t", breaker={}), "breaker of tool 't' must be a Breaker"),
    (
        "BreakerPolicy(failure_threshold=True)",
        lambda: BreakerPolicy(failure_threshold=True),
        "failure_threshold must be an int >= 1, got True",
    ),
    (
        "register('t', invoker)",
        lambda: ToolRegistry().register("t", EchoInvoker()),
        "register takes a ToolSpec, got str",
    ),
    (
        "register(spec, object())",
        lambda: ToolRegistry().register(ToolSpec("t"), object()),
        "invoker of tool 't' must have an async invoke",
    ),
    (
        "register_all('abc', invoker)",
        lambda: ToolRegistry().register_all("abc", EchoInvoker()),
        "register_all takes a list of ToolSpec",
    ),
]


@pytest.mark.parametrize(
    ("label", "make", "message"), TOOL_SPEC_REFUSED, ids=[r[0] for r in TOOL_SPEC_REFUSED]
)
def test_a_bad_tool_definition_is_refused(
    label: str, make: Callable[[], Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        make()


def test_register_all_with_a_bad_spec_registers_nothing() -> None:
    registry = ToolRegistry()
    registry.register(ToolSpec("kept"), EchoInvoker())
    with pytest.raises(ValidationError, match="register_all takes a list of ToolSpec"):
        registry.register_all([ToolSpec("a"), "b"], EchoInvoker())  # type: ignore[list-item]
    assert [spec.name for spec in registry] == ["kept"]


DISPATCH_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("arguments 'q=x'", {"arguments": "q=x"}, "arguments of tool 'search' must be a mapping"),
    ("arguments [('q', 'x')]", {"arguments": [("q", "x")]}, "must be a mapping"),
    ("a non-string name", {"arguments": {1: "x"}}, "argument names are strings"),
    ("a non-JSON value", {"arguments": {"q": object()}}, "arguments of tool 'search' must be JSON"),
    ("a NaN", {"arguments": {"q": float("nan")}}, "must be JSON"),
]


@pytest.mark.parametrize(
    ("label", "kwargs", "message"), DISPATCH_REFUSED, ids=[r[0] for r in DISPATCH_REFUSED]
)
async def test_bad_tool_arguments_are_refused_before_the_tool_or_its_breaker_sees_them(
    label: str, kwargs: dict[str, Any], message: str
) -> None:
    """Before: ValueError from dict(), pydantic's error from the invocation record, or the
    object handed to the tool (an MCP tool would fail to send it, and the failure counted
    against the tool's breaker)."""
    clock = FakeClock()
    invoker = EchoInvoker()
    registry = ToolRegistry()
    registry.register(ToolSpec("search"), invoker)
    tools = ToolDispatcher(registry, SharedBreakers(MemoryHotStore(clock=clock), clock=clock))
    with pytest.raises(ValidationError, match=message):
        await tools.call("search", **kwargs)
    assert invoker.calls == 0
    assert tools.stats("search").calls == 0
    assert (await tools.status("search")).recent_failures == 0


DISPATCHER_OPTIONS_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("recent_limit=-1", {"recent_limit": -1}, "recent_limit must be an integer >= 1"),
    ("latency_window='x'", {"latency_window": "x"}, "latency_window must be an integer"),
    ("max_partial_chunks=-1", {"max_partial_chunks": -1}, "max_partial_chunks must be"),
]


@pytest.mark.parametrize(
    ("label", "options", "message"),
    DISPATCHER_OPTIONS_REFUSED,
    ids=[r[0] for r in DISPATCHER_OPTIONS_REFUSED],
)
def test_a_dispatcher_with_bad_options_is_refused(
    label: str, options: dict[str, Any], message: str
) -> None:
    clock = FakeClock()
    breakers = SharedBreakers(MemoryHotStore(clock=clock), clock=clock)
    with pytest.raises(ValidationError, match=message):
        ToolDispatcher(ToolRegistry(), breakers, **options)


def test_stats_of_an_unknown_tool_is_not_found() -> None:
    """Before: zero counters for any name, so a typo read as 'never called'."""
    from tiermem.errors import NotFoundError

    clock = FakeClock()
    registry = ToolRegistry()
    registry.register(ToolSpec("search"), EchoInvoker())
    tools = ToolDispatcher(registry, SharedBreakers(MemoryHotStore(clock=clock), clock=clock))
    with pytest.raises(NotFoundError, match="no tool named 'serach'"):
        tools.stats("serach")
