"""Auto-detection of long-term memories in what a user says: rules only, no LLM.

:class:`RuleMemoryDetector` reads one user turn and returns :class:`DetectedMemory` drafts;
:meth:`tiermem.longterm.memory.LongTermMemory.remember_detected` writes them. It runs on
every user turn, so it is pure and cheap: a handful of regexes per sentence, most behind a
substring gate, over at most the rule window of the turn. The word lists and patterns are
data, in :mod:`tiermem.longterm._detect_rules`; this module is the engine that applies them.

What is detected, in English and Japanese:

=====================  ==========================================  ===========================
rule (``reason``)      examples                                    draft
=====================  ==========================================  ===========================
``command``            ``!remember my birthday is May 3`` (seed    fact, explicit, as written
                       004: the whole turn after the command)
``remember_request``   "remember that I'm vegetarian", "can you    fact, explicit, as written
                       remember …", "私はベジタリアンだと覚えておいて"
``favorite``           "my favorite genre is seinen",              preference
                       "好きなジャンルはセイネンです"                    ``favorite_genre`` = value
``prefer``             "I prefer seinen", "セイネンの方が好き",      preference
                       "I prefer hardcover", "紙の本のほうが好き"      ``favorite_genre``,
                                                                   ``favorite_format`` = value
``like`` / ``dislike`` "I love horror", "I don't like horror",     preference
                       "I hate isekai", "ホラーは苦手です", "嫌い",     ``opinion:genre:horror``
                       "not a fan of horror", "no horror"          = likes / dislikes …
``addressed_as``       "call me Ken", "Actually, call me Kenji",   preference ``addressed_as``
                       "No, call me Kenji, not Ken", "ケンと呼んで"
``contrast``           the X of "I'm into seinen now, not shojo",  preference
                       "I love Frieren instead of Berserk",        ``opinion:genre:shojo``
                       "ホラーじゃなくてセイネンが好き"                    = dislikes, and
                                                                   ``favorite_genre`` = seinen
``name``               "my name is Ken Sato", "名前はケンです"          preference ``name``
``correction``         "No, I meant volume 3", "Actually, volume   fact tagged ``correction``
                       7 instead", "3巻じゃなくて4巻です"
``feedback``           "this recommendation was great", "you keep  feedback tagged ``praise``
                       suggesting the wrong volume", "the search   or ``complaint``, the
                       is useless", "I love your recommendations", sentence as said
                       "おすすめが最高でした", "検索が使えない"
``habit``              "I always buy the whole set", "I usually    behavioral_pattern
                       read at night", "いつもセットで買います"         ``habit: <what was said>``
=====================  ==========================================  ===========================

**Preference keys.** A key names *what* the preference is about, so a later statement about
the same thing updates it (through :meth:`~tiermem.longterm.memory.LongTermMemory.
upsert_preference`, with the old value kept in history):

* "prefer" and "my favorite <noun> is" name one favourite per category: the category comes
  from the noun ("genre", "author"…) or, for "I prefer X", from what X is (a known genre,
  language or series title, via the entity rules of :mod:`tiermem.extraction.entities`):
  ``favorite_genre``, ``preferred_language``, ``favorite_series``; a format or an edition
  ("paperback", "ebooks", "紙の本"; "first editions", "kanzenban") is ``favorite_format`` or
  ``favorite_edition``, the keys "my preferred format / edition is" writes. "I prefer
  seinen" and later "I prefer shonen" both write ``favorite_genre``; "I prefer paperback"
  and later "Actually I prefer hardcover now" both write ``favorite_format``. A noun with a
  key of its own in ``KIND_FAVORITE_KEY`` uses it: "my favorite language is Japanese" and
  「好きな言語は日本語」 write ``preferred_language``, as "I prefer Japanese" does (before
  session 15 they wrote ``favorite_language``; :mod:`tiermem.longterm.preferences` reads
  such records and supersedes them, see :data:`~tiermem.longterm.preferences.
  PREFERENCE_KEY_ALIASES`).
* "like", "love", "don't like", "hate", "苦手" give an opinion about one thing, and a user
  has opinions about many things at once: the key is ``opinion:<kind>:<canonical value>``
  for a known entity (``opinion:genre:horror`` for "horror" and "ホラー" alike) or
  ``opinion:<slug>`` for anything else, and the value is the sentiment (``loves``,
  ``likes``, ``prefers``, ``dislikes``, ``hates``). So "I don't like horror" is a key of its
  own, separate from ``favorite_genre``, and "actually I love horror now" later updates it.
* **A replaced value.** "Not X" after a value is not part of it: "Call me Kenji, not Ken"
  changes ``addressed_as`` to Kenji, "I prefer hardcover, not paperback" sets
  ``favorite_format`` (the key already replaces the old favourite). After a *liked* value
  ("like", "love", "into", "fan of", 「好き」), "not X" / "instead of X" / "no longer X" and
  「XじゃなくてYが好き」 also write ``dislikes`` to X's opinion key (rule ``contrast``), so
  "I love shojo" said before does not stay current next to "I'm into seinen now, not
  shojo anymore". X must be a known entity, a format or edition, or (English) a short
  capitalised name: "not gonna lie" and "not just shojo" are prose. A favourite or a
  preference ("my favorite genre is romance, not shojo", 「少年じゃなくて青年のほうが好き」)
  says X is not the favourite, not that it is disliked: no ``contrast`` draft. "seinen over
  shojo" and 「少年より青年」 compare; they replace nothing. When the liked value and X are
  of one category (two genres, two formats), the contrast is also a choice, as "I prefer
  seinen over shojo" is: it writes the favourite of the category (``favorite_genre`` =
  seinen, content "prefers seinen"), so a favourite shojo said before is replaced, not left
  current next to "dislikes shojo".
* **Negations** are dislikes, on the thing's opinion key: "I don't like horror", "not a fan
  of horror", "no horror" and 「ホラーは苦手」 all write ``opinion:genre:horror`` =
  ``dislikes`` (never a like), and "actually I love horror now" later sets the same key to
  ``loves`` (the dislike goes to its history). A bare "no X" counts only for a known genre,
  format or edition: "no spoilers", "no rush", "no thanks" are requests, not tastes.
* **Feedback** is about the service, never about a manga: the subject is one of its parts
  (recommendation, suggestion, search, answer, the assistant as "you", 「おすすめ」,
  「検索」…), or a like or dislike has it as object ("I love your recommendations" is
  feedback, not an opinion). "This manga was great" and 「この漫画は最高」 are not feedback;
  nor is faint or negated praise of a negative ("the search isn't bad").
* **Behavioral patterns** are habits. A habit is seen over several sessions, so one
  sentence can only honestly give one the user describes themselves: a frequency word
  ("always", "usually", "tend to", 「いつも」「普段」) with a verb of reading or buying, said
  by "I" (not "my son always buys…"), not negated, not a question or a hypothesis. Habits
  *observed* across sessions (asks for prices in yen N times) need the session summaries'
  counts and are not detected here; the type's 30-day retention lets a described habit
  lapse unless it is said again.
* Values are kept as the user wrote them ("セイネン", not "seinen"); the draft's content is
  a short English line with the words as written ("favorite genre: セイネン").

**Not detected, on purpose.**

* Questions ("do you like horror?", "ホラーは好きですか") — except polite requests to
  remember or to be called something ("could you call me Ken?").
* A request about this answer's language ("in Japanese please"): an instruction for now,
  not a lasting preference; "I prefer Japanese" is one.
* Vague objects: "I like that one", "I love it", "これが好き" say nothing that can be
  recalled later; objects that start with a pronoun or demonstrative are dropped.
* Someone else's taste: a purpose naming another person ("seinen, not shojo, for my
  daughter", 「娘に」「息子のために」), a Japanese topic that is another person
  (「妹はホラーが苦手」, 「娘の好きなジャンルは」). Someone else's name: 「娘の名前はハナです」
  ("my daughter's name is Hana") is no ``name`` of the user's.
* A comparison as a dislike: "I don't like horror as much as thrillers" ranks, it does not
  reject. And a dislike taken back by the clause after it: "I don't like horror but I love
  it", 「ホラーは苦手だけど好き」 write the like.
* Hedges as part of a value: "my favorite language is probably python" writes python (the
  hedge says how sure the user is; a tentative favourite is kept, a later statement
  replaces it).
* A hedged dislike: "I probably don't like horror", 「たぶんホラーは苦手かも」 draft nothing
  (a dislike ends a favourite and replaces a like; a doubt does neither).
* "I'd like / I would like" (a wish, not a taste), "I prefer not to…", third persons ("my
  friend likes horror"), and long objects (over 8 words or 80 characters, where a rule is
  more likely to misread than to help).
* Weak corrections: "actually" and "no, it's …" count only with something concrete (an
  entity such as a volume, or "instead" / "not" / "rather"); "No, I meant …" and
  "XじゃなくてY" always count.
* The middle of a long turn: only its first 8,000 and last 4,000 characters are read (the
  rule window, :mod:`tiermem.policies.turn_text`), where a person's own words around a
  pasted text are; "!remember" keeps the whole turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from tiermem.extraction.entities import (
    DEFAULT_ENTITY_RULES,
    DEFAULT_READER,
    EntityExtractor,
    PhraseRule,
    RuleEntityExtractor,
)
from tiermem.longterm import _detect_rules as rules
from tiermem.models.turns import Entity
from tiermem.policies.phrases import TextView, normal_form
from tiermem.policies.turn_text import TurnText, as_turn_text

__all__ = [
    "MAX_OBJECT_CHARS",
    "MAX_OBJECT_WORDS",
    "DetectedMemory",
    "MemoryDetector",
    "RuleMemoryDetector",
    "SentenceSignals",
    "clean_object",
    "detect_memories",
    "favorite_key",
    "is_question",
    "read_sentences",
    "sentence_spans",
    "split_sentences",
]

MAX_OBJECT_WORDS = 8
MAX_OBJECT_CHARS = 80
EXPLICIT_IMPORTANCE = 0.8
"""Importance of a memory the user asked for ("!remember"): above a plain fact's 0.7."""

