"""Text relevance shared by every search index: one tokenizer and one BM25 formula.

Every index (in-process, SQLite, Redis) tokenizes with :func:`tokenize` and scores with
:func:`bm25_idf` and :func:`bm25_term`, so the same documents and query get the same scores
from each of them; the in-process index is the reference the others are tested against.

Tokenization:

1. NFKC (full-width ``ＢＥＲＳＥＲＫ４２`` → ``BERSERK42``, half-width katakana → full-width),
   then casefold (``Straße`` → ``strasse``).
2. Runs of CJK characters (kanji, hiragana, katakana) become overlapping character bigrams:
   Japanese has no spaces, and bigrams are the standard dictionary-free way to index it
   (``漫画が好き`` → ``漫画 画が が好 好き``). A one-character run is kept as a unigram.
   A query matches a document when they share bigrams, so a two-character word such as
   ``漫画`` is searchable; a single kanji inside a longer run is not (its bigrams are).
3. Everything else splits into words of letters and digits; English plurals are folded
   with the S-stemmer (Harman 1991: ``recommendations`` → ``recommendation``,
   ``stories`` → ``story``), and a short list of English stopwords is dropped.

Tokens consist of letters, digits and CJK characters only, so they can be stored
space-separated (the SQLite index's ``tokens`` column) and used as Redis key segments
unchanged.

BM25 (Robertson / Lucene form), with ``N`` the user's documents, ``df`` those containing the
term, ``tf`` the term's count in a document of ``len`` tokens and ``avg`` the average length::

    idf   = ln(1 + (N - df + 0.5) / (df + 0.5))
    score = Σ over query terms  idf · tf · (k1 + 1) / (tf + k1 · (1 - b + b · len / avg))

with ``k1 = 1.2`` and ``b = 0.75``. Statistics are per user, over all of the user's
documents whatever their kind.
"""

from __future__ import annotations

import collections
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, MutableMapping

from tiermem.policies.phrases import nfkc
from tiermem.policies.turn_text import TurnText
from tiermem.text_caches import track_table

__all__ = [
    "BM25_B",
    "BM25_K1",
    "MAX_QUERY_TERMS",
    "STOPWORDS",
    "bm25_idf",
    "bm25_term",
    "count_terms",
    "doc_terms",
    "query_terms",
    "tokenize",
]

BM25_K1 = 1.2
BM25_B = 0.75
MAX_QUERY_TERMS = 64
"""A query keeps its first 64 distinct terms: every index reads one posting list per term,
so a pasted paragraph must not turn one recall into hundreds of reads."""

_STOPWORD_TEXT = """
    a about after again all also am an and any are as at be been before being but by can
    could did do does doing for from had has have having he her here hers him his how i if
    in into is it its itself just me more most my nor of on once only or other our ours own
    s same she should so some such t than that the their theirs them then there these they
    this those through to too until very was we were what when where which while who whom
    why will with would you your yours d ll m re ve
"""
# "d ll m re ve" are the tails of "I'd", "we'll", "I'm", "you're", "I've".
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
"""English function words; Japanese particles need no list, bigrams dilute them."""

# Kanji (with extension A and compatibility ideographs), hiragana, katakana (with the
# prolonged sound mark ー and iteration marks). After NFKC, half-width katakana is full-width.
# Letters only: the blocks' punctuation (゠ and the middle dot ・ of "ヴィンランド・サガ"),
# combining sound marks and unassigned code points separate tokens, as FTS5's unicode61 does.
_CJK = (
    "\u3005\u3006\u3041-\u3096\u309d-\u309f\u30a1-\u30fa\u30fc-\u30ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uf900-\ufa6d\ufa70-\ufad9"
)
_TOKEN = re.compile(f"([{_CJK}]+)|([^\\W_{_CJK}]+)")
_BIGRAMS = re.compile("(?=(..))", re.DOTALL).findall
"""The overlapping two-character slices of a string, in order."""
_MAX_SLICED_PAIRS = 256
_PAIR_SLICES = tuple(slice(i, i + 2) for i in range(_MAX_SLICED_PAIRS))
"""The slices of a CJK run's first bigrams (see :func:`_terms`)."""
_GAP = re.compile(f"[^\\w{_CJK}]|_")  # never inside a token: where a long text may be cut
_CHUNK_CHARS = 8_192
_ASCII_WORD = re.compile(r"[a-z0-9]+")  # _TOKEN's words in casefolded ASCII text
_MAX_MEMO_TERMS = 65_536
_MAX_MEMO_CHARS = 32


def _fold_plural(word: str) -> str:
    """Harman's S-stemmer, on ASCII words only (other scripts' plurals differ)."""
    if len(word) <= 3 or not word.isascii() or not word.endswith("s"):
        return word
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith(("us", "ss")):
        return word
    return word[:-1]


class _TermMemo(dict[str, str]):
    """The index term of each (casefolded) word: "" for a stopword, else its folded plural.

    Looking a word up computes a missing term (``__missing__``), so the tokenizer maps
    words to terms with ``map`` in C, not a Python call per word. Words of up to 32
    characters are kept (words repeat across turns, and a lookup is cheaper than the two
    tests); at most 65,536 of them, so at most a few MB.
    """

    __slots__ = ()

    def __missing__(self, word: str) -> str:
        term = "" if word in STOPWORDS else _fold_plural(word)
        if len(word) <= _MAX_MEMO_CHARS:
            if len(self) >= _MAX_MEMO_TERMS:
                self.clear()  # a burst of new words only costs recomputing them
            self[word] = term
        return term


