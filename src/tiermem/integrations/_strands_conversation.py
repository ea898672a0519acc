"""The Strands conversation manager that delegates to :mod:`tiermem.managers` (re-exported
by :mod:`tiermem.integrations.strands`, which documents it)."""

from __future__ import annotations

import concurrent.futures
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from strands.agent.conversation_manager import ConversationManager as StrandsConversationManager
from strands.agent.conversation_manager.conversation_manager import ProactiveCompressionConfig
from strands.types.content import Message as StrandsMessage
from strands.types.exceptions import ContextWindowOverflowException

from tiermem.integrations._strands_messages import (
    SYNTHETIC,
    extras_of,
    is_pinned,
    is_synthetic,
    to_strands,
    to_tiermem,
)
from tiermem.managers import (
    ContextOverflowError,
    ConversationManager,
    Reduction,
    SummarizingManager,
)
from tiermem.models import Message
from tiermem.runtime import run as run_on_loop

if TYPE_CHECKING:
    from strands.agent.agent import Agent

__all__ = ["TierMemConversationManager"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _run_to_completion(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh loop in a worker thread: Strands calls conversation managers
    synchronously from inside its own running loop, where a coroutine cannot be awaited."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tiermem-strands") as pool:
        return pool.submit(run_on_loop, coro).result()  # uvloop when installed


# ---------------------------------------------------------------- conversation manager


class TierMemConversationManager(StrandsConversationManager):
    """A Strands conversation manager that delegates to a :mod:`tiermem.managers` manager.

    ``manager`` defaults to :class:`~tiermem.managers.SummarizingManager` (rule summarizer,
    fallback chain summarize → slide → shorten oldest tool outputs). Messages pinned the
    Strands way (``metadata.custom.pinned``) are passed as pinned. The manager runs on a
    fresh event loop in a worker thread, since Strands calls this class synchronously: a
    custom summarizer must not depend on the caller's loop.

    ``proactive_compression`` is Strands' option: before each model call, reduce (best
    effort) once the projected input holds that share of the model's window.
    """

    def __init__(
        self,
        manager: ConversationManager | None = None,
        *,
        proactive_compression: bool | ProactiveCompressionConfig | None = None,
    ) -> None:
        super().__init__(proactive_compression=proactive_compression)
        self.manager: ConversationManager = manager or SummarizingManager()
        self._summary_message: StrandsMessage | None = None

    def apply_management(self, agent: Agent, **kwargs: Any) -> None:
        """Routine management after an invocation (a sliding window trims to its size)."""

        def run(messages: Sequence[Message], pinned: list[int]) -> Awaitable[Reduction]:
            return self.manager.apply_management(messages, pinned=pinned)

        self._apply(agent, run)

    def reduce_context(self, agent: Agent, e: Exception | None = None, **kwargs: Any) -> None:
        """Replace the agent's messages with a smaller conversation.

        Raises:
            ContextWindowOverflowException: ``e`` is set (the model overflowed) and the
                manager could not shrink the conversation; the message says why.
        """
        overflow = e is not None

        def run(messages: Sequence[Message], pinned: list[int]) -> Awaitable[Reduction]:
            return self.manager.reduce_context(messages, pinned=pinned, overflow=overflow)

        try:
            self._apply(agent, run)
        except ContextOverflowError as stuck:
            raise ContextWindowOverflowException(str(stuck)) from stuck

    def _apply(
        self,
        agent: Agent,
        run: Callable[[Sequence[Message], list[int]], Awaitable[Reduction]],
    ) -> None:
        raw = list(agent.messages)
        converted = [to_tiermem(m) for m in raw]
        pinned = [i for i, m in enumerate(raw) if is_pinned(m)]

        async def reduce() -> Reduction:
            return await run(converted, pinned)

        reduction = _run_to_completion(reduce())
        if not reduction.changed:
            return
        out: list[StrandsMessage] = []
        for message, origin in zip(reduction.messages, reduction.origins, strict=True):
            if origin is not None and message == converted[origin]:
                out.append(raw[origin])  # the same object: Strands and the session see it kept
                continue
            if origin is not None:
                extras = extras_of(raw[origin])
                extras.pop("empty", None)
            else:
                extras = {
                    "tracking_id": str(uuid.uuid4()),
                    "metadata": {"custom": {SYNTHETIC: "+".join(reduction.steps)}},
                }
            made = to_strands(message, extras)
            out.append(made)
            if message == reduction.summary:
                self._summary_message = made
        removed = [i for i in reduction.removed(len(raw)) if not is_synthetic(raw[i])]
        self.removed_message_count += len(removed)
        agent.messages = out
        logger.debug(
            "agent %s: %s took %d messages to %d (%d -> %d tokens)",
            agent.agent_id,
            "+".join(reduction.steps),
            len(raw),
            len(out),
            reduction.tokens_before,
            reduction.tokens_after,
        )

    def get_state(self) -> dict[str, Any]:
        """Strands' state plus the latest summary, so Strands' own session managers can
        put it back in front (:class:`TierMemSessionManager` restores the exact window)."""
        return {**super().get_state(), "summary_message": self._summary_message}

    def restore_from_session(self, state: dict[str, Any]) -> list[StrandsMessage] | None:
        super().restore_from_session(state)
        self._summary_message = state.get("summary_message")
        return [self._summary_message] if self._summary_message else None
