"""Rule-based entity extraction: fast, deterministic, no LLM, on every turn's hot path.

Seed 001 keeps the entities a user mentioned (series, volumes, ASINs, order ids, languages)
as the session's *active entities*, so "is it in stock?" three turns later still means
Berserk vol 42. Its own review names the risk of LLM extraction: a malformed id ("B07-1234")
pollutes every later turn. Here each kind is a regex with a validator (ISBN check digits,
real calendar dates), and values are normalised so that "¥1,200" and "1200円" are one
entity. The rules are data (:data:`DEFAULT_ENTITY_RULES`): regex rules (:class:`EntityRule`)
and word lists (:class:`PhraseRule`).

========  ==========================================  ===========================
kind      matches                                     value
========  ==========================================  ===========================
order_id  ``ORD-12345`` (4..12 digits, any case)      ``ORD-12345``
asin      ``B0`` + 8 upper-case letters or digits     as written
isbn      ISBN-13 (978/979) with a valid check digit; digits only, ``X`` upper
          ISBN-10 with a valid check digit when it    case: ``9784088512341``
          follows "ISBN" or is written with hyphens
email     ``name@example.com``                        domain lower-cased
money     ``$50,000`` ``¥1,200`` ``€9.99`` ``£5``     ``USD 50000`` ``JPY 1200``
          ``1200円`` ``500 yen`` ``20 dollars``
date      ``2024-01-15`` ``2024年1月15日``             ``2024-01-15`` (ISO)
volume    ``vol 42`` ``vol. 42`` ``volume 42``        ``42``
          ``42巻`` ``第42巻``
language  Japanese English Chinese Korean French …    English name, lower case
          日本語 英語 中国語 韓国語 フランス語 …
genre     seinen shonen/shōnen shojo/shōjo josei      English name, lower case
          isekai horror romance fantasy dark fantasy  (``青年`` → ``seinen``)
          青年 セイネン 少年 少女 異世界 ホラー …
========  ==========================================  ===========================

Series come from a catalogue the caller supplies (alias → canonical title), matched
case-insensitively as whole words (:class:`~tiermem.policies.phrases.PhraseIndex`); a
match inside a series title (the "Fantasy" of "Final Fantasy") is not reported as another
kind. Text is read in NFKC form, so full-width ``４２巻`` is volume 42. Kanji numerals
(``四十二巻``) are not read; ``青年`` and ``少女`` are reported as genres even where they
just mean "young man" and "girl". Of a long turn, only the rule window is read: its first
8,000 and last 4,000 characters (:mod:`tiermem.policies.turn_text` says why).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Protocol

from tiermem.errors import ValidationError
from tiermem.models.content import text_of
from tiermem.models.turns import Entity
from tiermem.policies.phrases import LATIN_WORD_CHARS as _L
from tiermem.policies.phrases import PhraseIndex, TextView, phrase_key
from tiermem.policies.turn_text import TurnText, as_turn_text
from tiermem.text_caches import track_table

__all__ = [
    "DEFAULT_ENTITY_RULES",
    "DEFAULT_READER",
    "EntityExtractor",
    "EntityRule",
    "PhraseRule",
    "RuleEntityExtractor",
    "extract_entities",
]

_DIGITS = tuple("0123456789")
# What may hold upper-case letters in a folded pattern: escapes, group names and character
# classes ("[A-Za-z]" is harmless). An upper-case letter elsewhere could never match.
_NOT_LITERAL = re.compile(r"\\.|\(\?P<[^>]*>|\(\?P=[^)]*\)|\[(?:\\.|[^\]])*\]")


class EntityExtractor(Protocol):
    """Finds entities in text. Implementations are pure, safe to call from several threads,
    and return each entity once.

    ``text`` is a plain string or a turn's :class:`~tiermem.policies.turn_text.TurnText`;
    :func:`~tiermem.policies.turn_text.as_turn_text` turns either into the latter. Rule
    engines read its rule window (``text.view``); an engine that wants every word reads
    ``text.text``.
    """

    def extract(self, text: str | TurnText) -> tuple[Entity, ...]:
        """The entities in ``text``, deduplicated, in order of first appearance."""
        ...


@dataclass(frozen=True, slots=True)
class EntityRule:
    """One kind of entity: a regex and a function from a match to a value.

    ``value`` returns ``None`` to reject a match (a bad check digit, the 31st of February).
    With ``folded`` (the default) the rule reads :attr:`TextView.folded` and its pattern
    must be in lower case (faster than ``re.IGNORECASE``); otherwise it reads the NFKC text
    with its case. ``requires`` lists strings of which the text must hold one for the rule
    to run at all: a cheap gate before the regex. Raises
    :class:`~tiermem.errors.ValidationError` for an empty kind, a bad pattern, or upper-case
    letters in a folded pattern.
    """

    kind: str
    pattern: str
    value: Callable[[re.Match[str]], str | None]
    folded: bool = True
    requires: tuple[str, ...] = ()
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.kind:
            raise ValidationError("an entity rule needs a kind, e.g. 'volume'")
        try:
            object.__setattr__(self, "_regex", re.compile(self.pattern))
        except re.error as exc:
            raise ValidationError(f"entity rule {self.kind!r}: bad pattern: {exc}") from exc
        if self.folded and re.search("[A-Z]", _NOT_LITERAL.sub("", self.pattern)):
            raise ValidationError(
                f"entity rule {self.kind!r} reads folded text but its pattern has upper-case "
                "letters; write it in lower case or pass folded=False"
            )

    def find(self, view: TextView) -> list[tuple[int, int, str]]:
        """``(start, end, value)`` of each accepted match in ``view``."""
        text = view.folded if self.folded else view.normal
        if self.requires and not any(map(text.__contains__, self.requires)):
            return []
        return self._scan(text)

    def _scan(self, text: str) -> list[tuple[int, int, str]]:
        """:meth:`find` in the text this rule reads, its gate already passed (the
        extractor tests every rule's gate strings at once)."""
        value = self.value
        return [
            (match.start(), match.end(), found)
            for match in self._regex.finditer(text)
            if (found := value(match)) is not None
        ]


class PhraseRule:
    """One kind of entity from a word list: each key a way to write a name, each value the
    entity value (``{"青年": "seinen", "seinen": "seinen"}``).

    Names match as whole phrases, case-insensitively (:class:`PhraseIndex`); the list may be
    long (a catalogue of titles). Raises :class:`~tiermem.errors.ValidationError` for an
    empty list, or an empty name or value.
    """

    __slots__ = ("_index", "_values", "kind")

    def __init__(self, kind: str, names: Mapping[str, str]) -> None:
        if not kind:
            raise ValidationError("a phrase rule needs a kind, e.g. 'series'")
        for name, value in names.items():
            if not isinstance(value, str) or not value.strip():
                raise ValidationError(f"{kind} {name!r} has no value; map it to a name")
        self.kind = kind
        self._index = PhraseIndex(names)
        self._values = {phrase_key(name): value for name, value in names.items()}

    def __repr__(self) -> str:
        return f"PhraseRule({self.kind!r}, {len(self._values)} names)"

    def find(self, view: TextView) -> list[tuple[int, int, str]]:
        """``(start, end, value)`` of each name in ``view``."""
        found = self._index.find(view)
        if not found:  # most texts name nothing from a list
            return found
        values = self._values
        return [(start, end, values[key]) for start, end, key in found]


# ---------------------------------------------------------------- value functions


def _upper(match: re.Match[str]) -> str:
    return match.group(0).upper()


def _as_written(match: re.Match[str]) -> str:
    return match.group(0)


def _email(match: re.Match[str]) -> str | None:
    local, _, domain = match.group(0).rpartition("@")
    tld = domain.rpartition(".")[2]
    if "." not in domain or len(tld) < 2 or not tld.isalpha():
        return None  # "a@b", "a@b.1": not an address
    return f"{local}@{domain.lower()}"


_ISBN_PREFIX = re.compile(r"isbn(?:-?1[03])?:?\s*")


def _isbn(match: re.Match[str]) -> str | None:
    written = match.group(0)
    # Only the rule with the word starts with "i" (the others with a digit): no regex
    # call for theirs. A catalogue's tool output holds an ISBN a row.
    prefix = _ISBN_PREFIX.match(written) if written[0] == "i" else None
    if prefix:
        written = written[prefix.end() :]
    digits = written.replace("-", "").replace(" ", "").upper()
    if len(digits) == 13 and digits.isdigit() and digits.startswith(("978", "979")):
        if digits.isascii():  # always, from the built-in patterns ([0-9])
            # The weighted digit sum from the bytes, in C: each byte is its digit + 48,
            # 7 of them weighted 1 and 6 weighted 3.
            raw = digits.encode("ascii")
            total = sum(raw[::2]) + 3 * sum(raw[1::2]) - 48 * (7 + 3 * 6)
        else:
            total = sum(int(d) * (1 if i % 2 == 0 else 3) for i, d in enumerate(digits))
        return digits if total % 10 == 0 else None
    if len(digits) == 10 and digits[:9].isdigit() and (digits[9].isdigit() or digits[9] == "X"):
        # A bare 10-digit number is as likely a phone number: ask for a sign it is an ISBN.
        if not (prefix or "-" in written):
            return None
        total = sum((10 - i) * (10 if d == "X" else int(d)) for i, d in enumerate(digits))
        return digits if total % 11 == 0 else None
    return None


_CURRENCIES = {
    "$": "USD", "¥": "JPY", "€": "EUR", "£": "GBP", "円": "JPY", "yen": "JPY",
    "dollar": "USD", "dollars": "USD", "usd": "USD", "jpy": "JPY", "eur": "EUR",
    "euro": "EUR", "euros": "EUR",
}  # fmt: skip
_MONEY_PARTS = re.compile(r"([$¥€£]?)\s?([0-9][0-9,]*(?:\.[0-9]+)?)\s?(.*)")


_SYMBOLS = {"$": "USD", "¥": "JPY", "€": "EUR", "£": "GBP"}


def _money(match: re.Match[str]) -> str | None:
    written = match.group(0)
    currency = _SYMBOLS.get(written[0])
    if currency is not None:
        # The symbol rule's match: the symbol, at most one space (``\s?``), then the
        # amount, which is what ``_MONEY_PARTS`` would split it into (a catalogue's tool
        # output holds a price a row).
        amount = written[2:] if written[1].isspace() else written[1:]
        return f"{currency} {amount.replace(',', '')}"
    parts = _MONEY_PARTS.fullmatch(written)
    if parts is None:
        return None
    symbol, amount, word = parts.groups()
    return f"{_CURRENCIES[symbol or word]} {amount.replace(',', '')}"


def _date(match: re.Match[str]) -> str | None:
    try:
        return date(int(match["y"]), int(match["m"]), int(match["d"])).isoformat()
    except ValueError:  # not a calendar date: 2024-02-30, 2024-13-01
        return None


_FIRST_NUMBER = re.compile(r"[0-9]+")


def _volume(match: re.Match[str]) -> str | None:
    written = match.group(0)
    if written[0] == "v":
        # "vol 42", "volume 3": the word's rule, whose only digits end the match.
        return str(int(written[len(written.rstrip("0123456789")) :]))  # "vol 007" is 7
    number = _FIRST_NUMBER.search(written)
    return str(int(number.group())) if number else None


_LANGUAGES = {
    "Japanese": "japanese", "日本語": "japanese", "English": "english", "英語": "english",
    "Chinese": "chinese", "中国語": "chinese", "Korean": "korean", "韓国語": "korean",
    "French": "french", "フランス語": "french", "German": "german", "ドイツ語": "german",
    "Spanish": "spanish", "スペイン語": "spanish",
}  # fmt: skip
_GENRES = {
    "seinen": "seinen", "セイネン": "seinen", "青年": "seinen",
    "shonen": "shonen", "shōnen": "shonen", "shounen": "shonen", "少年": "shonen",
    "shojo": "shojo", "shōjo": "shojo", "shoujo": "shojo", "少女": "shojo",
    "josei": "josei", "isekai": "isekai", "異世界": "isekai",
    "horror": "horror", "ホラー": "horror", "romance": "romance", "恋愛": "romance",
    "fantasy": "fantasy", "ファンタジー": "fantasy",
    "dark fantasy": "dark fantasy", "ダークファンタジー": "dark fantasy",
}  # fmt: skip

# Speed: each pattern starts with a literal or one character class, and checks its left
# boundary with a lookbehind *after* it ("isbn(?<![a-z]isbn)", "[0-9](?<![0-9].)"), so re
# can jump to candidates. A leading lookbehind, re.IGNORECASE, or alternatives
# that start differently all turn that off and made extraction several times slower. A kind
# with two shapes ("vol 42", "42巻") is two rules, each behind a cheap ``requires`` gate.
_ISBN_END = rf"(?![{_L}\-])"

DEFAULT_ENTITY_RULES: tuple[EntityRule | PhraseRule, ...] = (
    EntityRule(
        "order_id", rf"ord-(?<![{_L}]ord-)[0-9]{{4,12}}(?![{_L}])", _upper, requires=("ord-",)
    ),
    EntityRule(
        "asin",
        rf"B0(?<![{_L}]B0)[A-Z0-9]{{8}}(?![{_L}])",
        _as_written,
        folded=False,
        requires=("B0",),
    ),
    EntityRule(
        "isbn",
        rf"isbn(?<![{_L}]isbn)(?:-?1[03])?:?\s*[0-9](?:[- ]?[0-9]){{8,11}}[- ]?[0-9x]{_ISBN_END}",
        _isbn,
        requires=("isbn",),
    ),
    EntityRule(  # ISBN-13 without the word: starts 978 or 979
        "isbn",
        rf"97(?<![{_L}\-]97)[89](?:[- ]?[0-9]){{10}}{_ISBN_END}",
        _isbn,
        requires=("978", "979"),
    ),
    EntityRule(  # ISBN-10 without the word: written with hyphens
        "isbn",
        rf"[0-9](?<![{_L}\-].)(?:-?[0-9]){{8}}-?[0-9x]{_ISBN_END}",
        _isbn,
        requires=("-",),
    ),
    EntityRule(
        "email",
        r"[A-Za-z0-9._%+-](?<![A-Za-z0-9._%+-].)[A-Za-z0-9._%+-]*+"
        r"@[A-Za-z0-9-]++(?:\.[A-Za-z0-9-]++)*+",
        _email,
        folded=False,
        requires=("@",),
    ),
    EntityRule(
        "money",
        rf"[$¥€£]\s?(?:[0-9]{{1,3}}(?:,[0-9]{{3}})+|[0-9]+)(?:\.[0-9]+)?(?![0-9{_L}])",
        _money,
        requires=("$", "¥", "€", "£"),
    ),
    EntityRule(
        "money",
        rf"[0-9](?<![0-9.,{_L}].)(?:[0-9]{{0,2}}(?:,[0-9]{{3}})+|[0-9]*)(?:\.[0-9]+)?"
        rf"\s?(?:円|yen|dollars?|euros?|usd|jpy|eur)(?![{_L}])",
        _money,
        requires=("円", "yen", "dollar", "euro", "usd", "jpy", "eur"),
    ),
    EntityRule(
        "date",
        r"(?P<y>[0-9](?<![0-9].)[0-9]{3})-(?P<m>[0-9]{2})-(?P<d>[0-9]{2})(?![0-9]|-[0-9])",
        _date,
        requires=("-",),
    ),
    EntityRule(
        "date",
        r"(?P<y>[0-9](?<![0-9].)[0-9]{3})年(?P<m>[0-9]{1,2})月(?P<d>[0-9]{1,2})日",
        _date,
        requires=("年",),
    ),
    EntityRule(
        "volume",
        rf"vol(?<![{_L}]vol)(?:ume)?\.?\s*[0-9]{{1,4}}(?![0-9])",
        _volume,
        requires=("vol",),
    ),
    EntityRule(
        "volume",
        r"[第0-9](?:(?<=第)\s*[0-9]{1,4}|(?<![0-9].)(?<=[0-9])[0-9]{0,3})\s*巻",
        _volume,
        requires=("巻",),
    ),
    PhraseRule("language", _LANGUAGES),
    PhraseRule("genre", _GENRES),
)
"""The built-in rules, in the order of the table in this module's docstring."""


class RuleEntityExtractor:
    """Extracts entities with rules and a catalogue of series titles.

    ``known_titles`` maps each way of writing a title to its canonical name, e.g.
    ``{"Berserk": "Berserk", "ベルセルク": "Berserk"}``; a match yields
    ``Entity(kind="series", value=canonical)``. ``rules`` replaces the built-in rules.
    Raises :class:`~tiermem.errors.ValidationError` for an empty title or canonical name.
    """

    def __init__(
        self,
        known_titles: Mapping[str, str] | None = None,
        *,
        rules: Iterable[EntityRule | PhraseRule] = DEFAULT_ENTITY_RULES,
    ) -> None:
        self._titles = PhraseRule("series", known_titles) if known_titles else None
        self._rules = tuple(rules)
        # One pass over the gate strings of every rule, then only the rules that can
        # match run: most turns hold none of "ord-", "B0", "@", "$", "vol"... and a
        # rule call costs more than a substring test.
        # A gate string found in the normal text is keyed apart from one found in the
        # folded text (``_NORMAL`` first), so a rule is selected exactly when its own gate
        # test passes, in the form of the text it reads.
        gated = [r for r in self._rules if isinstance(r, EntityRule) and r.requires]
        self._folded_gates = tuple({t for r in gated if r.folded for t in r.requires})
        normal_gates = {t: _NORMAL + t for r in gated if not r.folded for t in r.requires}
        self._normal_gates = tuple(normal_gates)
        self._normal_keys = normal_gates
        # A string with a non-ASCII character is in no ASCII text: most turns test fewer.
        self._folded_ascii_gates = tuple(t for t in self._folded_gates if t.isascii())
        self._normal_ascii_gates = tuple(t for t in self._normal_gates if t.isascii())
        # A word list runs only when one of its phrases' first words (first characters)
        # is a key of the text (TextView.keys): its gate keys are those first words,
        # marked apart (``_PHRASE``). One intersection with the keys of the text finds
        # the word lists that can match; most turns name none. A list that has phrases
        # starting with ASCII punctuation (not among an ASCII text's keys) always runs.
        phrase_firsts: dict[str, set[str]] = {}
        for rule in self._rules:
            if type(rule) is PhraseRule and not rule._index.punctuation_firsts:
                for first in rule._index.firsts:
                    phrase_firsts.setdefault(first, set()).add(_PHRASE + first)
        self._phrase_firsts = frozenset(phrase_firsts)
        self._plan = tuple((r, _gate_keys(r)) for r in self._rules)
        self._ungated = tuple(r for r, gate in self._plan if gate is None)
        # The rules to run for a set of gate strings found: few distinct sets occur.
        self._selected: dict[frozenset[str], tuple[EntityRule | PhraseRule, ...]] = {}

    def extract(self, text: str | TurnText) -> tuple[Entity, ...]:
        """The entities in ``text``, each ``(kind, value)`` once, by first appearance.

        Reads the rule window of the text (its first 8,000 and last 4,000 characters, see
        :mod:`tiermem.policies.turn_text`): entities in the middle of a long paste are not
        reported.
        """
        found = self._found(as_turn_text(text).view)
        if not found:
            return ()
        if len(found) == 1:  # most turns that name anything name one thing
            _, _, _, kind, value = found[0]
            return _entities(((kind, value),))
        # The first of each pair, in order.
        return _entities(tuple(dict.fromkeys([(kind, value) for _, _, _, kind, value in found])))

    def find(self, text: str | TurnText) -> list[tuple[int, int, str, str]]:
        """``(start, end, kind, value)`` of every entity match in the rule window of
        ``text``, by position, repeats included. Positions index the window's normal form
        (``as_turn_text(text).view.normal``; for a short plain string, its NFKC form), so a
        caller can tell where a value was said ("¥8,000, not ¥5,000")."""
        found = self._found(as_turn_text(text).view)
        return [(start, end, kind, value) for start, _, end, kind, value in found]

    def _found(self, view: TextView) -> list[tuple[int, int, int, str, str]]:
        """:meth:`find`'s matches as ``(start, n, end, kind, value)``, sorted; ``n`` is
        the order in which they were found, which breaks ties."""
        # ``plain_analysis.analyse_plain_text`` inlines this method and ``extract`` for a
        # service's turns: a change here is made there too (its tests compare the two).
        found: list[tuple[int, int, int, str, str]] = []
        titles = self._titles.find(view) if self._titles else []
        starts: list[int] = []
        if titles:
            found += [(start, 0, end, "series", value) for start, end, value in titles]
            # Title spans are sorted and disjoint: the one that could hold a match is the
            # last that starts at or before it.
            starts = [start for start, _, _ in titles]
        folded, normal = view.folded, view.normal
        # The gate strings in the text, tested without a Python frame per string.
        if folded.isascii():
            present = set(filter(folded.__contains__, self._folded_ascii_gates))
            # Not always ASCII too: "İ" folds to "i".
            normal_gates = self._normal_ascii_gates if normal.isascii() else self._normal_gates
        else:
            present = set(filter(folded.__contains__, self._folded_gates))
            normal_gates = self._normal_gates
        if normal_gates:
            present.update(
                map(self._normal_keys.__getitem__, filter(normal.__contains__, normal_gates))
            )
        phrase_firsts = self._phrase_firsts
        if phrase_firsts:
            keys = view._keys
            if keys is None and (
                len(folded) <= _KEYS_AFTER_SUBSTRINGS
                # Every key is a substring of ``folded``: a long text none of whose
                # substrings is a first word (most tool outputs) has none among its keys,
                # which are not built (importance reads the said text, not this one).
                or any(map(folded.__contains__, phrase_firsts))
            ):
                keys = view.keys
            if keys is not None and not keys.isdisjoint(phrase_firsts):
                present.update(_PHRASE + first for first in keys & phrase_firsts)
        # Only the rules one of whose strings is in the text run (the others cannot match).
        rules = self._rules_for(frozenset(present)) if present else self._ungated
        for rule in rules:
            if isinstance(rule, EntityRule):
                # Its gate passed above (an ungated rule has none).
                matches = rule._scan(folded if rule.folded else normal)
            else:
                matches = rule.find(view)
            if not matches:
                continue
            kind = rule.kind
            if not starts:  # no title a match could fall in (most texts)
                n = len(found)
                found += [
                    (start, n + i, end, kind, value)
                    for i, (start, end, value) in enumerate(matches)
                ]
                continue
            for start, end, value in matches:
                i = bisect_right(starts, start) - 1
                if i < 0 or titles[i][1] < end:  # not inside a title
                    found.append((start, len(found), end, kind, value))
        if len(found) > 1:
            found.sort()
        return found

    def _rules_for(self, present: frozenset[str]) -> tuple[EntityRule | PhraseRule, ...]:
        """The rules with no gate or a gate key in ``present``, in order; kept per set
        (bounded: a text can only hold so many of the gate strings, most hold none)."""
        rules = self._selected.get(present)
        if rules is None:
            rules = tuple(
                rule for rule, gate in self._plan if gate is None or not gate.isdisjoint(present)
            )
            if len(self._selected) >= _SELECTIONS:
                self._selected.clear()
            self._selected[present] = rules
        return rules


_NORMAL = "\x00"
_PHRASE = "\x01"


def _gate_keys(rule: EntityRule | PhraseRule) -> frozenset[str] | None:
    """The keys of ``rule``'s gate strings in the extractor's set of those found (None:
    no gate, the rule always runs)."""
    # Only a plain word list is gated by its first words: a subclass's ``find`` (or a
    # rule of another class, which only needs ``kind`` and ``find``) may match otherwise.
    if type(rule) is PhraseRule:
        index = rule._index
        if index.punctuation_firsts:
            return None
        return frozenset(_PHRASE + first for first in index.firsts)
    if not isinstance(rule, EntityRule) or not rule.requires:
        return None
    return frozenset(rule.requires if rule.folded else (_NORMAL + t for t in rule.requires))


_SELECTIONS = 1_024
"""Gate-string sets whose rule selection an extractor keeps."""
_KEYS_AFTER_SUBSTRINGS = 1_000
"""Above this many characters, the first words of the word lists are looked for as
substrings before a text's keys are built (``RuleEntityExtractor._found`` says why);
below it the keys are cheap, and the importance cues read them anyway."""
_ENTITY_CACHE = 2_048
"""Entities, and tuples of them, each table keeps for reuse (:func:`_entity`,
:func:`_entities`); a full table is emptied. Why this size: the sessions of a process
name a few hundred entities again and again, which fit; a conversation with unique texts
names several new ones per turn, each an object (and its field set) the garbage
collector walks for as long as it is kept, so the table must not hold many of those."""
_ENTITIES: dict[tuple[str, str], Entity] = {}
_ENTITY_TUPLES: dict[tuple[tuple[str, str], ...], tuple[Entity, ...]] = {}
track_table(_ENTITIES.clear)  # keyed by entity values: a user's words
track_table(_ENTITY_TUPLES.clear)


def _entities(pairs: tuple[tuple[str, str], ...]) -> tuple[Entity, ...]:
    """The entities of ``pairs``, in order; the same tuple for the same pairs while it is
    kept: a turn keeps its entities for as long as it is stored, and a session names the
    same ones turn after turn (one tuple fewer for the garbage collector to track)."""
    entities = _ENTITY_TUPLES.get(pairs)
    if entities is None:
        entities = tuple([_entity(kind, value) for kind, value in pairs])
        if len(_ENTITY_TUPLES) >= _ENTITY_CACHE:
            _ENTITY_TUPLES.clear()
        _ENTITY_TUPLES[pairs] = entities
    return entities


def _entity(kind: str, value: str) -> Entity:
    """``Entity(kind=kind, value=value)``; the same frozen instance for the same strings
    while it is kept (a session names the same series and volumes turn after turn).
    Nothing relies on that identity: entities compare by value."""
    if type(kind) is not str or type(value) is not str:
        # A custom rule returning something else: validated.
        return Entity(kind=kind, value=value)
    key = (kind, value)
    entity = _ENTITIES.get(key)
    if entity is None:
        # Strings, from the rules: nothing left to validate on this path, which runs for
        # every turn.
        entity = Entity.trusted({"kind": kind, "value": value})
        if len(_ENTITIES) >= _ENTITY_CACHE:
            _ENTITIES.clear()
        _ENTITIES[key] = entity
    return entity


DEFAULT_READER = RuleEntityExtractor()
"""The built-in rules without a title catalogue, one instance per process. Readers that keep
what they read per extractor instance (the summaries' line entities, stale-sentence
verdicts) share it, so a line read by one is not read again by another."""


def extract_entities(
    blocks: tuple[Any, ...] | list[Any], *, extractor: EntityExtractor | None = None
) -> tuple[Entity, ...]:
    """The entities in the text of ``blocks`` (see :func:`~tiermem.models.text_of`).

    Uses ``extractor``, or the built-in rules without a title catalogue.
    """
    return (extractor or DEFAULT_READER).extract(text_of(blocks))
