"""The tokenizer, ``doc_terms`` and ``turn_docs`` give exactly what their previous
implementations gave (kept here as the reference), on random and corpus text: ASCII,
Japanese (the recall fixture's queries), mixed scripts, full-width forms, stopwords,
plurals, long words and texts longer than one tokenizer chunk."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tiermem.longterm import text as text_module
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.recall import turn_docs
from tiermem.longterm.recall_dates import turn_date_terms
from tiermem.longterm.text import STOPWORDS, doc_terms, query_terms, tokenize
from tiermem.models import REDACTED_TEXT, TextBlock, ToolUseBlock, Turn
from tiermem.policies.phrases import nfkc
from tiermem.policies.turn_text import TurnText

# -- the reference: the implementation before the change ------------------------------------

_CJK = text_module._CJK
_TOKEN = re.compile(f"([{_CJK}]+)|([^\\W_{_CJK}]+)")
_GAP = re.compile(f"[^\\w{_CJK}]|_")
_CHUNK = 8_192
_ASCII_WORD = re.compile(r"[a-z0-9]+")


def _ref_fold(word: str) -> str:
    if len(word) <= 3 or not word.isascii() or not word.endswith("s"):
        return word
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith(("us", "ss")):
        return word
    return word[:-1]


def _ref_term(word: str) -> str:
    return "" if word in STOPWORDS else _ref_fold(word)


def ref_tokenize(text: str | TurnText) -> list[str]:
    normal = (text.nfkc if isinstance(text, TurnText) else nfkc(text)).casefold()
    size = len(normal)
    if size <= _CHUNK and normal.isascii():
        return [term for word in _ASCII_WORD.findall(normal) if (term := _ref_term(word))]
    tokens: list[str] = []
    start = 0
    while start < size:
        gap = _GAP.search(normal, start + _CHUNK) if size - start > _CHUNK else None
        end = gap.end() if gap else size
        for cjk, word in _TOKEN.findall(normal, start, end):
            if cjk:
                if len(cjk) == 1:
                    tokens.append(cjk)
                else:
                    tokens.extend([cjk[i : i + 2] for i in range(len(cjk) - 1)])
            elif term := _ref_term(word):
                tokens.append(term)
        start = end
    return tokens


def ref_doc_terms(text: str | TurnText, tags: Iterable[str] = ()) -> Counter[str]:
    counts = Counter(ref_tokenize(text))
    for tag in tags:
        counts.update(ref_tokenize(tag))
    return counts


def ref_turn_docs(
    user_id: str,
    session_id: str,
    turns: Sequence[Turn],
    expires_at: datetime | None,
    terms: Sequence[Mapping[str, int] | None] | None,
) -> list[dict[str, Any]]:
    """The documents' fields as the previous ``turn_docs`` built them."""
    expires_utc = None if expires_at is None else expires_at.astimezone(UTC)
    out = []
    for i, turn in enumerate(turns):
        text = turn.text
        if turn.redacted or not text.strip() or text == REDACTED_TEXT:
            continue
        counted = terms[i] if terms is not None else None
        dates = tuple(turn_date_terms(text, turn.timestamp))
        if counted is not None:
            counted = dict(counted)
            for term in dates:
                counted[term] = counted.get(term, 0) + 1
        out.append(
            {
                "user_id": user_id,
                "doc_id": f"{session_id}#{turn.index}",
                "kind": "turn",
                "text": text,
                "created_at": turn.timestamp,
                "embedding": None,
                "tags": dates,
                "expires_at": expires_utc,
                "terms": counted,
            }
        )
    return out


# -- corpus and random text -----------------------------------------------------------------

CORPUS = [
    "",
    "   \n\t ",
    "Hello!",
    "I prefer seinen, nothing with horror please.",
    "Do you have Berserk vol 42 in stock?",
    "好きなジャンルはセイネンです。ベルセルク42巻はありますか？",
    "Your order ORD-12345 ships tomorrow.",
    "ok thanks",
    "先週買った漫画は何でしたっけ？",
    "ヴィンランド・サガの新刊はいつ出ますか",
    "ｾｲﾈﾝ ＢＥＲＳＥＲＫ４２ 漫",
    "Straße STORIES boxes glasses octopus bus canoes ties aies_x don't I'd we'll",
    "々〆ゝゞーヽヾ 〇 一二三 ㈱ ｱｲｳ café naïve Ωmega ΣΙΣΥΦΟΣ",
    "I bought it yesterday, and again on March 9 and 2026-02-28; last week too.",
    "x" * 40 + "s " + "y" * 31 + "s",
    '<|endoftext|> tool_call(name="search") snake_case_words and__dunder__',
    REDACTED_TEXT,
]
_POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,!?-_'\"\n\t")
    + list("漫画好きなジャンルはセイネンですベルセルク巻ありますかー・。、？！々")
    + list("ｱｲｳｴｵﾞﾟＡＢＣ１２３éßΣçø€😀\u3099\u309a\ufa0e")
    + ["stories", " the ", " boxes ", " yesterday ", " March 9 ", " 2026-03-01 ", "ies"]
)


