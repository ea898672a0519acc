"""The Strands integration with a real ``strands.Agent``, a scripted model (no network) and
tiermem on the embedded backends (in-process, and SQLite files)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from strands import Agent, tool
from strands.types.exceptions import ContextWindowOverflowException

from tests.integrations.scripted_model import Reply, ScriptedModel, call, content_chars, say
from tests.managers.shapes import no_orphans
from tiermem.errors import BackendTimeoutError, TierMemError
from tiermem.integrations.strands import (
    STATE_PREFIX,
    TierMemConversationManager,
    TierMemSessionManager,
)
from tiermem.managers import NullManager, SlidingWindowManager, SummarizingManager
from tiermem.models import Message, NewTurn, Turn
from tiermem.models.convert import from_converse
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.sync import SyncMemory

STOCK_NOTES = "Warehouse notes: shelf B, aisle 4, restocked weekly. " * 12


@tool
def check_stock(title: str, volume: int) -> str:
    """Check how many copies of a volume are in stock.

    Args:
        title: the series title
        volume: the volume number
    """
    return f"{title} vol {volume}: 3 copies in stock. {STOCK_NOTES}"


def settings_for(deployment: str, tmp_path: Path) -> TierMemSettings:
    """``memory+memory``, the embedded default ``memory+sqlite``, or ``sqlite+sqlite``."""
    hot, durable = deployment.split("+")
    return TierMemSettings(
        hot_backend=hot, durable_backend=durable, sqlite_path=tmp_path / "tiermem.db"
    )


@pytest.fixture(params=["memory+memory", "memory+sqlite", "sqlite+sqlite"])
def memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SyncMemory]:
    with SyncMemory.from_settings(settings_for(request.param, tmp_path)) as opened:
        yield opened


def agent_for(
    memory: SyncMemory,
    model: ScriptedModel,
    *,
    session_id: str = "s-1",
    manager: Any = None,
    **options: Any,
) -> Agent:
    return Agent(
        model=model,
        tools=[check_stock],
        session_manager=TierMemSessionManager(memory, session_id, user_id="u-1"),
        conversation_manager=TierMemConversationManager(manager),
        callback_handler=None,
        **options,
    )


def stock_round(volume: int) -> list[Reply]:
    return [
        call("check_stock", f"t-{volume}", title="Berserk", volume=volume),
        say(f"Yes, 3 copies of vol {volume} are in stock."),
    ]


def archived(memory: SyncMemory, session_id: str = "s-1") -> list[Turn]:
    turns: list[Turn] = memory.session(session_id, user_id="u-1").get_turns()
    return turns


def as_tiermem(messages: Sequence[Any]) -> list[Message]:
    return from_converse([dict(m) for m in messages])


def pairs_whole(messages: Sequence[Any]) -> bool:
    """Every tool result answers a call made before it, and every call is answered."""
    converted = as_tiermem(messages)
    return no_orphans(converted) and not any(b.type == "tool_use" for b in converted[-1].content)


# ---------------------------------------------------------------- persistence


def test_messages_are_turns_and_a_new_agent_restores_them(memory: SyncMemory) -> None:
    agent = agent_for(memory, ScriptedModel.of(*stock_round(42)))
    agent.state.set("cart", {"items": 2})
    agent("I prefer seinen. Is Berserk vol 42 in stock?")

    turns = archived(memory)
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]
    assert {t.agent_name for t in turns} == {"default"}
    assert [t.to_message() for t in turns] == as_tiermem(agent.messages)
    assert [t.metadata["strands"]["tracking_id"] for t in turns] == [
        m["tracking_id"] for m in agent.messages
    ]
    # They are tiermem turns like any other: entities tracked, importance scored.
    entities = memory.session("s-1", user_id="u-1").active_entities()
    assert entities["volume"].value == "42"
    assert entities["genre"].value == "seinen"

    again = agent_for(memory, ScriptedModel.of(say("Vol 43 is sold out.")))
    assert again.messages == agent.messages  # content, tracking ids and usage metadata
    assert again.state.get("cart") == {"items": 2}
    again("And vol 43?")
    assert len(archived(memory)) == 6
    assert archived(memory)[-1].text == "Vol 43 is sold out."


def test_a_sqlite_file_outlives_the_process_that_wrote_it(tmp_path: Path) -> None:
    settings = settings_for("memory+sqlite", tmp_path)
    with SyncMemory.from_settings(settings) as first:
        written = agent_for(first, ScriptedModel.of(*stock_round(42)))
        written("Is Berserk vol 42 in stock?")
        messages = written.messages
    with SyncMemory.from_settings(settings) as second:
        assert agent_for(second, ScriptedModel.of()).messages == messages


def test_a_new_agent_with_initial_messages_stores_them_and_orphans_become_text(
    memory: SyncMemory,
) -> None:
    initial: list[Any] = [
        {"role": "user", "content": [{"text": "Look up vol 7."}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "lost", "name": "check_stock", "input": {}}}],
        },
        {"role": "user", "content": [{"text": "Never mind, vol 8."}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "open", "name": "check_stock", "input": {}}}],
        },
    ]
    agent_for(memory, ScriptedModel.of(), messages=initial)
    assert archived(memory)[0].text == "Look up vol 7."
    restored = agent_for(memory, ScriptedModel.of()).messages
    # The call whose result never came is visible text; the last one stays a call, which
    # Strands runs on the next invocation.
    assert "its result is not in this context" in restored[1]["content"][0]["text"]
    assert restored[3]["content"] == initial[3]["content"]


def test_agents_of_one_session_keep_their_own_turns(memory: SyncMemory) -> None:
    shop = agent_for(memory, ScriptedModel.of(say("Welcome to the shop.")), agent_id="shop")
    help_desk = agent_for(memory, ScriptedModel.of(say("How can I help?")), agent_id="help")
    shop("hello shop")
    help_desk("hello help")
    turns = archived(memory)
    assert [(t.agent_name, t.text) for t in turns] == [
        ("shop", "hello shop"),
        ("shop", "Welcome to the shop."),
        ("help", "hello help"),
        ("help", "How can I help?"),
    ]
    assert agent_for(memory, ScriptedModel.of(), agent_id="help").messages == help_desk.messages


def test_a_guardrail_redaction_redacts_the_turn_and_restores_the_replacement(
    memory: SyncMemory,
) -> None:
    agent = agent_for(
        memory, ScriptedModel.of(Reply(text="I can't help with that.", redact_user="[blocked]"))
    )
    agent("my card number is 4111 1111 1111 1111")
    first = archived(memory)[0]
    assert first.redacted
    assert "4111" not in first.text
    restored = agent_for(memory, ScriptedModel.of())
    assert restored.messages[0]["content"] == [{"text": "[blocked]"}]
    assert restored.messages == agent.messages


# ---------------------------------------------------------------- context overflow


def test_an_overflow_is_reduced_and_the_restored_agent_gets_the_reduced_window(
    memory: SyncMemory,
) -> None:
    replies = [r for volume in range(1, 7) for r in stock_round(volume)]
    model = ScriptedModel.of(*replies, max_chars=3000)
    manager = SummarizingManager(preserve_recent_messages=2)
    agent = agent_for(memory, model, manager=manager)
    for volume in range(1, 7):
        agent(f"Is Berserk vol {volume} in stock?")
    assert model.refused, "the conversation outgrew the scripted window"
    assert all(content_chars(c) <= 3000 for c in model.calls)
    # After the first refusal Strands reduced and retried, each input smaller, until the
    # model answered one that opens with the summary.
    first = next(n for n, (outcome, _) in enumerate(model.log) if outcome == "refused")
    answered = next(n for n in range(first, len(model.log)) if model.log[n][0] == "answered")
    sizes = [content_chars(messages) for _, messages in model.log[first : answered + 1]]
    assert sizes == sorted(sizes, reverse=True)
    assert len(set(sizes)) == len(sizes)
    assert model.log[answered][1][0]["content"][0]["text"].startswith("[Summary of")
    opening = agent.messages[0]["content"][0]["text"]
    assert opening.startswith("[Summary of")
    assert "- User: Is Berserk vol 1 in stock?" in opening
    assert agent.messages[0]["metadata"]["custom"]["tiermem_synthetic"] == "summarize"
    assert pairs_whole(agent.messages)
    assert agent.conversation_manager.removed_message_count > 0

    # The archive keeps every turn; the record keeps the window's shape.
    assert len(archived(memory)) == 6 * 4
    record = memory.session("s-1", user_id="u-1").get_state(STATE_PREFIX + "default")
    assert record is not None
    window = record.data["window"]
    assert "message" in window[0]  # the summary is no turn: it is kept in the record
    assert window[-1]["last"] is None  # an open run: later turns join the window
    restored = agent_for(memory, ScriptedModel.of(say("Anything else?")), manager=manager)
    assert restored.messages == agent.messages
    assert len(restored.messages) < len(archived(memory))
    restored("No, thanks.")
    assert len(archived(memory)) == 6 * 4 + 2


def test_pinned_messages_survive_the_reduction(memory: SyncMemory) -> None:
    rules: Any = {
        "role": "user",
        "content": [{"text": "Always answer in English. Is vol 1 in stock?"}],
        "metadata": {"custom": {"pinned": True}},
    }
    replies = [say("Yes.")] + [r for volume in range(2, 6) for r in stock_round(volume)]
    model = ScriptedModel.of(*replies, max_chars=2500)
    agent = agent_for(memory, model, manager=SummarizingManager(preserve_recent_messages=2))
    agent.messages = [rules]
    agent("ok")
    for volume in range(2, 6):
        agent(f"Is Berserk vol {volume} in stock?")
    assert model.refused
    assert agent.messages[0] is rules
    assert agent_for(memory, ScriptedModel.of()).messages[0]["content"] == rules["content"]


def test_an_overflow_nothing_can_reduce_is_raised_with_the_reasons(memory: SyncMemory) -> None:
    model = ScriptedModel.of(say("never sent"), max_chars=100)
    agent = agent_for(memory, model, manager=SlidingWindowManager())
    with pytest.raises(ContextWindowOverflowException, match="cannot make a conversation of 1"):
        agent("Is Berserk vol 42 in stock? " * 10)
    null = agent_for(
        memory, ScriptedModel.of(max_chars=100), session_id="s-2", manager=NullManager()
    )
    with pytest.raises(ContextWindowOverflowException, match="never reduces it"):
        null("Is Berserk vol 42 in stock? " * 10)


def test_proactive_compression_reduces_before_the_model_refuses(memory: SyncMemory) -> None:
    replies = [r for volume in range(1, 7) for r in stock_round(volume)]
    model = ScriptedModel.of(*replies)
    model.update_config(context_window_limit=1500)
    agent = Agent(
        model=model,
        tools=[check_stock],
        session_manager=TierMemSessionManager(memory, "s-1", user_id="u-1"),
        conversation_manager=TierMemConversationManager(
            SummarizingManager(preserve_recent_messages=2),
            proactive_compression={"compression_threshold": 0.5},
        ),
        callback_handler=None,
    )
    for volume in range(1, 7):
        agent(f"Is Berserk vol {volume} in stock?")
    assert not model.refused
    assert agent.messages[0]["content"][0]["text"].startswith("[Summary of")


# ---------------------------------------------------------------- loops and failures


async def test_an_async_agent_on_the_services_loop(tmp_path: Path) -> None:
    service = MemoryService.from_settings(settings_for("memory+memory", tmp_path))
    try:
        manager = await TierMemSessionManager.open(service, "s-async", user_id="u-1")
        agent = Agent(
            model=ScriptedModel.of(*stock_round(42)),
            tools=[check_stock],
            session_manager=manager,
            conversation_manager=TierMemConversationManager(),
            callback_handler=None,
        )
        await agent.invoke_async("Is Berserk vol 42 in stock?")
        session = await service.session("s-async", user_id="u-1")
        assert [t.role for t in await session.get_turns()] == [
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        restored = Agent(
            model=ScriptedModel.of(),
            session_manager=await TierMemSessionManager.open(service, "s-async", user_id="u-1"),
            conversation_manager=TierMemConversationManager(),
            callback_handler=None,
        )
        assert restored.messages == agent.messages

        # A synchronous call runs Strands' loop in another thread: refused, with the fix.
        other = Agent(
            model=ScriptedModel.of(say("hi")),
            session_manager=await TierMemSessionManager.open(service, "s-other", user_id="u-1"),
            callback_handler=None,
        )
        with pytest.raises(TierMemError, match=r"await agent\.invoke_async"):
            await asyncio.to_thread(other, "hello")
    finally:
        await service.aclose()


class LostAckDurable(MemoryDurableStore):
    """Stores the first append, then reports a timeout, as a lost response would."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    async def append_turns(
        self, session_id: str, turns: Sequence[NewTurn], **options: Any
    ) -> list[Turn]:
        stored = await super().append_turns(session_id, turns, **options)
        if not self.lost:
            self.lost += 1
            raise BackendTimeoutError("the answer was lost", backend="memory")
        return stored


