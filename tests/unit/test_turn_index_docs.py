"""A turn's recall document, built from term counts the session gives away
(``turn_docs(..., owned_terms=True)`` with :func:`text_term_counts`), is the document built
the way it was before: ``doc_terms`` counts, copied and checked by ``turn_docs``. Checked
on generated text (words, stopwords, CJK, dates that add date terms, full-width digits)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.longterm.recall import turn_docs
from tiermem.longterm.text import doc_terms, text_term_counts
from tiermem.models import TextBlock, Turn
from tiermem.policies.turn_text import TurnText

WORDS = [
    "Hello!", "the", "and", "I prefer", "seinen", "Berserk", "vol", "42", "42巻",
    "ORD-12345", "yesterday", "last week", "3 days ago", "on March 9", "2024-01-15",
    "好きなジャンルはセイネンです", "ベルセルク", "ＯＫ４２", "İstanbul", "Straße", "\n", "  ",
    "café", "naïve", "don't", "it's",
]  # fmt: skip

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=14).map(" ".join)
NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)


@settings(max_examples=300, deadline=None)
@given(st.lists(texts, min_size=1, max_size=4), st.integers(0, 400))
def test_owned_term_counts_build_the_documents_the_copied_counts_built(
    said: list[str], days: int
) -> None:
    at = NOW - timedelta(days=days)
    turns = [
        Turn(
            index=i,
            role="user",
            content=(TextBlock(text=text),),
            timestamp=at,
            token_count=1,
        )
        for i, text in enumerate(said)
    ]
    read = [TurnText.of(text) for text in said]
    expires = NOW + timedelta(days=30)
    before = turn_docs("u1", "s1", turns, expires_at=expires, terms=[doc_terms(r) for r in read])
    after = turn_docs(
        "u1",
        "s1",
        turns,
        expires_at=expires,
        terms=[text_term_counts(r) for r in read],
        owned_terms=True,
    )
    assert after == before
    for old, new in zip(before, after, strict=True):
        assert type(new.terms) is dict
        assert list((new.terms or {}).items()) == list((old.terms or {}).items())
        assert new.__pydantic_fields_set__ == old.__pydantic_fields_set__


@given(texts)
def test_text_term_counts_are_doc_terms_without_tags(text: str) -> None:
    counts = text_term_counts(text)
    assert type(counts) is dict
    assert list(counts.items()) == list(doc_terms(text).items())
