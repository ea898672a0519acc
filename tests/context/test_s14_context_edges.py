"""Context assembly refuses bad arguments with tiermem's ValidationError, naming what was
wrong (session 14's audit of the SDK edge). Before: ``system=5`` was TypeError ('int'
object is not iterable), ``tools="abc"`` pydantic's own error about a ``None`` name,
``current=5`` / ``allocation="x"`` AttributeError, ``budget=True`` a one-token budget that
failed as BudgetExceededError, and a tool named "" went into the manifest."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tiermem.context import assemble_context, check_context_call
from tiermem.errors import ValidationError
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.settings import TierMemSettings

Call = Callable[[Session], Awaitable[Any]]

SESSION_REFUSED: list[tuple[str, Call, str]] = [
    ("budget=True", lambda s: s.context(budget=True), "budget must be a positive integer"),
    ("system=5", lambda s: s.context(system=5, budget=4000), "system must be a string or a list"),
    ("tools='abc'", lambda s: s.context(tools="abc", budget=4000), "tools must be a list"),
    ("tools=[5]", lambda s: s.context(tools=[5], budget=4000), "tools\\[0\\] must be a Tool"),
    (
        "tools=[{'nam': 'x'}]",
        lambda s: s.context(tools=[{"nam": "x"}], budget=4000),
        "tools\\[0\\] is not a valid tool definition: name",
    ),
    (
        "tools=[{'name': ''}]",
        lambda s: s.context(tools=[{"name": ""}], budget=4000),
        "tools\\[0\\] is not a valid tool definition: name: String should have at least 1",
    ),
    (
        "tools=[{'name': 'x', 'input_schema': 'str'}]",
        lambda s: s.context(tools=[{"name": "x", "input_schema": "str"}], budget=4000),
        "its input schema must be a JSON Schema object",
    ),
    ("current=5", lambda s: s.context(current=5, budget=4000), "current must be a string"),
    (
        "current={'role': 'user'}",
        lambda s: s.context(current={"role": "user"}, budget=4000),
        "current is not a valid message: content",
    ),
    (
        "allocation='x'",
        lambda s: s.context(allocation="x", budget=4000),
        "allocation must be an Allocation or a mapping",
    ),
]


@pytest.fixture
async def session() -> AsyncIterator[Session]:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings) as memory:
        session = await memory.session(user_id="u-context-edges")
        await session.add_turn("user", "Is vol 42 in stock?")
        yield session


@pytest.mark.parametrize(
    ("label", "call", "message"), SESSION_REFUSED, ids=[r[0] for r in SESSION_REFUSED]
)
async def test_session_context_refuses_bad_arguments(
    session: Session, label: str, call: Call, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        await call(session)


async def test_blocks_current_and_allocation_may_be_mappings(session: Session) -> None:
    window = await session.context(
        budget=4000,
        system=[{"type": "text", "text": "You sell manga."}],  # type: ignore[list-item]
        current={"role": "user", "content": [{"type": "text", "text": "and vol 43?"}]},  # type: ignore[arg-type]
        allocation={"hot": 0.6, "memory": 0.25, "buffer": 0.15},  # type: ignore[arg-type]
    )
    assert window.system[0].text == "You sell manga."  # type: ignore[union-attr]
    assert window.messages[-1].content[-1].text == "and vol 43?"  # type: ignore[union-attr]


CHECK_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("query=5", {"query": 5}, "query must be a string or None, got int"),
    ("model=5", {"model": 5}, "model must be a model id string"),
    ("recall_k='5'", {"recall_k": "5"}, "recall_k must be an integer from 1 to 100"),
    ("recall_k=0", {"recall_k": 0}, "recall_k must be an integer from 1 to 100"),
    ("recall_k=10**9", {"recall_k": 10**9}, "recall_k must be an integer from 1 to 100"),
    ("allocation={'hot': 2}", {"allocation": {"hot": 2}}, "allocation is not valid: hot"),
    (
        "allocation={'hot': 0.5}",
        {"allocation": {"hot": 0.5}},
        "allocation is not valid: .*must add up to 1",
    ),
]


@pytest.mark.parametrize(
    ("label", "kwargs", "message"), CHECK_REFUSED, ids=[r[0] for r in CHECK_REFUSED]
)
def test_check_context_call_refuses_what_session_context_reads_first(
    label: str, kwargs: dict[str, Any], message: str
) -> None:
    """``Session.context`` reads query, model, recall_k and the allocation before assembly
    (before: AttributeError 'int' object has no attribute 'strip', TypeError from the
    recall policy, a recall of 10**9 candidates); this is the check it is to call first."""
    with pytest.raises(ValidationError, match=message):
        check_context_call(**kwargs)


def test_assemble_context_refuses_a_model_that_is_not_a_name() -> None:
    with pytest.raises(ValidationError, match="model must be a model id string or a ModelSpec"):
        assemble_context(model=5)  # type: ignore[arg-type]