def test_a_failed_write_is_raised_then_retried_without_a_duplicate() -> None:
    durable = LostAckDurable()
    with SyncMemory(lambda: MemoryService(MemoryHotStore(), durable)) as memory:
        session_manager = TierMemSessionManager(memory, "s-1", user_id="u-1")
        agent = Agent(
            model=ScriptedModel.of(say("Hello!")),
            session_manager=session_manager,
            callback_handler=None,
        )
        with pytest.raises(BackendTimeoutError):
            agent("hi")
        # Strands' after-invocation hook flushed again: the append was retried with its
        # idempotency key, so the turn whose answer was lost is stored once.
        assert durable.lost == 1
        assert [t.text for t in archived(memory)] == ["hi"]
        asyncio.run(session_manager.flush())  # nothing left to write
        agent("hi again")
        assert [t.text for t in archived(memory)] == ["hi", "hi again", "Hello!"]
        restored = Agent(
            model=ScriptedModel.of(),
            session_manager=TierMemSessionManager(memory, "s-1", user_id="u-1"),
            callback_handler=None,
        )
        assert restored.messages == agent.messages


class DownDurable(MemoryDurableStore):
    """Refuses appends while ``down``."""

    down = False

    async def append_turns(
        self, session_id: str, turns: Sequence[NewTurn], **options: Any
    ) -> list[Turn]:
        if self.down:
            raise BackendTimeoutError("the durable tier is down", backend="memory")
        return await super().append_turns(session_id, turns, **options)


def test_writes_that_keep_failing_stay_queued_until_a_flush_succeeds() -> None:
    durable = DownDurable()
    with SyncMemory(lambda: MemoryService(MemoryHotStore(), durable)) as memory:
        session_manager = TierMemSessionManager(memory, "s-1", user_id="u-1")
        agent = Agent(
            model=ScriptedModel.of(), session_manager=session_manager, callback_handler=None
        )
        durable.down = True
        with pytest.raises(BackendTimeoutError):
            agent("hi")
        with pytest.raises(BackendTimeoutError):
            asyncio.run(session_manager.flush())
        assert archived(memory) == []
        durable.down = False
        asyncio.run(session_manager.flush())
        assert [t.text for t in archived(memory)] == ["hi"]
