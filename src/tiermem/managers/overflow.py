"""Using a manager around a model call: reduce and retry on overflow
(:func:`call_with_reduction`), and reduce before the limit is reached
(:func:`reduce_if_over`).

Strands' agent loop does the first itself (it catches its overflow exception, calls
``reduce_context`` and runs the cycle again); these functions give the same behaviour to
callers that drive a model without Strands.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TypeVar

from tiermem.errors import ValidationError
from tiermem.managers.base import (
    ContextOverflowError,
    ConversationManager,
    Reduction,
    conversation_tokens,
)
from tiermem.models.content import Message
from tiermem.tokens import TokenCounter

__all__ = ["call_with_reduction", "reduce_if_over"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _is_overflow(exc: BaseException) -> bool:
    return isinstance(exc, ContextOverflowError)


def _pinned_after(reduction: Reduction, pinned: Collection[int]) -> set[int]:
    return {j for j, o in enumerate(reduction.origins) if o is not None and o in pinned}


async def call_with_reduction(
    manager: ConversationManager,
    messages: Sequence[Message],
    call: Callable[[tuple[Message, ...]], Awaitable[T]],
    *,
    tokens: TokenCounter,
    pinned: Collection[int] = (),
    is_overflow: Callable[[BaseException], bool] = _is_overflow,
    max_reductions: int = 16,
) -> tuple[T, Reduction]:
    """``await call(messages)``; when it raises an overflow (``is_overflow``), reduce the
    messages with ``manager.reduce_context(overflow=True)`` and call again.

    Returns the call's result and the reduction that led to the messages it accepted
    (:meth:`Reduction.unchanged` when the first call succeeded): replace your history with
    ``reduction.messages``. Each reduction is strictly smaller, so the loop ends; it stops
    after ``max_reductions``.

    Raises:
        ContextOverflowError: the manager could not shrink the messages further (from the
            model's overflow error), or ``max_reductions`` were not enough.
        ValidationError: ``max_reductions`` below 0, or a bad pinned position.
        Exception: whatever ``call`` raises that is not an overflow.
    """
    if max_reductions < 0:
        raise ValidationError(f"max_reductions must be 0 or more, got {max_reductions}")
    done = Reduction.unchanged(messages, conversation_tokens(messages, tokens))
    held = set(pinned)
    while True:
        try:
            return await call(done.messages), done
        except Exception as exc:
            if not is_overflow(exc):
                raise
            reductions = len(done.steps)
            if reductions >= max_reductions:
                raise ContextOverflowError(
                    f"the model still refused the conversation after {reductions} reductions "
                    f"({done.tokens_after} tokens left); raise max_reductions or use a model "
                    "with a larger context window",
                    tokens=done.tokens_after,
                ) from exc
            try:
                step = await manager.reduce_context(done.messages, pinned=held, overflow=True)
            except ContextOverflowError as stuck:
                raise stuck from exc
            logger.info(
                "context overflow: reduced the conversation by %s to %d tokens and retrying",
                "+".join(step.steps),
                step.tokens_after,
            )
            held = _pinned_after(step, held)
            done = done.then(step)


async def reduce_if_over(
    manager: ConversationManager,
    messages: Sequence[Message],
    *,
    limit_tokens: int,
    tokens: TokenCounter,
    threshold: float = 0.7,
    pinned: Collection[int] = (),
    max_rounds: int = 8,
) -> Reduction:
    """Proactive reduction: while the conversation holds ``threshold`` of ``limit_tokens``
    or more, ask ``manager`` for a smaller one (best effort, ``overflow=False``).

    Stops below the threshold, when the manager has nothing more to reduce, or after
    ``max_rounds``; never raises for a conversation it cannot shrink (the model call will
    tell). The default threshold, 0.7, is Strands'.

    Raises:
        ValidationError: ``threshold`` outside (0, 1], ``limit_tokens`` below 1, or a bad
            pinned position.
    """
    if not 0 < threshold <= 1:
        raise ValidationError(f"threshold must be in (0, 1], got {threshold}")
    if limit_tokens < 1:
        raise ValidationError(f"limit_tokens must be 1 or more, got {limit_tokens}")
    done = Reduction.unchanged(messages, conversation_tokens(messages, tokens))
    held = set(pinned)
    for _ in range(max_rounds):
        if done.tokens_after < threshold * limit_tokens:
            break
        step = await manager.reduce_context(done.messages, pinned=held, overflow=False)
        if not step.changed:
            break
        held = _pinned_after(step, held)
        done = done.then(step)
    if done.changed:
        logger.debug(
            "proactive reduction at %.0f%% of %d tokens: %d -> %d tokens by %s",
            threshold * 100,
            limit_tokens,
            done.tokens_before,
            done.tokens_after,
            "+".join(done.steps),
        )
    return done