# Rule data of corrections and categories, kept here (not in ``_detect_rules``) with the
# engine steps that read them; every one is read only after a drafting rule has matched,
# so the trigger gate of ``_detect_rules`` covers them.
_CORRECTION_LEAD = re.compile(
    r"^(?:(?:actually|no|nope|nah|sorry|oops|wait|oh|ok|okay|hmm|um|uh|correction|"
    r"make\s+that|i\s+mean)\b[,.!:;]*\s*)+"
)
"""Words a correction opens with ("Actually, call me Kenji", "No, call me Kenji"), read
before the request to be called something (which is anchored at the sentence start)."""
_NOT_TAIL = re.compile(
    r"[\s,;]*\b(?:(?:but|and)\s+)?(?:not|no\s+longer|instead\s+of|rather\s+than)\s+(?P<x>.+)$"
)
"""What follows a new value to name the one it replaces: "Kenji, not Ken", "seinen now,
not shojo anymore", "hardcover instead of paperback" (folded text)."""
_OVER = re.compile(r"\s+over\s+")
"""'I prefer <value> over <other>': the other is compared, not replaced."""
_TRAILING_CHANGE = re.compile(r"(?:\s+(?:instead|from\s+now\s+on|going\s+forward))+$")
"""Words after a new value that only say it is new ("Kenji from now on")."""
_JA_NOT = re.compile(r"(?:じゃなくて|じゃなく|ではなくて|ではなく)")
"""「XじゃなくてY」: X is the value replaced (not 「より」, which compares)."""
_CONTRAST_WORDS = 4
"""At most this many words in an English "not X" with no known entity in it (a name:
"not Berserk"); longer, or in lower case, it is read as prose ("not gonna lie")."""
_CATEGORY_FAVORITE_KEY = {"format": "favorite_format", "edition": "favorite_edition"}
"""The keys "my favorite (or preferred) format / edition is" writes, for "I prefer" too."""
_CATEGORY_VALUES: dict[str, tuple[str, str]] = {
    written: (category, canonical)
    for category, canonical, forms in (
        ("format", "paperback", "paperback paperbacks softcover softcovers soft_cover "
         "paper_back"),
        ("format", "hardcover", "hardcover hardcovers hardback hardbacks hard_cover"),
        ("format", "digital", "digital ebook ebooks e-book e-books kindle electronic "
         "電子書籍 電子版 電子"),
        ("format", "print", "print printed physical paper 紙 紙の本 紙版"),
        ("format", "audiobook", "audiobook audiobooks"),
        ("edition", "tankobon", "tankobon tankoubon tankobon_edition 単行本"),
        ("edition", "bunko", "bunko bunko_edition 文庫 文庫本 文庫版"),
        ("edition", "omnibus", "omnibus omnibuses omnibus_edition omnibus_editions"),
        ("edition", "first edition", "first_edition first_editions 1st_edition "
         "1st_editions 初版"),
        ("edition", "limited edition", "limited_edition limited_editions 限定版"),
        ("edition", "special edition", "special_edition special_editions deluxe_edition "
         "deluxe_editions collector's_edition collector's_editions collectors_edition "
         "collectors_editions 特装版 愛蔵版"),
        ("edition", "standard edition", "standard_edition standard_editions "
         "regular_edition regular_editions 通常版"),
        ("edition", "kanzenban", "kanzenban kanzenban_edition 完全版"),
    )
    for written in (f.replace("_", " ") for f in forms.split())
}  # fmt: skip
"""Formats and editions a preference can name (folded, as written → category and canonical
value): "I prefer paperback" and later "I prefer hardcover" both write
``favorite_format``, and "I love paperbacks" is ``opinion:format:paperback``."""
_CATEGORY_SUFFIX = frozenset({
    "copies", "copy", "version", "versions", "format", "formats", "book", "books", "volumes",
    "volume", "manga", "editions", "edition", "ones", "translation", "translations",
})  # fmt: skip
"""Words after a format, edition or language that do not change it ("paperback copies",
"the Japanese edition")."""


