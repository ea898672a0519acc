"""The two managers that need no model: :class:`NullManager` and
:class:`SlidingWindowManager`."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tiermem.errors import ValidationError
from tiermem.managers.base import (
    ContextOverflowError,
    Reduction,
    conversation_tokens,
    protection,
    reduce_with_fallbacks,
)
from tiermem.managers.steps import ShortenToolOutputs, Slide
from tiermem.models.content import Message
from tiermem.tokens import TiktokenCounter, TokenCounter

__all__ = ["NullManager", "SlidingWindowManager"]


class NullManager:
    """Never changes the conversation (Strands' ``NullConversationManager``).

    For tests, and for callers that manage history elsewhere. On overflow it raises, since
    it cannot help; proactive reduction gets the input back unchanged.
    """

    def __init__(self, *, tokens: TokenCounter | None = None) -> None:
        self._tokens = tokens or TiktokenCounter()

    async def apply_management(
        self, messages: Sequence[Message], *, pinned: Collection[int] = ()
    ) -> Reduction:
        """The input, unchanged."""
        return Reduction.unchanged(messages, conversation_tokens(messages, self._tokens))

    async def reduce_context(
        self, messages: Sequence[Message], *, pinned: Collection[int] = (), overflow: bool = True
    ) -> Reduction:
        """The input unchanged without ``overflow``.

        Raises:
            ContextOverflowError: ``overflow``: this manager never reduces.
        """
        size = conversation_tokens(messages, self._tokens)
        if overflow:
            raise ContextOverflowError(
                f"the conversation ({len(messages)} messages, {size} tokens) is too large for "
                "the model and the null conversation manager never reduces it; use a sliding "
                "window or summarizing manager",
                tokens=size,
            )
        return Reduction.unchanged(messages, size)


class SlidingWindowManager:
    """Keeps the newest ``window_size`` messages (Strands' ``SlidingWindowConversationManager``).

    ``apply_management`` trims to the window when the conversation is longer. On overflow,
    ``reduce_context`` runs the fallback chain slide → shorten oldest tool outputs
    (:mod:`tiermem.managers.steps`); ``shorten_tool_outputs=False`` leaves the second step
    out. Pinned messages and the latest message are always kept, and tool calls stay with
    their results.

    Raises:
        ValidationError: a negative ``window_size``.
    """

    def __init__(
        self,
        window_size: int = 40,
        *,
        shorten_tool_outputs: bool = True,
        tokens: TokenCounter | None = None,
    ) -> None:
        if window_size < 0:
            raise ValidationError(f"window_size must be 0 or more, got {window_size}")
        self.window_size = window_size
        self._tokens = tokens or TiktokenCounter()
        self._slide = Slide(window_size, self._tokens)
        self._steps: tuple[Slide | ShortenToolOutputs, ...] = (self._slide,)
        if shorten_tool_outputs:
            self._steps += (ShortenToolOutputs(self._tokens),)

    async def apply_management(
        self, messages: Sequence[Message], *, pinned: Collection[int] = ()
    ) -> Reduction:
        """The newest ``window_size`` messages (plus pinned ones), cut where no tool pair is
        parted; the input unchanged when it fits the window, cannot be cut, or would not
        get shorter."""
        if len(messages) <= self.window_size:
            return Reduction.unchanged(messages, conversation_tokens(messages, self._tokens))
        protect = protection(messages, pinned)
        outcome = self._slide.cut(messages, protect, self._slide.start(len(messages)))
        if (
            isinstance(outcome, str)
            or len(outcome.messages) >= len(messages)
            or outcome.tokens_after >= outcome.tokens_before
        ):  # a removed-note in place of one short message is no trim
            return Reduction.unchanged(messages, conversation_tokens(messages, self._tokens))
        return outcome

    async def reduce_context(
        self, messages: Sequence[Message], *, pinned: Collection[int] = (), overflow: bool = True
    ) -> Reduction:
        """A smaller conversation: slide, else shorten the oldest tool outputs.

        Raises:
            ContextOverflowError: ``overflow`` and neither step could shrink it.
            ValidationError: a pinned position outside the conversation.
        """
        return await reduce_with_fallbacks(
            messages, self._steps, tokens=self._tokens, pinned=pinned, overflow=overflow
        )
