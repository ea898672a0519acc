"""What every conversation manager shares: the :class:`Reduction` a step returns, the
:class:`ConversationManager` and :class:`ReductionStep` protocols, the overflow error, and
:func:`reduce_with_fallbacks`, the chain that runs steps until one shrinks the conversation.

Everything here takes values and returns values: a manager never changes the list it was
given or a message in it (messages are frozen), it returns a new tuple and says where each
message of it came from (:attr:`Reduction.origins`), so a caller can map the result back
onto its own objects (the Strands adapter keeps each unchanged message's dict, for one).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from tiermem.context.tool_pairs import tool_pair_groups
from tiermem.errors import BudgetExceededError, ValidationError
from tiermem.models.content import Message
from tiermem.models.turns import Turn
from tiermem.tokens import TokenCounter

__all__ = [
    "ContextOverflowError",
    "ConversationManager",
    "Protection",
    "Reduction",
    "ReductionStep",
    "StepName",
    "conversation_of",
    "conversation_tokens",
    "protection",
    "reduce_with_fallbacks",
]

logger = logging.getLogger(__name__)

StepName = Literal["summarize", "slide", "shorten_tool_outputs"]
"""The reduction steps, in the order of the full fallback chain."""


class ContextOverflowError(BudgetExceededError):
    """The conversation is too large for the model and no reduction step could shrink it:
    everything left is pinned, the latest message, or already as short as it gets.

    ``tokens`` is the conversation's size when the last step gave up; ``reasons`` says, per
    step, why it could not help.
    """

    def __init__(self, message: str, *, tokens: int, reasons: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.reasons = tuple(reasons)


@dataclass(frozen=True, slots=True)
class Reduction:
    """A conversation after a manager ran, and how it got there.

    ``origins[j]`` is the position in the input of the message ``messages[j]`` came from
    (unchanged, or with its tool outputs shortened), or ``None`` for a message a step made
    (a summary, a note that earlier messages were removed). ``steps`` names the steps that
    changed something, in order; empty means ``messages`` is the input unchanged.
    """

    messages: tuple[Message, ...]
    origins: tuple[int | None, ...]
    steps: tuple[StepName, ...]
    tokens_before: int
    tokens_after: int
    summary: Message | None = None

    @classmethod
    def unchanged(cls, messages: Sequence[Message], tokens: int) -> Reduction:
        """The input as it is: every message its own origin, no steps."""
        return cls(tuple(messages), tuple(range(len(messages))), (), tokens, tokens)

    @classmethod
    def by_step(
        cls,
        step: StepName,
        before: Sequence[Message],
        after: Sequence[Message],
        origins: Sequence[int | None],
        tokens: TokenCounter,
        summary: Message | None = None,
    ) -> Reduction:
        """What one step made of ``before``, with both token counts."""
        return cls(
            messages=tuple(after),
            origins=tuple(origins),
            steps=(step,),
            tokens_before=conversation_tokens(before, tokens),
            tokens_after=conversation_tokens(after, tokens),
            summary=summary,
        )

    @property
    def changed(self) -> bool:
        return bool(self.steps)

    def removed(self, count: int) -> tuple[int, ...]:
        """Positions of an input of ``count`` messages that are not in the result at all."""
        kept = {o for o in self.origins if o is not None}
        return tuple(i for i in range(count) if i not in kept)

    def then(self, later: Reduction) -> Reduction:
        """This reduction followed by ``later`` (which ran on this one's ``messages``), with
        origins that point into this reduction's input."""
        origins = tuple(None if o is None else self.origins[o] for o in later.origins)
        return Reduction(
            messages=later.messages,
            origins=origins,
            steps=self.steps + later.steps,
            tokens_before=self.tokens_before,
            tokens_after=later.tokens_after,
            summary=later.summary or self.summary,
        )


class ConversationManager(Protocol):
    """Keeps a conversation small enough for its model, with the semantics of Strands'
    conversation managers (seed 003), as pure functions of the messages.

    ``pinned`` lists positions that must be kept (with the tool calls or results paired with
    them). Every implementation keeps the latest message, never separates a tool call from
    its result, and never changes its input.
    """

    async def apply_management(
        self, messages: Sequence[Message], *, pinned: Collection[int] = ()
    ) -> Reduction:
        """Routine management after an agent's turn (a sliding window trims to its size)."""
        ...

    async def reduce_context(
        self, messages: Sequence[Message], *, pinned: Collection[int] = (), overflow: bool = True
    ) -> Reduction:
        """A smaller conversation.

        With ``overflow`` (the model refused the input as too long) the result is strictly
        smaller in tokens, or this raises :class:`ContextOverflowError`. Without it
        (proactive reduction before the limit is reached) it is best effort: the input comes
        back unchanged when nothing can shrink it.
        """
        ...


@dataclass(frozen=True, slots=True)
class Protection:
    """What the steps must leave alone in one conversation (see :func:`protection`).

    ``keep``: positions never dropped or summarized: pinned messages and the latest
    message, each with its whole tool-pair group. ``pinned``: positions never changed at
    all (pinned messages and their groups); a kept message that is not pinned may still
    have its tool outputs shortened, since the latest one is often the large one.
    """

    keep: frozenset[int]
    pinned: frozenset[int]


class ReductionStep(Protocol):
    """One way to shrink a conversation: summarize, drop (slide) or shorten."""

    name: StepName

    async def __call__(self, messages: Sequence[Message], protect: Protection) -> Reduction | str:
        """The reduced conversation, or a sentence saying why this step cannot reduce it."""
        ...


def conversation_of(turns: Sequence[Turn]) -> tuple[list[Message], list[int]]:
    """Stored turns as a manager takes them: their messages, and the positions of the
    pinned ones (``Turn.pinned``). ``origins`` of the result index ``turns`` too."""
    return [t.to_message() for t in turns], [i for i, t in enumerate(turns) if t.pinned]


def conversation_tokens(messages: Sequence[Message], tokens: TokenCounter) -> int:
    """Tokens of a conversation: each message with its per-message overhead."""
    return sum(tokens.count_message(m) for m in messages)


def protection(messages: Sequence[Message], pinned: Collection[int] = ()) -> Protection:
    """The :class:`Protection` of ``messages`` with ``pinned`` positions: each widened to its
    tool-pair group (a pinned call keeps its result), the latest message's group kept.

    Raises:
        ValidationError: a pinned position outside the conversation.
    """
    count = len(messages)
    bad = sorted(p for p in pinned if not 0 <= p < count)
    if bad:
        raise ValidationError(
            f"pinned positions {bad} are outside a conversation of {count} messages; "
            "pin positions of the list you pass"
        )
    wanted = set(pinned)
    keep: set[int] = set()
    fixed: set[int] = set()
    for group in tool_pair_groups([m.content for m in messages]):
        if wanted.intersection(group):
            fixed.update(group)
            keep.update(group)
        elif count - 1 in group:
            keep.update(group)
    return Protection(keep=frozenset(keep), pinned=frozenset(fixed))


async def reduce_with_fallbacks(
    messages: Sequence[Message],
    steps: Sequence[ReductionStep],
    *,
    tokens: TokenCounter,
    pinned: Collection[int] = (),
    overflow: bool = True,
) -> Reduction:
    """Run ``steps`` in order until one returns a conversation with fewer tokens.

    A step that cannot reduce, or whose result is not smaller (a summary as long as what it
    replaces), hands over to the next. When none helps: with ``overflow``, raise
    :class:`ContextOverflowError` naming each step's reason; without, return the input
    unchanged.

    Raises:
        ContextOverflowError: ``overflow`` and no step shrank the conversation.
        ValidationError: a pinned position outside the conversation.
    """
    protect = protection(messages, pinned)
    before = conversation_tokens(messages, tokens)
    reasons: list[str] = []
    for step in steps:
        outcome = await step(messages, protect)
        if isinstance(outcome, str):
            reasons.append(f"{step.name}: {outcome}")
            continue
        if outcome.tokens_after >= before:
            reasons.append(
                f"{step.name}: its result has {outcome.tokens_after} tokens, not fewer "
                f"than {before}"
            )
            continue
        logger.debug(
            "conversation reduced by %s: %d -> %d messages, %d -> %d tokens",
            step.name,
            len(messages),
            len(outcome.messages),
            before,
            outcome.tokens_after,
        )
        return outcome
    if not overflow:
        logger.debug("proactive reduction found nothing to reduce: %s", "; ".join(reasons))
        return Reduction.unchanged(messages, before)
    why = "; ".join(reasons) if reasons else "this manager has no reduction steps"
    raise ContextOverflowError(
        f"cannot make a conversation of {len(messages)} messages ({before} tokens) smaller: "
        f"{why}. Use a model with a larger context window, pin fewer messages, or shorten "
        "the latest message",
        tokens=before,
        reasons=reasons,
    )