def _random_text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(_POOL) for _ in range(size))


def _texts() -> list[str]:
    rng = random.Random(8)
    texts = list(CORPUS)
    texts += [_random_text(rng, rng.randint(0, 80)) for _ in range(1_500)]
    # Longer than one tokenizer chunk: ASCII and mixed (chunk boundaries).
    texts.append(" ".join(rng.choice(["stories", "vol", "the", "a1b2"]) for _ in range(3_000)))
    texts.append(_random_text(rng, 20_000))
    return texts


TEXTS = _texts()


def test_tokenize_and_query_terms_match_the_reference() -> None:
    for text in TEXTS:
        expected = ref_tokenize(text)
        assert tokenize(text) == expected, text
        assert tokenize(TurnText.of(text)) == expected, text
        assert query_terms(text) == list(dict.fromkeys(expected))[:64], text


def test_doc_terms_match_the_reference_in_order_and_type() -> None:
    rng = random.Random(9)
    for text in TEXTS:
        tags = tuple(rng.choice(TEXTS[:40]) for _ in range(rng.randint(0, 3)))
        got, expected = doc_terms(text, tags), ref_doc_terms(text, tags)
        assert type(got) is Counter
        assert list(got.items()) == list(expected.items()), text
        via_turn_text = doc_terms(TurnText.of(text))
        assert list(via_turn_text.items()) == list(ref_doc_terms(text).items())


def test_memoised_terms_survive_the_memo_being_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    # A memo of 4 words is cleared many times over this corpus; terms stay the same.
    monkeypatch.setattr(text_module, "_MAX_MEMO_TERMS", 4)
    text_module._TERMS.clear()
    for text in TEXTS[:300]:
        assert tokenize(text) == ref_tokenize(text)
    assert len(text_module._TERMS) <= 4


def _turns(rng: random.Random) -> list[Turn]:
    start = datetime(2026, 3, 10, 9, tzinfo=UTC)
    turns = []
    for index, text in enumerate(TEXTS[:400]):
        if rng.random() < 0.1:
            content: tuple[Any, ...] = (
                TextBlock(text=text),
                ToolUseBlock(tool_use_id="t1", name="search", input={"q": text[:10]}),
            )
        else:
            content = (TextBlock(text=text),)
        turns.append(
            Turn(
                index=index,
                role="user" if index % 2 == 0 else "assistant",
                content=content,
                timestamp=start + timedelta(hours=7 * index),
                redacted=rng.random() < 0.05,
            )
        )
    return turns


def test_turn_docs_match_the_reference() -> None:
    rng = random.Random(10)
    turns = _turns(rng)
    expires = datetime(2027, 1, 1, 9, tzinfo=UTC)
    given: list[Mapping[str, int] | None] = [
        None if rng.random() < 0.2 else doc_terms(t.text) for t in turns
    ]
    for terms in (given, None):
        docs = turn_docs("u1", "s#1", turns, expires_at=expires, terms=terms)
        expected = ref_turn_docs("u1", "s#1", turns, expires, terms)
        assert [doc.__dict__ for doc in docs] == expected
        # Term maps keep the reference's order too (the index stores them as given).
        for doc, want in zip(docs, expected, strict=True):
            assert list((doc.terms or {}).items()) == list((want["terms"] or {}).items())
    # Non-plain term counts still take the validating constructor.
    odd = [{"x": True} for _ in turns]
    with_bool = turn_docs("u1", "s1", turns, expires_at=None, terms=odd)
    assert all(type(doc) is IndexedDoc for doc in with_bool)
    assert all(doc.terms is not None and type(doc.terms["x"]) is int for doc in with_bool)


def test_the_python_counting_fallback_counts_as_counter_does() -> None:
    # The fallback runs only on an interpreter without collections._count_elements.
    rng = random.Random(11)
    for text in TEXTS[:200]:
        tokens = ref_tokenize(text) * rng.randint(1, 3)
        counts: dict[str, int] = {"seed": 1}
        text_module._count_elements_py(counts, tokens)
        assert list(counts.items()) == list((Counter({"seed": 1}) + Counter(tokens)).items())
