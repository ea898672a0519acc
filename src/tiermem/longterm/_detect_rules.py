"""The rule data of :mod:`tiermem.longterm.detect`: word lists and patterns.

The engine (:class:`~tiermem.longterm.detect.RuleMemoryDetector`) applies these; what they
detect, and what they leave out on purpose, is documented there. English patterns are
written in lower case and read the folded text (:attr:`~tiermem.policies.phrases.TextView.
folded`); Japanese patterns read the normal text.

Patterns that a sentence can rarely match are :class:`Gated`: a regex with the strings of
which the text must hold one for it to match at all (``prefer`` for "I prefer …"). The test
is a substring search, much cheaper than a regex that cannot skip ahead (a leading ``\b``
or ``.+?``), and most sentences of a long turn pass none of the gates.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["AnyOf", "Gated", "any_of"]

_TRIE_FROM = 3
"""A gate of this many strings or more is tested with one :func:`any_of`; fewer, a
substring test each is about as cheap."""


_Trie = dict[str, "_Trie"]


def _trie_regex(words: list[str]) -> re.Pattern[str] | None:
    """The strings as a trie regex ("you(?:'(?:re|ve been)| (?:a(?:lways|re)|…))"): it
    tries a handful of branches at each position where a plain alternation tries every
    string. A string that another one starts with is enough on its own ("no" for "nope")."""
    if not words:
        return None
    trie: _Trie = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: _Trie) -> str:
        if "" in node:
            return ""
        branches = [re.escape(char) + pattern(child) for char, child in sorted(node.items())]
        return branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"

    return re.compile(pattern(trie))


@dataclass(frozen=True, slots=True)
class AnyOf:
    """Whether a text holds one of some strings (:func:`any_of`): the ASCII strings as one
    trie regex, the others (Japanese) as another that only a text with a non-ASCII
    character is searched with, so English text does not pay for the Japanese strings."""

    ascii: re.Pattern[str] | None
    other: re.Pattern[str] | None

    def search(self, text: str) -> re.Match[str] | None:
        """A match of one of the strings in ``text``, or None if it holds none."""
        if self.ascii is not None and (found := self.ascii.search(text)) is not None:
            return found
        if self.other is not None and not text.isascii():
            return self.other.search(text)
        return None


def any_of(strings: Iterable[str]) -> AnyOf:
    """What finds any of ``strings`` in a text, several times faster than a plain
    alternation of them on short text (see :class:`AnyOf`). Raises ValueError for no
    strings or an empty one."""
    words = list(dict.fromkeys(strings))
    if not words or not all(words):
        raise ValueError("any_of needs one string or more, none of them empty")
    return AnyOf(
        _trie_regex([w for w in words if w.isascii()]),
        _trie_regex([w for w in words if not w.isascii()]),
    )


@dataclass(frozen=True, slots=True)
class Gated:
    """A regex that runs only on text holding one of ``requires``.

    Every string in ``requires`` must be one that any match contains (in the form the
    pattern reads: lower case for folded text), so the gate never changes a result.
    """

    regex: re.Pattern[str]
    requires: tuple[str, ...]
    _gate: AnyOf | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.requires) >= _TRIE_FROM:
            object.__setattr__(self, "_gate", any_of(self.requires))

    def opens(self, text: str) -> bool:
        """Whether the regex could match somewhere in ``text`` (its gate is open)."""
        if self._gate is not None:
            return self._gate.search(text) is not None
        return any(s in text for s in self.requires)

    def search(self, text: str) -> re.Match[str] | None:
        return self.regex.search(text) if self.opens(text) else None

    def match(self, text: str) -> re.Match[str] | None:
        return self.regex.match(text) if self.opens(text) else None

    def finditer(self, text: str) -> list[re.Match[str]]:
        return list(self.regex.finditer(text)) if self.opens(text) else []


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


# ---------------------------------------------------------------- sentences and objects

ABBREVIATIONS = _word_set(
    """
    vol no nos mr mrs ms dr st vs etc e.g i.e ch ep pp p approx jan feb mar apr jun jul aug sep
    sept oct nov dec
    """
)
PIECE = re.compile(r"[^.!?。\n]*(?:[.!?。]+|\n+|$)")

END_PUNCT = " \t.,;:!?。、…~〜・"
ARTICLES = re.compile(r"^(?:the|a|an|some|any)\s+", re.IGNORECASE)
VAGUE_HEADS = _word_set(
    """
    it it's its that that's this these those them they one ones you him her us me what which
    whatever everything anything something nothing stuff things here there when how who why
    where to other same idea way doing not no never
    """
)
JA_VAGUE = re.compile(
    r"^(?:これ|それ|あれ|どれ|この|その|あの|どの|こっち|そっち|あっち|ここ|そこ|あそこ|そういう|"
    r"こういう|あなた|君|きみ|お前|おまえ|彼|彼女)"
)
EN_CUT = re.compile(
    r"\s*(?:[,;:()\[\]\"]|\s-\s|\b(?:but|because|since|though|although|when|if|while|unless|"
    r"so\s+(?:please|can|could|do)|and\s+(?:i|my|we|it|also|please|can|could|do|is)|"
    r"which|who|that\s+(?:is|was|are)|(?:more|better|rather)\s+than)\b)",
    re.IGNORECASE,
)
EN_TRAILING_FILLER = re.compile(
    r"(?:\s+(?:a\s+lot|a\s+bit|(?:very\s+|so\s+|that\s+|too\s+)?much|at\s+all|too|the\s+most|"
    r"best|more|anyway|again|after\s+all|lol|probably|maybe|perhaps|i\s+think|i\s+guess|"
    r"please|now|these\s+days|nowadays|anymore|any\s+more|in\s+general|generally|honestly|"
    r"though|as\s+well))+$",
    re.IGNORECASE,
)
JA_LEAD = re.compile(
    r"^(?:(?:私|わたし|僕|ぼく|俺|おれ|自分)(?:は|って|も)|実は|正直|特に|やっぱり|やっぱ|やはり|"
    r"たぶん|多分|おそらく|恐らく|"
    r"でも|まあ|あと|それと|うーん|えっと|あの|いや|いいえ|はい|ええ|うん)[、,\s]*"
)
JA_END = re.compile(
    r"(?:です|でした|だよ|だね|ですね|ですよ|なんです|なんだ|だ|よ|ね|な|かも(?:しれない|しれません)?)+$"
)
EN_HEDGE_LEAD = re.compile(
    r"^(?:(?:probably|maybe|perhaps|i\s+think|i\s+guess|kind\s+of|sort\s+of|kinda|sorta)[,]?\s+)+",
    re.IGNORECASE,
)
"""Hedge words before a value ("my favorite language is probably python"): they say how
sure the user is, not what the value is (:func:`~tiermem.longterm.detect.clean_object`
drops them, as :data:`EN_TRAILING_FILLER` drops "python, I think")."""
EN_HEDGE = re.compile(r"\b(?:probably|maybe|perhaps|possibly|might|may\s+not)\b")
JA_HEDGE = re.compile(
    r"たぶん|多分|おそらく|恐らく|かも(?=しれ|ね|な|よ|です|[\s.,;:!?。、…~〜・！？]|$)"
)
"""A hedge in a dislike's clause, up to its object ("I probably don't like horror", "maybe
I don't like horror anymore", 「たぶんホラーは苦手かも」): the dislike drafts nothing
(docs/memory-detection.md says why). Read only once a dislike matched. "I think" / "I
guess" give an opinion, which a dislike is anyway, and "kind of" / "sort of" soften: "I
think I don't like horror anymore", "I kind of hate horror" count. かも is a word only
before しれない, ね, な, よ, です or the end: 「かもめも苦手」 is a gull, not a doubt."""
EN_HEDGE_AFTER = re.compile(
    r"\W*(?:or\s+(?:probably|maybe|perhaps|possibly)\b|(?:probably|maybe|perhaps|possibly)"
    r"(?:\s+not|\s+i\s+do(?:n't|nt|\s+not)?)?\W*$)"
)
JA_HEDGE_AFTER = re.compile(
    r"(?:です|だ|なの|なん)?(?:かも(?=しれ|ね|な|よ|です|[\s.,;:!?。、…~〜・！？]|$)|"
    r"[、,\s]*(?:たぶん|多分|おそらく|恐らく)[\s.,;:!?。、…~〜・！？]*$)"
)
"""What follows a dislike's object that still hedges it: a hedge alone ("I don't like
horror, maybe", "…, probably not") or offered as the other answer ("…, or maybe I do");
かも right after the verb (「ホラーは苦手かもしれない」) or たぶん alone after it. A hedge in a
clause of its own modifies that clause, not the dislike: "I don't like horror, it might
scare me", 「ホラーは嫌い、怖いかも」 are dislikes."""
EN_HEDGE_SCOPE = re.compile(
    r"\b(?:but|yet)\b|[;.!?](?=\s|$)"
    r"|(?:^|(?<=[;.!?])\s+|\b(?:but|yet|and)\s+)"
    r"(?:although|though|even\s+though|even\s+if|while|whereas)\b[^,;.!?]*,"
)
JA_HEDGE_SCOPE = re.compile(r"けど|けれど|ですが|が[、,]|[。!?]")
"""A clause break that ends a hedge's scope: a hedge before it is not the dislike's after
it ("It might rain, but honestly I don't like horror", "Maybe so, yet I don't like
horror", 「雨かもしれないが、ホラーは苦手」 are dislikes), and so does the comma closing a
concessive clause ("Although it might be good, I don't like horror", "Even if it may not
be fair, I hate horror"). A comma alone is no break: "Maybe, I don't like horror" stays
hedged."""
JA_NAME_END = re.compile(
    r"(?:(?:でございます|でござる|です|なんです|なんだ|っす|といいます|と言います|と申します|"
    r"っていいます|って言います|っていう|って)(?:よね|よ|ね|な|わ|さ)?|だ(?:よね|よ|ね|な|わ|さ)|"
    r"(?:(?<![ぁ-ゖ])|(?<=だ))だ|(?<![ぁ-ゖ])(?:よね|よ|ね|わ|さ))$"
)
"""The end of a stated name that is not part of it: a copula and a sentence-final particle
(「田中です」, 「田中だよ」, 「田中でございます」, 「田中っす」) or a particle alone after a name
not written in hiragana (「田中よ」, 「ハナね」): 「あかね」 keeps its ね. A bare だ after
hiragana is the name's (「やまだ」, 「よしだ」, 「しまだ」: surnames end in だ) unless a second
だ follows it (「やまだだ」); だよ, だね, です come off it (「よしだだよ」, 「やまだです」: よしだ,
やまだ; 「はなだよ」: はな, and so 「やまだよ」 reads as やま + だよ)."""
JA_NO_NAME = re.compile(
    r"^(?:まだ|特に|別に|今は)?(?:秘密|ひみつ|内緒|ないしょ|未定|なし|無し|ナシ|ない|無い)$|"
    r"(?:ない|無い|ません|なかった|ねえ|ねぇ)$"
)
"""A name that says there is none, or none to tell: 「名前はまだない」, 「まだ決めていない」,
「ないです」, 「秘密です」, 「教えたくありません」 write no ``name``."""
SLUG = re.compile(r"[^\w]+")


