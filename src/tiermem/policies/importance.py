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

Everything here is pure: values in, values out. Cues are matched by
:mod:`tiermem.policies.phrases`, the rule that rule-based extraction also uses, so a cue and an
entity name obey the same word boundaries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from tiermem.errors import ValidationError
from tiermem.models.content import ContentBlock, TextBlock, ToolResultBlock
from tiermem.models.turns import Entity
from tiermem.policies.phrases import PhraseIndex, TextView, latin_words
from tiermem.policies.turn_text import TurnText

__all__ = [
    "DEFAULT_IMPORTANCE_RULES",
    "ImportanceRules",
    "ImportanceScore",
    "ImportanceScorer",
    "RuleImportanceScorer",
    "score_importance",
]

_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_CJK_CHAR = re.compile(f"[{_CJK_CHARS}]")
_CJK_RUN = re.compile(f"[{_CJK_CHARS}][{_CJK_CHARS}]*")
# Patterns start with a character class, not a repeat ("[x][x]*", not "[x]+"), so that re
# skips to the positions that can start a match instead of trying every one.
_SPACED_WORD = re.compile(f"[^\\W_{_CJK_CHARS}][^\\W_{_CJK_CHARS}]*")  # a spaced-script word
_NUMBER = re.compile(r"[0-9][0-9]*(?:[.,][0-9]+)*")


