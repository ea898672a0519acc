"""Auto-detection of long-term memories in what a user says: rules only, no LLM.

:class:`RuleMemoryDetector` reads one user turn and returns :class:`DetectedMemory` drafts;
:meth:`tiermem.longterm.memory.LongTermMemory.remember_detected` writes them. It runs on
every user turn, so it is pure and cheap (a handful of regexes per sentence).

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
``prefer``             "I prefer seinen", "セイネンの方が好き"        preference
                                                                   ``favorite_genre`` = value
``like`` / ``dislike`` "I love horror", "I don't like horror",     preference
                       "I hate isekai", "ホラーは苦手です", "嫌い"      ``opinion:genre:horror``
                                                                   = likes / dislikes …
``addressed_as``       "call me Ken", "ケンと呼んでください"            preference ``addressed_as``
``name``               "my name is Ken Sato", "名前はケンです"          preference ``name``
``correction``         "No, I meant volume 3", "Actually, volume   fact tagged ``correction``
                       7 instead", "3巻じゃなくて4巻です"
=====================  ==========================================  ===========================

**Preference keys.** A key names *what* the preference is about, so a later statement about
the same thing updates it (through :meth:`~tiermem.longterm.memory.LongTermMemory.
upsert_preference`, with the old value kept in history):

* "prefer" and "my favorite <noun> is" name one favourite per category: the category comes
  from the noun ("genre", "author"…) or, for "I prefer X", from what X is (a known genre,
  language or series title, via the entity rules of :mod:`tiermem.extraction.entities`):
  ``favorite_genre``, ``preferred_language``, ``favorite_series``. "I prefer seinen" and
  later "I prefer shonen" both write ``favorite_genre``.
* "like", "love", "don't like", "hate", "苦手" give an opinion about one thing, and a user
  has opinions about many things at once: the key is ``opinion:<kind>:<canonical value>``
  for a known entity (``opinion:genre:horror`` for "horror" and "ホラー" alike) or
  ``opinion:<slug>`` for anything else, and the value is the sentiment (``loves``,
  ``likes``, ``prefers``, ``dislikes``, ``hates``). So "I don't like horror" is a key of its
  own, separate from ``favorite_genre``, and "actually I love horror now" later updates it.
* Values are kept as the user wrote them ("セイネン", not "seinen"); the draft's content is
  a short English line with the words as written ("favorite genre: セイネン").

**Not detected, on purpose.**

* Questions ("do you like horror?", "ホラーは好きですか") — except polite requests to
  remember or to be called something ("could you call me Ken?").
* Vague objects: "I like that one", "I love it", "これが好き" say nothing that can be
  recalled later; objects that start with a pronoun or demonstrative are dropped.
* "I'd like / I would like" (a wish, not a taste), "I prefer not to…", third persons ("my
  friend likes horror"), and long objects (over 8 words or 80 characters, where a rule is
  more likely to misread than to help).
* Weak corrections: "actually" and "no, it's …" count only with something concrete (an
  entity such as a volume, or "instead" / "not" / "rather"); "No, I meant …" and
  "XじゃなくてY" always count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tiermem.extraction.entities import DEFAULT_ENTITY_RULES, PhraseRule, RuleEntityExtractor
from tiermem.policies.phrases import TextView, normal_form

__all__ = [
    "MAX_OBJECT_CHARS",
    "MAX_OBJECT_WORDS",
    "DetectedMemory",
    "MemoryDetector",
    "RuleMemoryDetector",
    "detect_memories",
    "split_sentences",
]

MAX_OBJECT_WORDS = 8
MAX_OBJECT_CHARS = 80
EXPLICIT_IMPORTANCE = 0.8
"""Importance of a memory the user asked for ("!remember"): above a plain fact's 0.7."""


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
    addressed_as, name, correction."""
    importance: float | None = None
    """None: the memory type's default."""
    key: str | None = None
    value: str | None = None
    explicit: bool = False
    """The user asked for it to be remembered (provenance source ``explicit``, not ``auto``)."""
    tags: tuple[str, ...] = ()


class MemoryDetector(Protocol):
    """Finds memories in a user's text. Implementations are pure and fast: they run on
    every user turn."""

    def detect(self, text: str) -> tuple[DetectedMemory, ...]:
        """The drafts in ``text``, in order, each key (or content) once."""
        ...


