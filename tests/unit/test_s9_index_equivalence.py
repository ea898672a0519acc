"""The indexing fast paths give what the code they replaced gave.

Session 9 changed three things on every indexed turn's path: the tokenizer takes an ASCII
turn's words from its rule view (split by the turn analysis) and cuts CJK bigrams in C;
``_UserIndex.add`` updates the searched terms' groups and dense lists after the postings,
found with a set intersection; ``check_docs`` tests a common doc id inline. Each test below
holds a copy of the replaced function and compares it with the new one on randomised
inputs (ASCII, accents, Japanese, full-width, curly apostrophes, long texts, odd ids).
"""

from __future__ import annotations

import random
from array import array
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.errors import ValidationError
from tiermem.longterm import text as text_module
from tiermem.longterm.index import IndexedDoc, terms_of
from tiermem.longterm.index_memory import (
    POSTING_SHIFT,
    InProcessIndex,
    _Doc,
    _UserIndex,
    check_docs,
)
from tiermem.longterm.text import doc_terms, text_term_counts, tokenize
from tiermem.longterm.vectors import unit_vector
from tiermem.policies.phrases import nfkc
from tiermem.policies.turn_text import TurnText
from tiermem.store.keys import validate_id

# -- reference copies (main at f093b82) ------------------------------------------------------


def _reference_tokenize(text: str | TurnText) -> list[str]:
    """``tokenize`` before session 9 (``_terms`` of f093b82, as a list)."""
    normal = (text.nfkc if isinstance(text, TurnText) else nfkc(text)).casefold()
    size = len(normal)
    term = text_module._term
    if size <= text_module._CHUNK_CHARS and normal.isascii():
        return list(filter(None, map(term, text_module._ASCII_WORD.findall(normal))))
    tokens: list[str] = []
    start = 0
    while start < size:
        gap = (
            text_module._GAP.search(normal, start + text_module._CHUNK_CHARS)
            if size - start > text_module._CHUNK_CHARS
            else None
        )
        end = gap.end() if gap else size
        for cjk, word in text_module._TOKEN.findall(normal, start, end):
            if cjk:
                if len(cjk) == 1:
                    tokens.append(cjk)
                else:
                    tokens += [cjk[i : i + 2] for i in range(len(cjk) - 1)]
            elif t := term(word):
                tokens.append(t)
        start = end
    return tokens


class _ReferenceUserIndex(_UserIndex):
    """``_UserIndex`` with the ``add`` of f093b82."""

    __slots__ = ()

    def add(self, doc: IndexedDoc) -> None:
        doc_id = doc.doc_id
        if doc_id in self.docs:
            self.remove(doc_id)
        if len(self.keys) > 2 * len(self.docs) + 1024:
            self.renumber()
        slot = self.slots[doc_id] = len(self.keys)
        self.keys.append(doc_id)
        dense_cache = self.dense_cache
        counts = terms_of(doc)
        vector = unit_vector(doc.embedding) if doc.embedding else None
        length = sum(counts.values())
        expires_at = doc.expires_at
        self.docs[doc_id] = _Doc(doc.kind, length, tuple(counts), vector, expires_at)
        if expires_at is not None:
            self.expiring += 1
        self.total_length += length
        packed = length * POSTING_SHIFT
        postings, groups = self.postings, self.groups
        for term, tf in counts.items():
            posting = postings.get(term)
            if posting is None:
                posting = postings[term] = {}
            value = packed + tf
            posting[doc_id] = value
            if dense_cache:
                cached = dense_cache.get(term)
                if cached is not None:
                    cached[0].append(slot)
                    cached[1].append(value)
            if groups:
                by_value = groups.get(term)
                if by_value is not None:
                    holders = by_value.get(value)
                    if holders is None:
                        by_value[value] = {doc_id}
                    else:
                        holders.add(doc_id)
        if vector is not None:
            self.matrix_cache.clear()


def _reference_check_docs(docs: list[IndexedDoc]) -> None:
    checked: str | None = None
    for doc in docs:
        if doc.user_id != checked:
            checked = validate_id(doc.user_id, what="user_id")
        validate_id(doc.doc_id, what="doc_id")


