"""The three managers, the fallback chain, and reduce-and-retry / proactive reduction."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from tests.managers.shapes import COUNTER, shape, words
from tiermem.errors import ValidationError
from tiermem.managers import (
    ContextOverflowError,
    NullManager,
    Reduction,
    SlidingWindowManager,
    SummarizingManager,
    call_with_reduction,
    conversation_of,
    conversation_tokens,
    reduce_if_over,
    summary_header,
)
from tiermem.models import Message, TextBlock, Turn


class FailingSummarizer:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, messages: Sequence[Message]) -> Message:
        self.calls += 1
        raise RuntimeError("the summary model is down")


class FixedSummarizer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.seen: list[list[Message]] = []

    async def __call__(self, messages: Sequence[Message]) -> Message:
        self.seen.append(list(messages))
        return Message.text("assistant", self.text)


async def test_the_null_manager_never_changes_anything_and_refuses_overflow() -> None:
    messages, _ = shape("u a u a")
    manager = NullManager(tokens=COUNTER)
    assert not (await manager.apply_management(messages)).changed
    assert not (await manager.reduce_context(messages, overflow=False)).changed
    with pytest.raises(ContextOverflowError, match="never reduces it; use a sliding window"):
        await manager.reduce_context(messages)


@pytest.mark.parametrize(
    ("conversation", "window", "kept"),
    [
        ("u a u a", 4, "u a u a"),  # fits: unchanged
        ("u a u a u a", 4, "u a u a"),
        ("u a:t1 u:r1 a u a", 3, "u a"),
        ("u a u a:t1 u:r1", 1, "u a:t1 u:r1"),  # the latest message keeps its call
        ("u a:t1 u:r1 a:t2 u:r2", 2, "u a:t2 u:r2"),  # ... and a note opens the rest
    ],
)
async def test_sliding_window_trims_after_each_turn(
    conversation: str, window: int, kept: str
) -> None:
    messages, _ = shape(conversation)
    result = await SlidingWindowManager(window, tokens=COUNTER).apply_management(messages)
    assert words(result.messages) == kept


async def test_sliding_window_on_overflow_slides_then_shortens() -> None:
    manager = SlidingWindowManager(40, tokens=COUNTER)
    messages, _ = shape("u a u a:t1 u:r1!")
    slid = await manager.reduce_context(messages)
    assert slid.steps == ("slide",)
    assert words(slid.messages) == "u a:t1 u:r1"
    # Dropping "m0: I prefer seinen." for the removed-note is no smaller: shorten instead.
    messages, _ = shape("u a:t1 u:r1!")
    shortened = await manager.reduce_context(messages)
    assert shortened.steps == ("shorten_tool_outputs",)
    with pytest.raises(ContextOverflowError) as stuck:
        await manager.reduce_context(shortened.messages)
    assert [r.split(":")[0] for r in stuck.value.reasons] == ["slide", "shorten_tool_outputs"]
    assert "no unpinned tool output is long enough" in str(stuck.value)


def _long(role: str, n: int) -> Message:
    return Message.text(role, f"Message {n} mentions vol {n}. " + "Padding words here. " * 20)  # type: ignore[arg-type]


def _exchanges(count: int) -> list[Message]:
    return [_long("user" if i % 2 == 0 else "assistant", i) for i in range(count)]


async def test_summarizing_replaces_the_oldest_messages_with_one_summary() -> None:
    messages = _exchanges(20)
    manager = SummarizingManager(summary_ratio=0.3, preserve_recent_messages=4, tokens=COUNTER)
    assert not (await manager.apply_management(messages)).changed
    result = await manager.reduce_context(messages)
    assert result.steps == ("summarize",)
    # 30% of 20 = 6 messages folded; message 6 is a user message, so the summary opens it.
    assert result.origins == (6, *range(7, 20))
    opened = result.messages[0]
    assert opened.role == "user"
    assert isinstance(opened.content[0], TextBlock)
    assert opened.content[0].text.startswith(summary_header(6))
    assert "- User: Message 0 mentions vol 0." in opened.content[0].text
    assert opened.content[1:] == messages[6].content
    assert result.summary is not None
    assert (
        result.tokens_after == conversation_tokens(result.messages, COUNTER) < result.tokens_before
    )


async def test_a_summary_before_an_assistant_message_is_its_own_message() -> None:
    messages = _exchanges(21)[1:]  # starts with an assistant message
    summarizer = FixedSummarizer("The user asked about volumes 1 to 6.")
    manager = SummarizingManager(summarizer, preserve_recent_messages=4, tokens=COUNTER)
    result = await manager.reduce_context(messages)
    assert result.origins[:2] == (None, 6)
    assert result.messages[0] == Message.text("user", "The user asked about volumes 1 to 6.")
    assert summarizer.seen == [messages[:6]]


async def test_summarizing_keeps_pinned_messages_and_never_summarizes_them() -> None:
    messages = _exchanges(20)
    summarizer = FixedSummarizer("short")
    manager = SummarizingManager(summarizer, preserve_recent_messages=4, tokens=COUNTER)
    result = await manager.reduce_context(messages, pinned=[1])
    assert result.origins[:2] == (1, 6)
    assert summarizer.seen == [[messages[0], *messages[2:6]]]


@pytest.mark.parametrize(
    ("summarizer", "logged"),
    [
        (FailingSummarizer(), "the summarizer failed on 6 messages; trying the next step"),
        (FixedSummarizer("  "), "the summarizer returned no text for 6 messages"),
    ],
)
async def test_a_failing_summary_falls_back_to_the_slide_and_is_counted(
    summarizer: object, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    messages = _exchanges(20)
    manager = SummarizingManager(
        summarizer,  # type: ignore[arg-type]
        preserve_recent_messages=4,
        window_size=6,
        tokens=COUNTER,
    )
    with caplog.at_level(logging.WARNING, logger="tiermem.managers.summarizing"):
        result = await manager.reduce_context(messages)
    assert result.steps == ("slide",)
    assert result.origins == tuple(range(14, 20))
    assert manager.summarizer_failures == 1
    assert [r.getMessage() for r in caplog.records] == [logged]


async def test_an_overflow_nothing_can_shrink_names_every_step() -> None:
    manager = SummarizingManager(preserve_recent_messages=4, tokens=COUNTER)
    with pytest.raises(ContextOverflowError) as stuck:
        await manager.reduce_context([_long("user", 0)])
    assert stuck.value.reasons == (
        "summarize: 1 messages, and the newest 4 are never summarized",
        "slide: every message is pinned or the latest one",
        "shorten_tool_outputs: no unpinned tool output is long enough to shorten",
    )
    assert stuck.value.tokens == conversation_tokens([_long("user", 0)], COUNTER)


async def test_a_summary_that_does_not_shrink_gives_way() -> None:
    messages, _ = shape("u a u a u a")
    manager = SummarizingManager(
        FixedSummarizer("a summary far longer than the messages it replaces " * 30),
        preserve_recent_messages=2,
        tokens=COUNTER,
    )
    result = await manager.reduce_context(messages)
    assert result.steps == ("slide",)


async def test_proactive_reduction_never_raises() -> None:
    messages, _ = shape("u")
    for manager in (
        NullManager(tokens=COUNTER),
        SlidingWindowManager(tokens=COUNTER),
        SummarizingManager(tokens=COUNTER),
    ):
        result = await manager.reduce_context(messages, overflow=False)
        assert not result.changed
        assert result.messages == tuple(messages)


async def test_pinned_positions_are_checked() -> None:
    messages, _ = shape("u a")
    with pytest.raises(ValidationError, match=r"pinned positions \[5\] are outside"):
        await SlidingWindowManager(tokens=COUNTER).reduce_context(messages, pinned=[5])


@pytest.mark.parametrize(
    "make",
    [
        lambda: SlidingWindowManager(-1),
        lambda: SummarizingManager(summary_ratio=0),
        lambda: SummarizingManager(preserve_recent_messages=-1),
    ],
)
def test_bad_settings_are_refused(make: object) -> None:
    with pytest.raises(ValidationError):
        make()  # type: ignore[operator]


class SmallModel:
    """Refuses conversations over ``limit`` tokens, like a provider with a small window."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sizes: list[int] = []

    async def __call__(self, messages: tuple[Message, ...]) -> str:
        size = conversation_tokens(messages, COUNTER)
        self.sizes.append(size)
        if size > self.limit:
            raise ContextOverflowError(f"{size} tokens is over {self.limit}", tokens=size)
        return f"answered {len(messages)} messages"


