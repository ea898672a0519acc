"""The rule summarizer keeps what a later turn needs, and never just a count."""

from __future__ import annotations

import pytest

from tiermem.managers import RuleSummarizer, summary_header
from tiermem.models import Message, TextBlock, ToolResultBlock, ToolUseBlock

SUMMARIZER = RuleSummarizer()


def summary_of(*messages: Message) -> str:
    summary = SUMMARIZER.summarize(messages)
    assert summary.role == "user"
    [block] = summary.content
    assert isinstance(block, TextBlock)
    return block.text


@pytest.mark.parametrize(
    ("said", "kept"),
    [
        ("I prefer seinen.", True),  # a preference (and a genre)
        ("My name is Ken.", True),  # a name (memory detection rules)
        ("Is Berserk vol 42 in stock?", True),  # an entity: volume 42
        ("Where is order ORD-12345?", True),  # an entity: order id
        ("I need 3 copies.", True),  # a number
        ("No, I meant the blue edition.", True),  # a correction
        ("Remember that I am vegetarian.", True),  # a request to remember
        ("Thanks!", False),
        ("Let me check that.", False),
        ("Sure, here you go.", False),
    ],
)
def test_a_sentence_is_kept_when_it_holds_an_entity_a_number_or_a_preference(
    said: str, kept: bool
) -> None:
    text = summary_of(Message.text("user", f"Hello there. {said}"), Message.text("user", "ok"))
    assert (f"- User: {said}" in text) is kept


def test_tool_calls_and_their_results_are_kept_with_the_tool_name() -> None:
    text = summary_of(
        Message(
            role="assistant",
            content=(
                TextBlock(text="Let me check."),
                ToolUseBlock(tool_use_id="t1", name="check_stock", input={"volume": 42}),
            ),
        ),
        Message(
            role="user",
            content=(
                ToolResultBlock(
                    tool_use_id="t1",
                    content=(TextBlock(text="3 copies of vol 42. Restocked weekly."),),
                ),
            ),
        ),
        Message(
            role="assistant",
            content=(ToolUseBlock(tool_use_id="t2", name="reserve", input={"volume": 42}),),
        ),
        Message(
            role="user",
            content=(ToolResultBlock(tool_use_id="t2", status="error"),),
        ),
    )
    assert text.splitlines() == [
        summary_header(4),
        '- Assistant called check_stock({"volume": 42})',
        "- Result of check_stock: 3 copies of vol 42.",
        '- Assistant called reserve({"volume": 42})',
        "- reserve failed",
        "Entities: volume=42",
    ]


def test_the_entity_line_has_the_latest_value_of_each_kind() -> None:
    text = summary_of(
        Message.text("user", "I prefer seinen. Is vol 42 in stock?"),
        Message.text("user", "Actually I want vol 43."),
    )
    assert text.splitlines()[-1] == "Entities: genre=seinen; volume=43"


def test_small_talk_still_says_what_was_talked_about() -> None:
    text = summary_of(
        Message.text("user", "Hello! How are you today?"),
        Message.text("assistant", "Fine, thanks. How can I help?"),
    )
    assert text.splitlines() == [
        summary_header(2),
        "- User: Hello!",
        "- Assistant: Fine, thanks.",
    ]


def test_an_earlier_summary_is_carried_line_by_line_not_summarized_again() -> None:
    first = SUMMARIZER.summarize(
        [Message.text("user", "I prefer seinen."), Message.text("assistant", "Noted, vol 1.")]
    )
    merged = Message(role="user", content=(*first.content, TextBlock(text="And vol 2?")))
    text = summary_of(merged, Message.text("assistant", "Vol 2 is in stock."))
    assert text.splitlines() == [
        summary_header(4),
        "- User: I prefer seinen.",
        "- Assistant: Noted, vol 1.",
        "- User: And vol 2?",
        "- Assistant: Vol 2 is in stock.",
        "Entities: genre=seinen; volume=2",
    ]


def test_long_sentences_are_cut_and_long_summaries_keep_the_newest_lines() -> None:
    summarizer = RuleSummarizer(max_sentence_chars=20, max_lines=2)
    summary = summarizer.summarize(
        [Message.text("user", f"Order {n} is ORD-1234{n} and it is late again.") for n in range(4)]
    )
    [block] = summary.content
    assert isinstance(block, TextBlock)
    assert block.text.splitlines()[1:3] == [
        "- User: Order 2 is ORD-1234…",
        "- User: Order 3 is ORD-1234…",
    ]


async def test_the_summarizer_is_an_async_callable_and_deterministic() -> None:
    messages = [Message.text("user", "I prefer seinen. Is vol 42 in stock?")]
    assert (
        await SUMMARIZER(messages) == await SUMMARIZER(messages) == SUMMARIZER.summarize(messages)
    )