_TERMS = _TermMemo()
track_table(_TERMS.clear)  # keyed by a user's words
_term = _TERMS.__getitem__
"""The index term of a word (see :class:`_TermMemo`)."""


def tokenize(text: str | TurnText) -> list[str]:
    """The index terms of ``text``, in order, with repeats (see the module docstring).

    A :class:`~tiermem.policies.turn_text.TurnText` is tokenized from its NFKC form, already
    computed for the whole turn (the rule engines' cap does not apply: every word is
    indexed).
    """
    terms = _terms(text)
    return terms if type(terms) is list else list(terms)


def _terms(text: str | TurnText) -> Iterable[str]:
    """:func:`tokenize`'s terms: a list, or for most turns a lazy iterator over them (the
    caller counting them needs no list)."""
    if isinstance(text, TurnText):
        normal = text.nfkc
        if normal.isascii() and text.view.normal == normal:
            # The rule view of the whole turn (an ASCII turn of up to 12,000 characters):
            # its words are the turn's lower-cased ASCII letter-digit runs, the words this
            # tokenizer finds, and the turn analysis has split them already.
            return filter(None, map(_term, text.view.words))
        normal = normal.casefold()
    else:
        normal = nfkc(text).casefold()
    size = len(normal)
    if size <= _CHUNK_CHARS and normal.isascii():
        # Most turns: no CJK run can occur, and a word is an ASCII letter-digit run.
        # Stopwords map to "", which the filter drops.
        return filter(None, map(_term, _ASCII_WORD.findall(normal)))
    tokens: list[str] = []
    append = tokens.append
    # Chunks of about 8 K characters, cut where no token is: one regex call over a 200 KB
    # text holds the GIL for tens of milliseconds, which stalls an event loop in another
    # thread; between chunks it can run.
    start = 0
    while start < size:
        gap = _GAP.search(normal, start + _CHUNK_CHARS) if size - start > _CHUNK_CHARS else None
        end = gap.end() if gap else size
        for cjk, word in _TOKEN.findall(normal, start, end):
            if cjk:
                pairs = len(cjk) - 1
                if not pairs:
                    append(cjk)
                elif pairs <= _MAX_SLICED_PAIRS:
                    # cjk[i : i + 2] for each i, sliced in C by slice objects made once:
                    # a third cheaper than the regex's matches, and most runs are short.
                    tokens += map(cjk.__getitem__, _PAIR_SLICES[:pairs])
                else:
                    tokens += _BIGRAMS(cjk)  # the same slices, found by the regex
            elif term := _term(word):
                append(term)
        start = end
    return tokens


def query_terms(query: str) -> list[str]:
    """The distinct terms of a query, first occurrence first, at most :data:`MAX_QUERY_TERMS`."""
    return list(dict.fromkeys(_terms(query)))[:MAX_QUERY_TERMS]


def doc_terms(text: str | TurnText, tags: Iterable[str] = ()) -> Counter[str]:
    """Term frequencies of a document: its text and its tags (tags are searchable words)."""
    # Counted in C straight from the tokenizer's iterator: ``Counter(tokens)`` spends more
    # in ``__init__``/``update`` (two Python frames and an ABC check) than in counting the
    # few terms of a turn, and this runs for every indexed turn.
    counts: Counter[str] = _new_counter(Counter)
    count_terms(counts, _terms(text))
    for tag in tags:
        count_terms(counts, _terms(tag))
    return counts


def text_term_counts(text: str | TurnText) -> dict[str, int]:
    """:func:`doc_terms` of a text without tags, as a plain dict (what
    :attr:`~tiermem.longterm.index.IndexedDoc.terms` holds): a fresh one the caller may
    give away (:func:`~tiermem.longterm.recall.turn_docs` ``owned_terms``)."""
    counts: dict[str, int] = {}
    count_terms(counts, _terms(text))
    return counts


def _count_elements_py(counts: MutableMapping[str, int], terms: Iterable[str]) -> None:
    """What ``collections._count_elements`` does, for an interpreter without it."""
    get = counts.get
    for term in terms:
        counts[term] = get(term, 0) + 1


_new_counter = Counter.__new__  # an empty Counter: ``Counter.__init__`` only calls update
count_terms: Callable[[MutableMapping[str, int], Iterable[str]], None] = getattr(
    collections, "_count_elements", _count_elements_py
)
"""``counts[term] = counts.get(term, 0) + 1`` for each term, in C where CPython has it (the
helper ``Counter.update`` itself calls)."""


def bm25_idf(docs: int, df: int) -> float:
    """Inverse document frequency of a term in ``df`` of ``docs`` documents; always > 0."""
    return math.log(1.0 + (docs - df + 0.5) / (df + 0.5))


def bm25_term(idf: float, tf: int, length: int, average_length: float) -> float:
    """One query term's BM25 contribution to one document.

    The operations run in the same order in the Redis index's Lua script, so both give
    the same floating-point result.
    """
    norm = 1.0 - BM25_B + BM25_B * length / average_length
    return idf * (tf * (BM25_K1 + 1.0)) / (tf + BM25_K1 * norm)