async def test_an_overflow_is_reduced_and_the_call_retried_until_it_fits() -> None:
    messages = _exchanges(20)
    model = SmallModel(limit=1200)
    manager = SummarizingManager(preserve_recent_messages=4, tokens=COUNTER)
    answer, reduction = await call_with_reduction(manager, messages, model, tokens=COUNTER)
    assert model.sizes[0] > 1200 >= model.sizes[-1]
    assert model.sizes == sorted(model.sizes, reverse=True)
    assert answer == f"answered {len(reduction.messages)} messages"
    assert reduction.origins[-1] == 19  # the latest message is the original one
    assert conversation_tokens(reduction.messages, COUNTER) == model.sizes[-1]


async def test_an_overflow_nothing_can_fix_raises_with_the_reasons() -> None:
    messages = [_long("user", 0)]
    with pytest.raises(
        ContextOverflowError, match="cannot make a conversation of 1 messages"
    ) as stuck:
        await call_with_reduction(
            SlidingWindowManager(tokens=COUNTER), messages, SmallModel(limit=10), tokens=COUNTER
        )
    assert isinstance(stuck.value.__cause__, ContextOverflowError)  # the model's refusal


async def test_other_errors_of_the_call_pass_through() -> None:
    async def broken(messages: tuple[Message, ...]) -> str:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await call_with_reduction(
            NullManager(tokens=COUNTER), [_long("user", 0)], broken, tokens=COUNTER
        )