# -- random texts --------------------------------------------------------------------------

_WORD_TEXT = (
    "I prefer seinen nothing with horror please Do you have Berserk vol 42 in stock stories "
    "recommendations glasses the an of ORD-12345 ships tomorrow ok thanks Straße café naïve "
    "İstanbul ﬁne ＢＥＲＳＥＲＫ４２ ｶﾀｶﾅ 漫画が好き 好きなジャンルはセイネンです ベルセルク42巻 "
    "ヴィンランド・サガ 々 ー é 𠮷野家 x_y don’t it's 1,000 e-mail naïveté ΣΊΣΥΦΟΣ Ǆemal"
)
_WORDS = _WORD_TEXT.split()
_SEPARATORS = (" ", " ", " ", "\n", "\t", ", ", ". ", "。", "、", "！", "?", "_", "-", "")


def _random_text(rng: random.Random) -> str:
    shape = rng.random()
    if shape < 0.05:
        return ""
    count = rng.randint(1, 30) if shape < 0.9 else rng.randint(1_500, 3_500)  # long: > 8 K
    out = []
    for _ in range(count):
        out.append(rng.choice(_WORDS))
        out.append(rng.choice(_SEPARATORS))
    return "".join(out)


def _random_ascii_text(rng: random.Random) -> str:
    words = [w for w in _WORDS if w.isascii()]
    count = rng.choice((rng.randint(1, 40), rng.randint(1_000, 2_600)))  # up to ~14 K chars
    return "".join(
        rng.choice(words) + rng.choice((" ", ", ", "\n", "-", "_")) for _ in range(count)
    )


