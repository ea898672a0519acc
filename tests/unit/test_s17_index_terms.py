"""The indexing path's session 17 speed-ups (issue #8) change nothing the index holds.

- A CJK run's bigrams are sliced by slice objects made once instead of found by a regex:
  the tokenizer gives the terms the old loop gave (the reference below, copied), runs
  longer than the sliced ones included.
- ``InProcessIndex.upsert`` calls its collection only when the earliest expiry has passed:
  the index holds what the old ``upsert`` (copied below) leaves, write after write, as
  documents expire, are rewritten and collected.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.clock import FakeClock
from tiermem.longterm import text as text_module
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_memory import (
    InProcessIndex,
    _UserIndex,
    check_docs,
    collect_budget,
)
from tiermem.longterm.text import doc_terms, text_term_counts, tokenize
from tiermem.policies.phrases import nfkc
from tiermem.policies.turn_text import TurnText

# --- reference: the CJK loop of ``_terms`` before session 17 ---------------------------------


def reference_tokenize(text: str) -> list[str]:
    tm = text_module
    normal = nfkc(text).casefold()
    size = len(normal)
    if size <= tm._CHUNK_CHARS and normal.isascii():
        return list(filter(None, map(tm._term, tm._ASCII_WORD.findall(normal))))
    tokens: list[str] = []
    append = tokens.append
    start = 0
    while start < size:
        gap = (
            tm._GAP.search(normal, start + tm._CHUNK_CHARS)
            if size - start > tm._CHUNK_CHARS
            else None
        )
        end = gap.end() if gap else size
        for cjk, word in tm._TOKEN.findall(normal, start, end):
            if cjk:
                if len(cjk) == 1:
                    append(cjk)
                else:
                    tokens += tm._BIGRAMS(cjk)
            elif term := tm._term(word):
                append(term)
        start = end
    return tokens


_KANA = (
    "ぁあいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"
)
_KATA = (
    "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー"
)
_KANJI = "漫画好巻本日月年人大中小上下東京都語読書買売店円"
_OTHER = "abc XYZ 42 ４２ ＡＢ ・。、！？ - _\n"
_ALPHABET = _KANA + _KATA + _KANJI + _OTHER


def _cjk_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 6)):
        run = rng.choice((1, 2, 3, 8, 40, 255, 256, 257, 258, 300, 700))
        parts.append("".join(rng.choice(_KANA + _KATA + _KANJI) for _ in range(run)))
        parts.append(rng.choice((" ", "。", "、", " abc ", "42", "ー", "・", "\n", "")))
    return "".join(parts)


def test_long_and_short_cjk_runs_give_the_old_terms() -> None:
    rng = random.Random(17)
    for _ in range(400):
        text = _cjk_text(rng)
        assert tokenize(text) == reference_tokenize(text)
        assert tokenize(TurnText.of(text)) == reference_tokenize(text)
        counts = text_term_counts(TurnText.of(text))
        assert list(counts.items()) == list(doc_terms(text).items())
    # beyond the sliced runs, across a chunk boundary
    text = "漫画" * 9000 + " " + "ベルセルク" * 30
    assert tokenize(text) == reference_tokenize(text)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=_ALPHABET, max_size=400))
def test_generated_text_gives_the_old_terms(text: str) -> None:
    assert tokenize(text) == reference_tokenize(text)
    assert list(text_term_counts(TurnText.of(text)).items()) == [
        *doc_terms(TurnText.of(text)).items()
    ]


# --- reference: ``InProcessIndex.upsert`` before session 17 ----------------------------------


class ReferenceIndex(InProcessIndex):
    async def upsert(self, docs: Sequence[IndexedDoc]) -> None:
        check_docs(docs)
        now = self._clock.now()
        users, expiries, push = self._users, self._expiries, heapq.heappush
        for doc in docs:
            user_id = doc.user_id
            user = users.get(user_id)
            expires_at = doc.expires_at
            if expires_at is not None and expires_at <= now:
                if user is not None:
                    self._remove(user_id, user, [doc.doc_id])
                continue
            if user is None:
                user = users[user_id] = _UserIndex()
            before = user.expiring
            user.add(doc)
            self._expiring += user.expiring - before
            if expires_at is not None:
                push(expiries, (expires_at, user_id, doc.doc_id))
        self._collect(now, collect_budget(len(docs)))
        if len(self._expiries) > 2 * self._expiring + 1024:
            self._compact()


def _state(index: InProcessIndex) -> object:
    users = {
        user_id: (
            {doc_id: (d.kind, d.length, d.terms, d.expires_at) for doc_id, d in u.docs.items()},
            {term: list(p.items()) for term, p in u.postings.items()},
            u.total_length,
            u.expiring,
        )
        for user_id, u in index._users.items()
    }
    return users, sorted(index._expiries), index._expiring


def _doc(rng: random.Random, now: datetime) -> IndexedDoc:
    expiry = rng.choice((None, 1, 5, 30, 60, 300, -1))
    return IndexedDoc(
        user_id=rng.choice(("u1", "u2")),
        doc_id=f"s#{rng.randint(0, 60)}",
        kind="turn",
        text=" ".join(rng.choice(("berserk", "seinen", "vol", "42", "horror")) for _ in range(4)),
        created_at=now,
        expires_at=None if expiry is None else now + timedelta(seconds=expiry),
    )


async def _replay(seed: int) -> None:
    rng = random.Random(seed)
    start = datetime(2026, 3, 10, tzinfo=UTC)
    new_clock, old_clock = FakeClock(start), FakeClock(start)
    new, old = InProcessIndex(clock=new_clock), ReferenceIndex(clock=old_clock)
    for _ in range(300):
        now = new_clock.now()
        docs = [_doc(rng, now) for _ in range(rng.choice((1, 1, 2, 5, 40)))]
        await new.upsert(docs)
        await old.upsert(docs)
        assert _state(new) == _state(old)
        step = rng.choice((0, 0.5, 2, 10, 61))
        new_clock.advance(step)
        old_clock.advance(step)


def test_upserts_leave_what_the_old_upsert_left() -> None:
    for seed in range(12):
        asyncio.run(_replay(seed))
