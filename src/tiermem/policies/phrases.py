"""Phrase matching: finding whole phrases from a list in text, in English and Japanese.

:class:`TextView` holds one text in the forms rules read (:func:`normal_form`, then folded
to lower case); :class:`PhraseIndex` finds whole phrases from a list of any length in it.
Importance cues and rule-based entity extraction both match through this module, so a cue
and an entity name obey the same word boundaries. Everything here is pure: values in,
values out.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any

from tiermem.errors import ValidationError

__all__ = [
    "LATIN_WORD_CHARS",
    "MAX_PHRASE_CHARS",
    "PhraseIndex",
    "TextView",
    "latin_words",
    "nfkc",
    "normal_form",
    "phrase_key",
    "straight_apostrophes",
]

# Letters and digits of scripts that separate words with spaces. A Latin phrase must not touch
# one of these ("ok" in "book", "hi" in "this"); CJK text has no spaces, so a phrase may touch
# anything there ("OKです" is an acknowledgement, "青年が好き" a preference).
LATIN_WORD_CHARS = "0-9A-Za-z\u00c0-\u024f"
MAX_PHRASE_CHARS = 200
_LATIN = re.compile(f"[{LATIN_WORD_CHARS}]")
# "[x][x]*" rather than "[x]+": a pattern that starts with a character class lets re skip
# to the positions that can start a match; one that starts with a repeat tries every one.
_LATIN_RUN = re.compile(f"[{LATIN_WORD_CHARS}][{LATIN_WORD_CHARS}]*")
# An ASCII text's Latin words are its runs of [0-9A-Za-z]: every other byte becomes a space,
# and ``split`` finds the runs in one pass (``findall`` pays a match per word).
_ASCII_WORD_BYTES = bytes(c if chr(c).isalnum() else 0x20 for c in range(128)) + b" " * 128
_CURLY_APOSTROPHES = ("\u2019", "\u2018", "\u02bc")
_APOSTROPHES = str.maketrans(dict.fromkeys(_CURLY_APOSTROPHES, "'"))
_FULL_WIDTH = re.compile("[\uff01-\uff5e\u3000]")
# Lists with up to this many first words compile up front; longer lists compile on demand.
_SMALL_INDEX = 256


def _half_width(match: re.Match[str]) -> str:
    char = match.group()
    return " " if char == "\u3000" else chr(ord(char) - 0xFEE0)


def nfkc(text: str) -> str:
    """``unicodedata.normalize("NFKC", text)``, computed faster for most text."""
    # A full normalisation is slow on CJK text, and most text needs none: check first
    # (ASCII is always in NFKC).
    if text.isascii() or unicodedata.is_normalized("NFKC", text):
        return text
    # Japanese text is usually normal but for full-width ASCII ("？", "４２") and the
    # ideographic space: map those cheaply (as NFKC does) before paying for the rest.
    text = _FULL_WIDTH.sub(_half_width, text)
    if unicodedata.is_normalized("NFKC", text):
        return text
    return unicodedata.normalize("NFKC", text)


def straight_apostrophes(text: str) -> str:
    """``text`` with curly and modifier apostrophes (``’ ‘ ʼ``) as ``'``."""
    if text.isascii():  # most text: none of them
        return text
    # Three tests, not ``any`` over a generator: this runs for every non-ASCII turn.
    if "\u2019" in text or "\u2018" in text or "\u02bc" in text:
        return text.translate(_APOSTROPHES)
    return text


