"""The analysis of a plain text turn by the built-in engines, in one function.

Every plain ``add_turn`` analyses one string with the service's token counter, entity
extractor and importance scorer. With the built-in ones (:class:`TiktokenCounter`,
:class:`RuleEntityExtractor`, :class:`RuleImportanceScorer`, whatever their rules),
:func:`analyse_plain_text` does what :func:`~tiermem.extraction.turn_analysis.analyse_text_block`
does through them, inlined: the turn's text, its words and keys are computed once and read
by the entity gates, the word-list gate, the cue gate and the density rule, without about a
dozen Python calls between those layers. What that saves is small: 166.7k -> 159.3k
instructions per analysed turn of the bench's messages (callgrind, session 11); the rest is
the matching itself (regexes, tries, the social test, normal forms), the turn's models and
tiktoken (about 31k). The engines' own code stays the definition of each step: what this
inlines is their dispatch (gates, cue-list order, the density formula); the matching itself
runs in their methods. The equivalence tests
(``tests/unit/test_s11_analysis_plain.py``) compare both paths on generated text.

Only the exact classes take this path: a subclass may override any method, so it is
analysed through its methods (:func:`is_plain_analysis`).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from tiermem.extraction.entities import (
    _PHRASE,
    EntityRule,
    RuleEntityExtractor,
    _entities,
)
from tiermem.extraction.turn_analysis import TurnAnalysis
from tiermem.models.content import TextBlock
from tiermem.models.turns import Entity
from tiermem.policies.importance import _NUMBER, ImportanceScore, RuleImportanceScorer
from tiermem.policies.phrases import _ASCII_WORD_BYTES, TextView
from tiermem.policies.turn_text import RULE_HEAD_CHARS, RULE_TAIL_CHARS, TurnText
from tiermem.tokens import TiktokenCounter

__all__ = ["analyse_plain_text", "is_plain_analysis"]

_WHOLE_CHARS = RULE_HEAD_CHARS + RULE_TAIL_CHARS
_new = object.__new__
_set = object.__setattr__


def is_plain_analysis(tokens: Any, entities: Any, importance: Any) -> bool:
    """Whether :func:`analyse_plain_text` may analyse for these engines: each of the
    built-in class itself (not a subclass, which may override what is inlined)."""
    return (
        type(tokens) is TiktokenCounter
        and type(entities) is RuleEntityExtractor
        and type(importance) is RuleImportanceScorer
    )


def analyse_plain_text(
    role: str,
    blocks: tuple[TextBlock],
    tokens: TiktokenCounter,
    entities: RuleEntityExtractor,
    importance: RuleImportanceScorer,
) -> TurnAnalysis:
    """``analyse_text_block(role, blocks, tokens, entities, importance)`` for the built-in
    engines (:func:`is_plain_analysis`): the same analysis, every field, in fewer calls.
    ``role`` is checked and ``blocks`` is one text block, as for ``analyse_text_block``."""
    text = blocks[0].text
    if text.isascii() and len(text) <= _WHOLE_CHARS:
        # What ``TurnText.of`` builds for a short ASCII text (in NFKC, no curly
        # apostrophe, lower-cases to the same length), with the view's words and keys
        # (``TextView.words`` and ``TextView.keys`` of ASCII text) computed now: every
        # gate below reads them.
        normal = text
        folded = text.lower()
        words = folded.encode("ascii").translate(_ASCII_WORD_BYTES).decode("ascii").split()
        keys = frozenset(words)
        view = _new(TextView)
        view.normal = text
        view.folded = folded
        view._words = words
        view._keys = keys
        read = _new(TurnText)
        _set(
            read,
            "__dict__",
            {
                "text": text,
                "said_text": text,
                "nfkc": text,
                "view": view,
                "said": view,
                "truncated": False,
            },
        )
        folded_ascii = normal_ascii = True
    else:  # normalised and windowed as ever
        read = TurnText.of(text)
        view = read.view
        normal, folded = view.normal, view.folded
        keys = view.keys
        words = view.words
        folded_ascii = folded.isascii()
        normal_ascii = folded_ascii and normal.isascii()  # not always: "İ" folds to "i"

    # ``RuleEntityExtractor.find``, then ``extract``: the gate strings in the text select
    # the rules that run; most turns select none.
    if folded_ascii:
        present = set(filter(folded.__contains__, entities._folded_ascii_gates))
    else:
        present = set(filter(folded.__contains__, entities._folded_gates))
    normal_gates = entities._normal_ascii_gates if normal_ascii else entities._normal_gates
    if normal_gates:
        present.update(
            map(entities._normal_keys.__getitem__, filter(normal.__contains__, normal_gates))
        )
    phrase_firsts = entities._phrase_firsts
    if phrase_firsts and not keys.isdisjoint(phrase_firsts):
        present.update(_PHRASE + first for first in keys & phrase_firsts)
    rules = entities._rules_for(frozenset(present)) if present else entities._ungated
    titles_rule = entities._titles
    found: tuple[Entity, ...] = ()
    if rules or titles_rule is not None:
        found = _entities_of(view, folded, normal, rules, titles_rule)

    # ``RuleImportanceScorer.score`` of one text block (never a tool result), all of it
    # said: ``said`` is ``view``.
    cue_firsts = importance._cue_firsts
    if cue_firsts is None or not keys.isdisjoint(cue_firsts):
        # ``PhraseIndex.search`` is False at once for a text none of whose keys starts a
        # phrase of the list (and no phrase starts with punctuation): tested here first.
        user = role == "user"
        index = importance._preference if user else importance._recommendation
        if (not keys.isdisjoint(index._firsts) or index._ascii_char_firsts) and index.search(view):
            cue = importance._preference_score if user else importance._recommendation_score
            return _analysis(read, tokens, text, found, cue)
        index = importance._correction
        if (
            user
            and (not keys.isdisjoint(index._firsts) or index._ascii_char_firsts)
            and index.search(view)
        ):
            return _analysis(read, tokens, text, found, importance._correction_score)
        if not found and importance._is_only_social(view):
            if importance._acknowledgement.search(view):
                return _analysis(read, tokens, text, found, importance._acknowledgement_score)
            return _analysis(read, tokens, text, found, importance._greeting_score)

    # The density rule (``_density_score`` and ``_density``).
    window = folded
    if len(window) > importance.DENSITY_WINDOW_CHARS:
        window = window[: importance.DENSITY_WINDOW_CHARS]
        score_value = importance._density(window, found)
    elif not folded_ascii:
        score_value = importance._density(window, found)
    else:  # the view's words: ``_word_units`` of ASCII text
        rules_ = importance.rules
        d = (
            0.5 * min(len(found) if len(found) < 2 else len(set(found)), 4) / 4
            + 0.2 * min(len(_NUMBER.findall(window)), 3) / 3
            + 0.3 * min(len(words), 60) / 60
        )
        floor, ceiling = rules_.density_floor, rules_.density_ceiling
        score_value = min(max(floor + (ceiling - floor) * d, floor), ceiling)
    # Within the rules' bounds, which are checked to lie in [0, 1]: built unchecked.
    score = _new(ImportanceScore)
    _set(score, "score", score_value)
    _set(score, "reason", "density")
    return _analysis(read, tokens, text, found, score)


def _entities_of(
    view: TextView,
    folded: str,
    normal: str,
    rules: tuple[Any, ...],
    titles_rule: Any,
) -> tuple[Entity, ...]:
    """The rest of ``RuleEntityExtractor.find`` then ``extract``, its rules selected."""
    titles = titles_rule.find(view) if titles_rule is not None else []
    found: list[tuple[int, int, int, str, str]] = []
    starts: list[int] = []
    if titles:
        found += [(start, 0, end, "series", value) for start, end, value in titles]
        starts = [start for start, _, _ in titles]
    for rule in rules:
        if isinstance(rule, EntityRule):
            matches = rule._scan(folded if rule.folded else normal)
        else:
            matches = rule.find(view)
        for start, end, value in matches:
            i = bisect_right(starts, start) - 1 if starts else -1
            if i < 0 or titles[i][1] < end:
                found.append((start, len(found), end, rule.kind, value))
    if not found:
        return ()
    if len(found) == 1:
        _, _, _, kind, value = found[0]
        return _entities(((kind, value),))
    found.sort()
    pairs = tuple(dict.fromkeys((kind, value) for _, _, _, kind, value in found))
    return _entities(pairs)


def _analysis(
    read: TurnText,
    tokens: TiktokenCounter,
    text: str,
    found: tuple[Entity, ...],
    score: ImportanceScore,
) -> TurnAnalysis:
    try:  # ``TiktokenCounter.count``
        count = len(tokens._encode(text))
    except UnicodeEncodeError:
        count = tokens.count(text)
    analysis = _new(TurnAnalysis)
    _set(
        analysis,
        "__dict__",
        {
            "text": read,
            "token_count": count,
            "entities": found,
            "importance": score,
            "drafts": (),
            "terms": None,
        },
    )
    return analysis
