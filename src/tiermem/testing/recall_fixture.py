"""A deterministic multi-session recall fixture: users with dated sessions, planted
evidence and questions whose evidence turns are recorded.

Each :class:`RecallConversation` is one user's history: ``sessions`` dated sessions (days
apart) of ``turns_per_session`` turns, the last one being the session in progress when the
questions are asked. Filler comes from :func:`tiermem.testing.conversations.generate_conversation`
(manga-store talk full of budgets, series, volumes, orders and tool outputs: the words the
questions use, so plain keyword matching meets many wrong turns). Into it go planted
**episodes**, each with one question and the 1-3 turns that answer it:

* ``single``: a fact said once ("My cousin Aiko lives in Sapporo."), asked directly;
* ``assistant``: the user asks for a recommendation and the assistant answers in the next
  turn; the question asks what was recommended (the answer turn shares few words with it);
* ``multi_hop``: two facts in different sessions joined by a name ("My nephew Kenji is
  obsessed with Pluto." … "I want to surprise Kenji with the deluxe edition, up to ¥4,000."),
  asked about by the relation only;
* ``temporal``: an event said with a relative date ("I picked up Monster volume 4
  yesterday."), asked about by the absolute or query-relative date, among similar events on
  other days;
* ``when``: "When did I …?", answerable from the session's date;
* ``update``: a value said, then changed in a later session; the question asks the current
  one (evidence: the change);
* ``paraphrase``: a fact asked in other words (at most one content word shared).

Evidence turns sit in earlier sessions or in the current session before its last
``hot_turns`` turns, so they are never in a hot window of that size. Deterministic for the
seed. ``python -m tiermem.testing.recall_fixture OUT.json`` writes a sample.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal

from tiermem.errors import ValidationError
from tiermem.models.content import TextBlock
from tiermem.models.turns import NewTurn
from tiermem.testing.conversations import MANGA_TITLES, generate_conversation

__all__ = [
    "QuestionKind",
    "RecallConversation",
    "RecallQuestion",
    "RecallSession",
    "generate_recall_conversation",
    "generate_recall_fixture",
]

QuestionKind = Literal[
    "single", "assistant", "multi_hop", "temporal", "when", "update", "paraphrase"
]


@dataclass(frozen=True, slots=True)
class RecallSession:
    session_id: str
    started_at: datetime
    turns: tuple[NewTurn, ...]


@dataclass(frozen=True, slots=True)
class RecallQuestion:
    question_id: str
    kind: QuestionKind
    text: str
    answer: str
    evidence: tuple[tuple[str, int], ...]
    """(session id, turn index) of every turn the answer needs."""


@dataclass(frozen=True, slots=True)
class RecallConversation:
    user_id: str
    seed: int
    sessions: tuple[RecallSession, ...]
    questions: tuple[RecallQuestion, ...]
    asked_at: datetime
    """When the questions are asked: just after the last turn of the last session."""

    @property
    def current(self) -> RecallSession:
        return self.sessions[-1]

    def to_json(self) -> dict[str, object]:
        return {
            "user_id": self.user_id,
            "seed": self.seed,
            "asked_at": self.asked_at.isoformat(),
            "sessions": [
                {
                    "session_id": s.session_id,
                    "started_at": s.started_at.isoformat(),
                    "turns": [{"role": t.role, "text": t.text} for t in s.turns],
                }
                for s in self.sessions
            ],
            "questions": [
                {
                    "id": q.question_id,
                    "kind": q.kind,
                    "text": q.text,
                    "answer": q.answer,
                    "evidence": [list(e) for e in q.evidence],
                }
                for q in self.questions
            ],
        }


_RELATIONS = ("cousin", "nephew", "niece", "sister", "brother", "colleague", "neighbour", "aunt")
_NAMES = (
    "Aiko", "Kenji", "Mariko", "Takeshi", "Hana", "Ryo", "Sakura", "Daichi", "Yui", "Sota",
    "Emi", "Haruto", "Noa", "Ren", "Mei", "Kaito", "Rin", "Yuto", "Saki", "Riku",
)  # fmt: skip
_CITIES = ("Sapporo", "Fukuoka", "Sendai", "Nagoya", "Kobe", "Hiroshima", "Kanazawa", "Nara",
           "Matsuyama", "Kagoshima", "Niigata", "Okayama")  # fmt: skip
_SHOPS = ("Kinokuniya", "Animate", "Mandarake", "Tsutaya", "Book-Off", "Melonbooks")
_EDITIONS = ("deluxe", "collector's", "hardcover", "omnibus", "anniversary", "boxed")
_REASONS = (
    "the same slow, melancholic pacing",
    "a similar lone-wanderer hero",
    "gorgeous ink work like the one you loved",
    "the same mix of comedy and found family",
    "an equally dark fantasy world",
    "a quieter story about growing up",
)
_PETS = (("cat", "Mochi"), ("dog", "Kuro"), ("rabbit", "Daifuku"), ("parrot", "Pico"),
         ("hamster", "Kinako"), ("turtle", "Genki"))  # fmt: skip
_HOBBIES = (("pottery", "a class on Thursdays"), ("bouldering", "a gym near the station"),
            ("calligraphy", "lessons with my grandmother"), ("taiko drumming", "a community group"),
            ("watercolour", "an evening course"), ("kendo", "the club at work"))  # fmt: skip
_ITEMS = ("bookmark set", "tote bag", "acrylic stand", "poster", "art book", "figure")

_EVIDENCE_PERIOD = 0.75  # plants go in the first 75 % of a session (the current one too)


@dataclass(slots=True)
class _Builder:
    rng: random.Random
    sessions: list[list[NewTurn]]
    dates: list[datetime]
    session_ids: list[str]
    hot_turns: int
    free: dict[int, list[int]]
    """Per session, the user-turn slots not yet taken."""
    asked: datetime

    def take(self, session: int, *, late: bool = False) -> int:
        slots = self.free[session]
        if not slots:
            raise ValidationError("sessions too short for the planted episodes")
        index = self.rng.randrange(len(slots)) if not late else len(slots) - 1
        return slots.pop(index)

    def say(self, session: int, index: int, role: str, text: str) -> tuple[str, int]:
        old = self.sessions[session][index]
        self.sessions[session][index] = NewTurn(
            role="user" if role == "user" else "assistant",
            content=(TextBlock(text=text),),
            timestamp=old.timestamp,
        )
        return (self.session_ids[session], index)

    def day(self, session: int) -> datetime:
        return self.dates[session]

    def asked_day(self) -> date:
        return self.asked.date()


Episode = Callable[[_Builder, int, dict[str, list[str]]], "RecallQuestion"]


def _pick(rng: random.Random, pool: tuple[str, ...], used: dict[str, list[str]], key: str) -> str:
    taken = used.setdefault(key, [])
    left = [p for p in pool if p not in taken] or list(pool)
    value = rng.choice(left)
    taken.append(value)
    return value


def _earlier(b: _Builder, count: int = 1) -> list[int]:
    """Distinct sessions for evidence (any but the last one's hot tail), oldest first."""
    return sorted(b.rng.sample(range(len(b.sessions)), count))


def _single(b: _Builder, n: int, used: dict[str, list[str]]) -> RecallQuestion:
    rng = b.rng
    s = _earlier(b)[0]
    relation = _pick(rng, _RELATIONS, used, "relation")
    name = _pick(rng, _NAMES, used, "name")
    city = _pick(rng, _CITIES, used, "city")
    ev = b.say(
        s,
        b.take(s),
        "user",
        f"Oh, my {relation} {name} lives in {city}, so I sometimes order for two.",
    )
    return RecallQuestion(f"q{n}", "single", f"Which city does my {relation} live in?", city, (ev,))


def _assistant(b: _Builder, n: int, used: dict[str, list[str]]) -> RecallQuestion:
    rng = b.rng
    s = _earlier(b)[0]
    liked = _pick(rng, tuple(MANGA_TITLES), used, "title")
    rec = _pick(rng, tuple(MANGA_TITLES), used, "title")
    reason = rng.choice(_REASONS)
    at = b.take(s)
    ask = b.say(s, at, "user", f"I just finished {liked} and loved it. What should I read next?")
    ans = b.say(s, at + 1, "assistant", f"Try {rec}: {reason}. Volume 1 is in stock.")
    return RecallQuestion(
        f"q{n}", "assistant", f"What did you recommend after I finished {liked}?", rec, (ask, ans)
    )


def _multi_hop(b: _Builder, n: int, used: dict[str, list[str]]) -> RecallQuestion:
    rng = b.rng
    first, second = _earlier(b, 2)
    relation = _pick(rng, _RELATIONS, used, "relation")
    name = _pick(rng, _NAMES, used, "name")
    title = _pick(rng, tuple(MANGA_TITLES), used, "title")
    edition = rng.choice(_EDITIONS)
    amount = f"¥{rng.randrange(30, 90) * 100:,}"
    one = b.say(
        first,
        b.take(first),
        "user",
        f"My {relation} {name} is completely obsessed with {title} lately.",
    )
    two = b.say(
        second, b.take(second), "user",
        f"I'd like to surprise {name} with the {edition} edition; I can spend up to {amount}.",
    )  # fmt: skip
    return RecallQuestion(
        f"q{n}", "multi_hop",
        f"How much was I going to spend on a gift for my {relation}, and for which series?",
        f"{amount}, {title}", (one, two),
    )  # fmt: skip


def _temporal(b: _Builder, n: int, used: dict[str, list[str]]) -> RecallQuestion:
    rng = b.rng
    sessions = _earlier(b, 3)
    target = sessions[rng.randrange(3)]
    answer = ""
    evidence: tuple[tuple[str, int], ...] = ()
    for s in sessions:  # the same kind of event on other days: only the date tells them apart
        title = _pick(rng, tuple(MANGA_TITLES), used, "title")
        volume = rng.randrange(2, 30)
        shop = rng.choice(_SHOPS)
        ev = b.say(
            s, b.take(s), "user", f"I picked up {title} volume {volume} at {shop} yesterday."
        )
        if s == target:
            answer, evidence = f"{title} volume {volume}", (ev,)
    bought = (b.day(target) - timedelta(days=1)).date()
    ago = (b.asked_day() - bought).days
    if rng.random() < 0.5:
        text = f"Which volume did I buy on {bought:%B} {bought.day}?"
    else:
        text = f"Which volume did I buy {ago} days ago?"
    return RecallQuestion(f"q{n}", "temporal", text, answer, evidence)


def _when(b: _Builder, n: int, used: dict[str, list[str]]) -> RecallQuestion:
    rng = b.rng
    s = _earlier(b)[0]
    item = _pick(rng, _ITEMS, used, "item")
    title = _pick(rng, tuple(MANGA_TITLES), used, "title")
    ev = b.say(
        s, b.take(s), "user", f"I returned the damaged {title} {item} today, the box was crushed."
    )
    day = b.day(s).date()
    return RecallQuestion(
        f"q{n}", "when", f"When did I send back the {title} {item}?", day.isoformat(), (ev,)
    )


def _update(b: _Builder, n: int, used: dict[str, list[str]]) -> RecallQuestion:
    rng = b.rng
    first, second = _earlier(b, 2)
    hobby, old_where = _HOBBIES[rng.randrange(len(_HOBBIES))]
    new_where = rng.choice([w for _, w in _HOBBIES if w != old_where])
    b.say(first, b.take(first), "user", f"I do {hobby} in my free time, {old_where}.")
    ev = b.say(
        second,
        b.take(second),
        "user",
        f"Small change: I now do my {hobby} through {new_where} instead.",
    )
    return RecallQuestion(f"q{n}", "update", f"Where do I do {hobby} these days?", new_where, (ev,))


def _paraphrase(b: _Builder, n: int, used: dict[str, list[str]]) -> RecallQuestion:
    rng = b.rng
    s = _earlier(b)[0]
    kind, name = _PETS[rng.randrange(len(_PETS))]
    ev = b.say(
        s, b.take(s), "user", f"Sorry for the delay, {name} knocked my {kind} food bowl over again."
    )
    return RecallQuestion(f"q{n}", "paraphrase", f"What is the name of my {kind}?", name, (ev,))


_EPISODES: tuple[Episode, ...] = (
    _single, _assistant, _multi_hop, _temporal, _when, _update, _paraphrase,
)  # fmt: skip


def generate_recall_conversation(
    seed: int,
    *,
    sessions: int = 6,
    turns_per_session: int = 60,
    questions: int = 14,
    hot_turns: int = 20,
    start: datetime | None = None,
) -> RecallConversation:
    """One user's dated sessions with planted episodes and their questions (see the module
    docstring). ``questions`` episodes are planted, cycling through the kinds.

    Raises:
        ValidationError: fewer than 3 sessions, sessions too short for the episodes.
    """
    if sessions < 3:
        raise ValidationError("a recall conversation needs at least 3 sessions")
    if turns_per_session < 2 * hot_turns or turns_per_session % 2:
        raise ValidationError("turns_per_session must be even and at least twice hot_turns")
    rng = random.Random(f"recall-{seed}")
    total = sessions * turns_per_session
    filler = generate_conversation(
        seed, turns=total, facts=min(30, total // 20), corrections=min(10, total // 60)
    )
    start = start or datetime(2026, 1, 5, 10, tzinfo=UTC)
    dates: list[datetime] = []
    day = start + timedelta(days=rng.randrange(0, 20))
    for _ in range(sessions):
        dates.append(day)
        day += timedelta(days=rng.randrange(2, 12), hours=rng.randrange(-2, 6))
    user_id = f"recall-user-{seed}"
    session_ids = [f"{user_id}-s{i + 1}" for i in range(sessions)]
    built: list[list[NewTurn]] = []
    for i in range(sessions):
        chunk = filler.turns[i * turns_per_session : (i + 1) * turns_per_session]
        built.append(
            [
                t.model_copy(update={"timestamp": dates[i] + timedelta(minutes=j)})
                for j, t in enumerate(chunk)
            ]
        )
    # User turns (even indexes) not a tool call, leaving the next (assistant) turn free.
    free: dict[int, list[int]] = {}
    for i in range(sessions):
        limit = int(turns_per_session * _EVIDENCE_PERIOD)
        if i == sessions - 1:
            limit = min(limit, turns_per_session - hot_turns)
        free[i] = [
            j for j in range(2, limit - 1, 2)
            if all(isinstance(block, TextBlock) for block in built[i][j].content)
            and all(isinstance(block, TextBlock) for block in built[i][j + 1].content)
        ]  # fmt: skip
    asked_at = dates[-1] + timedelta(minutes=turns_per_session + 1)
    builder = _Builder(rng, built, dates, session_ids, hot_turns, free, asked_at)
    used: dict[str, list[str]] = {}
    planted = [_EPISODES[i % len(_EPISODES)](builder, i + 1, used) for i in range(questions)]
    return RecallConversation(
        user_id=user_id,
        seed=seed,
        sessions=tuple(
            RecallSession(session_ids[i], dates[i], tuple(built[i])) for i in range(sessions)
        ),
        questions=tuple(planted),
        asked_at=asked_at,
    )


def generate_recall_fixture(
    count: int = 20,
    *,
    seed: int = 0,
    sessions: int = 6,
    turns_per_session: int = 60,
    questions: int = 14,
) -> list[RecallConversation]:
    """``count`` conversations (seeds ``seed`` … ``seed + count - 1``), see
    :func:`generate_recall_conversation`. With the defaults: 20 users × 6 sessions × 60
    turns (360 turns each), 14 questions each (280)."""
    return [
        generate_recall_conversation(
            seed + i, sessions=sessions, turns_per_session=turns_per_session, questions=questions
        )
        for i in range(count)
    ]


def main(argv: list[str]) -> None:
    """Write a small JSON sample of the fixture (two conversations) to ``argv[0]``."""
    out = argv[0] if argv else "recall_fixture_sample.json"
    sample = [c.to_json() for c in generate_recall_fixture(2)]
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(sample, handle, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
