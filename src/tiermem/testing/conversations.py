"""Seeded long conversations with planted facts, for summary tests and benchmarks.

:func:`generate_conversation` writes a manga-store or a general-assistant conversation of
any length with known ground truth, so a summary engine can be measured: which facts it
kept, whether it kept a corrected value as current, and how much it let in that was not
the user's. A conversation holds:

* **planted facts**: a user states a slot's value ("My postcode is 150-0001.", "I'm
  looking for Berserk.", "I can spend up to ¥5,000."), at a known turn, sometimes followed by
  the assistant echoing it;
* **corrections**: a later user turn gives the same slot a new value ("Actually, my budget is
  ¥8,000, not ¥5,000."; "Sorry, the order number is ORD-48231, not ORD-48213."); the truth
  keeps the new value and the superseded one;
* **distractors**: similar values that are not the user's — another customer's order id in
  a quoted email, a friend's budget, a hypothetical, the assistant's suggestions;
* **filler**: small talk without facts;
* **tool calls with large outputs**: an assistant ``tool_use`` block and a ``tool_result``
  listing dozens of catalogue rows (ASINs, ISBNs, prices) or documents.

Slot names are those of :class:`~tiermem.summaries.structured.RuleStructuredExtractor`:
entity kinds (``series``, ``volume``, ``order_id``, ``asin``, ``isbn``, ``email``,
``language``), nouns (``budget``, ``postcode``, ``phone_number``…), ``name``,
``location`` and ``preference:<key>``. The phrasings are ones people use and the rules
read; a fact said in a way no rule reads would measure nothing but the phrase list.
Values never collide: each value is used once, and the assistant's suggestions and tool
outputs use none of the planted values, so a superseded value reappearing in a summary
comes from the summary, not from a later mention.

Deterministic for a seed: the same arguments give the same turns and truth.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from tiermem.errors import ValidationError
from tiermem.models.content import (
    JsonBlock,
    TextBlock,
    ToolResultBlock,
    ToolResultContent,
    ToolUseBlock,
)
from tiermem.models.turns import NewTurn, Turn

__all__ = [
    "MANGA_TITLES",
    "Conversation",
    "Distractor",
    "PlantedFact",
    "PlantedItem",
    "generate_conversation",
]

Domain = Literal["manga", "assistant"]

MANGA_TITLES: Mapping[str, str] = {
    title: title
    for title in (
        "Berserk", "Naruto", "One Piece", "Vinland Saga", "Monster", "Vagabond",
        "Fullmetal Alchemist", "Attack on Titan", "Chainsaw Man", "Spy x Family",
        "Frieren", "Blue Period", "Dorohedoro", "Pluto", "20th Century Boys", "Slam Dunk",
        "Mushishi", "Planetes", "Goodnight Punpun", "Blame!", "Akira", "Nana", "Kingdom",
        "Haikyu", "Dungeon Meshi", "Oshi no Ko", "Jujutsu Kaisen", "Bleach",
    )
}  # fmt: skip
"""The store's catalogue (canonical titles), for ``known_titles`` of the extractors."""


@dataclass(frozen=True, slots=True)
class PlantedFact:
    """A slot's value as the user last stated it, and the values it superseded."""

    slot: str
    value: str
    """The latest value, as said."""
    turn_index: int
    """The turn that planted the slot's first value."""
    superseded: tuple[str, ...] = ()
    """Earlier values, oldest first (as said); empty when never corrected."""
    corrected_at: int | None = None
    """The turn of the correction, if any."""


@dataclass(frozen=True, slots=True)
class Distractor:
    """A value that looks like a fact of the user's but is not (``kind`` says why)."""

    slot: str
    value: str
    turn_index: int
    kind: str
    """``quoted_email``, ``third_party``, ``hypothetical``, ``suggestion``."""


@dataclass(frozen=True, slots=True)
class PlantedItem:
    """A decision, goal or unresolved intention the user stated."""

    kind: Literal["decision", "goal", "unresolved"]
    text: str
    turn_index: int