async def test_retries_stop_after_max_reductions() -> None:
    with pytest.raises(ContextOverflowError, match="after 1 reductions"):
        await call_with_reduction(
            SlidingWindowManager(tokens=COUNTER),
            _exchanges(20),
            SmallModel(limit=10),
            tokens=COUNTER,
            max_reductions=1,
        )


async def test_proactive_reduction_stops_below_the_threshold() -> None:
    messages = _exchanges(20)
    size = conversation_tokens(messages, COUNTER)
    manager = SummarizingManager(preserve_recent_messages=4, tokens=COUNTER)
    untouched = await reduce_if_over(manager, messages, limit_tokens=size * 2, tokens=COUNTER)
    assert not untouched.changed
    reduced = await reduce_if_over(
        manager, messages, limit_tokens=size, tokens=COUNTER, threshold=0.5
    )
    assert reduced.changed
    assert reduced.tokens_after < size * 0.5 or len(reduced.steps) == 8
    assert reduced.origins[-1] == 19


async def test_proactive_reduction_keeps_pinned_messages_across_rounds() -> None:
    messages = _exchanges(20)
    size = conversation_tokens(messages, COUNTER)
    reduced = await reduce_if_over(
        SlidingWindowManager(4, tokens=COUNTER),
        messages,
        limit_tokens=size,
        tokens=COUNTER,
        threshold=0.1,
        pinned=[0],
    )
    assert reduced.origins[0] == 0
    assert reduced.messages[0] is messages[0]


@pytest.mark.parametrize(
    ("limit", "threshold"),
    [(0, 0.7), (100, 0.0), (100, 1.5)],
)
async def test_proactive_settings_are_checked(limit: int, threshold: float) -> None:
    with pytest.raises(ValidationError):
        await reduce_if_over(
            NullManager(tokens=COUNTER), [], limit_tokens=limit, tokens=COUNTER, threshold=threshold
        )


def test_reductions_compose() -> None:
    messages, _ = shape("u a u a")
    first = Reduction(tuple(messages[1:]), (1, 2, 3), ("slide",), 40, 30)
    second = Reduction((messages[3],), (2,), ("slide",), 30, 10)
    both = first.then(second)
    assert both.origins == (3,)
    assert both.steps == ("slide", "slide")
    assert (both.tokens_before, both.tokens_after) == (40, 10)
    assert both.removed(4) == (0, 1, 2)


async def test_stored_turns_are_managed_with_their_pins() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    turns = [
        Turn(index=i, role=m.role, content=m.content, timestamp=now, pinned=i == 1)
        for i, m in enumerate(_exchanges(12))
    ]
    messages, pinned = conversation_of(turns)
    assert pinned == [1]
    result = await SlidingWindowManager(4, tokens=COUNTER).apply_management(messages, pinned=pinned)
    assert [turns[o].index for o in result.origins if o is not None] == [1, 8, 9, 10, 11]