@pytest.mark.parametrize("seed", range(6))
def test_tokenize_matches_reference(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        text = _random_text(rng) if rng.random() < 0.6 else _random_ascii_text(rng)
        turn_text = TurnText.of(text)
        turn_text.view.words  # noqa: B018 - as the turn analysis leaves it
        expected = _reference_tokenize(text)
        assert tokenize(text) == expected
        assert tokenize(turn_text) == expected
        assert tokenize(TurnText.of(text)) == expected  # words not split yet
        assert list(text_term_counts(turn_text).items()) == list(doc_terms(text, ()).items())


def test_tokenize_ascii_turn_uses_whole_text_past_the_rule_window() -> None:
    """An ASCII turn longer than the rule window (its view leaves out the middle) is still
    indexed whole: the middle's words are terms."""
    head = "alpha " * 2_000
    text = head + "needleword " + "omega " * 2_000
    turn_text = TurnText.of(text)
    assert turn_text.truncated
    assert "needleword" in tokenize(turn_text)
    assert tokenize(turn_text) == _reference_tokenize(text)


def test_cjk_bigrams_match_reference() -> None:
    for text in ("漫画が好き", "好", "ヴィンランド・サガ", "々々", "𠮷野家の牛丼", "ｶﾀｶﾅ", "ー"):
        assert tokenize(text) == _reference_tokenize(text)
    assert tokenize("漫画が好き") == ["漫画", "画が", "が好", "好き"]


# -- the in-process index ----------------------------------------------------------------------

_T0 = datetime(2026, 3, 10, 12, tzinfo=UTC)


def _state(user: _UserIndex) -> tuple[object, ...]:
    dense = {term: (list(a), list(b)) for term, (a, b) in user.dense_cache.items()}
    groups = {term: dict(by_value) for term, by_value in user.groups.items()}
    docs = {
        doc_id: (d.kind, d.length, d.terms, d.vector, d.expires_at)
        for doc_id, d in user.docs.items()
    }
    postings = {term: list(posting.items()) for term, posting in user.postings.items()}
    return (docs, postings, groups, dense, user.slots, user.keys, user.total_length, user.expiring)


@pytest.mark.parametrize("seed", range(4))
def test_user_index_add_matches_reference(seed: int) -> None:
    """Random adds, rewrites and removals, with searches (groups and dense lists built)
    between them: the new ``add`` leaves the same postings, groups and dense lists."""
    rng = random.Random(seed)
    new, old = _UserIndex(), _ReferenceUserIndex()
    for step in range(600):
        action = rng.random()
        if action < 0.75:
            text = _random_text(rng) if rng.random() < 0.97 else "x " * 50
            if len(text) > 2_000:
                text = text[:2_000]
            embedding = (rng.random(), rng.random()) if rng.random() < 0.1 else None
            given = None if rng.random() < 0.3 else dict(doc_terms(text, ("dt20260310",)))
            doc = IndexedDoc(
                user_id="u",
                doc_id=f"s#{rng.randrange(400)}",
                kind=rng.choice(("turn", "memory", "chunk")),
                text=text,
                created_at=_T0,
                embedding=embedding,
                tags=("dt20260310",),
                expires_at=None if rng.random() < 0.5 else _T0 + timedelta(days=step),
                terms=given,
            )
            new.add(doc)
            old.add(doc)
        elif action < 0.85:
            doc_id = f"s#{rng.randrange(400)}"
            new.remove(doc_id)
            old.remove(doc_id)
        elif new.postings:
            # A search: its terms get groups (bm25_top) or dense lists (bm25_top_dense).
            term = rng.choice(sorted(new.postings))
            if rng.random() < 0.5:
                assert new.groups[term] == old.groups[term]
            else:
                a, b = new.dense(term), old.dense(term)
                assert a[0] == b[0]
                assert list(a[1]) == list(b[1])
                assert list(a[2]) == list(b[2])
        assert _state(new) == _state(old)
    # The searched terms' paths were exercised.
    assert new.groups
    assert new.dense_cache


async def test_search_results_match_reference_index() -> None:
    """Whole index: the same documents give the same hits and scores through the new
    ``add`` as through the reference one (BM25 with groups and with dense lists)."""
    rng = random.Random(7)
    new, old = InProcessIndex(), InProcessIndex()
    old._users["u"] = _ReferenceUserIndex()
    queries = ["berserk vol 42", "漫画", "seinen horror please stock", "straße café", "ok"]
    for batch in range(40):
        docs = [
            IndexedDoc(
                user_id="u",
                doc_id=f"s#{rng.randrange(300)}",
                kind="turn",
                text=_random_text(rng)[:1_500],
                created_at=_T0,
            )
            for _ in range(8)
        ]
        await new.upsert(docs)
        await old.upsert(docs)
        for query in queries[batch % 2 :: 2]:
            kinds = ("turn",)
            assert await new.search("u", query, kinds=kinds, limit=10) == await old.search(
                "u", query, kinds=kinds, limit=10
            )


# -- doc id checks ------------------------------------------------------------------------


class _StrSubclass(str):
    __slots__ = ()


def _outcome(check: object, docs: list[IndexedDoc]) -> str:
    try:
        check(docs)  # type: ignore[operator]
    except ValidationError as exc:
        return f"error: {exc}"
    return "ok"


def test_check_docs_accepts_and_rejects_what_validate_id_does() -> None:
    rng = random.Random(3)
    alphabet = ["a", "Z", "0", "#", " ", "-", "é", "好", "\n", "\t", "\x00", "\x7f", "\u2028"]
    ids: list[object] = ["", "a" * 256, "a" * 257, "s#1", "日本#3", "\ud800", _StrSubclass("s#2")]
    for _ in range(400):
        ids.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
    for doc_id in ids:
        doc = IndexedDoc.model_construct(user_id="u", doc_id=doc_id, kind="turn", text="x")
        assert _outcome(check_docs, [doc]) == _outcome(_reference_check_docs, [doc]), doc_id


def test_dense_lists_are_arrays() -> None:
    """The dense lists ``add`` appends to stay the typed arrays ``dense`` reads."""
    user = _UserIndex()
    user.add(IndexedDoc(user_id="u", doc_id="a", kind="turn", text="one two three", created_at=_T0))
    user.dense("one")
    user.add(IndexedDoc(user_id="u", doc_id="b", kind="turn", text="one", created_at=_T0))
    slots, values = user.dense_cache["one"]
    assert isinstance(slots, array)
    assert list(slots) == [0, 1]
    assert list(values) == [3 * POSTING_SHIFT + 1, 1 * POSTING_SHIFT + 1]