def latin_words(text: str) -> list[str]:
    """The runs of :data:`LATIN_WORD_CHARS` in ``text``, in order (a phrase's first word is
    one of them)."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_WORD_BYTES).decode("ascii").split()
    return _LATIN_RUN.findall(text)


def normal_form(text: str) -> str:
    """``text`` as rules read it: NFKC (``ＯＫ４２`` → ``OK42``) with straight apostrophes."""
    return straight_apostrophes(nfkc(text))


class TextView:
    """One text in the forms that rules read, computed once and shared by all of them.

    ``normal`` is :func:`normal_form`; ``folded`` is ``normal`` lower-cased and of the same
    length, so a position in one is a position in the other; ``words`` (computed on first
    use) are the Latin words of ``folded`` (:func:`latin_words`), and ``keys`` those words
    and, unless the text is ASCII, the characters of ``folded``.
    """

    __slots__ = ("_keys", "_words", "folded", "normal")
    normal: str
    folded: str
    _keys: frozenset[str] | None
    _words: list[str] | None

    def __init__(self, text: str) -> None:
        self._set(normal_form(text))

    @classmethod
    def of_normal(cls, normal: str) -> TextView:
        """A view of text that is already in :func:`normal_form` (not checked: the caller
        normalised it, e.g. once for a whole turn)."""
        # ``_set`` inlined: this runs for every turn.
        view = _new(cls)
        folded = normal.lower()
        if len(folded) != len(normal):  # "İ" lower-cases to two characters; keep one
            folded = "".join(ch.lower()[0] for ch in normal)
        view.normal = normal
        view.folded = folded
        view._keys = view._words = None
        return view

    def _set(self, normal: str) -> None:
        self.normal = normal
        folded = normal.lower()
        if len(folded) != len(normal):  # "İ" lower-cases to two characters; keep one
            folded = "".join(ch.lower()[0] for ch in normal)
        self.folded = folded
        self._keys = self._words = None

    def slice(self, start: int, end: int) -> TextView:
        """The view of ``normal[start:end]``, without normalising or folding again."""
        view = TextView.__new__(TextView)
        view.normal = self.normal[start:end]
        view.folded = self.folded[start:end]
        view._keys = view._words = None
        return view

    @property
    def words(self) -> list[str]:
        """The Latin words of ``folded``, in order (do not change the list: it is shared)."""
        if self._words is None:
            self._words = latin_words(self.folded)
        return self._words

    @property
    def keys(self) -> frozenset[str]:
        """What a phrase can start with; of an ASCII text, only its words (an index tests
        the few punctuation characters its phrases start with itself)."""
        if self._keys is None:
            folded = self.folded
            words = frozenset(self.words)
            self._keys = words if folded.isascii() else words.union(folded)
        return self._keys


_new = object.__new__


def phrase_key(phrase: str) -> str:
    """``phrase`` folded, with each run of whitespace one space: how matches are reported."""
    return " ".join(TextView(phrase).folded.split())


class PhraseIndex:
    """Finds whole phrases from a list of any length in a :class:`TextView`.

    Matching is case-insensitive and by whole phrase: an end of a phrase that is a Latin
    letter or digit must not touch another one (``ok`` is not in ``book``, ``hi`` not in
    ``this``), while an end in CJK script may touch anything, since Japanese does not
    separate words (``OKです``, ``青年が好き``). A space matches any run of whitespace. Where
    matches overlap, the leftmost wins, then the longest ("dark fantasy" over "fantasy").

    Phrases are grouped by their first Latin word (or first character): a search runs only
    the groups whose first word is a word of the text (:attr:`TextView.keys`), each a trie
    compiled into one regex, so the cost hardly grows with the list. Lists of over 256
    groups compile groups on first use.
    Raises :class:`~tiermem.errors.ValidationError` for no phrases, or an empty phrase or
    one over ``MAX_PHRASE_CHARS`` characters.
    """

    def __init__(self, phrases: Iterable[str]) -> None:
        groups: dict[str, set[str]] = {}
        for phrase in phrases:
            key = phrase_key(phrase)
            if not key or len(key) > MAX_PHRASE_CHARS:
                raise ValidationError(
                    f"phrase {phrase!r} is empty or over {MAX_PHRASE_CHARS} characters"
                )
            word = _LATIN_RUN.match(key)
            groups.setdefault(word.group() if word else key[0], set()).add(key)
        if not groups:
            raise ValidationError("a phrase list is empty; give at least one phrase")
        self._groups = groups
        self._firsts = frozenset(groups)
        # Groups keyed by an ASCII character that is not a Latin letter or digit: not in
        # the keys of an ASCII text.
        self._ascii_char_firsts = tuple(
            first for first in groups if first.isascii() and not _LATIN.match(first)
        )
        self._patterns: dict[str, re.Pattern[str]] = {}
        # A small list also gets one pattern of all its phrases, run when a text holds the
        # first words of several groups: one finditer instead of merging each group's
        # matches in Python. The same matches: a match starts with its group's first word
        # whole (or its first character), so at any position at most one group can match,
        # and its trie takes the longest phrase there, as a group's own pattern does.
        self._all: re.Pattern[str] | None = None
        if len(groups) <= _SMALL_INDEX:
            for first in groups:
                self._pattern(first)
            self._all = re.compile(_trie_regex(_trie(k for g in groups.values() for k in g), ""))

    @property
    def firsts(self) -> frozenset[str]:
        """The first words (or first characters) of the phrases: a text none of whose
        :attr:`TextView.keys` is one of them holds no phrase, unless
        :attr:`punctuation_firsts` is not empty."""
        return self._firsts

    @property
    def punctuation_firsts(self) -> tuple[str, ...]:
        """The ASCII characters other than Latin letters and digits that phrases start
        with: not among the keys of an ASCII text, so looked for apart."""
        return self._ascii_char_firsts

    def _pattern(self, first: str) -> re.Pattern[str]:
        pattern = self._patterns.get(first)
        if pattern is None:
            trie = _trie(self._groups[first])
            pattern = self._patterns[first] = re.compile(_trie_regex(trie, previous=""))
        return pattern

    # Both lookups run only the patterns of groups whose first word (or first character)
    # is a word (a character) of the text, :attr:`TextView.keys`: a superset of the groups
    # with a match; the regex decides. A match starts with its phrase's first word whole
    # (the patterns check the word boundaries), so no group with a match is left out. The
    # view's keys are read once per turn and shared by every index that reads it; most
    # texts hold no first word of most indexes, which costs one ``isdisjoint``. The keys
    # of an ASCII text are its words only: the characters that are not Latin letters or
    # digits ("'", "#") that some phrases start with are looked for apart.

    def _firsts_in(self, view: TextView) -> frozenset[str]:
        keys = view._keys if view._keys is not None else view.keys
        firsts = keys & self._firsts
        if self._ascii_char_firsts and view.folded.isascii():
            folded = view.folded
            firsts = firsts.union(c for c in self._ascii_char_firsts if c in folded)
        return firsts

    def search(self, view: TextView) -> bool:
        """Whether any phrase occurs in ``view``."""
        keys = view._keys if view._keys is not None else view.keys
        if keys.isdisjoint(self._firsts) and not self._ascii_char_firsts:
            return False
        folded = view.folded
        firsts = self._firsts_in(view)
        if len(firsts) > 1 and self._all is not None:
            return self._all.search(folded) is not None
        # A loop, not ``any`` over a generator: this runs several times per turn.
        for first in firsts:  # noqa: SIM110 (see above)
            if self._pattern(first).search(folded):
                return True
        return False

    def find(self, view: TextView) -> list[tuple[int, int, str]]:
        """``(start, end, phrase_key)`` of each match in ``view.folded``, left to right."""
        keys = view._keys if view._keys is not None else view.keys
        if keys.isdisjoint(self._firsts) and not self._ascii_char_firsts:
            return []
        text = view.folded
        patterns = [self._pattern(first) for first in self._firsts_in(view)]
        if not patterns:
            return []
        if len(patterns) == 1:
            spans: Iterable[tuple[int, int]] = map(_span, patterns[0].finditer(text))
        elif self._all is not None:
            spans = map(_span, self._all.finditer(text))
        else:
            spans = _leftmost_longest(patterns, text)
        return [(start, end, " ".join(text[start:end].split())) for start, end in spans]


_span = re.Match.span


def _leftmost_longest(patterns: list[re.Pattern[str]], text: str) -> list[tuple[int, int]]:
    # Merge several patterns' matches: each time take the leftmost, then longest, match that
    # starts after the last one taken (of equals, the earlier pattern's), re-searching a
    # pattern whose next match overlapped it. Plain loops and a list, not a generator:
    # this runs on most turns.
    heads = [pattern.search(text) for pattern in patterns]
    spans: list[tuple[int, int]] = []
    while True:
        best = None
        for match in heads:
            if match is not None and (
                best is None
                or match.start() < best.start()
                or (match.start() == best.start() and match.end() > best.end())
            ):
                best = match
        if best is None:
            return spans
        start, end = best.span()
        spans.append((start, end))
        for i, match in enumerate(heads):
            if match is not None and match.start() < end:
                heads[i] = patterns[i].search(text, end)


def _trie(keys: Iterable[str]) -> dict[str, Any]:
    trie: dict[str, Any] = {}
    for key in keys:
        node = trie
        for ch in key:
            node = node.setdefault(ch, {})
        node[""] = {}
    return trie


def _trie_regex(node: dict[str, Any], previous: str) -> str:
    alternatives = []
    for ch in sorted(k for k in node if k):
        head = r"\s+" if ch == " " else re.escape(ch)
        if not previous and _LATIN.match(ch):
            # The left boundary is checked after the first character, so that re can still
            # jump to candidate first characters (a leading lookbehind disables that).
            head += f"(?<![{LATIN_WORD_CHARS}].)"
        alternatives.append(head + _trie_regex(node[ch], ch))
    if "" in node:  # a phrase ends here; longer phrases were tried first
        alternatives.append(f"(?![{LATIN_WORD_CHARS}])" if _LATIN.match(previous) else "")
    if len(alternatives) == 1:
        return alternatives[0]
    return "(?:" + "|".join(alternatives) + ")"
