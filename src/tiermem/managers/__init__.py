r"""Conversation managers: keep a conversation small enough for its model, with the
semantics of Strands' conversation managers (seed 003), as pure functions.

A manager takes a sequence of :class:`~tiermem.models.Message` values (for stored turns,
:func:`conversation_of` gives their messages and the positions of the pinned ones) and
returns a :class:`Reduction`: a new tuple of messages and, for each, the position of the
input message it came from. Nothing is changed in place; the caller decides what to do with
the result (the Strands adapter in :mod:`tiermem.integrations.strands` writes it back to the
agent).

=======================  ==========================  ===========================================
manager                  ``apply_management``        ``reduce_context`` (on overflow)
                         (after each agent turn)
=======================  ==========================  ===========================================
:class:`NullManager`     nothing                     raises :class:`ContextOverflowError`
:class:`SlidingWindow\   trims to the newest         slide → shorten oldest tool outputs
Manager`                 ``window_size`` messages
:class:`Summarizing\     nothing                     summarize → slide → shorten oldest tool
Manager`                                             outputs
=======================  ==========================  ===========================================

What every manager guarantees, whatever the input (property-tested):

* a tool call and its result are kept or dropped together: cuts happen only where
  :func:`tiermem.context.tool_pairs.tool_pair_groups` allows, the one function that owns
  that rule;
* pinned messages (with their tool partners) and the latest message are kept;
* ``reduce_context(overflow=True)`` returns strictly fewer tokens or raises
  :class:`ContextOverflowError`, which says why each step could not help. Without
  ``overflow`` (proactive) it is best effort and never raises for that.

On overflow, :func:`call_with_reduction` reduces and retries a model call;
:func:`reduce_if_over` reduces ahead of time once a conversation holds a share of the
model's window (0.7 by default, as in Strands). Summaries come from a :class:`Summarizer`
(an async callable from messages to a summary message, e.g. an LLM call); the default,
:class:`RuleSummarizer`, keeps the sentences with entities, numbers and preferences.
"""

from tiermem.managers.base import (
    ContextOverflowError,
    ConversationManager,
    Protection,
    Reduction,
    ReductionStep,
    StepName,
    conversation_of,
    conversation_tokens,
    protection,
    reduce_with_fallbacks,
)
from tiermem.managers.overflow import call_with_reduction, reduce_if_over
from tiermem.managers.steps import (
    SHORTENED_MARKER,
    ShortenToolOutputs,
    Slide,
    cut_points,
    removed_note,
    starts_cleanly,
)
from tiermem.managers.summarizing import Summarize, SummarizingManager
from tiermem.managers.summary import RuleSummarizer, Summarizer, summary_header
from tiermem.managers.window import NullManager, SlidingWindowManager

__all__ = [
    "SHORTENED_MARKER",
    "ContextOverflowError",
    "ConversationManager",
    "NullManager",
    "Protection",
    "Reduction",
    "ReductionStep",
    "RuleSummarizer",
    "ShortenToolOutputs",
    "Slide",
    "SlidingWindowManager",
    "StepName",
    "Summarize",
    "Summarizer",
    "SummarizingManager",
    "call_with_reduction",
    "conversation_of",
    "conversation_tokens",
    "cut_points",
    "protection",
    "reduce_if_over",
    "reduce_with_fallbacks",
    "removed_note",
    "starts_cleanly",
    "summary_header",
]
