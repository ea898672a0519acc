"""Turn importance: how much a turn is worth keeping when the context budget is tight.

The score (0..1) is computed once, when a turn is added, and drives importance-weighted
eviction in context assembly. Scoring is pluggable through :class:`ImportanceScorer`; the
default, :class:`RuleImportanceScorer`, implements the table of seed 000 (§1.4):

=====================================================  =====  =================
turn                                                   score  reason
=====================================================  =====  =================
user states a preference ("I like seinen", "青年が好き")    0.9   ``preference``
user corrects the agent ("No, I meant volume 3")        0.85  ``correction``
assistant recommends ("I recommend…", "おすすめは…")      0.6   ``recommendation``
the turn carries a tool result                          0.4   ``tool_result``
short acknowledgement ("thanks", "ok", "了解です")         0.2   ``acknowledgement``
short greeting or farewell ("hi", "またね")               0.1   ``greeting``
anything else: information density, 0.25..0.75              ``density``
=====================================================  =====  =================

Everything here is pure: values in, values out. This module also owns the phrase-matching
rule (:class:`TextView`, :class:`PhraseIndex`) that rule-based extraction reuses, so a cue
and an entity name obey the same word boundaries.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from tiermem.errors import ValidationError
from tiermem.models.content import ContentBlock, TextBlock, ToolResultBlock, text_of
from tiermem.models.turns import Entity

__all__ = [
    "DEFAULT_IMPORTANCE_RULES",
    "LATIN_WORD_CHARS",
    "MAX_PHRASE_CHARS",
    "ImportanceRules",
    "ImportanceScore",
    "ImportanceScorer",
    "PhraseIndex",
    "RuleImportanceScorer",
    "TextView",
    "normal_form",
    "phrase_key",
    "score_importance",
]

# Letters and digits of scripts that separate words with spaces. A Latin phrase must not touch
# one of these ("ok" in "book", "hi" in "this"); CJK text has no spaces, so a phrase may touch
# anything there ("OKです" is an acknowledgement, "青年が好き" a preference).
LATIN_WORD_CHARS = "0-9A-Za-z\u00c0-\u024f"
MAX_PHRASE_CHARS = 200
_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_LATIN = re.compile(f"[{LATIN_WORD_CHARS}]")
_LATIN_RUN = re.compile(f"[{LATIN_WORD_CHARS}]+")
_CJK_CHAR = re.compile(f"[{_CJK_CHARS}]")
_SPACED_WORD = re.compile(f"[^\\W_{_CJK_CHARS}]+")  # a word of a space-separated script
_NUMBER = re.compile(r"[0-9]+(?:[.,][0-9]+)*")
_CURLY_APOSTROPHES = ("\u2019", "\u2018", "\u02bc")
_APOSTROPHES = str.maketrans(dict.fromkeys(_CURLY_APOSTROPHES, "'"))
_FULL_WIDTH = re.compile("[\uff01-\uff5e\u3000]")
# Lists with up to this many first words compile up front and pick the groups to run by a
# substring test per group; longer lists compile on demand and use TextView.keys.
_SMALL_INDEX = 256


def _half_width(match: re.Match[str]) -> str:
    char = match.group()
    return " " if char == "\u3000" else chr(ord(char) - 0xFEE0)


def normal_form(text: str) -> str:
    """``text`` as rules read it: NFKC (``ＯＫ４２`` → ``OK42``) with straight apostrophes."""
    # Both steps are slow on CJK text, and most text needs neither: check first.
    if not unicodedata.is_normalized("NFKC", text):
        # Japanese text is usually normal but for full-width ASCII ("？", "４２") and the
        # ideographic space: map those cheaply before paying for a full normalisation.
        text = _FULL_WIDTH.sub(_half_width, text)
        if not unicodedata.is_normalized("NFKC", text):
            text = unicodedata.normalize("NFKC", text)
    if any(mark in text for mark in _CURLY_APOSTROPHES):
        text = text.translate(_APOSTROPHES)
    return text


class TextView:
    """One text in the forms that rules read, computed once and shared by all of them.

    ``normal`` is :func:`normal_form`; ``folded`` is ``normal`` lower-cased and of the same
    length, so a position in one is a position in the other; ``keys`` (computed on first
    use) holds the Latin words and the characters of ``folded``: what a phrase can start with.
    """

    __slots__ = ("_keys", "folded", "normal")

    def __init__(self, text: str) -> None:
        self.normal = normal_form(text)
        folded = self.normal.lower()
        if len(folded) != len(self.normal):  # "İ" lower-cases to two characters; keep one
            folded = "".join(ch.lower()[0] for ch in self.normal)
        self.folded = folded
        self._keys: frozenset[str] | None = None

    @property
    def keys(self) -> frozenset[str]:
        if self._keys is None:
            self._keys = frozenset(_LATIN_RUN.findall(self.folded)).union(self.folded)
        return self._keys


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
    the groups whose first word is in the text, each a trie compiled into one regex, so the
    cost hardly grows with the list. Lists of over 256 groups compile groups on first use.
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
        self._patterns: dict[str, re.Pattern[str]] = {}
        self._small = len(groups) <= _SMALL_INDEX
        if self._small:
            for first in groups:
                self._pattern(first)

    def _pattern(self, first: str) -> re.Pattern[str]:
        pattern = self._patterns.get(first)
        if pattern is None:
            trie: dict[str, Any] = {}
            for key in self._groups[first]:
                node = trie
                for ch in key:
                    node = node.setdefault(ch, {})
                node[""] = {}
            pattern = self._patterns[first] = re.compile(_trie_regex(trie, previous=""))
        return pattern

    def _candidates(self, view: TextView) -> Iterable[str]:
        # A superset of the groups whose first word is in the text; the regex decides.
        if self._small:
            return [first for first in self._groups if first in view.folded]
        return self._groups.keys() & view.keys

    def search(self, view: TextView) -> bool:
        """Whether any phrase occurs in ``view``."""
        return any(self._pattern(f).search(view.folded) for f in self._candidates(view))

    def find(self, view: TextView) -> list[tuple[int, int, str]]:
        """``(start, end, phrase_key)`` of each match in ``view.folded``, left to right."""
        text = view.folded
        patterns = [self._pattern(first) for first in self._candidates(view)]
        if len(patterns) == 1:
            spans: Iterable[tuple[int, int]] = (m.span() for m in patterns[0].finditer(text))
        else:
            spans = _leftmost_longest(patterns, text)
        return [(start, end, " ".join(text[start:end].split())) for start, end in spans]


def _leftmost_longest(patterns: list[re.Pattern[str]], text: str) -> Iterator[tuple[int, int]]:
    # Merge several patterns' matches: each time take the leftmost, then longest, match that
    # starts after the last one taken, re-searching a pattern whose next match overlapped it.
    heads = {pattern: pattern.search(text) for pattern in patterns}
    while live := [match for match in heads.values() if match is not None]:
        best = min(live, key=lambda match: (match.start(), -match.end()))
        yield best.span()
        for pattern, match in heads.items():
            if match is not None and match.start() < best.end():
                heads[pattern] = pattern.search(text, best.end())


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


def _word_units(text: str) -> int:
    """A rough word count for mixed scripts: spaced words, plus one word per 2 CJK chars."""
    return len(_SPACED_WORD.findall(text)) + (len(_CJK_CHAR.findall(text)) + 1) // 2


@dataclass(frozen=True, slots=True)
class ImportanceScore:
    """A score in [0, 1] and the rule that produced it (e.g. ``"preference"``)."""

    score: float
    reason: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValidationError(f"importance score {self.score} is outside [0, 1]")
        if not self.reason:
            raise ValidationError("an importance score needs a reason, e.g. 'preference'")


class ImportanceScorer(Protocol):
    """Scores one turn. Implementations must be pure and return a score in [0, 1]."""

    def score(
        self,
        role: str,
        content: tuple[ContentBlock, ...],
        *,
        entities: tuple[Entity, ...] = (),
    ) -> ImportanceScore:
        """The importance of a turn by ``role`` with ``content``; ``entities`` already found."""
        ...


@dataclass(frozen=True, slots=True)
class ImportanceRules:
    """The data of :class:`RuleImportanceScorer`: scores, cue phrases and density bounds.

    Cue phrases are plain text, matched as :class:`PhraseIndex` describes. Change some with
    ``dataclasses.replace(DEFAULT_IMPORTANCE_RULES, preference_cues=(...))``. Raises
    :class:`~tiermem.errors.ValidationError` when a score is outside [0, 1], the density
    bounds are reversed, a limit is negative, or a cue list is empty.
    """

    preference: float = 0.9
    correction: float = 0.85
    recommendation: float = 0.6
    tool_result: float = 0.4
    acknowledgement: float = 0.2
    greeting: float = 0.1
    density_floor: float = 0.25
    density_ceiling: float = 0.75
    # An acknowledgement or greeting may carry at most this many other words ("thanks so
    # much" is an acknowledgement; "ok, show me the next one" is not).
    social_max_extra_words: int = 3
    social_max_chars: int = 120
    preference_cues: tuple[str, ...] = (
        "I prefer", "I'd prefer", "I would prefer", "I like", "I liked", "I love", "I loved",
        "I enjoy", "I enjoyed", "I don't like", "I do not like", "I dislike", "I hate",
        "I can't stand", "I'm into", "I am into", "I'm a fan of", "I'm not a fan of",
        "I'd rather", "I would rather", "my favorite", "my favourite", "call me",
        "好き", "大好き", "嫌い", "好きなジャンルは", "苦手", "好み", "お気に入り",
        "のほうがいい", "の方がいい", "と呼んで",
    )  # fmt: skip
    correction_cues: tuple[str, ...] = (
        "no, I meant", "I meant", "actually", "that's not what", "that is not what",
        "not what I asked", "I said", "I didn't say", "I did not say", "wrong",
        "いいえ", "違います", "違う", "ちがう", "じゃなくて", "ではなく", "そうじゃない",
    )  # fmt: skip
    recommendation_cues: tuple[str, ...] = (
        "I recommend", "I'd recommend", "I would recommend", "I suggest", "I'd suggest",
        "you might like", "you may like", "you might enjoy", "you may enjoy", "you'll love",
        "you would love", "you'd love", "how about", "check out",
        "おすすめ", "お勧め", "オススメ", "いかがでしょうか",
    )  # fmt: skip
    acknowledgement_cues: tuple[str, ...] = (
        "thanks", "thank you", "thx", "ok", "okay", "got it", "sure", "alright",
        "all right", "great", "cool", "perfect", "sounds good", "understood", "noted",
        "ありがとう", "ありがとうございます", "どうも", "了解", "わかりました", "分かりました",
        "はい", "承知しました",
    )  # fmt: skip
    greeting_cues: tuple[str, ...] = (
        "hi", "hello", "hey", "bye", "goodbye", "good morning", "good afternoon",
        "good evening", "good night", "see you", "you're welcome", "how can I help you",
        "こんにちは", "こんばんは", "おはよう", "おはようございます", "さようなら", "またね",
        "じゃあね", "いらっしゃいませ", "どういたしまして", "よろしくお願いします",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in _SCORE_FIELDS:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValidationError(
                    f"ImportanceRules.{name}={getattr(self, name)} is not in [0, 1]"
                )
        if self.density_floor > self.density_ceiling:
            raise ValidationError("ImportanceRules.density_floor is above density_ceiling")
        if self.social_max_extra_words < 0 or self.social_max_chars < 0:
            raise ValidationError("ImportanceRules.social_max_* limits must be >= 0")
        for name in _CUE_FIELDS:
            cues = getattr(self, name)
            if isinstance(cues, str) or not cues:
                raise ValidationError(
                    f"ImportanceRules.{name} must be a non-empty tuple of phrases"
                )


_SCORE_FIELDS = (
    "preference", "correction", "recommendation", "tool_result", "acknowledgement",
    "greeting", "density_floor", "density_ceiling",
)  # fmt: skip
_CUE_FIELDS = (
    "preference_cues", "correction_cues", "recommendation_cues", "acknowledgement_cues",
    "greeting_cues",
)  # fmt: skip

DEFAULT_IMPORTANCE_RULES = ImportanceRules()


class RuleImportanceScorer:
    """Seed 000's importance table, by cue phrases in English and Japanese.

    The first rule that applies wins, in this order:

    1. ``preference`` — a user turn whose text has a preference cue ("I prefer", "好き").
    2. ``correction`` — a user turn whose text has a correction cue ("I meant", "違います").
    3. ``recommendation`` — an assistant turn with a recommendation cue ("you might like").
    4. ``tool_result`` — the turn carries a :class:`~tiermem.models.ToolResultBlock`.
    5. ``acknowledgement`` — a short text (at most ``social_max_chars`` characters) with an
       acknowledgement cue ("thanks", "了解") where, once every acknowledgement and greeting
       cue is removed, no digit, no ``entities`` and at most ``social_max_extra_words``
       words remain. So "ok thanks!" is one, "ok, show me vol 3" is scored by density, and
       "ok, I prefer seinen" by rule 1.
    6. ``greeting`` — the same test, with a greeting cue ("hi", "またね") and no
       acknowledgement cue.
    7. ``density`` — ``floor + (ceiling - floor) * d``, where
       ``d = 0.5 * min(entities, 4) / 4 + 0.2 * min(numbers, 3) / 3 + 0.3 * min(words, 60) / 60``;
       ``entities`` counts distinct entities passed in, ``numbers`` digit runs and ``words``
       the words of the whole turn (a CJK character counts as half a word), both counted in
       its first ``DENSITY_WINDOW_CHARS`` characters, past which every term has saturated.

    Cues are looked for only in the turn's own text blocks: a tool result quoting "I love
    this series" is not the user's preference, and a reasoning block is not a recommendation.
    """

    DENSITY_WINDOW_CHARS = 4000

    def __init__(self, rules: ImportanceRules = DEFAULT_IMPORTANCE_RULES) -> None:
        self.rules = rules
        self._preference = PhraseIndex(rules.preference_cues)
        self._correction = PhraseIndex(rules.correction_cues)
        self._recommendation = PhraseIndex(rules.recommendation_cues)
        self._acknowledgement = PhraseIndex(rules.acknowledgement_cues)
        self._social = PhraseIndex(rules.acknowledgement_cues + rules.greeting_cues)

    def score(
        self,
        role: str,
        content: tuple[ContentBlock, ...],
        *,
        entities: tuple[Entity, ...] = (),
    ) -> ImportanceScore:
        """Score one turn. Raises :class:`~tiermem.errors.ValidationError` for a role other
        than ``"user"`` or ``"assistant"``."""
        if role not in ("user", "assistant"):
            raise ValidationError(f"role must be 'user' or 'assistant', got {role!r}")
        rules = self.rules
        said = TextView("\n".join(b.text for b in content if isinstance(b, TextBlock)))
        if role == "user" and self._preference.search(said):
            return ImportanceScore(rules.preference, "preference")
        if role == "user" and self._correction.search(said):
            return ImportanceScore(rules.correction, "correction")
        if role == "assistant" and self._recommendation.search(said):
            return ImportanceScore(rules.recommendation, "recommendation")
        if any(isinstance(b, ToolResultBlock) for b in content):
            return ImportanceScore(rules.tool_result, "tool_result")
        if not entities and self._is_only_social(said):
            if self._acknowledgement.search(said):
                return ImportanceScore(rules.acknowledgement, "acknowledgement")
            return ImportanceScore(rules.greeting, "greeting")
        window = text_of(content)[: self.DENSITY_WINDOW_CHARS]
        return ImportanceScore(self._density(TextView(window).folded, entities), "density")

    def _is_only_social(self, said: TextView) -> bool:
        # True when the text has a social cue and little else: "thanks so much!", "またね".
        if len(said.folded) > self.rules.social_max_chars:
            return False
        cues = self._social.find(said)
        if not cues:
            return False
        edges = [0, *(edge for start, end, _ in cues for edge in (start, end)), len(said.folded)]
        rest = " ".join(said.folded[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True))
        return not _NUMBER.search(rest) and _word_units(rest) <= self.rules.social_max_extra_words

    def _density(self, text: str, entities: tuple[Entity, ...]) -> float:
        rules = self.rules
        d = (
            0.5 * min(len(set(entities)), 4) / 4
            + 0.2 * min(len(_NUMBER.findall(text)), 3) / 3
            + 0.3 * min(_word_units(text), 60) / 60
        )
        score = rules.density_floor + (rules.density_ceiling - rules.density_floor) * d
        return min(max(score, rules.density_floor), rules.density_ceiling)


_DEFAULT_SCORER = RuleImportanceScorer()


def score_importance(
    role: str,
    content: tuple[ContentBlock, ...],
    *,
    entities: tuple[Entity, ...] = (),
) -> ImportanceScore:
    """Score a turn with the default rules; see :class:`RuleImportanceScorer`.

    Raises :class:`~tiermem.errors.ValidationError` for an unknown role.
    """
    return _DEFAULT_SCORER.score(role, content, entities=entities)
