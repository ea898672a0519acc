"""Properties every manager keeps on random conversations (tests/managers/shapes.py):

* a tool call and its result are never parted, and no result is left without its call;
* pinned messages and the latest message are kept, in order, and the input is untouched;
* ``reduce_context`` on overflow returns strictly fewer tokens (counted again here) or
  raises :class:`ContextOverflowError` with a reason per step; proactively it never raises.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.managers.shapes import COUNTER, conversations, no_orphans, pairs_intact
from tiermem.managers import (
    ContextOverflowError,
    ConversationManager,
    NullManager,
    Reduction,
    SlidingWindowManager,
    SummarizingManager,
    conversation_tokens,
    protection,
)
from tiermem.models import Message

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

managers = st.one_of(
    st.builds(
        lambda w, shorten: SlidingWindowManager(w, shorten_tool_outputs=shorten, tokens=COUNTER),
        st.integers(0, 12),
        st.booleans(),
    ),
    st.builds(
        lambda ratio, keep, w: SummarizingManager(
            summary_ratio=ratio, preserve_recent_messages=keep, window_size=w, tokens=COUNTER
        ),
        st.sampled_from([0.1, 0.3, 0.5, 0.8, 1.0]),
        st.integers(0, 6),
        st.integers(0, 12),
    ),
    st.just(NullManager(tokens=COUNTER)),
)


def check_shape(before: list[Message], pinned: list[int], result: Reduction) -> None:
    assert len(result.messages) == len(result.origins)
    assert pairs_intact(before, result)
    assert no_orphans(result.messages)
    kept = [o for o in result.origins if o is not None]
    assert kept == sorted(set(kept)), "order is kept and nothing is duplicated"
    assert result.origins[-1] == len(before) - 1, "the latest message is kept, last"
    for p in protection(before, pinned).pinned:
        j = result.origins.index(p)
        assert result.messages[j] is before[p], "pinned messages are kept unchanged"
    assert result.tokens_after == conversation_tokens(result.messages, COUNTER)


@PROPERTY
@given(conversation=conversations(), manager=managers)
async def test_reduce_context_shrinks_or_says_why(
    conversation: tuple[list[Message], list[int]], manager: ConversationManager
) -> None:
    messages, pinned = conversation
    snapshot = copy.deepcopy(messages)
    before = conversation_tokens(messages, COUNTER)
    outcome: Reduction | ContextOverflowError
    try:
        outcome = await manager.reduce_context(messages, pinned=pinned)
    except ContextOverflowError as stuck:
        outcome = stuck
    if isinstance(outcome, ContextOverflowError):
        assert outcome.tokens == before
        assert "cannot make a conversation" in str(outcome) or "never reduces" in str(outcome)
        assert isinstance(manager, NullManager) or outcome.reasons
    else:
        assert outcome.changed
        assert outcome.tokens_before == before
        assert outcome.tokens_after < before
        check_shape(messages, pinned, outcome)
    assert messages == snapshot


@PROPERTY
@given(conversation=conversations(), manager=managers)
async def test_routine_and_proactive_management_never_raise_and_keep_the_shape(
    conversation: tuple[list[Message], list[int]], manager: ConversationManager
) -> None:
    messages, pinned = conversation
    for result in (
        await manager.apply_management(messages, pinned=pinned),
        await manager.reduce_context(messages, pinned=pinned, overflow=False),
    ):
        check_shape(messages, pinned, result)
        assert result.tokens_after <= result.tokens_before


@PROPERTY
@given(conversation=conversations(), manager=managers)
async def test_reducing_until_stuck_always_ends_and_keeps_the_pairs(
    conversation: tuple[list[Message], list[int]], manager: ConversationManager
) -> None:
    messages, pinned = conversation
    done = Reduction.unchanged(messages, conversation_tokens(messages, COUNTER))
    held = set(pinned)
    for _ in range(200):
        try:
            step = await manager.reduce_context(done.messages, pinned=held)
        except ContextOverflowError:
            break
        held = {j for j, o in enumerate(step.origins) if o is not None and o in held}
        done = done.then(step)
    else:
        raise AssertionError("200 reductions and still shrinking")
    check_shape(messages, pinned, done)
