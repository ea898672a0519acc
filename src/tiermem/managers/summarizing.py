"""The summarizing manager: on overflow, fold the oldest messages into one summary, and
when that cannot help, slide, then shorten the oldest tool outputs.

:class:`Summarize` is the step, with Strands' arithmetic (seed 003): summarize
``summary_ratio`` of the messages (at least one), never the newest
``preserve_recent_messages``, with the cut moved forward until it parts no tool pair (or,
when there is no such place, back to the last one before it: fold less rather than none). The
summary is a user message in place of what it replaces; when the first message after it is
a user message too (and not pinned), the summary opens that message instead, so roles
still alternate.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from tiermem.errors import ValidationError
from tiermem.managers.base import (
    Protection,
    Reduction,
    ReductionStep,
    StepName,
    conversation_tokens,
    reduce_with_fallbacks,
)
from tiermem.managers.steps import ShortenToolOutputs, Slide, cut_points
from tiermem.managers.summary import RuleSummarizer, Summarizer
from tiermem.models.content import Message, TextBlock
from tiermem.tokens import TiktokenCounter, TokenCounter

__all__ = ["Summarize", "SummarizingManager"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Summarize:
    """Replace the oldest messages with a summary from ``summarizer``.

    A summarizer that raises, or returns no text, makes the step give way (logged at
    warning, counted in ``failures``): the fallback chain goes on to the next step.
    """

    summarizer: Summarizer
    tokens: TokenCounter
    summary_ratio: float = 0.3
    preserve_recent_messages: int = 10
    failures: int = 0
    name: StepName = field(default="summarize", init=False)

    def split(self, messages: Sequence[Message], protect: Protection) -> int | str:
        """Where the summarized part ends, or why there is nothing to summarize."""
        count = len(messages)
        wanted = min(max(1, int(count * self.summary_ratio)), count - self.preserve_recent_messages)
        if wanted <= 0:
            return (
                f"{count} messages, and the newest {self.preserve_recent_messages} are never "
                "summarized"
            )
        cuts = [c for c in cut_points(messages) if any(i not in protect.keep for i in range(c))]
        later = [c for c in cuts if c >= wanted]
        if later or cuts:
            # The first cut at or after the wanted one; else fold less, up to the last cut.
            return later[0] if later else cuts[-1]
        return (
            "no place to end the summary without parting a tool call from its result, with "
            "something unpinned before it"
        )

    async def __call__(self, messages: Sequence[Message], protect: Protection) -> Reduction | str:
        cut = self.split(messages, protect)
        if isinstance(cut, str):
            return cut
        folded = [i for i in range(cut) if i not in protect.keep]
        try:
            summary = await self.summarizer([messages[i] for i in folded])
        except Exception as exc:
            self.failures += 1
            logger.warning(
                "the summarizer failed on %d messages; trying the next step",
                len(folded),
                exc_info=True,
            )
            return f"the summarizer failed: {type(exc).__name__}: {exc}"
        text = tuple(b for b in summary.content if isinstance(b, TextBlock) and b.text.strip())
        if not text:
            self.failures += 1
            logger.warning("the summarizer returned no text for %d messages", len(folded))
            return "the summarizer returned no text"
        summary = Message(role="user", content=text)
        kept = [i for i in range(cut) if i in protect.keep]
        out = [messages[i] for i in kept]
        origins: list[int | None] = list(kept)
        rest_from = cut
        if messages[cut].role == "user" and cut not in protect.pinned:
            out.append(Message(role="user", content=text + messages[cut].content))
            origins.append(cut)
            rest_from = cut + 1
        else:
            out.append(summary)
            origins.append(None)
        out += messages[rest_from:]
        origins += range(rest_from, len(messages))
        return Reduction.by_step(self.name, messages, out, origins, self.tokens, summary)


class SummarizingManager:
    """Summarizes the oldest messages on overflow (Strands'
    ``SummarizingConversationManager``), with the fallback chain summarize → slide →
    shorten oldest tool outputs.

    ``summarizer`` defaults to :class:`~tiermem.managers.summary.RuleSummarizer` (no model).
    ``apply_management`` does nothing, as in Strands: summaries are made only when the
    context must shrink (on overflow, or proactively: :func:`tiermem.managers.reduce_if_over`).
    ``window_size`` is the slide step's window. ``summarizer_failures`` counts summaries
    that failed and were replaced by the next step.

    Raises:
        ValidationError: ``summary_ratio`` outside (0, 1], or a negative count.
    """

    def __init__(
        self,
        summarizer: Summarizer | None = None,
        *,
        summary_ratio: float = 0.3,
        preserve_recent_messages: int = 10,
        window_size: int = 40,
        shorten_tool_outputs: bool = True,
        tokens: TokenCounter | None = None,
    ) -> None:
        if not 0 < summary_ratio <= 1:
            raise ValidationError(f"summary_ratio must be in (0, 1], got {summary_ratio}")
        if preserve_recent_messages < 0 or window_size < 0:
            raise ValidationError("preserve_recent_messages and window_size must be 0 or more")
        self._tokens = tokens or TiktokenCounter()
        self._summarize = Summarize(
            summarizer or RuleSummarizer(),
            self._tokens,
            summary_ratio=summary_ratio,
            preserve_recent_messages=preserve_recent_messages,
        )
        steps: list[ReductionStep] = [self._summarize, Slide(window_size, self._tokens)]
        if shorten_tool_outputs:
            steps.append(ShortenToolOutputs(self._tokens))
        self._steps = tuple(steps)

    @property
    def summarizer_failures(self) -> int:
        return self._summarize.failures

    async def apply_management(
        self, messages: Sequence[Message], *, pinned: Collection[int] = ()
    ) -> Reduction:
        """The input, unchanged: summaries are made only when the context must shrink."""
        return Reduction.unchanged(messages, conversation_tokens(messages, self._tokens))

    async def reduce_context(
        self, messages: Sequence[Message], *, pinned: Collection[int] = (), overflow: bool = True
    ) -> Reduction:
        """A smaller conversation: summarize, else slide, else shorten tool outputs.

        Raises:
            ContextOverflowError: ``overflow`` and no step could shrink it.
            ValidationError: a pinned position outside the conversation.
        """
        return await reduce_with_fallbacks(
            messages, self._steps, tokens=self._tokens, pinned=pinned, overflow=overflow
        )
