"""Review of the offline summarizer's issue #8 changes (commit 07cb4e8): the counts a row
carries are the encoder's for every line the summarizer makes or carries (any speaker a
prior's line may name, any body), and the rows of kept spans of turns neither keep the
turns alive nor grow past a bound of characters."""

from __future__ import annotations

import gc
import weakref
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.models.content import TextBlock
from tiermem.models.turns import Turn
from tiermem.summaries import offline
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()

# Characters the encoder's pre-tokenizer treats specially (letters, digits of several
# scripts, marks, punctuation runs, apostrophe contractions, whitespace kinds), and any
# other character; never ":" in a speaker (the line pattern stops a speaker there) and
# never a line break (a carried line is one line of its prior).
_SPECIAL = st.sampled_from(
    [
        "a", "Z", "vol", "'s", "'LL", "'", " ", "  ", "\t", "\u3000", "\xa0", "\u200b",
        ".", ",", "!?", "-", "[", "]", "(", ")", "(failed)", "…", "¥", "42", "1234",
        "١٢", "²", "ベルセルク", "é", "\u0301", "😀", "#", "_", "\x1f", "\x00",
    ]
)  # fmt: skip
_ANY = st.characters(
    blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
)
_TEXT = st.lists(st.one_of(_SPECIAL, _ANY), max_size=12).map("".join)
_WHO = st.one_of(
    st.sampled_from(["User", "Assistant", "Result of search_books", "Result of x (failed)"]),
    _TEXT.map(lambda text: text.replace(":", "")),
)


@settings(max_examples=600, deadline=None)
@given(index=st.integers(min_value=0, max_value=10**9), who=_WHO, body=_TEXT)
def test_a_carried_line_carries_the_encoders_counts(index: int, who: str, body: str) -> None:
    """A prior's line, with whatever speaker and text it has, carries the encoder's count of
    the line (and one for its newline) and of the line with its newline."""
    line = f"- [{index}] {who}: {body}".strip()
    row = ExtractiveSummarizer(COUNTER)._carried_line(line)
    assert row[offline._COST] == COUNTER.count(line) + 1
    assert row[offline._JOINED] == COUNTER.count(line + "\n")


@settings(max_examples=600, deadline=None)
@given(digits=st.integers(min_value=0, max_value=10**15).map(str), body=_TEXT)
def test_a_turns_line_counts_as_the_encoder_counts_it(digits: str, body: str) -> None:
    """A turn's line (``_cut`` bodies: any text, spaces folded, cut with "…")."""
    summarizer = ExtractiveSummarizer(COUNTER, max_sentence_chars=8)
    for who in ("User", "Assistant"):
        cut = summarizer._cut(body)
        line = f"- [{digits}] {who}: {cut}"
        assert summarizer._indexed_tokens(line, digits, who, cut) == COUNTER.count(line) + 1


def _turns(count: int, *, sentences: int = 1) -> list[Turn]:
    said = " ".join(f"My budget for Berserk volume {n} is ¥{n},000." for n in range(sentences))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        Turn(
            index=i,
            role="user" if i % 2 == 0 else "assistant",
            content=(TextBlock(text=f"{said} Turn {i} says order ORD-{i:05d} ships."),),
            timestamp=now,
        )
        for i in range(count)
    ]


def test_kept_spans_do_not_keep_their_turns_alive() -> None:
    """A shared summarizer finds a kept span by its turns' identity, but does not hold the
    turns (up to 1 MB each) once their owner dropped them: it holds nothing of a span but
    its candidate rows."""
    summarizer = ExtractiveSummarizer(COUNTER)
    turns = _turns(12)
    first = summarizer.summarize_sync(turns, target_tokens=200)
    assert summarizer.summarize_sync(turns, target_tokens=200) == first  # kept: the same
    watched = weakref.ref(turns[3])
    del turns
    gc.collect()
    assert watched() is None


def test_a_span_found_again_after_its_turns_died_is_read_afresh() -> None:
    """Turns equal to a kept span's (a new read of the archive) give the same summary."""
    summarizer = ExtractiveSummarizer(COUNTER)
    first = summarizer.summarize_sync(_turns(12), target_tokens=200)
    gc.collect()
    assert summarizer.summarize_sync(_turns(12), target_tokens=200) == first
    assert ExtractiveSummarizer(COUNTER).summarize_sync(_turns(12), target_tokens=200) == first


def test_kept_spans_stay_under_their_character_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A span whose candidate lines are longer than :data:`offline.SPAN_CHARS` is not kept
    whole (its text blocks are still kept, under the text cache's own bound), so eight
    spans of long turns cannot grow the process past the caches' bounds."""
    monkeypatch.setattr(offline, "SPAN_CHARS", 2_000, raising=False)
    summarizer = ExtractiveSummarizer(COUNTER)
    small = _turns(2)
    summarizer.summarize_sync(small, target_tokens=200)
    big = _turns(40, sentences=3)
    summary = summarizer.summarize_sync(big, target_tokens=200)
    kept = [rows for _, rows in summarizer._spans.values()]
    assert len(kept) == 1  # the small span only
    assert sum(len(row[offline._LINE_AT]) for rows in kept for row in rows) <= 2_000
    assert summary == ExtractiveSummarizer(COUNTER).summarize_sync(big, target_tokens=200)


def test_a_generated_conversation_summarizes_the_same_with_spans_kept_or_not() -> None:
    """Spans kept, then found again by identity, give what a fresh summarizer gives."""
    conversation = generate_conversation(5, turns=120, facts=12, corrections=4)
    turns = list(conversation.indexed())
    titles = dict(conversation.known_titles)
    shared = ExtractiveSummarizer(COUNTER, known_titles=titles)
    for _ in range(2):
        for start in range(0, 100, 20):
            span = turns[start : start + 40]
            fresh = ExtractiveSummarizer(COUNTER, known_titles=titles)
            assert shared.summarize_sync(span, target_tokens=300) == fresh.summarize_sync(
                span, target_tokens=300
            )
