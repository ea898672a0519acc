"""The shared tokenizer, BM25 formula and vector helpers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.longterm.text import (
    MAX_QUERY_TERMS,
    bm25_idf,
    bm25_term,
    doc_terms,
    query_terms,
    tokenize,
)
from tiermem.longterm.vectors import cosine, cosine_top, pack_vector, unit_vector, unpack_vector
from tiermem.policies.turn_text import TurnText


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("The Berserk volumes", ["berserk", "volume"]),
        ("stories, series & boxes", ["story", "sery", "boxe"]),
        ("glass bus status", ["glass", "bus", "status"]),
        ("ＢＥＲＳＥＲＫ４２", ["berserk42"]),
        ("Straße", ["strasse"]),
        ("漫画が好き", ["漫画", "画が", "が好", "好き"]),
        ("ｶﾀｶﾅ", ["カタ", "タカ", "カナ"]),  # half-width katakana, NFKC to full width
        ("猫", ["猫"]),
        ("Berserk全巻セット", ["berserk", "全巻", "巻セ", "セッ", "ット"]),
        ("vol.42 & ch_3", ["vol", "42", "ch", "3"]),
        ("ヴィンランド・サガ", ["ヴィ", "ィン", "ンラ", "ラン", "ンド", "サガ"]),  # ・ separates
        ("I'm not sure it's here, you've", ["not", "sure"]),
        ("", []),
    ],
)
def test_tokenize(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


def test_query_terms_are_distinct_and_capped() -> None:
    assert query_terms("manga Manga MANGAS berserk") == ["manga", "berserk"]
    long_query = " ".join(f"word{i}" for i in range(200))
    assert len(query_terms(long_query)) == MAX_QUERY_TERMS
    assert query_terms(long_query)[0] == "word0"


def test_doc_terms_count_text_and_tags() -> None:
    assert doc_terms("seinen seinen horror", ["Seinen"]) == {"seinen": 3, "horror": 1}


@given(st.text(max_size=80))
def test_tokens_are_safe_for_fts5_and_redis_keys(text: str) -> None:
    for token in tokenize(text):
        assert token
        assert all(ch.isalnum() for ch in token), token
        assert not set(token) & set(":{}#*?[]/\\%=| \t\"'")


@given(st.text(max_size=120))
def test_a_turn_text_tokenizes_as_its_string(text: str) -> None:
    assert tokenize(TurnText.of(text)) == tokenize(text)


# Words and CJK runs whose tokens do not depend on their neighbours across a space.
WORD = st.text(st.sampled_from(list("abcSz09漫画が好き・ー_")), min_size=1, max_size=12)


@settings(max_examples=50, deadline=None)
@given(st.lists(WORD, min_size=1, max_size=20))
def test_a_long_text_is_tokenized_whole(words: list[str]) -> None:
    # Texts are tokenized in chunks of about 8 K characters: no token may be split.
    repeat = 20_000 // (len(" ".join(words)) + 1) + 1
    text = " ".join(words * repeat)
    assert tokenize(text) == [t for word in words * repeat for t in tokenize(word)]


def test_bm25_matches_the_published_formula() -> None:
    # Robertson/Lucene BM25, k1=1.2, b=0.75, hand-computed.
    idf = math.log(1 + (10 - 2 + 0.5) / (2 + 0.5))
    assert bm25_idf(10, 2) == pytest.approx(idf)
    expected = idf * 3 * 2.2 / (3 + 1.2 * (0.25 + 0.75 * 8 / 4))
    assert bm25_term(idf, 3, 8, 4.0) == pytest.approx(expected)
    assert bm25_idf(10, 10) > 0  # never negative, even for a term in every document


def test_rare_terms_weigh_more_and_repeats_saturate() -> None:
    assert bm25_idf(100, 1) > bm25_idf(100, 50)
    one, two, ten = (bm25_term(1.0, tf, 5, 5.0) for tf in (1, 2, 10))
    assert one < two < ten < 2.2  # bounded by k1 + 1
    assert bm25_term(1.0, 1, 2, 5.0) > bm25_term(1.0, 1, 20, 5.0)  # short docs win


def test_vectors_round_trip_and_cosine() -> None:
    blob = pack_vector([0.5, -1.0, 2.0])
    assert len(blob) == 12
    assert list(unpack_vector(blob)) == [0.5, -1.0, 2.0]
    assert unit_vector([0.0, 0.0]) is None
    assert cosine([1.0, 0.0], [2.0, 2.0]) == pytest.approx(math.sqrt(0.5))
    assert cosine([1.0, 0.0], [1.0, 0.0, 0.0]) is None
    assert cosine([0.0, 0.0], [1.0, 0.0]) is None


@pytest.mark.parametrize("use_numpy", [True, False])
def test_cosine_top_with_and_without_numpy(use_numpy: bool) -> None:
    keys = ["a", "b", "c", "d"]
    rows = [unit_vector(v) for v in ([1, 0], [1, 1], [0, 1], [1, 0])]
    packed = [pack_vector(r) for r in rows if r is not None]
    for vectors in (rows, packed):
        top = cosine_top([1.0, 0.0], keys, vectors, 3, use_numpy=use_numpy)  # type: ignore[arg-type]
        assert [k for k, _ in top] == ["a", "d", "b"]  # a and d tie: by key
        assert [s for _, s in top] == pytest.approx([1.0, 1.0, math.sqrt(0.5)], abs=1e-6)
    assert cosine_top([0.0, 0.0], keys, rows, 3, use_numpy=use_numpy) == []  # type: ignore[arg-type]
