"""TurnText: a turn's text read once, and the rule window that caps what rules read."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from tiermem.models import TextBlock, ToolResultBlock, ToolUseBlock, text_of
from tiermem.policies.phrases import TextView, nfkc, normal_form
from tiermem.policies.turn_text import (
    RULE_ELISION,
    RULE_HEAD_CHARS,
    RULE_TAIL_CHARS,
    TurnText,
    as_turn_text,
    rule_window,
)

LIMIT = RULE_HEAD_CHARS + RULE_TAIL_CHARS


def paste(chars: int) -> str:
    """Pasted prose of about ``chars`` characters (words of five letters and a space)."""
    return "lorem " * (chars // 6)


def test_a_turn_up_to_the_limit_is_read_whole() -> None:
    text = "x" * LIMIT
    assert rule_window(text) is text
    turn = TurnText.of(text)
    assert not turn.truncated
    assert turn.view.normal == text


def test_a_long_turn_is_read_as_its_head_and_tail() -> None:
    text = "I prefer seinen. " + paste(50_000) + "Is vol 42 in stock?"
    window = rule_window(text)
    head, tail = window.split(RULE_ELISION)
    assert head.startswith("I prefer seinen.")
    assert tail.endswith("Is vol 42 in stock?")
    assert RULE_HEAD_CHARS - 64 <= len(head) <= RULE_HEAD_CHARS
    assert RULE_TAIL_CHARS - 64 <= len(tail) <= RULE_TAIL_CHARS
    # Cut between words: every word on either side is whole.
    assert set(head.split()) <= {"I", "prefer", "seinen.", "lorem"}
    assert set(tail.split()) <= {"lorem", "Is", "vol", "42", "in", "stock?"}
    assert TurnText.of(text).truncated


def test_text_without_spaces_is_cut_where_it_is() -> None:
    text = "あ" * 20_000
    assert rule_window(text) == "あ" * RULE_HEAD_CHARS + RULE_ELISION + "あ" * RULE_TAIL_CHARS


def test_views_are_normal_and_folded_as_a_text_view_would_be() -> None:
    text = "ＯＫ？ I’M ＳＥＩＮＥＮ ｶﾀｶﾅ " * 1_000
    turn = TurnText.of(text)
    expected = TextView(rule_window(normal_form(text)))
    assert turn.view.normal == expected.normal
    assert turn.view.folded == expected.folded
    assert turn.nfkc == unicodedata.normalize("NFKC", text)  # whole, for the search index
    assert turn.said is turn.view


def test_said_is_what_the_speaker_wrote_and_text_is_everything() -> None:
    blocks = (
        TextBlock(text="I like horror"),
        ToolUseBlock(tool_use_id="t1", name="search", input={"q": "horror"}),
        ToolResultBlock(tool_use_id="t1", content=(TextBlock(text="I love isekai"),)),
    )
    turn = TurnText.of_blocks(blocks)
    assert turn.text == text_of(blocks)
    assert turn.said_text == "I like horror"
    assert turn.said.folded == "i like horror"
    assert "i love isekai" in turn.view.folded


def test_as_turn_text_reads_a_string_and_passes_a_turn_text_through() -> None:
    turn = TurnText.of("hello")
    assert as_turn_text(turn) is turn
    assert as_turn_text("hello") == turn


@given(st.text(max_size=80))
def test_nfkc_is_unicode_nfkc(text: str) -> None:
    assert nfkc(text) == unicodedata.normalize("NFKC", text)


@given(st.text(max_size=40))
def test_a_slice_of_a_view_is_a_view_of_the_slice(text: str) -> None:
    view = TextView(text)
    for start, end in ((0, len(view.normal)), (1, 3), (2, 2)):
        part = view.slice(start, end)
        assert part.normal == view.normal[start:end]
        assert part.folded == view.folded[start:end]