def _word_units(text: str) -> int:
    """A rough word count for mixed scripts: spaced words, plus one word per 2 CJK chars."""
    if text.isascii():
        # No CJK; and an ASCII spaced word ([^\W_]) is a run of [0-9A-Za-z], a Latin word.
        return len(latin_words(text))
    cjk = sum(map(len, _CJK_RUN.findall(text)))  # a match per run, not per character
    return len(_SPACED_WORD.findall(text)) + (cjk + 1) // 2


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
    """Scores one turn. Implementations must be pure, safe to call from several threads,
    and return a score in [0, 1]."""

    def score(
        self,
        role: str,
        content: tuple[ContentBlock, ...],
        *,
        entities: tuple[Entity, ...] = (),
        text: TurnText | None = None,
    ) -> ImportanceScore:
        """The importance of a turn by ``role`` with ``content``; ``entities`` already
        found; ``text`` the turn's text, when the caller already read it
        (``TurnText.of_blocks(content)``), else the scorer reads ``content``."""
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
    Of a long turn, only the rule window is read (its first 8,000 and last 4,000
    characters, see :mod:`tiermem.policies.turn_text`): a cue in the middle of a long paste
    is not the speaker's.
    """

    DENSITY_WINDOW_CHARS = 4000

    def __init__(self, rules: ImportanceRules = DEFAULT_IMPORTANCE_RULES) -> None:
        self.rules = rules
        self._preference = PhraseIndex(rules.preference_cues)
        self._correction = PhraseIndex(rules.correction_cues)
        self._recommendation = PhraseIndex(rules.recommendation_cues)
        self._acknowledgement = PhraseIndex(rules.acknowledgement_cues)
        self._social = PhraseIndex(rules.acknowledgement_cues + rules.greeting_cues)
        # A text none of whose keys starts a cue of any list (TextView.keys; most density
        # turns) goes straight to the density rule: one intersection instead of a lookup
        # per list. Lists with phrases that start with ASCII punctuation are always read.
        indexes = (self._preference, self._correction, self._recommendation, self._social)
        self._cue_firsts: frozenset[str] | None = (
            None
            if any(index.punctuation_firsts for index in indexes)
            else frozenset().union(*(index.firsts for index in indexes))
        )
        # The fixed scores, built (and checked) once rather than per turn.
        self._preference_score = ImportanceScore(rules.preference, "preference")
        self._correction_score = ImportanceScore(rules.correction, "correction")
        self._recommendation_score = ImportanceScore(rules.recommendation, "recommendation")
        self._tool_result_score = ImportanceScore(rules.tool_result, "tool_result")
        self._acknowledgement_score = ImportanceScore(rules.acknowledgement, "acknowledgement")
        self._greeting_score = ImportanceScore(rules.greeting, "greeting")

    def score(
        self,
        role: str,
        content: tuple[ContentBlock, ...],
        *,
        entities: tuple[Entity, ...] = (),
        text: TurnText | None = None,
    ) -> ImportanceScore:
        """Score one turn; ``text``, if given, is ``TurnText.of_blocks(content)`` already
        computed. Raises :class:`~tiermem.errors.ValidationError` for a role other than
        ``"user"`` or ``"assistant"``."""
        # ``tiermem.extraction.plain_analysis`` inlines this method (and the density rule)
        # for a service's plain turns: a change here is made there too (its tests compare).
        if role not in ("user", "assistant"):
            raise ValidationError(f"role must be 'user' or 'assistant', got {role!r}")
        read = text if text is not None else TurnText.of_blocks(content)
        said = read.said
        cue_firsts = self._cue_firsts
        if cue_firsts is not None:
            keys = said._keys if said._keys is not None else said.keys
            if keys.isdisjoint(cue_firsts):
                # No cue of any list: neither rule 1-3 nor 5-6 (those need a social cue).
                if (len(content) != 1 or type(content[0]) is not TextBlock) and any(
                    isinstance(b, ToolResultBlock) for b in content
                ):
                    return self._tool_result_score
                return self._density_score(read.view, entities)
        if role == "user":
            if self._preference.search(said):
                return self._preference_score
            if self._correction.search(said):
                return self._correction_score
        elif self._recommendation.search(said):
            return self._recommendation_score
        if (len(content) != 1 or type(content[0]) is not TextBlock) and any(
            isinstance(b, ToolResultBlock) for b in content
        ):
            return self._tool_result_score
        if not entities and self._is_only_social(said):
            if self._acknowledgement.search(said):
                return self._acknowledgement_score
            return self._greeting_score
        return self._density_score(read.view, entities)

    def _density_score(self, view: TextView, entities: tuple[Entity, ...]) -> ImportanceScore:
        window = view.folded
        words = None
        if len(window) > self.DENSITY_WINDOW_CHARS:
            window = window[: self.DENSITY_WINDOW_CHARS]
        elif window.isascii():
            words = len(view.words)  # the view's words: those the cue lookups read
        # Clamped to the rules' bounds, which are checked to lie in [0, 1]: built without
        # ``__post_init__``'s checks (most turns are scored by density).
        score = _new(ImportanceScore)
        _set(score, "score", self._density(window, entities, words))
        _set(score, "reason", "density")
        return score

    def _is_only_social(self, said: TextView) -> bool:
        # True when the text has a social cue and little else: "thanks so much!", "またね".
        if len(said.folded) > self.rules.social_max_chars:
            return False
        cues = self._social.find(said)
        if not cues:
            return False
        folded = said.folded
        parts = []  # the text between the cues
        last = 0
        for start, end, _ in cues:
            parts.append(folded[last:start])
            last = end
        parts.append(folded[last:])
        rest = " ".join(parts)
        return not _NUMBER.search(rest) and _word_units(rest) <= self.rules.social_max_extra_words

    def _density(self, text: str, entities: tuple[Entity, ...], words: int | None = None) -> float:
        # ``words``: ``_word_units(text)`` when the caller has it.
        rules = self.rules
        d = (
            # Distinct entities (one or none need no hashing).
            0.5 * min(len(entities) if len(entities) < 2 else len(set(entities)), 4) / 4
            + 0.2 * min(len(_NUMBER.findall(text)), 3) / 3
            + 0.3 * min(_word_units(text) if words is None else words, 60) / 60
        )
        score = rules.density_floor + (rules.density_ceiling - rules.density_floor) * d
        return min(max(score, rules.density_floor), rules.density_ceiling)


_new = object.__new__
_set = object.__setattr__

_DEFAULT_SCORER = RuleImportanceScorer()


def score_importance(
    role: str,
    content: tuple[ContentBlock, ...],
    *,
    entities: tuple[Entity, ...] = (),
    text: TurnText | None = None,
) -> ImportanceScore:
    """Score a turn with the default rules; see :class:`RuleImportanceScorer`.

    Raises :class:`~tiermem.errors.ValidationError` for an unknown role.
    """
    return _DEFAULT_SCORER.score(role, content, entities=entities, text=text)
