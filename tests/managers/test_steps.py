"""The reduction steps on tables of conversation shapes (see tests/managers/shapes.py)."""

from __future__ import annotations

import pytest

from tests.managers.shapes import COUNTER, shape, words
from tiermem.managers import (
    SHORTENED_MARKER,
    Reduction,
    RuleSummarizer,
    ShortenToolOutputs,
    Slide,
    Summarize,
    cut_points,
    protection,
    removed_note,
    starts_cleanly,
)
from tiermem.models import (
    DocumentBlock,
    ImageBlock,
    JsonBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)


@pytest.mark.parametrize(
    ("conversation", "cuts"),
    [
        ("u a u a", [1, 2, 3]),
        ("u a:t1 u:r1 a", [1, 3]),
        ("u a:t1 u:r1 a:t2 u:r2 a", [1, 3, 5]),
        ("u a:t1,t2 u:r1 u:r2 a", [1, 4]),
        ("u a:t1,t2 u:r1,r2 a u", [1, 3, 4]),
        ("a:t1 u:r1", []),
        ("u", []),
    ],
)
def test_cut_points_never_fall_inside_a_tool_pair(conversation: str, cuts: list[int]) -> None:
    messages, _ = shape(conversation)
    assert cut_points(messages) == cuts


@pytest.mark.parametrize(
    ("message", "clean"),
    [
        (Message.text("user", "hi"), True),
        (Message.text("assistant", "hi"), False),
        (Message(role="user", content=(ToolResultBlock(tool_use_id="t"),)), False),
    ],
)
def test_a_conversation_starts_cleanly_only_at_a_plain_user_message(
    message: Message, clean: bool
) -> None:
    assert starts_cleanly(message) is clean


# (shape, window, kept origins, starts with the removed note)
SLIDES = [
    pytest.param("u a u a u a", 2, [4, 5], False, id="window"),
    pytest.param("u a u a u a", 3, [4, 5], False, id="moves-forward-to-a-user-message"),
    pytest.param("u a:t1 u:r1 a u a", 3, [4, 5], False, id="skips-the-pair"),
    pytest.param("u* a u a u a", 2, [0, 4, 5], False, id="pinned-stays"),
    pytest.param("u a:t1* u:r1 a u a", 2, [1, 2, 4, 5], False, id="pinned-call-keeps-its-result"),
    pytest.param("u a:t1 u:r1 a:t2 u:r2 a", 2, [None, 5], True, id="note-before-assistant"),
    pytest.param("u a u a", 10, [2, 3], False, id="overflow-drops-at-least-two"),
    pytest.param("u a u a:t1 u:r1", 1, [2, 3, 4], False, id="back-when-nothing-ahead"),
]


@pytest.mark.parametrize(("conversation", "window", "origins", "note"), SLIDES)
async def test_slide_keeps_the_newest_messages_and_their_pairs(
    conversation: str, window: int, origins: list[int | None], note: bool
) -> None:
    messages, pinned = shape(conversation)
    result = await Slide(window, COUNTER)(messages, protection(messages, pinned))
    assert isinstance(result, Reduction)
    assert list(result.origins) == origins
    assert result.steps == ("slide",)
    assert (result.messages[0] == removed_note(len(messages) - len(origins) + 1)) is note
    for message, origin in zip(result.messages, result.origins, strict=True):
        if origin is not None:
            assert message is messages[origin]


@pytest.mark.parametrize(
    ("conversation", "why"),
    [
        ("u", "every message is pinned or the latest one"),
        ("u* a* u", "every message is pinned or the latest one"),
        ("a:t1 u:r1", "every message is pinned or the latest one"),
        ("u* u:r9 u:r8", "no place to cut"),  # orphan results: no start
    ],
)
async def test_slide_says_why_it_cannot_cut(conversation: str, why: str) -> None:
    messages, pinned = shape(conversation)
    result = await Slide(1, COUNTER)(messages, protection(messages, pinned))
    assert isinstance(result, str)
    assert result.startswith(why)


def _result(*items: object) -> Message:
    return Message(role="user", content=(ToolResultBlock(tool_use_id="t1", content=items),))  # type: ignore[arg-type]


