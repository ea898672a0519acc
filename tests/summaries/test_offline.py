"""The extractive summarizer: what it keeps, what it drops, its budget, must_keep, prior."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tiermem.errors import ValidationError
from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.models.turns import NewTurn, Turn
from tiermem.summaries.models import SessionSummarizer, StructuredMemory
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.quality import measure
from tiermem.summaries.structured import RuleStructuredExtractor
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

TITLES = {"Berserk": "Berserk", "Naruto": "Naruto"}
COUNTER = TiktokenCounter()
SUMMARIZER = ExtractiveSummarizer(COUNTER, known_titles=TITLES)
WHEN = datetime(2026, 1, 5, tzinfo=UTC)


def turns(*said: str | tuple[str, str], start: int = 0) -> list[Turn]:
    out = []
    for offset, item in enumerate(said):
        role, text = ("user", item) if isinstance(item, str) else item
        turn = NewTurn(role=role, content=(TextBlock(text=text),), timestamp=WHEN)  # type: ignore[arg-type]
        out.append(turn.with_index(start + offset))
    return out


def summary(*said: str | tuple[str, str], target: int = 500, **kwargs: object) -> str:
    return SUMMARIZER.summarize_sync(turns(*said), target_tokens=target, **kwargs)  # type: ignore[arg-type]


def test_it_is_a_session_summarizer() -> None:
    assert isinstance(SUMMARIZER, SessionSummarizer)
    assert SUMMARIZER.name == "extractive"


@pytest.mark.parametrize(
    ("said", "kept"),
    [
        ("Is Berserk vol 42 in stock?", True),  # entities
        ("I need 3 copies.", True),  # a number
        ("I prefer seinen.", True),  # a preference
        ("No, I meant the blue edition.", True),  # a correction
        ("My postcode is 150-0001.", True),  # a slot statement
        ("I'll take the deluxe edition.", True),  # a decision
        ("I'm looking for a gift for a friend.", True),  # a goal
        ("I'll think about it and come back later.", True),  # an unresolved intention
        ("Thanks!", False),
        ("Let me check that.", False),
        ("Sure, here you go.", False),
    ],
)
def test_a_sentence_is_kept_for_what_it_carries(said: str, kept: bool) -> None:
    text = summary("Hello there.", f"Okay. {said}", "My budget is ¥5,000.")
    assert (f"- [1] User: {said}" in text) is kept, text


def test_lines_are_in_turn_order_with_the_speaker() -> None:
    text = summary(
        "Is Berserk vol 42 in stock?",
        ("assistant", "Yes, vol 42 is ¥990."),
        "My budget is ¥5,000.",
    )
    assert text.splitlines() == [
        "- [0] User: Is Berserk vol 42 in stock?",
        "- [1] Assistant: Yes, vol 42 is ¥990.",
        "- [2] User: My budget is ¥5,000.",
    ]


def test_the_latest_statement_of_a_corrected_value_stays_and_the_stale_one_goes() -> None:
    text = summary(
        "My budget is ¥5,000.",
        ("assistant", "Great, I'll look for options under ¥5,000."),
        "Thanks.",
        "Actually, my budget is ¥8,000, not ¥5,000.",
    )
    assert text.splitlines() == ["- [3] User: Actually, my budget is ¥8,000, not ¥5,000."]


def test_a_correction_in_a_later_span_drops_the_stale_line_of_the_prior() -> None:
    first = summary("My budget is ¥5,000.", "My postcode is 150-0001.")
    assert "¥5,000" in first
    second = SUMMARIZER.summarize_sync(
        turns("Sorry, I got that wrong earlier: my budget is ¥8,000.", start=2),
        prior=first,
        target_tokens=500,
    )
    assert second.splitlines() == [
        "- [1] User: My postcode is 150-0001.",
        "- [2] User: Sorry, I got that wrong earlier: my budget is ¥8,000.",
    ]


def test_a_value_corrected_by_entity_kind_drops_earlier_mentions() -> None:
    text = summary(
        "Is Berserk vol 42 in stock?",
        ("assistant", "Vol 42 ships tomorrow."),
        "No, I meant vol 3, not vol 42.",
    )
    assert "[0]" not in text
    assert "[1]" not in text
    assert "- [2] User: No, I meant vol 3, not vol 42." in text


def test_a_restated_value_is_kept_once_at_its_latest_statement() -> None:
    text = summary("My postcode is 150-0001.", "Again, my postcode is 150-0001.")
    assert text.splitlines() == ["- [1] User: Again, my postcode is 150-0001."]


def test_prior_lines_are_carried_over_with_their_turn_indexes() -> None:
    first = summary("My postcode is 150-0001.", "I live in Osaka.")
    second = SUMMARIZER.summarize_sync(
        turns("Thanks!", "My name is Ken.", start=2), prior=first, target_tokens=500
    )
    assert second.splitlines() == [
        "- [0] User: My postcode is 150-0001.",
        "- [1] User: I live in Osaka.",
        "- [3] User: My name is Ken.",
    ]


def test_a_prior_written_by_someone_else_is_kept_as_context_lines() -> None:
    prior = "The user is shopping for a birthday gift.\n- budget: ¥5,000"
    text = SUMMARIZER.summarize_sync(turns("Thanks!"), prior=prior, target_tokens=200)
    assert text.splitlines() == [
        "- The user is shopping for a birthday gift.",
        "- budget: ¥5,000",
    ]
    corrected = SUMMARIZER.summarize_sync(
        turns("Actually, my budget is ¥8,000.", start=1), prior=prior, target_tokens=200
    )
    assert "¥5,000" not in corrected  # a carried line with a superseded value goes too


def test_must_keep_items_are_stated_verbatim_first() -> None:
    text = summary("My postcode is 150-0001.", must_keep=["budget: ¥5,000", "series: Berserk"])
    assert text.splitlines() == [
        "- budget: ¥5,000",
        "- series: Berserk",
        "- [0] User: My postcode is 150-0001.",
    ]


def test_must_keep_items_that_alone_exceed_the_target_are_all_stated_and_nothing_else() -> None:
    items = [f"fact {n}: a long item that takes a number of tokens to state" for n in range(10)]
    text = summary("My postcode is 150-0001.", target=20, must_keep=items)
    assert text.splitlines() == [f"- {item}" for item in items]
    assert COUNTER.count(text) > 20  # the documented exception to the target


@pytest.mark.parametrize("target", [5, 30, 60, 120, 400])
def test_the_summary_never_exceeds_the_target(target: int) -> None:
    said = [f"My slot {n} is value-{n} with number {n * 7}." for n in range(40)]
    text = summary(*said, target=target)
    assert COUNTER.count(text) <= target


def test_under_pressure_user_statements_and_recent_lines_win() -> None:
    said: list[str | tuple[str, str]] = []
    for n in range(30):
        said += [f"My locker {n} code is L-{n:03d}.", ("assistant", f"Aisle {n} has {n} copies.")]
    text = summary(*said, target=60)
    lines = text.splitlines()
    assert len(lines) > 2
    assert all("User:" in line for line in lines)  # no assistant line beat them
    assert "L-029" in text  # the newest first
    assert "L-000" not in text


def test_tool_calls_are_kept_and_large_results_give_a_few_lines() -> None:
    rows = "\n".join(f"Naruto vol {n} | ¥{500 + n}" for n in range(1, 60))
    call = NewTurn(
        role="assistant",
        content=(ToolUseBlock(tool_use_id="t1", name="search", input={"q": "Naruto"}),),
        timestamp=WHEN,
    ).with_index(0)
    result = NewTurn(
        role="user",
        content=(ToolResultBlock(tool_use_id="t1", content=(TextBlock(text=rows),)),),
        timestamp=WHEN,
    ).with_index(1)
    text = SUMMARIZER.summarize_sync([call, result], target_tokens=500)
    assert text.splitlines() == [
        '- [0] Assistant called search({"q": "Naruto"})',
        "- [1] Result of search: Naruto vol 1 | ¥501",
        "- [1] Result of search: Naruto vol 2 | ¥502",
    ]


def test_quoted_and_third_party_lines_rank_below_the_users_own() -> None:
    text = summary(
        "My order number is ORD-12345.",
        "Someone sent me this:\n> Order ORD-99999 has shipped.",
        target=16,
    )
    assert text == "- [0] User: My order number is ORD-12345."


def test_when_nothing_qualifies_the_first_sentence_of_each_user_turn_says_the_topic() -> None:
    text = summary("Hello there. How are you?", ("assistant", "Fine."), "Tell me a story.")
    assert text.splitlines() == ["- [0] User: Hello there.", "- [2] User: Tell me a story."]


def test_a_long_sentence_is_cut() -> None:
    summarizer = ExtractiveSummarizer(COUNTER, max_sentence_chars=30)
    text = summarizer.summarize_sync(
        turns("My address is 1-2-3 A very long street name in a very long town."),
        target_tokens=100,
    )
    assert text == "- [0] User: My address is 1-2-3 A very lo…"  # 30 characters


def test_redacted_turns_are_left_out() -> None:
    [turn] = turns("My budget is ¥5,000.")
    assert SUMMARIZER.summarize_sync([turn.redact()], target_tokens=100) == ""


def test_the_output_is_deterministic() -> None:
    said = ("Is Berserk vol 42 in stock?", "My budget is ¥5,000.", "I live in Osaka.")
    other = ExtractiveSummarizer(COUNTER, known_titles=TITLES)
    assert summary(*said, target=25) == other.summarize_sync(turns(*said), target_tokens=25)


async def test_the_async_protocol_method_gives_the_same_text() -> None:
    said = turns("My budget is ¥5,000.")
    assert await SUMMARIZER.summarize(said, target_tokens=50) == SUMMARIZER.summarize_sync(
        said, target_tokens=50
    )


@pytest.mark.parametrize("target", [0, -1])
def test_a_target_below_one_is_rejected(target: int) -> None:
    with pytest.raises(ValidationError, match="target_tokens"):
        summary("Hi", target=target)


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(ValidationError, match="max_sentence_chars"):
        ExtractiveSummarizer(COUNTER, max_sentence_chars=0)


# ---------------------------------------------------------------- acceptance (issue #9)


@pytest.mark.parametrize("domain", ["manga", "assistant"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_a_300_turn_conversation_keeps_every_latest_value_and_no_stale_one(
    domain: str, seed: int
) -> None:
    """300 turns, 30 planted facts, 10 corrections, distractors, filler and large tool
    outputs, summarized as the rolling tiers will: spans of 20 raw turns with the prior
    summary as context, structured memory carried from span to span."""
    conv = generate_conversation(seed, turns=300, facts=30, corrections=10, domain=domain)  # type: ignore[arg-type]
    extractor = RuleStructuredExtractor(conv.known_titles)
    summarizer = ExtractiveSummarizer(COUNTER, extractor=extractor)
    turns_ = conv.indexed()
    text: str | None = None
    structured: StructuredMemory | None = None
    for start in range(0, len(turns_), 20):
        span = turns_[start : start + 20]
        text = summarizer.summarize_sync(span, prior=text, target_tokens=800)
        structured = extractor.extract_sync(span, prior=structured)
        assert COUNTER.count(text) <= 800
    assert text is not None
    assert structured is not None
    source = sum(COUNTER.count_blocks(t.content) for t in turns_)
    report = measure(
        conv.facts,
        summary_text=text,
        structured=structured,
        source_tokens=source,
        summary_tokens=COUNTER.count(text),
        extractor=extractor.entities,
    )
    assert report.lost == ()
    assert report.stale == ()
    assert report.compression_ratio < 0.1
    for distractor in conv.distractors:  # another customer's order is never the user's
        held = structured.entities.get(distractor.slot) or structured.facts.get(distractor.slot)
        assert held is None or distractor.value not in held.value