@dataclass(frozen=True, slots=True)
class DetectedMemory:
    """A draft memory found in a turn; :meth:`LongTermMemory.remember_detected` writes it.

    Preferences carry ``key`` and ``value`` (written with ``upsert_preference``, ``content``
    as the display text); other drafts are remembered by ``content``.
    """

    memory_type: str
    content: str
    reason: str
    """The rule that fired: command, remember_request, favorite, prefer, like, dislike,
    addressed_as, name, correction, contrast, feedback, habit."""
    importance: float | None = None
    """None: the memory type's default."""
    key: str | None = None
    value: str | None = None
    explicit: bool = False
    """The user asked for it to be remembered (provenance source ``explicit``, not ``auto``)."""
    tags: tuple[str, ...] = ()


class MemoryDetector(Protocol):
    """Finds memories in a user's text. Implementations are pure, fast (they run on every
    user turn) and safe to call from several threads.

    ``text`` is a plain string or a turn's :class:`~tiermem.policies.turn_text.TurnText`;
    :func:`~tiermem.policies.turn_text.as_turn_text` turns either into the latter. Rule
    engines read what the speaker wrote (``text.said``, the rule window).
    """

    def detect(self, text: str | TurnText) -> tuple[DetectedMemory, ...]:
        """The drafts in ``text``, in order, each key (or content) once."""
        ...


# ---------------------------------------------------------------- sentences