async def test_shortening_keeps_the_head_and_tail_of_the_oldest_long_output() -> None:
    text = "HEAD" + "x" * 1000 + "TAIL"
    messages = [
        Message.text("user", "go"),
        Message(role="assistant", content=(ToolUseBlock(tool_use_id="t1", name="dump"),)),
        _result(TextBlock(text=text)),
        Message.text("assistant", "done"),
    ]
    result = await ShortenToolOutputs(COUNTER)(messages, protection(messages))
    assert isinstance(result, Reduction)
    assert result.origins == (0, 1, 2, 3)
    [block] = result.messages[2].content
    assert isinstance(block, ToolResultBlock)
    [shortened] = block.content
    assert isinstance(shortened, TextBlock)
    assert shortened.text.startswith("HEAD")
    assert shortened.text.endswith("TAIL")
    # One truncation rule (tiermem.context.truncate.mark_cut): head, marker, tail.
    marker = f"{SHORTENED_MARKER}; the original had {COUNTER.count(text)} tokens]"
    assert shortened.text == f"{text[:200]}\n{marker}\n{text[-200:]}"
    assert result.tokens_after < result.tokens_before
    assert messages[2].content[0] == ToolResultBlock(
        tool_use_id="t1", content=(TextBlock(text=text),)
    )  # the input is untouched
    again = await ShortenToolOutputs(COUNTER)(result.messages, protection(result.messages))
    assert again == "no unpinned tool output is long enough to shorten"


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            ImageBlock(format="png", data=b"1234"),
            "[image: png, 4 bytes, removed to fit the context]",
        ),
        (
            DocumentBlock(format="pdf", name="spec", data=b"%PDF"),
            "[document 'spec' (pdf), removed to fit the context]",
        ),
        (JsonBlock(json={"rows": ["r" * 500]}), SHORTENED_MARKER),
    ],
)
def test_media_and_json_in_results_become_text(item: object, expected: str) -> None:
    shortened = ShortenToolOutputs(COUNTER).shorten(_result(item))
    assert shortened is not None
    [block] = shortened.content
    assert isinstance(block, ToolResultBlock)
    [text] = block.content
    assert isinstance(text, TextBlock)
    assert expected in text.text


async def test_shortening_skips_pinned_messages_and_takes_the_latest() -> None:
    messages, pinned = shape("u a:t1* u:r1! a:t2 u:r2!")
    result = await ShortenToolOutputs(COUNTER)(messages, protection(messages, pinned))
    assert isinstance(result, Reduction)
    assert result.messages[2] is messages[2]  # pinned with its call
    assert result.messages[4] != messages[4]  # the latest message is shortened
    assert words(result.messages) == words(messages)


@pytest.mark.parametrize(
    ("conversation", "ratio", "preserve", "split"),
    [
        ("u a u a u a u a u a", 0.3, 2, 3),
        ("u a u a u a u a u a", 0.3, 8, 2),  # never the newest 8
        ("u a:t1 u:r1 a u a", 0.3, 0, 1),
        ("u a:t1 u:r1 a u a", 0.5, 0, 3),  # 3 parts no pair
        ("u a:t1,t2 u:r1 u:r2 a", 0.5, 0, 4),  # moved forward past the pair
        ("u a:t1 u:r1 a:t2 u:r2", 1.0, 0, 3),  # no place at 5: fold less
        ("u a u", 0.3, 4, "3 messages, and the newest 4 are never summarized"),
        ("a:t1 u:r1", 0.5, 0, "no place to end the summary"),
        ("u* a* u", 0.5, 0, "no place to end the summary"),
    ],
)
def test_where_the_summary_ends(
    conversation: str, ratio: float, preserve: int, split: int | str
) -> None:
    messages, pinned = shape(conversation)
    step = Summarize(
        RuleSummarizer(), COUNTER, summary_ratio=ratio, preserve_recent_messages=preserve
    )
    found = step.split(messages, protection(messages, pinned))
    if isinstance(split, str):
        assert isinstance(found, str)
        assert found.startswith(split)
    else:
        assert found == split