# ---------------------------------------------------------------- sentences

_ABBREVIATIONS = frozenset(
    {
        "vol",
        "no",
        "nos",
        "mr",
        "mrs",
        "ms",
        "dr",
        "st",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "ch",
        "ep",
        "pp",
        "p",
        "approx",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
    }
)
_PIECE = re.compile(r"[^.!?。\n]*(?:[.!?。]+|\n+|$)")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (NFKC), each with its end mark. A "." after an abbreviation
    ("vol. 42") or inside a number ("3.5") does not end a sentence."""
    pieces = [p for p in _PIECE.findall(normal_form(text)) if p]
    sentences: list[str] = []
    buffer = ""
    for index, piece in enumerate(pieces):
        buffer += piece
        if piece.endswith(".") and not piece.endswith(".."):
            words = piece[:-1].split()
            last = words[-1].lower() if words else ""
            following = pieces[index + 1] if index + 1 < len(pieces) else ""
            initial = len(last) == 1 and last.isalpha()  # "J. K. Rowling", "e.g."
            decimal = last[-1:].isdigit() and following[:1].isdigit()  # "3.5"
            if last in _ABBREVIATIONS or initial or decimal:
                continue
        if buffer.strip():
            sentences.append(buffer.strip())
        buffer = ""
    if buffer.strip():
        sentences.append(buffer.strip())
    return sentences


# ---------------------------------------------------------------- shared pieces

_END_PUNCT = " \t.,;:!?。、…~〜・"
_ARTICLES = re.compile(r"^(?:the|a|an|some|any)\s+", re.IGNORECASE)
_VAGUE_HEADS = frozenset(
    {
        "it",
        "it's",
        "its",
        "that",
        "that's",
        "this",
        "these",
        "those",
        "them",
        "they",
        "one",
        "ones",
        "you",
        "him",
        "her",
        "us",
        "me",
        "what",
        "which",
        "whatever",
        "everything",
        "anything",
        "something",
        "nothing",
        "stuff",
        "things",
        "here",
        "there",
        "when",
        "how",
        "who",
        "why",
        "where",
        "to",
        "other",
        "same",
        "idea",
        "way",
        "doing",
        "not",
        "no",
        "never",
    }
)
_JA_VAGUE = re.compile(
    r"^(?:これ|それ|あれ|どれ|この|その|あの|どの|こっち|そっち|あっち|ここ|そこ|あそこ|そういう|"
    r"こういう|あなた|君|きみ|お前|おまえ|彼|彼女)"
)
_EN_CUT = re.compile(
    r"\s*(?:[,;:()\[\]\"]|\s-\s|\b(?:but|because|since|though|although|when|if|while|unless|"
    r"so\s+(?:please|can|could|do)|and\s+(?:i|my|we|it|also|please|can|could|do|is)|"
    r"which|who|that\s+(?:is|was|are))\b)",
    re.IGNORECASE,
)
_EN_TRAILING_FILLER = re.compile(
    r"(?:\s+(?:a\s+lot|a\s+bit|very\s+much|so\s+much|too|the\s+most|best|more|anyway|lol|"
    r"please|now|these\s+days|nowadays|anymore|any\s+more|in\s+general|generally|honestly|"
    r"though|as\s+well))+$",
    re.IGNORECASE,
)
_JA_LEAD = re.compile(
    r"^(?:(?:私|わたし|僕|ぼく|俺|おれ|自分)(?:は|って|も)|実は|正直|特に|やっぱり|やっぱ|やはり|"
    r"でも|まあ|あと|それと|うーん|えっと|あの|いや|いいえ|はい|ええ|うん)[、,\s]*"
)
_JA_END = re.compile(r"(?:です|でした|だよ|だね|ですね|ですよ|なんです|なんだ|だ|よ|ね|な)+$")
_SLUG = re.compile(r"[^\w]+")


_EN_CLAUSE = re.compile(
    r"(?:[,;]\s*|\s+)(?:but|and|although|though|while|whereas|also)\s+(?=i\b|i'|my\b)|;\s*"
)
_JA_CLAUSE = re.compile(r"(?:けど|けれど|けれども|だけど|ですが|でも)[、,]?")


def _clauses(folded: str, *, japanese: bool) -> list[tuple[int, int]]:
    """``(start, end)`` of the clauses of a sentence: "I like horror but I hate romance"
    holds two statements."""
    spans, start = [], 0
    for match in (_JA_CLAUSE if japanese else _EN_CLAUSE).finditer(folded):
        spans.append((start, match.start()))
        start = match.end()
    spans.append((start, len(folded)))
    return [(s, e) for s, e in spans if e > s]


def _is_question(sentence: str) -> bool:
    s = sentence.rstrip(" .。!…")
    return s.endswith(("?", "？")) or bool(re.search(r"(?:か|かな|かしら|の)$", s))


def _words(text: str) -> list[str]:
    return text.split()


def _clean_en_object(raw: str) -> str | None:
    """The object phrase of an English statement, or None if it is vague or too long."""
    cut = _EN_CUT.search(raw)
    obj = raw[: cut.start()] if cut else raw
    obj = _EN_TRAILING_FILLER.sub("", obj.strip(_END_PUNCT)).strip(_END_PUNCT)
    if not obj:
        return None
    head_words = _words(_ARTICLES.sub("", obj).lower())
    if not head_words or head_words[0].strip(_END_PUNCT) in _VAGUE_HEADS:
        return None
    if len(_words(obj)) > MAX_OBJECT_WORDS or len(obj) > MAX_OBJECT_CHARS:
        return None
    return obj


def _clean_ja_object(raw: str) -> str | None:
    """The object phrase of a Japanese statement, or None if it is vague or too long."""
    obj = re.split(r"[、,]", raw)[-1]
    for contrast in ("じゃなくて", "じゃなく", "ではなくて", "ではなく", "より"):
        if contrast in obj:
            obj = obj.rsplit(contrast, 1)[1]
    previous = None
    while previous != obj:
        previous = obj
        obj = _JA_LEAD.sub("", obj.strip(_END_PUNCT))
    obj = obj.strip(_END_PUNCT)
    if not obj or _JA_VAGUE.match(obj) or len(obj) > MAX_OBJECT_CHARS // 2:
        return None
    return obj


def _slug(text: str) -> str:
    """A stable key part: NFKC, lower case, articles dropped, non-word runs as ``_``."""
    folded = _ARTICLES.sub("", normal_form(text).strip()).casefold()
    return _SLUG.sub("_", folded).strip("_")


# Words that say nothing about *which* thing is liked: "horror manga" is "horror".
_FILLER_WORDS = frozenset(
    {
        "manga",
        "mangas",
        "comics",
        "comic",
        "books",
        "book",
        "novels",
        "novel",
        "stories",
        "story",
        "series",
        "anime",
        "genre",
        "genres",
        "titles",
        "title",
        "works",
        "ones",
        "stuff",
        "kind",
        "kinds",
        "of",
        "type",
        "types",
        "and",
        "or",
        "&",
        "both",
        "also",
        "all",
        "really",
        "the",
        "a",
        "an",
        "as",
        "well",
        "in",
        "general",
        "especially",
        "漫画",
        "マンガ",
        "まんが",
        "作品",
        "系",
        "もの",
    }
)
_KIND_FAVORITE_KEY = {"genre": "favorite_genre", "language": "preferred_language",
                      "series": "favorite_series"}  # fmt: skip
_NOUNS = {
    "genre": "genre", "genres": "genre", "author": "author", "authors": "author",
    "writer": "author", "writers": "author", "mangaka": "author", "artist": "artist",
    "artists": "artist", "series": "series", "manga": "series", "title": "series",
    "titles": "series", "comic": "series", "book": "book", "books": "book",
    "character": "character", "characters": "character", "language": "language",
    "ジャンル": "genre", "作家": "author", "漫画家": "author", "マンガ家": "author",
    "作者": "author", "漫画": "series", "マンガ": "series", "まんが": "series",
    "作品": "series", "シリーズ": "series", "キャラクター": "character",
    "キャラ": "character", "本": "book", "言語": "language",
}  # fmt: skip


def _noun_key(noun: str) -> tuple[str, str]:
    """(key part, readable noun) of "my favorite <noun>"."""
    noun = " ".join(noun.split())
    canonical = _NOUNS.get(noun.lower()) or _NOUNS.get(noun)
    if canonical:
        return canonical, canonical
    return _slug(noun), noun.lower()


_SENTIMENT_WORDS = {
    "like": "likes", "enjoy": "likes", "love": "loves", "adore": "loves", "prefer": "prefers",
    "hate": "hates", "detest": "hates", "loathe": "hates", "can't stand": "hates",
    "cannot stand": "hates", "can't bear": "hates", "dislike": "dislikes",
}  # fmt: skip

_ADV = (
    r"(?:(?:really|also|just|absolutely|totally|truly|definitely|generally|usually|still|"
    r"actually|honestly|personally|kinda|kind\s+of|sort\s+of|so|do|quite|especially|always|"
    r"very|much|particularly|even)\s+)*"
)
_EN_PREFER = re.compile(rf"\bi(?:'d|\s+would)?\s+{_ADV}prefer\s+(?P<obj>.+)")
_EN_NEG_LIKE = re.compile(
    rf"\bi\s+{_ADV}(?:don't|do\s+not|dont|didn't|did\s+not|never)\s+{_ADV}"
    r"(?P<verb>like|love|enjoy|care\s+(?:much\s+)?for)\s+(?P<obj>.+)"
)
_EN_HATE = re.compile(
    rf"\bi\s+{_ADV}(?P<verb>hate|dislike|detest|loathe|can't\s+stand|cannot\s+stand|"
    r"can't\s+bear)\s+(?P<obj>.+)"
)
_EN_LIKE = re.compile(rf"\bi\s+{_ADV}(?P<verb>like|love|adore|enjoy)\s+(?P<obj>.+)")
_EN_FAN = re.compile(
    rf"\bi(?:'m|\s+am)\s+{_ADV}(?P<neg>not\s+)?{_ADV}"
    r"(?:(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of|into|crazy\s+about|obsessed\s+with|"
    r"(?P<tired>tired\s+of|sick\s+of))\s+(?P<obj>.+)"
)
_EN_FAVORITE = re.compile(
    r"\bmy\s+(?:all[- ]time\s+|absolute\s+|current\s+)?(?:favou?rite|fave|preferred)\s+"
    r"(?:(?P<noun>[a-z][a-z ]{0,30}?)\s+)?(?:is|are|would\s+be|has\s+to\s+be|=)\s+(?P<obj>.+)"
)
_EN_CALL_ME = re.compile(
    r"^(?:(?:please|pls|just|you\s+can|you\s+may|(?:can|could|would|will)\s+you(?:\s+please)?)"
    r"\s+)*call\s+me\s+(?P<obj>.+)"
)
_EN_NAME = re.compile(r"\bmy\s+name(?:'s|\s+is)\s+(?P<obj>.+)")
_EN_NEGATED = re.compile(r"\b(?:don't|do\s+not|never|stop|not)\b")
_EN_REMEMBER = re.compile(
    r"^(?:(?:hey|ok|okay|so|and|also|oh|btw|by\s+the\s+way)[,!]?\s+)*(?:(?:please|pls|plz)\s+)?"
    r"(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?|i\s+want\s+you\s+to\s+|"
    r"i'd\s+like\s+you\s+to\s+)?"
    r"(?:remember|keep\s+in\s+mind|don't\s+forget|do\s+not\s+forget|never\s+forget)"
    r"(?:\s+that)?\s*[:,]?\s+(?P<x>.+)$"
)
_COMMAND = re.compile(r"^\s*!remember\b[:\s]*(?P<x>.*)$", re.IGNORECASE | re.DOTALL)
_EN_STRONG_CORRECTION = re.compile(
    r"^(?:(?:(?:no|nope|nah|sorry|oops|wait|hmm|uh|um)[,.!]*\s+)*i\s+meant\s+|"
    r"(?:that's|that\s+is|that\s+was)\s+not\s+what\s+i\s+(?:meant|said|asked(?:\s+for)?)"
    r"[,.!]*\s*)(?P<x>.+)"
)
_EN_WEAK_CORRECTION = re.compile(
    r"^(?:(?:(?:no|nope|nah|sorry|oops|wait)[,.!]*\s+)+(?:it's|it\s+is|i\s+said|i\s+wanted|"
    r"i\s+asked\s+for)\s+|actually[,!]?\s+)(?P<x>.+)"
)
_CONTRAST = re.compile(r"\b(?:instead|not|rather)\b")
_INTERJECTION = re.compile(
    r"^(?:(?:no|nope|nah|sorry|oops|wait|hmm|uh|um|いいえ|いや|違います|ちがいます|違う|ちがう)"
    r"[,.!、。\s]+)+",
    re.IGNORECASE,
)

_JA_FAVORITE = re.compile(
    r"(?:一番|いちばん|特に)?好きな(?P<noun>ジャンル|漫画家|マンガ家|作家|作者|漫画|マンガ|まんが|"
    r"作品|シリーズ|キャラクター|キャラ|本|言語)は(?P<obj>.+)$"
)
_JA_CALL_ME = re.compile(r"(?P<obj>.+?)(?:と|って)呼んで")
_JA_NAME = re.compile(
    r"(?:私|わたし|僕|ぼく|俺|おれ)?の?名前は(?P<obj>.+?)(?:です|だ|といいます|と申します)?$"
)
_JA_PREFER = re.compile(
    r"(?P<obj>.+?)(?:の(?:ほう|方)が|が一番|がいちばん)(?:好き|いい|良い)(?!じゃない|ではない)"
)
_JA_NEG_LIKE = re.compile(
    r"(?P<obj>.+?)(?:が|は|も)(?:あまり|あんまり)?"
    r"(?:好きじゃない|好きではない|好きではありません|好きじゃありません)"
)
# The object is followed by a particle ("ホラーが好き"), or is a katakana or kanji word right
# before the verb ("ホラー好き"); that excludes adverbs ("本当に好き") and "大好き" itself.
_JA_OBJECT = r"(?:(?P<obj>.+?)(?:が|は|も)|(?P<bare>.*?[\u30a0-\u30ff\u3400-\u9fff])(?<!大))"
_JA_DISLIKE = re.compile(
    rf"{_JA_OBJECT}(?:ちょっと|とても|本当に|ほんとに|すごく|かなり)?"
    r"(?P<verb>大嫌い|嫌い|苦手)(?!じゃない|ではない|ではありません|じゃありません)"
)
_JA_LIKE = re.compile(
    rf"{_JA_OBJECT}(?:とても|すごく|本当に|ほんとに|めっちゃ|かなり)?"
    r"(?P<verb>大好き|好き)(?!な|じゃ|では)"
)
_JA_REMEMBER = re.compile(
    r"^(?P<pre>.*?)(?:ことを|のを|を|って|と)?\s*(?:覚えておいて|覚えといて|覚えて置いて|記憶しておいて|"
    r"記憶して)(?:ください|下さい|くれる|くれ|ね|ほしい|欲しい)*[、,:：]?\s*(?P<post>.*)$"
)
_JA_CONTRAST = re.compile(r"(?P<a>.+?)(?:じゃなくて|じゃなく|ではなくて|ではなく)(?P<b>.+)")
_JA_WEAK_CORRECTION = re.compile(
    r"^(?:いいえ|いや|違います|ちがいます|違う|ちがう)[、,]\s*(?P<x>.+)"
)
_JA_SENTIMENT = {"大好き": "loves", "好き": "likes", "大嫌い": "hates", "嫌い": "dislikes",
                 "苦手": "dislikes"}  # fmt: skip
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")


# ---------------------------------------------------------------- the detector


class RuleMemoryDetector:
    """Finds preferences, corrections and requests to remember, with rules (see the module
    docstring for the table and for what is left out on purpose).

    ``known_titles`` (alias → canonical title, as for
    :class:`~tiermem.extraction.entities.RuleEntityExtractor`) lets "I prefer Berserk"
    become ``favorite_series``. Raises :class:`~tiermem.errors.ValidationError` for an
    empty title.
    """

    def __init__(self, known_titles: Mapping[str, str] | None = None) -> None:
        rules = [r for r in DEFAULT_ENTITY_RULES if isinstance(r, PhraseRule)]
        if known_titles:
            rules.append(PhraseRule("series", known_titles))
        self._kinds: tuple[PhraseRule, ...] = tuple(
            r for r in rules if r.kind in _KIND_FAVORITE_KEY
        )
        self._entities = RuleEntityExtractor(known_titles)

    # -- public ---------------------------------------------------------------------------

    def detect(self, text: str) -> tuple[DetectedMemory, ...]:
        """The memory drafts in one user turn's text, in order, each key or content once."""
        command = _COMMAND.match(text)
        if command:
            content = command.group("x").strip()
            return (self._explicit(content, "command"),) if content else ()
        found: list[DetectedMemory] = []
        for sentence in split_sentences(text):
            found.extend(self._sentence(sentence))
        return _unique(found)

    # -- per sentence -------------------------------------------------------------------

    def _sentence(self, sentence: str) -> list[DetectedMemory]:
        view = TextView(sentence)
        normal, folded = view.normal, view.folded
        explicit = self._remember_request(normal, folded)
        if explicit is not None:
            return [explicit]
        polite_name = self._addressed_as(normal, folded)
        if polite_name is not None:
            return [polite_name]  # "could you call me Ken?" is a request, not a question
        if _is_question(normal):
            return []
        drafts: list[DetectedMemory] = []
        japanese = bool(_CJK.search(normal))
        for start, end in _clauses(folded, japanese=japanese):
            if japanese:
                drafts += self._japanese_preferences(normal[start:end])
            else:
                drafts += self._english_preferences(normal[start:end], folded[start:end])
        if drafts:
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
        match = _EN_REMEMBER.match(folded)
        if match:
            raw = normal[match.start("x") :].strip()
            raw = re.sub(r"[,\s]*please[.!?]*$", "", raw, flags=re.IGNORECASE).rstrip(" ?!")
            words = _words(_ARTICLES.sub("", raw).lower())
            if not words or words[0].strip(_END_PUNCT) in _VAGUE_HEADS:
                return None
            return self._explicit(raw, "remember_request")
        match = _JA_REMEMBER.match(normal)
        if match:
            for part in (match.group("pre"), match.group("post")):
                content = part.strip(_END_PUNCT)
                if content and not _JA_VAGUE.match(content):
                    return self._explicit(content, "remember_request")
        return None

    def _addressed_as(self, normal: str, folded: str) -> DetectedMemory | None:
        match = _EN_CALL_ME.match(folded)
        if match:
            raw = normal[match.start("obj") :]
            obj = _clean_en_object(re.sub(r"[,\s]*please\b.*$", "", raw, flags=re.IGNORECASE))
            # Names are capitalised: "call me later" and "call me back" are not names.
            if obj is None or not (obj[0].isupper() or _CJK.match(obj)) or len(_words(obj)) > 3:
                return None
            return _preference("addressed_as", obj, f"wants to be called {obj}", "addressed_as")
        match = _JA_CALL_ME.search(normal)
        if match and not re.search(r"呼ばないで|呼ぶな", normal):
            obj = _clean_ja_object(match.group("obj"))
            if obj is not None:
                return _preference("addressed_as", obj, f"wants to be called {obj}", "addressed_as")
        return None

    def _english_preferences(self, normal: str, folded: str) -> list[DetectedMemory]:
        def obj_of(match: re.Match[str]) -> str | None:
            return _clean_en_object(normal[match.start("obj") : match.end("obj")])

        if match := _EN_NAME.search(folded):
            obj = obj_of(match)
            if (
                obj is not None
                and len(_words(obj)) <= 4
                and not _EN_NEGATED.search(folded[: match.start()])
            ):
                return [_preference("name", obj, f"name: {obj}", "name")]
            return []
        if match := _EN_FAVORITE.search(folded):
            obj = obj_of(match)
            if obj is None:
                return []
            noun = match.group("noun")
            if noun:
                key, readable = _noun_key(noun)
                return [
                    _preference(f"favorite_{key}", obj, f"favorite {readable}: {obj}", "favorite")
                ]
            return self._favorite_by_kind(obj, reason="favorite", text=f"favorite: {obj}")
        if match := _EN_PREFER.search(folded):
            obj = obj_of(match)
            if obj is None or obj.lower().startswith(("not ", "to not", "not to")):
                return []
            return self._favorite_by_kind(obj, reason="prefer", text=f"prefers {obj}")
        if match := _EN_NEG_LIKE.search(folded):
            obj = obj_of(match)
            return self._opinions(obj, "dislikes", "dislike") if obj else []
        if match := _EN_HATE.search(folded):
            obj = obj_of(match)
            verb = " ".join(match.group("verb").split())
            return self._opinions(obj, _SENTIMENT_WORDS[verb], "dislike") if obj else []
        if match := _EN_FAN.search(folded):
            obj = obj_of(match)
            negative = bool(match.group("neg")) != bool(match.group("tired"))
            sentiment, reason = ("dislikes", "dislike") if negative else ("likes", "like")
            return self._opinions(obj, sentiment, reason) if obj else []
        if (match := _EN_LIKE.search(folded)) and not _EN_NEGATED.search(
            folded[max(0, match.start() - 12) : match.start()]
        ):
            obj = obj_of(match)
            sentiment = _SENTIMENT_WORDS[match.group("verb")]
            return self._opinions(obj, sentiment, "like") if obj else []
        return []

    def _japanese_preferences(self, normal: str) -> list[DetectedMemory]:
        body = normal.strip(_END_PUNCT)
        if match := _JA_FAVORITE.search(body):
            obj = _clean_ja_object(_JA_END.sub("", match.group("obj").strip(_END_PUNCT)))
            if obj is None:
                return []
            key, readable = _noun_key(match.group("noun"))
            return [_preference(f"favorite_{key}", obj, f"favorite {readable}: {obj}", "favorite")]
        if match := _JA_NAME.search(body):
            obj = _clean_ja_object(match.group("obj"))
            return [_preference("name", obj, f"name: {obj}", "name")] if obj else []
        if match := _JA_PREFER.search(body):
            obj = _clean_ja_object(match.group("obj"))
            return (
                self._favorite_by_kind(obj, reason="prefer", text=f"prefers {obj}") if obj else []
            )
        if match := _JA_NEG_LIKE.search(body):
            obj = _clean_ja_object(match.group("obj"))
            return self._opinions(obj, "dislikes", "dislike") if obj else []
        if match := _JA_DISLIKE.search(body):
            obj = _clean_ja_object(match.group("obj") or match.group("bare"))
            sentiment = _JA_SENTIMENT[match.group("verb")]
            return self._opinions(obj, sentiment, "dislike") if obj else []
        if match := _JA_LIKE.search(body):
            obj = _clean_ja_object(match.group("obj") or match.group("bare"))
            sentiment = _JA_SENTIMENT[match.group("verb")]
            return self._opinions(obj, sentiment, "like") if obj else []
        return []

    def _correction(self, normal: str, folded: str) -> DetectedMemory | None:
        strong = _EN_STRONG_CORRECTION.match(folded)
        weak = None if strong else _EN_WEAK_CORRECTION.match(folded)
        ja_contrast = _JA_CONTRAST.search(normal) if _CJK.search(normal) else None
        ja_weak = _JA_WEAK_CORRECTION.match(normal)
        if strong:
            obj = _clean_en_object(normal[strong.start("x") :])
            if obj is None:
                return None
        elif weak or ja_weak:
            concrete = bool(self._entities.extract(normal)) or bool(_CONTRAST.search(folded))
            if not concrete:
                return None
        elif ja_contrast is None or not ja_contrast.group("a").strip(_END_PUNCT):
            return None
        said = _INTERJECTION.sub("", normal).strip()
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
        leftover = [w for w in re.split(r"[\s,、・/]+", rest) if w and w not in _FILLER_WORDS]
        if leftover:
            return []
        return [(kind, value, view.normal[start:end]) for start, end, kind, value in spans]

    def _favorite_by_kind(self, obj: str, *, reason: str, text: str) -> list[DetectedMemory]:
        known = self._known(obj)
        kinds = {kind for kind, _, _ in known}
        if len(kinds) == 1:
            (kind,) = kinds
            return [_preference(_KIND_FAVORITE_KEY[kind], obj, text, reason)]
        return self._opinions(obj, "prefers", reason)

    def _opinions(self, obj: str, sentiment: str, reason: str) -> list[DetectedMemory]:
        known = self._known(obj)
        if known:
            return [
                _preference(
                    f"opinion:{kind}:{_slug(value)}", sentiment, f"{sentiment} {written}", reason
                )
                for kind, value, written in known
            ]
        slug = _slug(obj)
        if not slug:
            return []
        return [_preference(f"opinion:{slug}", sentiment, f"{sentiment} {obj}", reason)]


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


def detect_memories(
    text: str, *, detector: MemoryDetector | None = None
) -> tuple[DetectedMemory, ...]:
    """The memory drafts in ``text``, with ``detector`` or the built-in rules."""
    return (detector or _DEFAULT_DETECTOR).detect(text)