EN_CLAUSE = Gated(
    re.compile(
        r"(?:[,;]\s*|\s+)(?:but|and|although|though|while|whereas|also)\s+(?=i\b|i'|my\b)|;\s*"
    ),
    (";", "but", "and", "though", "while", "whereas", "also"),
)
JA_CLAUSE = re.compile(r"(?:けど|けれど|けれども|だけど|ですが|でも)[、,]?")

FILLER_WORDS = _word_set(
    """
    manga mangas comics comic books book novels novel stories story series anime genre genres
    titles title works ones stuff kind kinds of type types and or & both also all really the a
    an as well in general especially 漫画 マンガ まんが 作品 系 もの
    """
)
KIND_FAVORITE_KEY = {"genre": "favorite_genre", "language": "preferred_language",
                      "series": "favorite_series"}  # fmt: skip
NOUNS = {
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

SENTIMENT_WORDS = {
    "like": "likes", "enjoy": "likes", "love": "loves", "adore": "loves", "prefer": "prefers",
    "hate": "hates", "detest": "hates", "loathe": "hates", "can't stand": "hates",
    "cannot stand": "hates", "can't bear": "hates", "dislike": "dislikes",
}  # fmt: skip

ADV = (
    r"(?:(?:really|also|just|absolutely|totally|truly|definitely|generally|usually|still|"
    r"actually|honestly|personally|kinda|kind\s+of|sort\s+of|so|do|quite|especially|always|"
    r"very|much|particularly|even|probably|maybe|perhaps)\s+)*"
)
EN_PREFER = Gated(
    re.compile(rf"\bi(?:'d|\s+would)?\s+{ADV}prefer\s+(?P<obj>.+)"),
    ("prefer",),
)
EN_NEG_LIKE = Gated(
    re.compile(
        rf"\bi\s+{ADV}(?:don't|do\s+not|dont|didn't|did\s+not|never)\s+{ADV}"
        r"(?P<verb>like|love|enjoy|care\s+(?:much\s+)?for)\s+(?P<obj>.+)"
    ),
    ("like", "love", "enjoy", "care"),
)
EN_HATE = Gated(
    re.compile(
        rf"\bi\s+{ADV}(?P<verb>hate|dislike|detest|loathe|can't\s+stand|cannot\s+stand|"
        r"can't\s+bear)\s+(?P<obj>.+)"
    ),
    ("hate", "dislike", "detest", "loathe", "stand", "bear"),
)
EN_LIKE = Gated(
    re.compile(rf"\bi\s+{ADV}(?P<verb>like|love|adore|enjoy)\s+(?P<obj>.+)"),
    ("like", "love", "adore", "enjoy"),
)
EN_FAN = Gated(
    re.compile(
        rf"\bi(?:'m|\s+am)\s+{ADV}(?P<neg>not\s+)?{ADV}"
        r"(?:(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of|into|crazy\s+about|obsessed\s+with|"
        r"(?P<tired>tired\s+of|sick\s+of))\s+(?P<obj>.+)"
    ),
    ("fan", "into", "crazy", "obsessed", "tired", "sick"),
)
EN_FAVORITE = Gated(
    re.compile(
        r"\bmy\s+(?:all[- ]time\s+|absolute\s+|current\s+)?(?:favou?rite|fave|preferred)\s+"
        r"(?:(?P<noun>[a-z][a-z ]{0,30}?)\s+)?(?:is|are|would\s+be|has\s+to\s+be|=)\s+(?P<obj>.+)"
    ),
    ("fav", "preferred"),
)
EN_NOT_FAN = Gated(
    re.compile(
        r"^(?:(?:honestly|personally|really|just|also|and|but|so|tbh|ok|okay|well|sadly)[,]?\s+)*"
        rf"not\s+{ADV}(?:(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of|into)\s+(?P<obj>.+)"
    ),
    ("fan", "into"),
)
"""A fragment without "I'm": "not a fan of horror", "not really into romance"."""
EN_NO_THING = re.compile(
    r"^(?:(?:and|also|but|oh|so|ok|okay|please|pls|just)[,]?\s+)*(?:no\s+more|no)\s+"
    r"(?!longer\b|thanks\b|thank\b|problem\b|worries\b|way\b|idea\b|need\b|one\b)"
    r"(?P<obj>.+)"
)
"""A refusal of a kind of thing: "no horror", "no more isekai please" (the object must be a
known genre, format or edition; "no thanks" and "no, I meant…" are not)."""
EN_CALL_ME = re.compile(
    r"^(?:(?:please|pls|just|you\s+can|you\s+may|(?:can|could|would|will)\s+you(?:\s+please)?)"
    r"\s+)*call\s+me\s+(?P<obj>.+)"
)
EN_FOR_OTHER = re.compile(
    r"\bfor\s+(?:my|our)\s+(?:[a-z]+\s+){0,2}?(?:daughters?|sons?|wife|husband|friends?|"
    r"sisters?|brothers?|mom|mum|mother|dad|father|parents?|kids?|child|children|"
    r"boyfriend|girlfriend|partner|nephews?|nieces?|cousins?|grandsons?|granddaughters?|"
    r"grandkids?|grandchildren|colleagues?|coworkers?|co-workers?|boss|family)\b|"
    r"\bas\s+an?\s+(?:gift|present)\b"
)
"""A purpose naming someone else ("I'm into seinen, not shojo, for my daughter", "as a
gift"): the clause is about their taste, or a gift, not the user's preference. A veto,
not a drafting rule: the engine searches it only in a clause holding "for " or "as a"."""
EN_AS_MUCH = re.compile(r"\b(?:as\s+much|(?:more|better)\s+than)\b")
"""A negated like that compares ("I don't like horror as much as thrillers", "not as much
anymore"): it ranks the thing below another, it does not reject it."""
EN_BUT_LIKE_IT = re.compile(
    rf"^i\s+{ADV}(?P<verb>like|love|adore|enjoy)\s+"
    r"(?:it|them|that|those)(?:\s+(?:anyway|though|still|a\s+lot))*[\s.!]*$"
)
"""The clause after a dislike and a "but" that takes the dislike back: "I don't like
horror but I love it"."""
EN_CONTRASTIVE = re.compile(r"\b(?:but|though|although)\b")
"""A clause break that turns what follows against what precedes."""
EN_NAME = Gated(
    re.compile(r"\bmy\s+name(?:'s|\s+is)\s+(?P<obj>.+)"),
    ("name",),
)
EN_NEGATED = re.compile(r"\b(?:don't|do\s+not|never|stop|not)\b")
EN_REPORTED = re.compile(
    r"(?:\b(?:you|who|someone|somebody|they|he|she)\s+(?:[\w']+\s+){0,3}|"
    r"\b(?:never|not|didn't|did\s+not|don't|do\s+not|wouldn't|would\s+not|won't|doesn't|"
    r"does\s+not)\s+)"
    r"(?:said|say|saying|says|think|thinks|thought|claim|claimed|assume|assumed|"
    r"told\s+\w+|tell\s+\w+|mean|meant|implying|suggesting)\s+(?:that\s+)?$"
)
"""What makes an "I don't like X" / "I hate X" that follows it words the user denies or
quotes, not their taste: "you said I don't like horror, but that's wrong", "I never said I
hate horror", "I wouldn't say I don't like horror" (tested on the text before the clause's
"I"). "I said I don't like horror" and "I'd say I hate horror" still count."""
EN_REMEMBER = re.compile(
    r"^(?:(?:hey|ok|okay|so|and|also|oh|btw|by\s+the\s+way)[,!]?\s+)*(?:(?:please|pls|plz)\s+)?"
    r"(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?|i\s+want\s+you\s+to\s+|"
    r"i'd\s+like\s+you\s+to\s+)?"
    r"(?:remember|keep\s+in\s+mind|don't\s+forget|do\s+not\s+forget|never\s+forget)"
    r"(?:\s+that)?\s*[:,]?\s+(?P<x>.+)$"
)
COMMAND = re.compile(r"^\s*!remember\b[:\s]*(?P<x>.*)$", re.IGNORECASE | re.DOTALL)
EN_STRONG_CORRECTION = re.compile(
    r"^(?:(?:(?:no|nope|nah|sorry|oops|wait|hmm|uh|um)[,.!]*\s+)*i\s+meant\s+|"
    r"(?:that's|that\s+is|that\s+was)\s+not\s+what\s+i\s+(?:meant|said|asked(?:\s+for)?)"
    r"[,.!]*\s*)(?P<x>.+)"
)
EN_WEAK_CORRECTION = re.compile(
    r"^(?:(?:(?:no|nope|nah|sorry|oops|wait)[,.!]*\s+)+(?:it's|it\s+is|i\s+said|i\s+wanted|"
    r"i\s+asked\s+for)\s+|actually[,!]?\s+)(?P<x>.+)"
)
CONTRAST = re.compile(r"\b(?:instead|not|rather)\b")
INTERJECTION = re.compile(
    r"^(?:(?:no|nope|nah|sorry|oops|wait|hmm|uh|um|いいえ|いや|違います|ちがいます|違う|ちがう)"
    r"[,.!、。\s]+)+",
    re.IGNORECASE,
)

# Patterns that open with a lazy ".+?" are anchored with "^". A sentence holds no newline,
# so such a pattern matches at the start of the text if it matches anywhere, with the same
# groups; unanchored, a search that fails retries from every position: quadratic, seconds
# on a long Japanese sentence.
JA_FAVORITE = Gated(
    re.compile(
        r"(?:一番|いちばん|特に)?好きな(?P<noun>ジャンル|漫画家|マンガ家|作家|作者|漫画|マンガ|まんが|"
        r"作品|シリーズ|キャラクター|キャラ|本|言語)は(?P<obj>.+)$"
    ),
    ("好きな",),
)
JA_CALL_ME = Gated(
    re.compile(r"^(?P<obj>.+?)(?:と|って)呼んで"),
    ("呼んで",),
)
JA_NAME = Gated(
    re.compile(
        r"(?:私|わたし|僕|ぼく|俺|おれ)?の?名前は(?P<obj>.+?)"
        r"(?:です|(?:(?<![ぁ-ゖ])|(?<=だ))だ|といいます|と申します)?$"
    ),
    ("名前は",),
)
JA_NAME_OWNER = re.compile(r"(?P<owner>\w+)の$")
JA_FIRST_PERSON = ("私", "わたし", "僕", "ぼく", "俺", "おれ", "自分", "あたし")
"""Whose name 「…の名前は」 gives: the user's only after a first person (「私の名前は」, or
「名前は」 alone); 「娘の名前はハナです」「うちの猫の名前は」「私の友達の名前は」 name someone else,
and write no ``name`` (as "my daughter's name is Hana" never matched ``EN_NAME``)."""
JA_PREFER = Gated(
    re.compile(
        r"^(?P<obj>.+?)(?:の(?:ほう|方)が|が一番|がいちばん)(?:好き|いい|良い)(?!じゃない|ではない)"
    ),
    ("ほうが", "方が", "が一番", "がいちばん"),
)
JA_NEG_LIKE = Gated(
    re.compile(
        r"^(?P<obj>.+?)(?:が|は|も)(?:あまり|あんまり)?"
        r"(?:好きじゃない|好きではない|好きではありません|好きじゃありません)"
    ),
    ("好き",),
)
# The object is followed by a particle ("ホラーが好き"), or is a katakana or kanji word right
# before the verb ("ホラー好き"); that excludes adverbs ("本当に好き") and "大好き" itself.
JA_OBJECT = r"(?:(?P<obj>.+?)(?:が|は|も)|(?P<bare>.*?[\u30a0-\u30ff\u3400-\u9fff])(?<!大))"
JA_DISLIKE = Gated(
    re.compile(
        rf"^{JA_OBJECT}(?:ちょっと|とても|本当に|ほんとに|すごく|かなり)?"
        r"(?P<verb>大嫌い|嫌い|苦手)(?!じゃない|ではない|ではありません|じゃありません|"
        r"だった|でした|な(?!の|ん))"
    ),
    ("嫌い", "苦手"),
)
JA_LIKE = Gated(
    re.compile(
        rf"^{JA_OBJECT}(?:とても|すごく|本当に|ほんとに|めっちゃ|かなり)?"
        r"(?P<verb>大好き|好き)(?!な|じゃ|では)"
    ),
    ("好き",),
)
JA_REMEMBER = Gated(
    re.compile(
        r"^(?P<pre>.*?)(?:ことを|のを|を|って|と)?\s*(?:覚えておいて|覚えといて|覚えて置いて|記憶しておいて|"
        r"記憶して)(?:ください|下さい|くれる|くれ|ね|ほしい|欲しい)*[、,:：]?\s*(?P<post>.*)$"
    ),
    ("覚え", "記憶"),
)
JA_CONTRAST = Gated(
    re.compile(r"^(?P<a>.+?)(?:じゃなくて|じゃなく|ではなくて|ではなく)(?P<b>.+)"),
    ("じゃなく", "ではなく"),
)
JA_WEAK_CORRECTION = re.compile(
    r"^(?:いいえ|いや|違います|ちがいます|違う|ちがう)[、,]\s*(?P<x>.+)"
)
JA_SENTIMENT = {"大好き": "loves", "好き": "likes", "大嫌い": "hates", "嫌い": "dislikes",
                 "苦手": "dislikes"}  # fmt: skip
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")


# ---------------------------------------------------------------- feedback and habits
# Feedback is about the service (its recommendations, its search, the assistant itself),
# never about a manga: "this volume was great" is an opinion, "this recommendation was
# great" is feedback. Every pattern names the service, or addresses the assistant ("you").

_SERVICE = (
    r"(?:recommendations?|suggestions?|picks?|search(?:\s+results?)?|results|answers?|"
    r"repl(?:y|ies)|responses?|service|help|advice|assistant|bot|chatbot|app|site|website)"
)
"""The assistant and what it gives. The shop's logistics (delivery, stock) are left out:
"my delivery date is …" states a slot, and a late parcel is not the assistant's doing."""
_INTENSIFIER = (
    r"(?:(?:really|so|very|pretty|totally|completely|absolutely|super|quite|just|kind\s+of|"
    r"kinda|always|still|actually|honestly)\s+)*"
)
_PRAISE = (
    r"(?:great|good|excellent|amazing|awesome|perfect|helpful|useful|spot[\s-]on|on\s+point|"
    r"fantastic|wonderful|brilliant|a\s+(?:big|great|huge)\s+help)"
)
_COMPLAINT = (
    r"(?:terrible|awful|useless|bad|wrong|unhelpful|not\s+(?:helpful|useful|good|great|working)|"
    r"broken|slow|confusing|poor|horrible|garbage|irrelevant|way\s+off|off|late|annoying|"
    r"frustrating|worthless|pointless|a\s+joke)"
)
EN_FEEDBACK_SERVICE = Gated(
    re.compile(
        rf"\b(?:this|that|the|your|these|those)\s+(?:last\s+|previous\s+|first\s+|new\s+)?"
        rf"{_SERVICE}\s+(?:(?P<neg>isn't|is\s+not|wasn't|was\s+not|aren't|are\s+not|weren't|"
        r"were\s+not)\s+|(?:was|is|were|are|has\s+been|have\s+been|seems?|looks?|feels?)\s+|"
        rf"'s\s+){_INTENSIFIER}(?:(?P<praise>{_PRAISE})|(?P<complaint>{_COMPLAINT}))\b"
    ),
    ("recommend", "suggest", "pick", "search", "result", "answer", "repl", "respons",
     "service", "help", "advice", "assistant", "bot", "app", "site"),
)  # fmt: skip
"""'<the service's thing> is <praise or complaint>': "this recommendation was great", "the
search is useless", "your answers aren't helpful"."""
EN_FEEDBACK_EXCLAIM = Gated(
    re.compile(
        r"^(?:(?:thanks|thank\s+you|wow|oh|ok|okay|well)[,!.]*\s+)*"
        r"(?:(?:that's|that\s+was|that\s+is|what|such)\s+)?(?:an?\s+)?"
        r"(?:(?:really|very|so)\s+)?(?:(?P<praise>great|good|excellent|amazing|awesome|perfect|"
        r"nice|brilliant|solid|helpful)|(?P<complaint>terrible|awful|bad|useless|poor|wrong|"
        r"horrible|lousy))\s+(?:recommendations?|suggestions?|picks?|answers?|call)\s*[.!]*$"
    ),
    ("recommend", "suggest", "pick", "answer", "call"),
)
"""A short exclamation about a recommendation: "Great recommendation!", "Thanks, good
pick.", "What a terrible suggestion." (not "good recommendations for beginners, please")."""
EN_FEEDBACK_THANKS = Gated(
    re.compile(
        r"^(?:thanks|thank\s+you)(?:\s+so\s+much|\s+a\s+lot)?[,!.]*\s+(?:that|this|it)"
        r"(?:'s|\s+was|\s+is|\s+has\s+been)\s+(?:(?:really|so|very|super|extremely)\s+)*"
        r"(?:helpful|useful|perfect|a\s+(?:big\s+|great\s+|huge\s+)?help)\b"
    ),
    ("help", "useful", "perfect"),
)
"""Thanks for an answer that helped: "Thanks, that was really helpful"."""
EN_FEEDBACK_YOU = Gated(
    re.compile(
        # The words right after "you" are joined by one space, as the gate's strings are.
        r"\byou(?: (?P<keep>keep|kept)\s+(?:on\s+)?(?:suggesting|recommending|showing|giving|"
        r"getting|sending|forgetting|ignoring|mixing|asking|repeating|listing|confusing|"
        r"misreading|missing|changing|offering|picking|bringing|telling|recommend)|"
        r" (?:never|don't ever|do not ever)\s+(?P<never>listen|remember|understand|"
        r"get\s+(?:it|this|that|anything)\s+right|read|check)|"
        r" (?:always|constantly)\s+\w+\s+(?:me\s+)?(?:the\s+)?(?P<wrong>wrong|same)|"
        r"(?:'re| are| have been|'ve been)\s+(?:really\s+|so\s+|very\s+|such\s+|"
        r"always\s+|super\s+)*(?:(?P<good>helpful|great|amazing|awesome|the\s+best|"
        r"a\s+(?:big\s+|great\s+|huge\s+)?help|a\s+lifesaver)|(?P<bad>useless|unhelpful|"
        r"not\s+(?:helpful|helping|listening)|no\s+help|hopeless|terrible)))\b"
    ),
    ("you keep", "you kept", "you never", "you don't ever", "you do not ever", "you always",
     "you constantly", "you're", "you are", "you have been", "you've been"),
)  # fmt: skip
"""The assistant addressed: "you keep suggesting the wrong volume", "you never listen",
"you always show me the same titles", "you're so helpful", "you're useless"."""
JA_FEEDBACK = Gated(
    re.compile(
        r"(?:おすすめ|オススメ|お勧め|お薦め|提案|検索結果|検索|回答|返事|返答|答え|説明|サービス|"
        r"アプリ|サイト|対応|サポート|配送|チャット|あなた)(?:は|が|も|って)?、?"
        r"(?:とても|すごく|本当に|ほんとに|ほんと|めっちゃ|かなり|全然|まったく|全く|ちょっと|"
        r"いつも)?(?:(?P<praise>よかった|良かった|最高|完璧|助かった|助かります|役に立った|"
        r"役立った|参考になった|参考になります|的確|素晴らしい|すばらしい)|"
        r"(?P<complaint>ひどい|酷い|最悪|使えない|役に立たない|役立たない|ダメ|だめ|間違って|"
        r"間違い|遅い|わかりにくい|分かりにくい|イマイチ|いまいち|微妙|的外れ))"
    ),
    ("おすすめ", "オススメ", "お勧め", "お薦め", "提案", "検索", "回答", "返事", "返答",
     "答え", "説明", "サービス", "アプリ", "サイト", "対応", "サポート", "配送", "チャット",
     "あなた"),
)  # fmt: skip
"""「おすすめが最高でした」, 「検索が使えない」, 「回答が間違ってる」."""
JA_FEEDBACK_AGAIN = Gated(
    re.compile(
        r"(?:また|いつも|毎回)(?:違う|ちがう|間違った|間違えた|同じ)(?:巻|本|漫画|マンガ|作品|もの)"
    ),
    ("また", "いつも", "毎回"),
)
"""「また違う巻を勧めてる」, 「いつも同じ漫画ばかり」: a complaint about what is offered."""

EN_HABIT = Gated(
    re.compile(
        r"\bi\s+(?:(?:also|just|pretty\s+much|almost)\s+)?(?P<adv>always|usually|normally|"
        r"typically|generally|mostly|often|tend\s+to|never|rarely|only\s+ever)\s+"
        r"(?:(?:just|only)\s+)?(?P<verb>buy|order|read|pick\s+up|pre-?order|shop|collect|"
        r"get(?!\s+(?:confused|lost|bored|tired|annoyed|angry|upset|sick|scared|frustrated|"
        r"distracted|mixed\s+up)\b)|"
        r"wait|start|finish|binge|re-?read|listen|pay|use|keep|skip|borrow|rent|download)\b"
        r"(?P<rest>.*)"
    ),
    ("always", "usually", "normally", "typically", "generally", "mostly", "often", "tend",
     "never", "rarely", "only ever"),
)  # fmt: skip
"""A self-described habit: "I always buy the whole set", "I usually read at night"."""
SERVICE_OBJECT = re.compile(rf"^(?:your|the|this|these|those)\s+(?:[a-z]+\s+)?{_SERVICE}$")
"""The object of "I love / hate …" when it is the service ("I love your recommendations"):
feedback, not an opinion about a thing."""
JA_HABIT = Gated(
    re.compile(
        r"(?:いつも|普段|ふだん|大抵|たいてい|基本的に|基本|毎回|だいたい)(?:は|、)?"
        r"(?P<rest>.{0,30}?)(?:買う|買います|買ってる|買っています|買ってます|読む|読みます|"
        r"読んでる|読んでいます|読んでます|注文する|注文します|注文してる|注文しています|"
        r"予約する|予約します|予約してる|予約しています|まとめ買い)"
    ),
    ("いつも", "普段", "ふだん", "大抵", "たいてい", "基本", "毎回", "だいたい"),
)  # fmt: skip
"""「いつもセットで買います」, 「普段は夜に読みます」."""
_JA_PERSON = (
    r"(?:息子|娘|妻|夫|主人|友達|友人|母|父|兄|姉|弟|妹|彼女|彼|家族|子供|子ども|同僚|上司)"
)
JA_OTHER_PERSON = re.compile(rf"{_JA_PERSON}(?:は|が|も)")
"""Someone else as the subject (「息子はいつもセットで買います」): their habit, not the user's."""
JA_NAME_TOPIC = re.compile(rf"{_JA_PERSON}(?:さん|ちゃん|くん)?(?:(?:は|って)[、,]?|[、,])\s*$")
"""Someone else as the topic right before a bare 「名前は」: 「娘、名前はハナです」,
「息子は、名前は太郎」 give the child's name, not the user's (as 「娘の名前は」 does)."""
JA_NOT_MINE = re.compile(
    rf"{_JA_PERSON}(?:さん|ちゃん|くん|たち|達)?(?:は|が|も|に|へ|のため|向け|の$)"
)
"""Someone else before a preference's verb: the topic (「妹はホラーが苦手」), the one it
is for (「娘にセイネンが好き」「息子のために」), or whose favourite (「娘の好きなジャンルは」,
tested on the text before 好きな): their taste or a gift, not the user's."""
JA_BARE_LIKE = re.compile(
    r"^(?:でも|やっぱり|やっぱ|結局|けっこう|結構|とても|すごく|本当は|本当に|ほんとに|めっちゃ|かなり)*"
    r"(?P<verb>大好き|好き)(?:です|だ|なんです|なんだ|だよ|ですね|だね|よ|ね)*$"
)
"""The clause after a dislike that takes it back: 「ホラーは苦手だけど好き」."""
_FEEDBACK_HABIT_GATES = (
    EN_FEEDBACK_SERVICE, EN_FEEDBACK_EXCLAIM, EN_FEEDBACK_THANKS, EN_FEEDBACK_YOU, JA_FEEDBACK,
    JA_FEEDBACK_AGAIN, EN_HABIT, JA_HABIT,
)  # fmt: skip
FEEDBACK_OR_HABIT = any_of(s for gate in _FEEDBACK_HABIT_GATES for s in gate.requires)
"""Found in a folded text whenever a feedback or habit rule can match in it: one search
instead of the eight gates, which most sentences pass none of."""


# What a sentence must hold for any rule to draft a memory from it: every gate's strings,
# and a literal that each ungated drafting pattern needs (in the form it reads; folded
# English, normal Japanese, which folding leaves as it is). A turn that holds none of them
# (most do not) skips the rules. Keep it complete when adding a rule:
# tests/longterm/test_detect_triggers.py checks it against the engine without the gate.
_UNGATED_TRIGGERS = (
    "remember", "mind", "forget",  # EN_REMEMBER ("keep in mind", "don't forget")
    "call",  # EN_CALL_ME
    "meant", "what",  # EN_STRONG_CORRECTION ("i meant", "that's not what i said")
    "no", "nah", "sorry", "oops", "wait", "actually",  # EN_WEAK_CORRECTION ("nope" too),
    # EN_NO_THING ("no horror")
    "いいえ", "いや", "違", "ちが",  # JA_WEAK_CORRECTION
)  # fmt: skip
_PREFERENCE_GATES = (
    EN_NAME, EN_FAVORITE, EN_PREFER, EN_NEG_LIKE, EN_HATE, EN_FAN, EN_LIKE, EN_NOT_FAN,
    JA_REMEMBER, JA_CALL_ME, JA_FAVORITE, JA_NAME, JA_PREFER, JA_NEG_LIKE, JA_DISLIKE,
    JA_LIKE, JA_CONTRAST,
)  # fmt: skip
DRAFTING_GATES = _PREFERENCE_GATES + _FEEDBACK_HABIT_GATES
"""The gated patterns that can draft a memory (the detector's; not the slot rules')."""
PREFERENCE_TRIGGERS = any_of(
    [*_UNGATED_TRIGGERS, *(s for g in _PREFERENCE_GATES for s in g.requires)]
)
"""Found in a turn's folded text whenever a rule other than feedback and habits (requests
to remember, names, preferences, corrections) can draft a memory from it."""
DRAFT_TRIGGERS = any_of([*_UNGATED_TRIGGERS, *(s for g in DRAFTING_GATES for s in g.requires)])
"""Found in a turn's folded text whenever some rule can draft a memory from it: a turn
opens it (most do not) or :data:`PREFERENCE_TRIGGERS` and :data:`FEEDBACK_OR_HABIT`."""


# Small patterns and lists of the engine's clean-up steps.
JA_QUESTION_ENDS = ("か", "かな", "かしら", "の")
QUESTION_MARKS = ("?", "？")
QUESTION_TRAIL = " .。!…"
JA_OBJECT_SPLIT = re.compile(r"[、,]")
JA_CONTRASTS = ("じゃなくて", "じゃなく", "ではなくて", "ではなく", "より")
TRAILING_PLEASE = re.compile(r"[,\s]*please[.!?]*$", re.IGNORECASE)
PLEASE_AND_AFTER = re.compile(r"[,\s]*please\b.*$", re.IGNORECASE)
JA_DO_NOT_CALL = re.compile(r"呼ばないで|呼ぶな")
LEFTOVER_SPLIT = re.compile(r"[\s,、・/]+")
DIGIT = re.compile(r"[0-9０-９]")
"""A digit, ASCII or full-width: a sentence with a number is kept by rule summaries."""


# ---------------------------------------------------------------- slot statements
# Read by the structured extraction of summaries (:mod:`tiermem.summaries.structured`): which
# sentence states the value of a slot ("my budget is ¥8,000"), which values a correction
# says are wrong ("…, not ¥5,000"), and whose statement it is (a quoted email, a friend).

EN_POSSESSIVE = Gated(
    re.compile(
        r"\b(?:my|our)\s+(?P<noun>[a-z][a-z0-9\- ]{0,40}?)\s+(?:is|=|has\s+changed\s+to|"
        r"changed\s+to)\s+(?:now\s+|actually\s+|still\s+|also\s+)?(?P<obj>.+)"
    ),
    ("my ", "our "),
)
"""'my <noun> is <value>': the generic slot statement; the slot is the noun."""
SLOT_NOUNS = {
    "postal code": "postcode", "zip code": "postcode", "zip": "postcode",
    "phone": "phone_number", "mobile": "phone_number", "mobile number": "phone_number",
    "phone number": "phone_number", "telephone number": "phone_number",
    "shipping address": "address", "delivery address": "address", "mailing address": "address",
    "home address": "address", "max budget": "budget", "total budget": "budget",
    "delivery deadline": "delivery_date", "delivery date": "delivery_date",
}  # fmt: skip
"""Nouns of one slot written in several ways, and the slot they name."""
NOUN_ENTITY_KINDS = {
    "order": "order_id", "order number": "order_id", "order id": "order_id",
    "order no": "order_id", "asin": "asin", "isbn": "isbn", "email": "email",
    "email address": "email", "e-mail": "email", "e-mail address": "email",
    "volume": "volume", "language": "language", "series": "series",
}  # fmt: skip
"""Nouns that name an entity kind: the value must be a well-formed entity of that kind
(a malformed ASIN or order id is rejected, not stored)."""
NOUN_NEEDS_MONEY = frozenset({"budget", "price", "limit", "spending limit"})
NOUN_STOP = _word_set(
    """
    question point problem issue concern guess bad apologies pleasure understanding hope
    plan goal mistake fault idea thought worry answer reason favorite favourite fave name
    preferred all-time absolute current
    """
)
"""Nouns that do not name a slot ("my point is…"), or that other rules read (goals, names,
favourites)."""

EN_BUDGET = Gated(
    re.compile(
        r"\b(?:budget|spend(?:ing)?\s+(?:up\s+to|at\s+most|no\s+more\s+than|max(?:imum)?)|"
        r"can\s+afford|keep\s+it\s+(?:under|below)|stay\s+(?:under|below)|max(?:imum)?\s+is)\b"
    ),
    ("budget", "spend", "afford", "keep it", "stay", "max"),
)
EN_DELIVERY = Gated(
    re.compile(
        r"\b(?:deliver(?:y|ed)?|arriv(?:e|al)|ship(?:ped|ping)?\s+by|need\s+it\s+(?:by|before|on))\b"
    ),
    ("deliver", "arriv", "ship", "need it"),
)
EN_LOCATION = Gated(
    re.compile(r"\bi(?:'m|\s+am)?\s+(?:live|living|based|staying|located)\s+in\s+(?P<obj>.+)"),
    ("live", "living", "based", "staying", "located"),
)
EN_NEGATED_TAIL = Gated(
    re.compile(r"\b(?:not|instead\s+of|rather\s+than)\b[^,;]*"),
    ("not", "instead", "rather"),
)
"""The part of a sentence that names a wrong value: "¥8,000, not ¥5,000"."""
EN_SWITCH = Gated(
    re.compile(
        r"^(?:(?:ok(?:ay)?|oh|hmm|actually|wait|no|sorry)[,.!]*\s+)*(?:forget\s+(?:that|it|"
        r"about\s+(?:that|it))|never\s*mind|scratch\s+that|change\s+of\s+plans?|"
        r"let's\s+switch\s+to|switch(?:ing)?\s+to\s+something\s+else)\b"
    ),
    ("forget", "never", "scratch", "change of plan", "switch"),
)
"""An explicit change of subject: the active product entities expire (seed 001)."""
JA_SWITCH = Gated(
    re.compile(r"^(?:やっぱり|それは)?(?:いいや|もういい|忘れて|やめて)"), ("いい", "忘れ", "やめ")
)
EN_THIRD_PARTY = Gated(
    re.compile(
        r"\b(?:my|our)\s+(?:[a-z]+\s+)?(?:friend|sister|brother|wife|husband|partner|mom|mum|"
        r"mother|dad|father|son|daughter|kid|child|colleague|coworker|co-worker|boss|"
        r"neighbou?r|cousin|nephew|niece|roommate)'s\b|\b(?:another|other|a\s+different)\s+"
        r"customer|\bsomeone\s+else|\b(?!(?:it|that|let|what|here|there|he|she|who|where)'s)"
        r"[a-z]+'s\s+(?:order|email|address|budget|account|phone|number|isbn|asin|card)\b|"
        r"\b(?:his|her|their)\s+(?:order|email|address|budget|account|phone|number|card)\b"
    ),
    ("'s", "customer", "someone", "his ", "her ", "their "),
)
"""A statement about someone else: its values are not the user's."""
EN_HYPOTHETICAL = re.compile(
    r"^(?:[a-z]+[,]?\s+)?(?:if|what\s+if|suppose|supposing|imagine|hypothetically)\b"
)
QUOTED_LINE = re.compile(r"^\s*(?:>|\|)")
"""A quoted line of a pasted email or message."""
EN_DECISION = Gated(
    re.compile(
        r"\b(?:(?:i|we)(?:'ll|\s+will)\s+(?:take|buy|go\s+with|order|get)|"
        r"let's\s+(?:go\s+with|do)|(?:i|we)(?:'ve|\s+have)?\s+decided|(?:i|we)\s+choose|"
        r"(?:i'm|we're)\s+going\s+with|decision:|"
        r"(?:i|we)(?:'ve|\s+have)\s+(?:placed|added|reserved|booked|cancell?ed|ordered|applied)|"
        r"go\s+ahead\s+(?:and|with)|"
        # "Put it in my cart", "add vol 3 to the order" (not "don't put it in my cart").
        r"(?<!n't\s)(?<!not\s)(?<!never\s)(?:put|add)\s+(?:[\w'.-]+\s+){1,6}?"
        r"(?:in|into|to)\s+(?:my|our|the)\s+(?:cart|basket|order))\b"
    ),
    ("i'll", "i will", "we'll", "we will", "let's", "decided", "choose", "going with",
     "decision", "i've", "i have", "we've", "we have", "go ahead", "cart", "basket", "order"),
)  # fmt: skip
EN_GOAL = Gated(
    re.compile(
        r"\b(?:i(?:'m|\s+am)\s+(?:looking\s+for|trying\s+to|hoping\s+to|shopping\s+for|after)|"
        r"i\s+want\s+to|i\s+need\s+to|my\s+goal\s+is|our\s+goal\s+is|"
        r"i(?:'d|\s+would)\s+like\s+to|i\s+want\s+(?:a|an|the|some|to)\b)"
    ),
    ("looking", "trying", "hoping", "shopping", "after", "want", "need", "goal", "like to"),
)
_LATER_REQUEST = (
    # Asking to hear about something that has not happened yet: "let me know when it's
    # back", "notify me if the price drops" ("let me know if you have it" asks now).
    r"(?:let\s+me\s+know|keep\s+me\s+posted)\s+(?:when|once|as\s+soon\s+as)|"
    r"(?:notify|alert|email|e-mail|message|ping|text)\s+me\s+(?:when|once|as\s+soon\s+as|if)|"
    # "remind me about the preorder", not "remind me what the price was" (asks now).
    r"remind\s+me(?!\s+(?:what|which|who|how|where|why|of\s+what)\b)"
)
EN_UNRESOLVED = Gated(
    re.compile(
        r"\b(?:i(?:'ll|\s+will)\s+(?:think\s+about|decide|come\s+back|get\s+back|let\s+you\s+know|"
        r"check\s+(?:later|back|with))|not\s+sure\s+yet|haven't\s+decided|"
        r"still\s+need\s+to|(?:can|could)\s+you\s+(?:check|find\s+out|look\s+into)\s+.*\blater|"
        r"decide\s+later|to\s+be\s+decided|tbd|pending|"
        # Waiting on someone else: "let me check with my wife first", "I need to ask my
        # husband", "let me think it over".
        r"let\s+me\s+(?:(?:check|talk|speak|consult)\s+with|ask\s+(?:my|our)|"
        r"think\s+(?:about\s+it|it\s+over)|sleep\s+on\s+it)|"
        r"(?:need|have)\s+to\s+(?:(?:check|talk|speak|consult)\s+with|ask\s+(?:my|our))|"
        rf"{_LATER_REQUEST})\b"
    ),
    ("think", "decide", "come back", "get back", "let you know", "check", "remind", "not sure",
     "haven't", "still need", "later", "tbd", "pending", "to be decided", "let me",
     "need to", "have to", "me when", "me once", "me as soon", "me if", "posted"),
)  # fmt: skip
EN_REQUESTED_UNRESOLVED = Gated(
    re.compile(
        r"\b(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?(?:"
        rf"{_LATER_REQUEST}|(?:check|find\s+out|look\s+into)\s+.*\blater|"
        r"(?:hold|reserve|save|keep)\s+(?:it|that|this|them|one|a\s+copy)\s+for\s+me)|"
        rf"^(?:please\s+)?(?:{_LATER_REQUEST}))\b"
    ),
    ("you", "let me", "me when", "me once", "me as soon", "me if", "posted", "remind"),
)  # fmt: skip
"""A question that asks for something later ("can you let me know when vol 43 is back?",
"could you remind me next week?"): an unresolved intention although it ends in "?". An
ordinary question ("is vol 43 in stock?", "can you check if it's in stock?") is not."""
EN_ASSISTANT_UNRESOLVED = Gated(
    re.compile(
        r"\bi(?:'ll|\s+will)\s+(?:check|get\s+back|follow\s+up|let\s+you\s+know|look\s+into|"
        r"notify|remind)\b"
    ),
    ("i'll", "i will"),
)
JA_SLOT = Gated(
    re.compile(
        r"(?:(?:私|わたし|僕|ぼく|俺)の)?(?P<noun>予算|住所|メールアドレス|メール|電話番号|注文番号|"
        r"郵便番号|誕生日)は(?P<obj>.+?)(?:です|だよ|だ|になります)?[。.!！]*$"
    ),
    ("は",),
)
JA_SLOT_NOUNS = {
    "予算": "budget", "住所": "address", "メールアドレス": "email", "メール": "email",
    "電話番号": "phone_number", "注文番号": "order", "郵便番号": "postcode",
    "誕生日": "birthday",
}  # fmt: skip
"""Japanese slot nouns, as the English noun they stand for."""
EN_SLOT_CHANGE = Gated(
    re.compile(
        r"\b(?:change|set|update|switch)\s+(?:the\s+|my\s+|our\s+)"
        r"(?P<noun>[a-z][a-z0-9\- ]{0,40}?)\s+to\s+(?P<obj>.+)"
    ),
    ("change", "set", "update", "switch"),
)
"""'change the <noun> to <value>' (also set, update, switch): a restatement."""
EN_SLOT_USE = Gated(
    re.compile(
        r"\b(?:use|put)\s+(?P<obj>[^,;]+?)\s+(?:down\s+)?as\s+(?:the\s+|my\s+|our\s+)"
        r"(?P<noun>[a-z][a-z0-9\- ]{0,40}?)(?:\s+from\s+now\s+on|\s+instead|\s+please)?\s*[.!]*$"
    ),
    ("use", "put"),
)
"""'use <value> as the <noun>', 'put <value> down as my <noun>'."""
EN_SLOT_REVERSED = Gated(
    re.compile(
        r"^(?P<obj>[^,;]+?)\s+(?:is|will\s+be)\s+(?:my|our)\s+(?:new\s+)?"
        r"(?P<noun>[a-z][a-z0-9\- ]{0,40}?)\s*[.!]*$"
    ),
    (" my ", " our "),
)
"""'<value> is my <noun>'."""
PREFERENCE_HEADS = frozenset({"favorite", "favourite", "fave", "preferred"})