@dataclass(frozen=True, slots=True)
class Conversation:
    """A generated conversation and its ground truth."""

    seed: int
    domain: Domain
    turns: tuple[NewTurn, ...]
    facts: tuple[PlantedFact, ...]
    distractors: tuple[Distractor, ...]
    items: tuple[PlantedItem, ...]
    known_titles: Mapping[str, str] = field(default_factory=dict)

    def indexed(self) -> list[Turn]:
        """The turns as a store returns them, indexed from 0."""
        return [turn.with_index(index) for index, turn in enumerate(self.turns)]

    @property
    def corrections(self) -> tuple[PlantedFact, ...]:
        return tuple(fact for fact in self.facts if fact.superseded)


# ---------------------------------------------------------------- slot specs

Maker = Callable[[random.Random], str]


@dataclass(frozen=True, slots=True)
class _Slot:
    slot: str
    make: Maker
    say: tuple[str, ...]
    correct: tuple[str, ...]
    free_say: tuple[str, ...] = ()
    free_correct: tuple[str, ...] = ()


def _digits(n: int) -> Maker:
    return lambda rng: "".join(rng.choice(string.digits) for _ in range(n))


def _choice(values: Sequence[str]) -> Maker:
    return lambda rng: rng.choice(values)


def _money(symbol: str, low: int, high: int, step: int) -> Maker:
    return lambda rng: f"{symbol}{rng.randrange(low, high, step):,}"


def _date(year: int) -> Maker:
    def make(rng: random.Random) -> str:
        start = datetime(year, 1, 1)
        return (start + timedelta(days=rng.randrange(0, 360))).date().isoformat()

    return make


def _isbn(rng: random.Random) -> str:
    body = "9784" + "".join(rng.choice(string.digits) for _ in range(8))
    total = sum(int(d) * (1 if i % 2 == 0 else 3) for i, d in enumerate(body))
    check = (10 - total % 10) % 10
    return f"{body[:3]}-{body[3]}-{body[4:6]}-{body[6:]}-{check}"


def _asin(rng: random.Random) -> str:
    return "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))


_SAY = (
    "My {noun} is {v}.",
    "Oh, and my {noun} is {v}.",
    "For the record, my {noun} is {v}.",
    "Just so you know, my {noun} is {v}.",
)
_CORRECT = (
    "Actually, my {noun} is {v}, not {old}.",
    "Sorry, I got that wrong earlier: my {noun} is {v}.",
    "Correction: my {noun} is now {v}.",
    "Quick update, my {noun} has changed to {v}.",
)
_PREF_CORRECT = (
    "Actually, my {noun} is {v}, not {old}.",
    "Sorry, I got that wrong earlier: my {noun} is {v}.",
    "Quick update: my {noun} is {v} these days.",
)


# Phrasings the rules were not written for: what ``paraphrase`` measures.
_FREE_SAY = (
    "{v} is my {noun}.",
    "Put {v} down as my {noun}.",
    "The {noun} to use is {v}.",
    "For {noun}, go with {v}.",
)
_FREE_CORRECT = (
    "Change the {noun} to {v}.",
    "Use {v} as the {noun} from now on.",
    "Scratch the old {noun}, it should be {v}.",
)