def sentence_spans(normal: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence of ``normal`` (text in
    :func:`~tiermem.policies.phrases.normal_form`), with its end mark and without the
    whitespace around it. A "." after an abbreviation ("vol. 42"), inside a number ("3.5")
    or inside a word ("ken@example.com") does not end a sentence, nor does a mark followed
    by a comma ("I meant Blame!, not Berserk")."""
    pieces = [m for m in rules.PIECE.finditer(normal) if m.end() > m.start()]
    spans: list[tuple[int, int]] = []
    start = 0
    for index, match in enumerate(pieces):
        piece = match.group()
        following = pieces[index + 1].group() if index + 1 < len(pieces) else ""
        if piece[-1:] in ".!?" and following[:1] in (",", ";"):
            continue
        if piece.endswith(".") and not piece.endswith(".."):
            words = piece[:-1].split()
            last = words[-1].lower() if words else ""
            initial = len(last) == 1 and last.isalpha()  # "J. K. Rowling", "e.g."
            decimal = last[-1:].isdigit() and following[:1].isdigit()  # "3.5"
            attached = bool(words) and piece[-2:-1].isalnum() and following[:1].isalnum()
            if last in rules.ABBREVIATIONS or initial or decimal or attached:
                continue
        _add_stripped(spans, normal, start, match.end())
        start = match.end()
    _add_stripped(spans, normal, start, len(normal))
    return spans


def _add_stripped(spans: list[tuple[int, int]], text: str, start: int, end: int) -> None:
    part = text[start:end]
    kept = part.strip()
    if kept:
        begin = start + len(part) - len(part.lstrip())
        spans.append((begin, begin + len(kept)))


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (NFKC), each with its end mark; see :func:`sentence_spans`."""
    normal = normal_form(text)
    return [normal[start:end] for start, end in sentence_spans(normal)]


# ---------------------------------------------------------------- shared pieces


def _clauses(folded: str, *, japanese: bool) -> list[tuple[int, int]]:
    """``(start, end)`` of the clauses of a sentence: "I like horror but I hate romance"
    holds two statements."""
    spans, start = [], 0
    for match in (rules.JA_CLAUSE if japanese else rules.EN_CLAUSE).finditer(folded):
        spans.append((start, match.start()))
        start = match.end()
    spans.append((start, len(folded)))
    return [(s, e) for s, e in spans if e > s]


def is_question(sentence: str) -> bool:
    """``sentence`` (normal form) asks something: it ends with "?" or a Japanese question
    ending. Statements of fact and preference are not read from questions."""
    return _is_question(sentence)


def _is_question(sentence: str) -> bool:
    s = sentence.rstrip(rules.QUESTION_TRAIL)
    return s.endswith(rules.QUESTION_MARKS) or s.endswith(rules.JA_QUESTION_ENDS)


def _words(text: str) -> list[str]:
    return text.split()


def _clean_en_object(raw: str) -> str | None:
    """The object phrase of an English statement, or None if it is vague or too long."""
    cut = rules.EN_CUT.search(raw)
    obj = raw[: cut.start()] if cut else raw
    obj = rules.EN_TRAILING_FILLER.sub("", obj.strip(rules.END_PUNCT)).strip(rules.END_PUNCT)
    obj = obj[hedge.end() :] if (hedge := rules.EN_HEDGE_LEAD.match(obj)) else obj
    if not obj:
        return None
    head_words = _words(rules.ARTICLES.sub("", obj).lower())
    if not head_words or head_words[0].strip(rules.END_PUNCT) in rules.VAGUE_HEADS:
        return None
    if len(_words(obj)) > MAX_OBJECT_WORDS or len(obj) > MAX_OBJECT_CHARS:
        return None
    return obj


def _clean_en_value(raw: str) -> str | None:
    """:func:`_clean_en_object` of a stated value, without the words that only say it is
    new ("Kenji from now on", "hardcover now instead"). The slot rules of summaries keep
    :func:`clean_object` as it is."""
    obj = _clean_en_object(raw)
    if obj is None or _TRAILING_CHANGE.search(obj) is None:
        return obj
    obj = _TRAILING_CHANGE.sub("", obj)
    return rules.EN_TRAILING_FILLER.sub("", obj).strip(rules.END_PUNCT) or None


def clean_object(raw: str) -> str | None:
    """The object phrase of an English statement ("¥8,000 by the way" → "¥8,000"), or None
    when it is vague ("it", "that one") or too long; the clean-up the preference rules use,
    shared with the slot rules of :mod:`tiermem.summaries.structured`."""
    return _clean_en_object(raw)


def favorite_key(noun: str) -> str:
    """The preference key of "my favorite <noun>" (``favorite_genre``, ``favorite_author``
    for "writer" too), as the ``favorite`` rule writes it; for slot rules that read the
    same preference said another way ("Inoue is my favorite author")."""
    return _favorite_noun_key(_noun_key(noun)[0])


def _favorite_noun_key(noun_key: str) -> str:
    """The favourite's key of a canonical noun: ``KIND_FAVORITE_KEY`` where it has one
    ("language" → ``preferred_language``, the key "I prefer Japanese" writes, so the two
    statements update one key), else ``favorite_<noun>``."""
    return rules.KIND_FAVORITE_KEY.get(noun_key) or f"favorite_{noun_key}"


def _clean_ja_object(raw: str) -> str | None:
    """The object phrase of a Japanese statement, or None if it is vague or too long."""
    obj = rules.JA_OBJECT_SPLIT.split(raw)[-1]
    for contrast in rules.JA_CONTRASTS:
        if contrast in obj:
            obj = obj.rsplit(contrast, 1)[1]
    previous = None
    while previous != obj:
        previous = obj
        obj = rules.JA_LEAD.sub("", obj.strip(rules.END_PUNCT))
    obj = obj.strip(rules.END_PUNCT)
    if not obj or rules.JA_VAGUE.match(obj) or len(obj) > MAX_OBJECT_CHARS // 2:
        return None
    return obj


def _slug(text: str) -> str:
    """A stable key part: NFKC, lower case, articles dropped, non-word runs as ``_``."""
    folded = rules.ARTICLES.sub("", normal_form(text).strip()).casefold()
    return rules.SLUG.sub("_", folded).strip("_")


def _noun_key(noun: str) -> tuple[str, str]:
    """(key part, readable noun) of "my favorite <noun>"."""
    noun = " ".join(noun.split())
    canonical = rules.NOUNS.get(noun.lower()) or rules.NOUNS.get(noun)
    if canonical:
        return canonical, canonical
    return _slug(noun), noun.lower()


def _split_replaced(normal: str, folded: str) -> tuple[str, str | None]:
    """(the new value's part, the replaced value's part or None) of an English object
    phrase: "Kenji, not Ken" → ("Kenji", "Ken"). A "not" after a clause break is not about
    the value ("Berserk because it's not boring"): (``normal``, None)."""
    found = _NOT_TAIL.search(folded)
    if found is None:
        return normal, None
    head = normal[: found.start()]
    if rules.EN_CUT.search(head):
        return normal, None
    return head, normal[found.start("x") :]


# ---------------------------------------------------------------- the detector


class RuleMemoryDetector:
    """Finds preferences, corrections, requests to remember, feedback and described habits,
    with rules (see the module docstring for the table and for what is left out on
    purpose).

    ``known_titles`` (alias → canonical title, as for
    :class:`~tiermem.extraction.entities.RuleEntityExtractor`) lets "I prefer Berserk"
    become ``favorite_series``. Raises :class:`~tiermem.errors.ValidationError` for an
    empty title.
    """

    def __init__(self, known_titles: Mapping[str, str] | None = None) -> None:
        phrase_rules = [r for r in DEFAULT_ENTITY_RULES if isinstance(r, PhraseRule)]
        if known_titles:
            phrase_rules.append(PhraseRule("series", known_titles))
        self._kinds: tuple[PhraseRule, ...] = tuple(
            r for r in phrase_rules if r.kind in rules.KIND_FAVORITE_KEY
        )
        self._entities = RuleEntityExtractor(known_titles)

    # -- public ---------------------------------------------------------------------------

    def detect(self, text: str | TurnText) -> tuple[DetectedMemory, ...]:
        """The memory drafts in one user turn's text, in order, each key or content once.

        Reads the rule window of what the user wrote (its first 8,000 and last 4,000
        characters, see :mod:`tiermem.policies.turn_text`); "!remember" keeps the whole
        turn after the command.
        """
        turn = as_turn_text(text)
        command = rules.COMMAND.match(turn.said_text)
        if command:
            content = command.group("x").strip()
            return (self._explicit(content, "command"),) if content else ()
        said = turn.said
        if rules.DRAFT_TRIGGERS.search(said.folded) is None:
            return ()  # no rule can match: "Hello!", "ok thanks", most questions
        # A turn opened by feedback or habit words alone ("do you have it?", a pasted
        # email's "reply") skips the other rules, which cannot match in it.
        preferences = rules.PREFERENCE_TRIGGERS.search(said.folded) is not None
        return self._sentences(said, preferences=preferences)

    def _sentences(self, said: TextView, *, preferences: bool = True) -> tuple[DetectedMemory, ...]:
        """The drafts of every sentence of ``said``: the rules, without the trigger gate
        (and without the rules other than feedback and habits if not ``preferences``)."""
        found: list[DetectedMemory] = []
        for start, end in sentence_spans(said.normal):
            found.extend(self._sentence(said.slice(start, end), preferences=preferences))
        return _unique(found)

    # -- per sentence -------------------------------------------------------------------

    def _sentence(self, view: TextView, *, preferences: bool = True) -> list[DetectedMemory]:
        normal, folded = view.normal, view.folded
        if preferences:
            explicit = self._remember_request(normal, folded)
            if explicit is not None:
                return [explicit]
            polite_name = self._addressed_as(normal, folded)
            if polite_name is not None:
                return [polite_name]  # "could you call me Ken?" is a request, not a question
        if _is_question(normal):
            return []
        drafts: list[DetectedMemory] = []
        japanese = bool(rules.CJK.search(normal))
        previous: list[DetectedMemory] = []
        last_end = 0
        for start, end in _clauses(folded, japanese=japanese) if preferences else ():
            if previous and (
                sentiment := _taken_back(
                    folded[last_end:start], normal[start:end], folded[start:end], japanese=japanese
                )
            ):
                drafts += [_reversed(d, sentiment) for d in previous]
                previous = []
            else:
                drafts += previous
                if japanese:
                    previous = self._japanese_preferences(normal[start:end])
                else:
                    previous = self._english_preferences(normal[start:end], folded[start:end])
            last_end = end
        drafts += previous
        if rules.FEEDBACK_OR_HABIT.search(folded):
            if (feedback := _feedback(normal, folded, japanese=japanese)) is not None:
                drafts.append(feedback)
            if (habit := _habit(normal, folded, japanese=japanese)) is not None:
                drafts.append(habit)
        if drafts or not preferences:
            return drafts
        correction = self._correction(normal, folded)
        return [correction] if correction is not None else []

    def _explicit(self, content: str, reason: str) -> DetectedMemory:
        return DetectedMemory(
            memory_type="fact",
            content=content,
            reason=reason,
            importance=EXPLICIT_IMPORTANCE,
            explicit=True,
        )

    def _remember_request(self, normal: str, folded: str) -> DetectedMemory | None:
        match = rules.EN_REMEMBER.match(folded)
        if match:
            raw = normal[match.start("x") :].strip()
            raw = rules.TRAILING_PLEASE.sub("", raw).rstrip(" ?!")
            words = _words(rules.ARTICLES.sub("", raw).lower())
            if not words or words[0].strip(rules.END_PUNCT) in rules.VAGUE_HEADS:
                return None
            return self._explicit(raw, "remember_request")
        match = rules.JA_REMEMBER.match(normal)
        if match:
            for part in (match.group("pre"), match.group("post")):
                content = part.strip(rules.END_PUNCT)
                if content and not rules.JA_VAGUE.match(content):
                    return self._explicit(content, "remember_request")
        return None

    def _addressed_as(self, normal: str, folded: str) -> DetectedMemory | None:
        match = None
        if "call" in folded:
            # "Actually, call me Kenji", "No, call me Kenji, not Ken": a correction's
            # opening words, then the request.
            lead = _CORRECTION_LEAD.match(folded)
            skip = lead.end() if lead else 0
            match = rules.EN_CALL_ME.match(folded[skip:])
        if match:
            start = skip + match.start("obj")
            raw, _ = _split_replaced(normal[start:], folded[start:])
            obj = _clean_en_value(rules.PLEASE_AND_AFTER.sub("", raw))
            # Names are capitalised: "call me later" and "call me back" are not names.
            if obj is None or len(_words(obj)) > 3:
                return None
            if not (obj[0].isupper() or rules.CJK.match(obj)):
                return None
            return _preference("addressed_as", obj, f"wants to be called {obj}", "addressed_as")
        match = rules.JA_CALL_ME.search(normal)
        if match and not rules.JA_DO_NOT_CALL.search(normal):
            obj = _clean_ja_object(match.group("obj"))
            if obj is not None:
                return _preference("addressed_as", obj, f"wants to be called {obj}", "addressed_as")
        return None

    def _english_preferences(self, normal: str, folded: str) -> list[DetectedMemory]:
        replaced: str | None = None

        def obj_of(match: re.Match[str]) -> str | None:
            # The value the user names as replaced ("seinen now, not shojo") is kept
            # apart, for the positive rules to mark it (:meth:`_replaced_en`).
            nonlocal replaced
            start, end = match.span("obj")
            head, replaced = _split_replaced(normal[start:end], folded[start:end])
            return _clean_en_value(head)

        def disliked(
            match: re.Match[str], obj: str, sentiment: str = "dislikes"
        ) -> list[DetectedMemory]:
            # A hedged dislike drafts nothing: it would end a favourite, or replace a like
            # of the thing (one opinion key), on a doubt. The hedge must be the dislike's:
            # up to its object's end, or alone after it ("I don't like horror, maybe"); in
            # a clause of its own ("…, it might scare me", "it might rain, but honestly I
            # don't like horror") it hedges that clause.
            if rules.EN_HEDGE.search(folded):
                cut = rules.EN_CUT.search(folded, match.start("obj"))
                end = cut.start() if cut else len(folded)
                begin = _scope_start(rules.EN_HEDGE_SCOPE, folded, match.start())
                if rules.EN_HEDGE.search(folded, begin, end) or rules.EN_HEDGE_AFTER.match(
                    folded, end
                ):
                    return []
            return self._opinions(obj, sentiment, "dislike")

        if match := rules.EN_NAME.search(folded):
            obj = obj_of(match)
            if (
                obj is not None
                and len(_words(obj)) <= 4
                and not rules.EN_NEGATED.search(folded[: match.start()])
            ):
                return [_preference("name", obj, f"name: {obj}", "name")]
            return []
        if ("for " in folded or "as a" in folded) and rules.EN_FOR_OTHER.search(folded):
            return []  # "seinen, not shojo, for my daughter": their taste, or a gift
        if match := rules.EN_FAVORITE.search(folded):
            obj = obj_of(match)
            if obj is None:
                return []
            noun = match.group("noun")
            if noun:
                key, readable = _noun_key(noun)
                favorite = _favorite_noun_key(key)
                return [_preference(favorite, obj, f"favorite {readable}: {obj}", "favorite")]
            return self._favorite_by_kind(obj, reason="favorite", text=f"favorite: {obj}")
        if match := rules.EN_PREFER.search(folded):
            start, end = match.span("obj")
            if over := _OVER.search(folded, start, end):  # "seinen over shojo": a comparison
                end = over.start()
            obj = _clean_en_value(_split_replaced(normal[start:end], folded[start:end])[0])
            if obj is None or obj.lower().startswith(("not ", "to not", "not to")):
                return []
            return self._favorite_by_kind(obj, reason="prefer", text=f"prefers {obj}")
        if (match := rules.EN_NEG_LIKE.search(folded)) and not rules.EN_REPORTED.search(
            folded, 0, match.start()
        ):
            if rules.EN_AS_MUCH.search(folded, match.start("obj")):
                return []  # "I don't like horror as much as thrillers": a ranking
            obj = obj_of(match)
            if obj is not None and _is_service(obj):  # "I don't like your suggestions"
                return _as_feedback(normal, "complaint")
            return disliked(match, obj) if obj else []
        if (match := rules.EN_HATE.search(folded)) and not rules.EN_REPORTED.search(
            folded, 0, match.start()
        ):
            obj = obj_of(match)
            if obj is not None and _is_service(obj):
                return _as_feedback(normal, "complaint")
            verb = " ".join(match.group("verb").split())
            return disliked(match, obj, rules.SENTIMENT_WORDS[verb]) if obj else []
        if match := rules.EN_NOT_FAN.match(folded):
            obj = obj_of(match)
            return disliked(match, obj) if obj else []
        if folded.startswith("no") and (match := rules.EN_NO_THING.match(folded)):
            # "no horror": only a known genre, format or edition, so "no spoilers" or "no
            # rush" (a request for now, not a taste) draft nothing.
            obj = obj_of(match)
            if obj is None or not (self._known(obj) or self._category(obj)):
                return []
            return disliked(match, obj)
        if match := rules.EN_FAN.search(folded):
            obj = obj_of(match)
            negative = bool(match.group("neg")) != bool(match.group("tired"))
            if obj is None:
                return []
            if negative:
                return disliked(match, obj)
            return self._opinions(obj, "likes", "like") + self._replaced_en(obj, replaced)
        if (match := rules.EN_LIKE.search(folded)) and not rules.EN_NEGATED.search(
            folded[max(0, match.start() - 12) : match.start()]
        ):
            obj = obj_of(match)
            sentiment = rules.SENTIMENT_WORDS[match.group("verb")]
            if obj is None:
                return []
            if _is_service(obj):  # "I love your recommendations"
                return _as_feedback(normal, "praise")
            return self._opinions(obj, sentiment, "like") + self._replaced_en(obj, replaced)
        return []

    def _japanese_preferences(self, normal: str) -> list[DetectedMemory]:
        body = normal.strip(rules.END_PUNCT)
        if match := rules.JA_FAVORITE.search(body):
            if _not_mine(body, match.start()):
                return []
            obj = _clean_ja_object(rules.JA_END.sub("", match.group("obj").strip(rules.END_PUNCT)))
            if obj is None:
                return []
            key, readable = _noun_key(match.group("noun"))
            favorite = _favorite_noun_key(key)
            return [_preference(favorite, obj, f"favorite {readable}: {obj}", "favorite")]
        if (
            "名前は" in body  # JA_NAME's gate, before a call per clause
            and (mine := _own_name_at(body)) is not None
            and (match := rules.JA_NAME.search(body[mine:]))
        ):
            obj = _ja_name(match.group("obj"))
            return [_preference("name", obj, f"name: {obj}", "name")] if obj else []
        if match := rules.JA_PREFER.search(body):
            if _not_mine(body, match.end()):
                return []
            obj = _clean_ja_object(match.group("obj"))
            if obj is None:
                return []
            return self._favorite_by_kind(obj, reason="prefer", text=f"prefers {obj}")
        if match := rules.JA_NEG_LIKE.search(body):
            if _not_mine(body, match.end()):
                return []
            obj = _clean_ja_object(match.group("obj"))
            if _ja_hedged(body, match.end()):
                return []  # a hedged dislike (as in English)
            return self._opinions(obj, "dislikes", "dislike") if obj else []
        if match := rules.JA_DISLIKE.search(body):
            if _not_mine(body, match.end()) or _ja_hedged(body, match.end()):
                return []
            obj = _clean_ja_object(match.group("obj") or match.group("bare"))
            sentiment = rules.JA_SENTIMENT[match.group("verb")]
            return self._opinions(obj, sentiment, "dislike") if obj else []
        if match := rules.JA_LIKE.search(body):
            if _not_mine(body, match.end()):
                return []
            raw = match.group("obj") or match.group("bare")
            obj = _clean_ja_object(raw)
            sentiment = rules.JA_SENTIMENT[match.group("verb")]
            if obj is None:
                return []
            return self._opinions(obj, sentiment, "like") + self._replaced_ja(obj, raw)
        return []

    def _correction(self, normal: str, folded: str) -> DetectedMemory | None:
        strong = rules.EN_STRONG_CORRECTION.match(folded)
        weak = None if strong else rules.EN_WEAK_CORRECTION.match(folded)
        ja_contrast = rules.JA_CONTRAST.search(normal) if rules.CJK.search(normal) else None
        ja_weak = rules.JA_WEAK_CORRECTION.match(normal)
        if strong:
            obj = _clean_en_object(normal[strong.start("x") :])
            if obj is None:
                return None
        elif weak or ja_weak:
            concrete = bool(self._entities.extract(normal)) or bool(rules.CONTRAST.search(folded))
            if not concrete:
                return None
        elif ja_contrast is None or not ja_contrast.group("a").strip(rules.END_PUNCT):
            return None
        said = rules.INTERJECTION.sub("", normal).strip()
        if len(said) > 4 * MAX_OBJECT_CHARS:
            return None
        return DetectedMemory(
            memory_type="fact",
            content=f"Correction: {said}",
            reason="correction",
            tags=("correction",),
        )

    # -- keys ---------------------------------------------------------------------------

    def _known(self, obj: str) -> list[tuple[str, str, str]]:
        """``(kind, canonical value, as written)`` of known entities that make up ``obj``
        (nothing else in it but filler words), else []."""
        view = TextView(obj)
        spans: list[tuple[int, int, str, str]] = []
        for rule in self._kinds:
            for start, end, value in rule.find(view):
                spans.append((start, end, rule.kind, value))
        if not spans:
            return []
        spans.sort()
        rest = view.folded
        for start, end, _, _ in spans:
            rest = rest[:start] + " " * (end - start) + rest[end:]
        words = rules.LEFTOVER_SPLIT.split(rest)
        if any(w and w not in rules.FILLER_WORDS for w in words):
            return []
        return [(kind, value, view.normal[start:end]) for start, end, kind, value in spans]

    def _category(self, obj: str) -> tuple[str, str] | None:
        """``(category, canonical value)`` of a format or an edition ("paperback copies" →
        format, paperback), or of one known entity followed by words that do not change it
        ("the Japanese edition" → language, japanese); else None."""
        words = rules.ARTICLES.sub("", obj.strip(rules.END_PUNCT)).lower().split()
        for end in range(len(words), 0, -1):
            phrase = " ".join(words[:end])
            if found := _CATEGORY_VALUES.get(phrase):
                return found
            if end < len(words):
                known = self._known(phrase)
                if len(known) == 1:
                    kind, value, _ = known[0]
                    return kind, value
            if words[end - 1] not in _CATEGORY_SUFFIX:
                return None
        return None

    def _favorite_by_kind(self, obj: str, *, reason: str, text: str) -> list[DetectedMemory]:
        key = self._favorite_key_of(obj)
        if key is not None:
            return [_preference(key, obj, text, reason)]
        return self._opinions(obj, "prefers", reason)

    def _replaced_en(self, liked: str, replaced: str | None) -> list[DetectedMemory]:
        """The opinion drafts that mark a value the user replaced ("seinen now, not shojo
        anymore" → ``dislikes shojo``), so it does not stay a positive preference next to
        the new one, and the favourite of their category when both values have the same
        one (:meth:`_chosen`). Only a known entity, a format or edition, or a short
        capitalised name counts; "not gonna lie" or "not just shojo" is prose, not a
        value."""
        if replaced is None:
            return []
        obj = _clean_en_value(replaced)
        if obj is None:
            return []
        if not (
            self._known(obj)
            or self._category(obj)
            or (obj[0].isupper() and len(_words(obj)) <= _CONTRAST_WORDS)
        ):
            return []
        return self._chosen(liked, obj) + self._opinions(obj, "dislikes", "contrast")

    def _replaced_ja(self, liked: str, raw: str) -> list[DetectedMemory]:
        """:meth:`_replaced_en` of 「XじゃなくてYが好き」: X, if it is a known entity, a
        format or an edition."""
        parts = _JA_NOT.split(raw)
        if len(parts) < 2:
            return []
        obj = _clean_ja_object(parts[-2])
        if obj is None or not (self._known(obj) or self._category(obj)):
            return []
        return self._chosen(liked, obj) + self._opinions(obj, "dislikes", "contrast")

    def _chosen(self, liked: str, replaced: str) -> list[DetectedMemory]:
        """The favourite a contrast names: "I'm into seinen, not shojo" chooses seinen over
        shojo, as "I prefer seinen over shojo" does (seed 000's ``favorite_genre: seinen``),
        so it replaces a favourite shojo said before. Only when both values are of one
        category (two genres, two formats); "I love Frieren, not Berserk" without a title
        catalogue names no category, and chooses nothing."""
        key = self._favorite_key_of(liked)
        if key is None or key != self._favorite_key_of(replaced):
            return []
        return [_preference(key, liked, f"prefers {liked}", "contrast")]

    def _favorite_key_of(self, obj: str) -> str | None:
        """The favourite key of ``obj``'s category (``favorite_genre`` for "seinen" and
        "seinen and josei", ``favorite_format`` for "ebooks"), or None."""
        known = self._known(obj)
        kinds = {kind for kind, _, _ in known}
        if len(kinds) == 1:
            return rules.KIND_FAVORITE_KEY[kinds.pop()]
        if not known and (category := self._category(obj)) is not None:
            return _CATEGORY_FAVORITE_KEY.get(category[0]) or rules.KIND_FAVORITE_KEY[category[0]]
        return None

    def _opinions(self, obj: str, sentiment: str, reason: str) -> list[DetectedMemory]:
        known = self._known(obj)
        if known:
            return [
                _preference(
                    f"opinion:{kind}:{_slug(value)}", sentiment, f"{sentiment} {written}", reason
                )
                for kind, value, written in known
            ]
        if (category := self._category(obj)) is not None:
            kind, value = category
            key = f"opinion:{kind}:{_slug(value)}"
            return [_preference(key, sentiment, f"{sentiment} {obj}", reason)]
        slug = _slug(obj)
        if not slug:
            return []
        return [_preference(f"opinion:{slug}", sentiment, f"{sentiment} {obj}", reason)]


def _ja_name(said: str) -> str | None:
    """The name in what follows 「名前は」: its first part up to a comma, without the
    copula and sentence-final particles (「ハナです、よろしく」: ハナ; the last part, as an
    object is read, gave よろしく; 「田中だよ」: 田中), the first that is not empty
    (「私の名前は、ハナです」); None when it says there is no name (「まだない」, 「秘密です」)."""
    for part in rules.JA_OBJECT_SPLIT.split(said):
        if part.strip(rules.END_PUNCT):
            # JA_NAME again on the part alone: its copula (です, といいます) now ends it.
            named = rules.JA_NAME.regex.match("名前は" + part.strip())
            if named is None:
                return None
            name = _clean_ja_object(rules.JA_NAME_END.sub("", named.group("obj")))
            # 「名前はまだない」, 「秘密です」: no name, or none to tell.
            return None if name is None or rules.JA_NO_NAME.search(name) else name
    return None


def _ja_hedged(body: str, verb_end: int) -> bool:
    """A hedge on the dislike whose verb ends at ``verb_end``: before it
    (「たぶんホラーは苦手」) or right after it (「苦手かもしれない」); not in a clause of its
    own (「ホラーは嫌い、怖いかも」, 「雨かもしれないが、ホラーは苦手」) nor inside a word
    (「かもめも苦手」)."""
    if rules.JA_HEDGE_AFTER.match(body, verb_end):
        return True
    if rules.JA_HEDGE.search(body, 0, verb_end) is None:
        return False
    begin = _scope_start(rules.JA_HEDGE_SCOPE, body, verb_end)
    return rules.JA_HEDGE.search(body, begin, verb_end) is not None


def _scope_start(breaks: re.Pattern[str], text: str, at: int) -> int:
    """Where the clause holding ``at`` starts: after the last clause break before ``at``
    (0 without one). A hedge before it is another clause's."""
    start = 0
    for found in breaks.finditer(text, 0, at):
        start = found.end()
    return start


def _own_name_at(body: str) -> int | None:
    """Where the user's own 「名前は」 starts in ``body`` (at its first person: 「私の名前は」,
    or bare: 「名前は」), or None: every 「…の名前は」 there names someone else
    (「娘の名前はハナです」, 「夫の名前はケンです」; :data:`~tiermem.longterm._detect_rules.
    JA_NAME_OWNER`), as does a bare one right after someone else as the topic
    (「娘、名前はハナです」: :data:`~tiermem.longterm._detect_rules.JA_NAME_TOPIC`)."""
    at = body.find("名前は")
    while at >= 0:
        owner = rules.JA_NAME_OWNER.search(body, 0, at)
        if owner is None:
            if rules.JA_NAME_TOPIC.search(body, 0, at) is None:
                return at
            at = body.find("名前は", at + 3)  # 「娘、名前は」: the daughter's
            continue
        said = owner.group("owner")
        if said.endswith(rules.JA_FIRST_PERSON):
            person = max(said.rfind(p) for p in rules.JA_FIRST_PERSON if said.endswith(p))
            return owner.start() + person
        at = body.find("名前は", at + 3)
    return None


def _not_mine(body: str, end: int) -> bool:
    """Someone else comes before a Japanese preference's verb (``body[:end]``): the topic
    (「妹はホラーが苦手」), the one it is for (「娘にセイネンが好き」), or whose favourite
    (「娘の好きなジャンルは」): not the user's taste (:data:`~tiermem.longterm.
    _detect_rules.JA_NOT_MINE`)."""
    return rules.JA_NOT_MINE.search(body, 0, end) is not None


def _is_service(obj: str) -> bool:
    """``obj`` names the service ("your recommendations", "the search"), not a thing."""
    return rules.SERVICE_OBJECT.match(obj.lower()) is not None


def _feedback(normal: str, folded: str, *, japanese: bool) -> DetectedMemory | None:
    """A ``feedback`` draft of praise or a complaint about the service in one sentence
    (not a question), tagged ``praise`` or ``complaint``; None if it holds none. A like or
    dislike of the service ("I love your recommendations") is read by the preference rules,
    which see its object (:func:`_is_service`)."""
    kind: str | None = None
    if japanese:
        if match := rules.JA_FEEDBACK.search(normal):
            kind = "praise" if match.group("praise") else "complaint"
        elif rules.JA_FEEDBACK_AGAIN.search(normal):
            kind = "complaint"
    elif match := rules.EN_FEEDBACK_SERVICE.search(folded):
        praise = bool(match.group("praise"))
        if match.group("neg"):
            if not praise:
                return None  # "the search isn't bad": faint praise, read as nothing
            praise = False
        kind = "praise" if praise else "complaint"
    elif match := rules.EN_FEEDBACK_EXCLAIM.match(folded):
        kind = "praise" if match.group("praise") else "complaint"
    elif rules.EN_FEEDBACK_THANKS.match(folded):
        kind = "praise"
    elif match := rules.EN_FEEDBACK_YOU.search(folded):
        kind = "praise" if match.group("good") else "complaint"
    if kind is None or rules.EN_HYPOTHETICAL.match(folded):
        return None
    drafts = _as_feedback(normal, kind)
    return drafts[0] if drafts else None


def _as_feedback(normal: str, kind: str) -> list[DetectedMemory]:
    """The ``feedback`` draft of ``kind`` (praise or complaint) for a sentence or clause;
    none for one too long to be a remark (a pasted text)."""
    said = rules.INTERJECTION.sub("", normal).strip()
    if len(said) > 4 * MAX_OBJECT_CHARS:
        return []
    return [
        DetectedMemory(
            memory_type="feedback",
            content=f"feedback ({kind}): {said}",
            reason="feedback",
            tags=("feedback", kind),
        )
    ]


def _habit(normal: str, folded: str, *, japanese: bool) -> DetectedMemory | None:
    """A ``behavioral_pattern`` draft of a habit the user describes in one sentence ("I
    always buy the whole set", 「普段は夜に読みます」); None if it describes none."""
    if japanese:
        match = rules.JA_HABIT.search(normal)
        if match is None or rules.JA_OTHER_PERSON.search(normal, 0, match.start()):
            return None
        said = normal[match.start() :].strip(rules.END_PUNCT)
    else:
        match = rules.EN_HABIT.search(folded)
        if match is None or rules.EN_HYPOTHETICAL.match(folded):
            return None
        rest = _words(match.group("rest"))
        if len(rest) == 1 and rest[0].strip(rules.END_PUNCT) in rules.VAGUE_HEADS:
            return None  # "I always read it": nothing to recall later
        said = normal[match.start() :].strip(rules.END_PUNCT)
    if len(said) > 2 * MAX_OBJECT_CHARS:
        return None
    return DetectedMemory(
        memory_type="behavioral_pattern",
        content=f"habit: {said}",
        reason="habit",
        tags=("habit",),
    )


def _taken_back(between: str, normal: str, folded: str, *, japanese: bool) -> str | None:
    """The sentiment of a clause that takes back the dislike before it ("I don't like
    horror but I love it", 「ホラーは苦手だけど好き」: the like is the last word, and
    wins), or None. Only after a contrastive break (but, though, けど, でも), and only a
    like with no object of its own (one with an object is read as a statement of its
    own)."""
    if japanese:
        match = rules.JA_BARE_LIKE.match(normal.strip(rules.END_PUNCT))
        return rules.JA_SENTIMENT[match.group("verb")] if match else None
    if not rules.EN_CONTRASTIVE.search(between):
        return None
    match = rules.EN_BUT_LIKE_IT.match(folded)
    return rules.SENTIMENT_WORDS[match.group("verb")] if match else None


def _reversed(draft: DetectedMemory, sentiment: str) -> DetectedMemory:
    """``draft`` with a dislike turned into ``sentiment`` (a like), on the same key."""
    if draft.value not in DISLIKES or draft.key is None or not draft.key.startswith("opinion:"):
        return draft
    written = draft.content.split(" ", 1)[1]
    return replace(draft, value=sentiment, content=f"{sentiment} {written}", reason="like")


def _preference(key: str, value: str, content: str, reason: str) -> DetectedMemory:
    return DetectedMemory(
        memory_type="preference", content=content, reason=reason, key=key, value=value
    )


def _unique(drafts: Iterable[DetectedMemory]) -> tuple[DetectedMemory, ...]:
    """Each key (or content) once; a later statement of the same key wins, in its place."""
    by_identity: dict[str, DetectedMemory] = {}
    for draft in drafts:
        identity = f"k:{draft.key}" if draft.key else f"c:{draft.content.casefold()}"
        by_identity.pop(identity, None)
        by_identity[identity] = draft
    return tuple(by_identity.values())


_DEFAULT_DETECTOR = RuleMemoryDetector()


DISLIKES = frozenset({"dislikes", "hates"})
"""The values of an opinion key that say the user does not like the thing."""


def favorite_key_of_kind(kind: str) -> str | None:
    """The favourite's key of an opinion's kind (``opinion:<kind>:<value>``): ``genre`` →
    ``favorite_genre``, ``language`` → ``preferred_language``, ``format`` →
    ``favorite_format``; None for a kind without one."""
    return _CATEGORY_FAVORITE_KEY.get(kind) or rules.KIND_FAVORITE_KEY.get(kind)


def opinion_keys(value: str) -> frozenset[str]:
    """The keys the built-in rules write an opinion about ``value`` under ("horror" and
    "ホラー": ``opinion:genre:horror``; "paperbacks": ``opinion:format:paperback``)."""
    drafts = _DEFAULT_DETECTOR._opinions(value, "likes", "like")
    return frozenset(d.key for d in drafts if d.key is not None)


def detect_memories(
    text: str | TurnText, *, detector: MemoryDetector | None = None
) -> tuple[DetectedMemory, ...]:
    """The memory drafts in ``text``, with ``detector`` or the built-in rules."""
    return (detector or _DEFAULT_DETECTOR).detect(text)


# ---------------------------------------------------------------- sentence signals


@dataclass(frozen=True, slots=True)
class SentenceSignals:
    """What the rules found in one sentence: its entities, its memory drafts (preferences,
    names, corrections, requests to remember, feedback, described habits) and whether it
    holds a digit. Rule summaries
    (:class:`~tiermem.managers.summary.RuleSummarizer`, the offline engine of
    :mod:`tiermem.summaries`) keep a sentence for these signals."""

    text: str
    entities: tuple[Entity, ...]
    memories: tuple[DetectedMemory, ...]
    has_number: bool

    @property
    def salient(self) -> bool:
        """The sentence says something a later turn may need (an entity, a number, a
        preference, a name, a correction, feedback or a habit); "Thanks!" and "Let me
        check." do not."""
        return bool(self.entities or self.memories or self.has_number)


def read_sentences(
    text: str,
    *,
    entities: EntityExtractor | None = None,
    detector: MemoryDetector | None = None,
) -> list[SentenceSignals]:
    """The sentences of ``text`` (:func:`split_sentences`), each with its signals, read with
    ``entities`` and ``detector`` (default: the built-in rules without a title catalogue).
    The one place where rule summaries decide what a sentence carries."""
    extractor = entities or DEFAULT_READER
    memory_detector = detector or _DEFAULT_DETECTOR
    return [
        SentenceSignals(
            text=sentence,
            entities=extractor.extract(sentence),
            memories=memory_detector.detect(sentence),
            has_number=bool(rules.DIGIT.search(sentence)),
        )
        for sentence in split_sentences(text)
    ]