def _noun(slot: str, noun: str, make: Maker, *, preference: bool = False) -> _Slot:
    def fill(templates: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(t.replace("{noun}", noun) for t in templates)

    return _Slot(
        slot,
        make,
        fill(_SAY),
        fill(_PREF_CORRECT if preference else _CORRECT),
        fill(_FREE_SAY),
        fill(_FREE_CORRECT),
    )


def _pref(key: str, noun: str, values: Sequence[str]) -> _Slot:
    return _noun(f"preference:{key}", noun, _choice(values), preference=True)


_FIRST = ("Ken", "Yui", "Aiko", "Hiro", "Mika", "Sora", "Ren", "Emi", "Taro", "Nao")
_LAST = ("Sato", "Suzuki", "Takahashi", "Tanaka", "Ito", "Watanabe", "Yamamoto", "Kato")
_NAME: Maker = lambda rng: f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"  # noqa: E731

_COMMON = (
    _Slot(
        "name",
        _NAME,
        ("My name is {v}.", "Hi, my name is {v}."),
        ("Sorry, I mistyped earlier: my name is {v}.", "Correction: my name is {v}, not {old}."),
    ),
    _Slot(
        "email",
        lambda rng: f"{rng.choice(_FIRST).lower()}.{_digits(4)(rng)}@example.com",
        ("My email is {v}.", "You can reach me at {v}."),
        ("My email is now {v}.", "Actually, my email is {v}, not {old}."),
    ),
    _Slot(
        "location",
        _choice(
            (
                "Osaka",
                "Sapporo",
                "Fukuoka",
                "Kyoto",
                "Nagoya",
                "Sendai",
                "Kobe",
                "Lisbon",
                "Porto",
                "Berlin",
                "Toronto",
                "Seattle",
            )
        ),
        ("I live in {v}.", "I'm based in {v}."),
        ("Actually, I live in {v} now, not {old}.", "I moved recently, I live in {v}."),
    ),
    _noun("phone_number", "phone number", lambda rng: f"090-{_digits(4)(rng)}-{_digits(4)(rng)}"),
    _noun("birthday", "birthday", _date(1990)),
    _noun("postcode", "postcode", lambda rng: f"{_digits(3)(rng)}-{_digits(4)(rng)}"),
    _noun("username", "username", lambda rng: f"{rng.choice(_FIRST).lower()}{_digits(3)(rng)}"),
)

_MANGA = (
    _Slot(
        "series",
        _choice(tuple(MANGA_TITLES)),
        ("I'm looking for {v}.", "Do you have {v} in stock?", "I've been reading {v} lately."),
        ("Actually, I want {v}, not {old}.", "Sorry, I meant {v}, not {old}."),
    ),
    _Slot(
        "volume",
        lambda rng: f"vol {rng.randrange(1, 60)}",
        ("I need {v}.", "Is {v} available?", "I'm missing {v} of my set."),
        ("Sorry, I meant {v}, not {old}.", "Actually it's {v}, not {old}."),
    ),
    _Slot(
        "order_id",
        lambda rng: f"ORD-{_digits(5)(rng)}",
        ("My order number is {v}.", "I'm asking about order {v}."),
        ("Sorry, the order number is {v}, not {old}.", "Actually my order number is {v}."),
    ),
    _Slot(
        "asin",
        _asin,
        ("The ASIN is {v}.", "Can you look up ASIN {v}?"),
        ("Actually the ASIN is {v}, not {old}.", "Sorry, I meant ASIN {v}, not {old}."),
    ),
    _Slot(
        "isbn",
        _isbn,
        ("The ISBN is {v}.", "I have the ISBN here: {v}."),
        ("Sorry, the ISBN is {v}, not {old}.", "Actually the ISBN is {v}, not {old}."),
    ),
    _Slot(
        "language",
        _choice(("Japanese", "English", "French", "German", "Spanish", "Korean", "Chinese")),
        ("I want the {v} edition.", "I read manga in {v}."),
        ("Actually, make it the {v} edition, not {old}.",),
    ),
    _noun("budget", "budget", _money("¥", 3000, 30000, 500)),
    _noun(
        "address",
        "shipping address",
        lambda rng: (
            f"{rng.randrange(1, 9)}-{rng.randrange(1, 30)}-{rng.randrange(1, 20)} "
            f"{rng.choice(('Jingumae', 'Ebisu', 'Nakameguro', 'Kichijoji', 'Umeda', 'Tenjin'))}"
        ),
    ),
    _noun("membership_number", "membership number", lambda rng: f"M-{_digits(6)(rng)}"),
    _noun(
        "coupon_code",
        "coupon code",
        lambda rng: (
            f"{rng.choice(('SPRING', 'SUMMER', 'MANGA', 'OTAKU', 'READ'))}-{_digits(2)(rng)}"
        ),
    ),
    _noun(
        "local_store",
        "local store",
        _choice(("Shinjuku", "Shibuya", "Akihabara", "Ikebukuro", "Nakano", "Namba", "Tenjin")),
    ),
    _noun("delivery_date", "delivery date", _date(2026)),
    _noun(
        "payment_method",
        "payment method",
        _choice(
            ("PayPay", "bank transfer", "convenience store payment", "Visa", "Mastercard", "JCB")
        ),
    ),
    _noun(
        "shipping_method",
        "shipping method",
        _choice(("express", "regular post", "store pickup", "economy")),
    ),
    _noun("points_balance", "points balance", lambda rng: f"{rng.randrange(100, 9000):,} points"),
    _noun(
        "gift_message",
        "gift message",
        lambda rng: (
            f"{rng.choice(('Happy birthday', 'Congratulations', 'Enjoy the story'))} "
            f"{rng.choice(_FIRST)}"
        ),
    ),
    _noun("membership_tier", "membership tier", _choice(("Gold", "Silver", "Platinum", "Bronze"))),
    _pref(
        "favorite_genre",
        "favorite genre",
        ("seinen", "shonen", "shojo", "josei", "isekai", "horror", "romance"),
    ),
    _pref(
        "favorite_author",
        "favorite author",
        (
            "Kentaro Miura",
            "Naoki Urasawa",
            "Rumiko Takahashi",
            "Hiromu Arakawa",
            "Makoto Yukimura",
            "Inio Asano",
            "Takehiko Inoue",
        ),
    ),
    _pref(
        "favorite_character",
        "favorite character",
        ("Guts", "Levi", "Edward Elric", "Thorfinn", "Frieren", "Denji", "Anya"),
    ),
    _pref(
        "favorite_format",
        "preferred format",
        ("paperback", "hardcover", "digital", "deluxe box set"),
    ),
    _pref(
        "favorite_delivery_time",
        "preferred delivery time",
        ("morning", "afternoon", "evening", "weekend"),
    ),
    _pref(
        "favorite_contact_method",
        "preferred contact method",
        ("phone call", "LINE", "text message", "postcard"),
    ),
    _pref(
        "favorite_edition",
        "preferred edition",
        ("kanzenban", "tankobon", "collector's edition", "omnibus"),
    ),
)

_ASSISTANT = (
    _noun("budget", "budget", _money("€", 500, 9000, 50)),
    _noun("time_zone", "time zone", _choice(("UTC+1", "UTC+9", "UTC-5", "UTC-8", "UTC+0"))),
    _noun(
        "flight_number",
        "flight number",
        lambda rng: f"{rng.choice(('TP', 'LH', 'NH', 'JL', 'BA'))}{rng.randrange(100, 999)}",
    ),
    _noun(
        "hotel",
        "hotel",
        _choice(("Hotel Avenida", "Casa do Rio", "Park Lane Inn", "Harbour View", "Hotel Lumen")),
    ),
    _noun(
        "manager",
        "manager",
        _choice(("Ana Costa", "Rui Lopes", "Marta Silva", "Jonas Weber", "Claire Martin")),
    ),
    _noun("team_size", "team size", lambda rng: f"{rng.randrange(3, 40)} people"),
    _noun(
        "project_name",
        "project name",
        _choice(("Orion", "Atlas", "Nimbus", "Kestrel", "Juniper", "Basalt")),
    ),
    _noun("deadline", "deadline", _date(2026)),
    _noun("meeting_room", "meeting room", lambda rng: f"{rng.choice('ABCD')}-{_digits(3)(rng)}"),
    _noun(
        "laptop", "laptop", _choice(("ThinkPad X1", "MacBook Air", "Dell XPS 13", "Framework 13"))
    ),
    _noun(
        "operating_system",
        "operating system",
        _choice(("Ubuntu 24.04", "Fedora 40", "macOS 14", "Windows 11")),
    ),
    _noun(
        "dietary_restriction",
        "dietary restriction",
        _choice(("vegetarian", "vegan", "gluten-free", "halal", "shellfish-free")),
    ),
    _noun("car", "car", _choice(("Honda Fit", "Toyota Yaris", "Renault Clio", "VW Golf"))),
    _noun("doctor", "doctor", _choice(("Dr Silva", "Dr Mendes", "Dr Okada", "Dr Brown"))),
    _noun("rent", "rent", _money("€", 600, 2500, 25)),
    _noun("savings_target", "savings target", _money("€", 1000, 20000, 500)),
    _noun("gym", "gym", _choice(("FitLab", "Urban Gym", "Holmes Place", "Clube Vida"))),
    _noun("bank", "bank", _choice(("Millennium", "Novo Banco", "Revolut", "N26", "Santander"))),
    _noun("employee_id", "employee id", lambda rng: f"E-{_digits(5)(rng)}"),
    _noun("anniversary", "anniversary", _date(2015)),
    _noun("passport_expiry", "passport expiry", _date(2030)),
    _noun("wifi_network", "wifi network", lambda rng: f"casa-{_digits(3)(rng)}"),
    _pref("favorite_editor", "preferred editor", ("Neovim", "VS Code", "Emacs", "Helix")),
    _pref(
        "favorite_cuisine",
        "favorite cuisine",
        ("Thai", "Italian", "Ethiopian", "Mexican", "Portuguese"),
    ),
    _pref("favorite_seat", "preferred seat", ("aisle", "window", "exit row")),
    _pref(
        "favorite_programming_language",
        "favorite programming language",
        ("Rust", "Python", "Kotlin", "Haskell", "Elixir"),
    ),
)

_SLOTS: Mapping[str, tuple[_Slot, ...]] = {
    "manga": (*_COMMON, *_MANGA),
    "assistant": (*_COMMON, *_ASSISTANT),
}

# ---------------------------------------------------------------- other talk

_USER_FILLER = (
    "Thanks!",
    "Okay.",
    "Hmm, let me think about that.",
    "That sounds good.",
    "Can you tell me more?",
    "What do you recommend?",
    "Interesting.",
    "Sure.",
    "Got it, thanks.",
    "Nice, that helps.",
    "Let me check something first.",
    "Cool.",
    "I see what you mean.",
    "Could you explain that again?",
    "Alright.",
)
_ASSISTANT_FILLER = (
    "Happy to help!",
    "Of course.",
    "Here's what I found.",
    "Let me know if you need anything.",
    "Great question.",
    "Sure thing.",
    "Understood.",
    "I can help with that.",
    "That makes sense.",
    "Anything else I can do for you?",
)
_ACK = ("Noted: {v}.", "Got it, {v}.", "Thanks, I have {v} down.")
_ITEMS: Mapping[str, tuple[tuple[Literal["decision", "goal", "unresolved"], str], ...]] = {
    "manga": (
        ("goal", "I'm looking for a birthday gift for a friend."),
        ("goal", "I want to finish my collection before the holidays."),
        ("decision", "I'll take the deluxe edition."),
        ("decision", "Let's go with gift wrapping."),
        ("unresolved", "I'll think about the box set and come back later."),
        ("unresolved", "Remind me to check the preorder next week."),
    ),
    "assistant": (
        ("goal", "I'm trying to plan the team offsite."),
        ("goal", "I want to cut my monthly spending."),
        ("decision", "I've decided to book the earlier train."),
        ("decision", "Let's go with the shared calendar."),
        ("unresolved", "I'll decide about the conference later."),
        ("unresolved", "Remind me to renew the insurance."),
    ),
}


def _catalogue_rows(
    rng: random.Random, titles: Sequence[str], volumes: Sequence[int], rows: int
) -> list[str]:
    out = []
    for _ in range(rows):
        out.append(
            f"{rng.choice(titles)} vol {rng.choice(volumes)} | ASIN {_asin(rng)} | "
            f"ISBN {_isbn(rng)} | ¥{rng.randrange(500, 2500, 10):,} | "
            f"in stock: {rng.randrange(0, 30)}"
        )
    return out


def _documents(rng: random.Random, rows: int) -> list[dict[str, str | int]]:
    topics = ("quarterly report", "travel policy", "meeting notes", "budget sheet", "roadmap")
    return [
        {
            "id": f"doc-{rng.randrange(1000, 9999)}",
            "title": f"{rng.choice(topics).title()} {rng.randrange(2019, 2026)}",
            "snippet": " ".join(rng.choice(_ASSISTANT_FILLER) for _ in range(3)),
            "pages": rng.randrange(1, 80),
        }
        for _ in range(rows)
    ]


# ---------------------------------------------------------------- the generator


@dataclass(slots=True)
class _Plan:
    user: dict[int, str] = field(default_factory=dict)
    ack: dict[int, str] = field(default_factory=dict)
    tools: set[int] = field(default_factory=set)


def generate_conversation(
    seed: int,
    *,
    turns: int = 300,
    facts: int = 30,
    corrections: int = 10,
    domain: Domain = "manga",
    distractors: int | None = None,
    tool_calls: int | None = None,
    paraphrase: float = 0.0,
    start: datetime | None = None,
) -> Conversation:
    """A conversation of ``turns`` turns (user first, alternating) with ``facts`` planted
    facts, ``corrections`` of them corrected later, ``distractors`` distractors (default
    one per 25 turns) and ``tool_calls`` tool calls with large outputs (default one per 25
    turns). With ``paraphrase`` > 0, that share of the statements and corrections of noun
    slots (budget, postcode, favourites…) use phrasings the slot rules were not written
    for ("Put 150-0001 down as my postcode.", "Change the budget to ¥8,000."): a measure of
    how the rules do outside their phrase list. Deterministic for ``seed``.

    Raises:
        ValidationError: more facts than the domain has slots (manga: 32, assistant: 33),
            more corrections than facts, too few turns to hold them all, or a
            ``paraphrase`` outside 0..1.
    """
    specs = _SLOTS.get(domain)
    if specs is None:
        raise ValidationError(f"unknown domain {domain!r}; use 'manga' or 'assistant'")
    if not 0 <= facts <= len(specs):
        raise ValidationError(f"{domain} conversations have {len(specs)} slots; got {facts}")
    if not 0 <= corrections <= facts:
        raise ValidationError(f"corrections must be between 0 and facts ({facts})")
    if not 0.0 <= paraphrase <= 1.0:
        raise ValidationError(f"paraphrase is a share between 0 and 1, got {paraphrase}")
    rng = random.Random(seed)
    phrasing = random.Random(f"phrasing-{seed}")
    n_distract = turns // 25 if distractors is None else distractors
    n_tools = turns // 25 if tool_calls is None else tool_calls
    user_slots = list(range(0, turns, 2))
    needed = facts + corrections + n_distract + n_tools + 2
    if needed > len(user_slots):
        raise ValidationError(f"{turns} turns cannot hold {needed} planned user turns")
    titles = tuple(MANGA_TITLES)
    chosen = rng.sample(list(specs), facts)
    used: set[str] = set()

    def fresh(slot: _Slot) -> str:
        for _ in range(200):
            value = slot.make(rng)
            if value.casefold() not in used:
                used.add(value.casefold())
                return value
        raise ValidationError(f"cannot draw a fresh value for {slot.slot}")  # pragma: no cover

    plan = _Plan()
    free = user_slots[1:]  # turn 0 greets
    rng.shuffle(free)
    tool_turns = sorted(free[:n_tools])
    plan.tools = set(tool_turns)
    free = [t for t in free[n_tools:] if t - 2 not in plan.tools]
    rng.shuffle(free)
    # Plants go in the first 80% of the conversation, so a correction can follow each.
    early = sorted(t for t in free if t < turns * 0.8)
    plant_turns = sorted(rng.sample(early, facts)) if facts else []
    taken = set(plant_turns)
    planted: list[PlantedFact] = []
    for slot, turn in zip(chosen, plant_turns, strict=True):
        value = fresh(slot)
        template = _template(rng, phrasing, slot.say, slot.free_say, paraphrase)
        plan.user[turn] = template.format(v=value)
        if rng.random() < 0.5:
            plan.ack[turn + 1] = rng.choice(_ACK).format(v=value)
        planted.append(PlantedFact(slot=slot.slot, value=value, turn_index=turn))
    to_correct = sorted(rng.sample(range(facts), corrections))
    by_slot = {spec.slot: spec for spec in chosen}
    for i in to_correct:
        fact = planted[i]
        later = [t for t in user_slots if t > fact.turn_index + 10 and t not in taken
                 and t not in plan.tools and t < turns - 1]  # fmt: skip
        if not later:
            raise ValidationError(f"{turns} turns leave no room to correct {fact.slot}")
        turn = rng.choice(later)
        taken.add(turn)
        new = fresh(by_slot[fact.slot])
        spec = by_slot[fact.slot]
        template = _template(rng, phrasing, spec.correct, spec.free_correct, paraphrase)
        plan.user[turn] = template.format(v=new, old=fact.value)
        if rng.random() < 0.5:
            plan.ack[turn + 1] = f"Thanks, I've updated that to {new}."
        planted[i] = PlantedFact(
            slot=fact.slot,
            value=new,
            turn_index=fact.turn_index,
            superseded=(fact.value,),
            corrected_at=turn,
        )
    remaining = [t for t in free if t not in taken]
    rng.shuffle(remaining)
    distract: list[Distractor] = []
    for turn in sorted(remaining[:n_distract]):
        text, found = _distractor(rng, domain, turn, fresh, specs)
        plan.user[turn] = text
        distract.extend(found)
    items: list[PlantedItem] = []
    for turn, (kind, text) in zip(
        sorted(remaining[n_distract : n_distract + len(_ITEMS[domain])]),
        _ITEMS[domain],
        strict=False,
    ):
        plan.user[turn] = text
        items.append(PlantedItem(kind=kind, text=text, turn_index=turn))
    new_turns = _write(rng, plan, turns, domain, titles, used, start)
    return Conversation(
        seed=seed,
        domain=domain,
        turns=tuple(new_turns),
        facts=tuple(planted),
        distractors=tuple(distract),
        items=tuple(items),
        known_titles=MANGA_TITLES if domain == "manga" else {},
    )


def _template(
    rng: random.Random,
    phrasing: random.Random,
    usual: tuple[str, ...],
    free: tuple[str, ...],
    paraphrase: float,
) -> str:
    # The usual template is drawn from the main stream either way, and the paraphrase from
    # a stream of its own: a conversation with paraphrases differs only in those phrasings.
    template = rng.choice(usual)
    if free and phrasing.random() < paraphrase:
        return phrasing.choice(free)
    return template


def _distractor(
    rng: random.Random,
    domain: Domain,
    turn: int,
    fresh: Callable[[_Slot], str],
    specs: Sequence[_Slot],
) -> tuple[str, list[Distractor]]:
    by_slot = {spec.slot: spec for spec in specs}
    kind = rng.choice(("quoted_email", "third_party", "hypothetical"))
    if kind == "quoted_email":
        slot = "order_id" if domain == "manga" else "email"
        spec = by_slot.get(slot) or _Slot(slot, lambda r: f"ORD-{_digits(5)(r)}", (), ())
        value = fresh(spec)
        label = "Order" if slot == "order_id" else "Contact"
        text = (
            "Someone forwarded me this email by mistake:\n"
            f"> Dear customer, {label} {value} has been updated.\n"
            "> Please reply within 3 days.\n"
            "Is that anything I need to worry about?"
        )
        return text, [Distractor(slot, value, turn, kind)]
    budget = by_slot.get("budget") or _noun("budget", "budget", _money("¥", 3000, 30000, 500))
    if kind == "third_party":
        relation = rng.choice(("friend", "sister", "brother", "colleague"))
        value = fresh(budget)
        return (
            f"My {relation}'s budget is {value}, but that's not mine.",
            [Distractor("budget", value, turn, kind)],
        )
    value = fresh(budget)
    return (
        f"If my budget were {value}, I'd buy everything at once.",
        [Distractor("budget", value, turn, kind)],
    )


def _write(
    rng: random.Random,
    plan: _Plan,
    turns: int,
    domain: Domain,
    titles: Sequence[str],
    used: set[str],
    start: datetime | None,
) -> list[NewTurn]:
    begin = start or datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    free_titles = [t for t in titles if t.casefold() not in used] or list(titles)
    planted_volumes = {int(v[4:]) for v in used if v.startswith("vol ")}
    volumes = [n for n in range(1, 60) if n not in planted_volumes]
    out: list[NewTurn] = []
    for index in range(turns):
        when = begin + timedelta(seconds=30 * index)
        content: tuple[TextBlock | ToolUseBlock | ToolResultBlock, ...]
        if index % 2 == 0:
            role: Literal["user", "assistant"] = "user"
            if index in plan.tools:
                content = (_tool_result(rng, index, domain, free_titles, volumes),)
            elif index == 0:
                content = (TextBlock(text="Hello!"),)
            else:
                content = (TextBlock(text=plan.user.get(index) or rng.choice(_USER_FILLER)),)
        else:
            role = "assistant"
            if index + 1 in plan.tools:
                query = rng.choice(free_titles) if domain == "manga" else "recent documents"
                content = (
                    TextBlock(text="Let me look that up."),
                    ToolUseBlock(
                        tool_use_id=f"tool-{index + 1}",
                        name="search_catalog" if domain == "manga" else "search_documents",
                        input={"query": query, "limit": 40},
                    ),
                )
            elif index - 1 in plan.tools:
                content = (TextBlock(text=_tool_answer(rng, domain, free_titles, volumes)),)
            elif index in plan.ack:
                content = (TextBlock(text=plan.ack[index]),)
            elif domain == "manga" and rng.random() < 0.2:
                content = (TextBlock(text=_suggestion(rng, free_titles, volumes)),)
            else:
                content = (TextBlock(text=rng.choice(_ASSISTANT_FILLER)),)
        out.append(NewTurn(role=role, content=content, timestamp=when))
    return out


def _tool_result(
    rng: random.Random, index: int, domain: Domain, titles: Sequence[str], volumes: Sequence[int]
) -> ToolResultBlock:
    rows = rng.randrange(25, 45)
    body: ToolResultContent
    if domain == "manga":
        body = TextBlock(text="\n".join(_catalogue_rows(rng, titles, volumes, rows)))
    else:
        body = JsonBlock.model_validate({"json": json.loads(json.dumps(_documents(rng, rows)))})
    return ToolResultBlock(tool_use_id=f"tool-{index}", content=(body,))


def _tool_answer(
    rng: random.Random, domain: Domain, titles: Sequence[str], volumes: Sequence[int]
) -> str:
    if domain == "manga":
        return (
            f"I found {rng.randrange(25, 45)} results. The closest match is "
            f"{rng.choice(titles)} vol {rng.choice(volumes)} at ¥{rng.randrange(500, 2500, 10):,}."
        )
    return f"I found {rng.randrange(25, 45)} documents; the newest is from last month."


def _suggestion(rng: random.Random, titles: Sequence[str], volumes: Sequence[int]) -> str:
    return (
        f"You might also enjoy {rng.choice(titles)} vol {rng.choice(volumes)}, "
        f"it's ¥{rng.randrange(500, 2500, 10):,} this week."
    )
