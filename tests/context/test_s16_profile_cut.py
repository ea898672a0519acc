"""A preference the budget cuts from the profile is no longer silently lost (session 16).

``assemble_context`` places the profile (the user's preferences, most important first)
within what the budget leaves it and cuts it short when it does not fit. A per-turn
recall hit of a memory the profile holds is left out of the recall block (it would say
the same twice). Before, that held for every line of the profile, also those the cut
removed: a preference cut for the budget and found again by this turn's recall was in
neither block, while a lower-scored recall hit (a knowledge chunk) kept its place, and
nothing said which lines were cut. Now hits of cut lines go into the recall block by
their score, the profile item's provenance lists only the lines it shows,
``stats.profile_cut`` names the lines cut, and the profile loses whole lines (it was cut
within a line: "favorite_thing_6: value number 6, said in"). Fails on fc45edb (the hit
was left out; no ``profile_cut``; a line cut short).
"""

from __future__ import annotations

from datetime import UTC, datetime

from tiermem.context import assemble_context
from tiermem.context.models import ContextWindow
from tiermem.longterm.context import UserContext, render_user_context
from tiermem.longterm.hits import RecallHit
from tiermem.models import ActiveEntity, MemoryRecord, Provenance, TextBlock, Turn
from tiermem.tokens import TiktokenCounter

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SYSTEM = "You are the assistant of a manga shop. " * 40
COUNTER = TiktokenCounter()


def _preference(n: int, key: str, value: str) -> MemoryRecord:
    return MemoryRecord(
        memory_id=f"pref-{n}",
        user_id="u-1",
        memory_type="preference",
        content=f"{key}: {value}",
        metadata={"preference_key": key, "preference_value": value},
        importance=0.9 - n * 0.05,  # the profile's order: pref-0 first, pref-11 last
        created_at=T0,
        provenance=Provenance(source="explicit"),
    )


PREFERENCES = [
    _preference(n, f"favorite_thing_{n}", f"value number {n}, said in a long sentence")
    for n in range(11)
] + [_preference(11, "preferred_language", "English")]
TURNS = [
    Turn(
        index=i,
        role="user" if i % 2 == 0 else "assistant",
        content=(TextBlock(text=f"turn {i} " * 30),),
        timestamp=T0,
    )
    for i in range(20)
]


def _profile() -> UserContext:
    return render_user_context("u-1", PREFERENCES, (), budget_tokens=2_000, counter=COUNTER)


def _hits() -> list[RecallHit]:
    # This turn's recall finds the least important preferences, and shop policy chunks.
    found = [
        RecallHit(kind="memory", doc_id=p.memory_id, text=p.content, score=0.9, memory=p)
        for p in PREFERENCES[-3:]
    ]
    return found + [
        RecallHit(kind="chunk", doc_id=f"chunk-{n}", text="Shipping policy. " * 25, score=0.5)
        for n in range(4)
    ]


def _window(budget: int, entities: tuple[ActiveEntity, ...] = ()) -> ContextWindow:
    return assemble_context(
        system=SYSTEM,
        user_context=_profile(),
        recall=_hits(),
        turns=TURNS,
        entities=entities,
        budget=budget,
        counter=COUNTER,
    )


def _shown(window: ContextWindow, record: MemoryRecord) -> list[str]:
    return [
        i.kind for i in window.items if i.kind in ("profile", "recall") and record.content in i.text
    ]


def test_a_preference_cut_from_the_profile_comes_back_through_recall() -> None:
    window = _window(1_800)
    (profile,) = [i for i in window.items if i.kind == "profile"]
    assert profile.truncated
    # The budget cut the two least important lines; this turn's recall found both.
    cut = ("pref-10", "pref-11")
    assert window.stats.profile_cut == cut
    assert set(profile.provenance.memory_ids) == {p.memory_id for p in PREFERENCES[:10]}
    for record in PREFERENCES[10:]:
        assert record.content not in profile.text
        assert _shown(window, record) == ["recall"], record.memory_id
    # Every preference is in the window, in one block or the other, once.
    for record in PREFERENCES:
        assert len(_shown(window, record)) == 1, record.memory_id


def test_a_tighter_budget_brings_back_what_fits_by_score() -> None:
    window = _window(1_200)
    (profile,) = [i for i in window.items if i.kind == "profile"]
    cut = window.stats.profile_cut
    assert len(cut) >= 3
    assert set(profile.provenance.memory_ids).isdisjoint(cut)
    assert all(PREFERENCES[n].content in profile.text for n in range(12) if f"pref-{n}" not in cut)
    # Whole lines are cut, never a preference within its line.
    *lines, marker = profile.text.split("\n")
    assert marker.startswith("[… truncated")
    assert set(lines) <= set(_profile().text.split("\n"))
    # The hits of cut lines (score 0.9) come before the chunks (0.5).
    recalled = [i for i in window.items if i.kind == "recall"]
    assert recalled, "nothing recalled"
    assert any(p.content in recalled[0].text for p in PREFERENCES[-3:])
    assert not any("Shipping policy" in i.text for i in recalled)


def test_a_profile_shown_whole_keeps_its_lines_out_of_recall() -> None:
    window = _window(4_000)
    (profile,) = [i for i in window.items if i.kind == "profile"]
    assert not profile.truncated
    assert window.stats.profile_cut == ()
    assert set(profile.provenance.memory_ids) == {p.memory_id for p in PREFERENCES}
    for record in PREFERENCES:
        assert _shown(window, record) == ["profile"], record.memory_id


def test_a_preference_the_conversation_overrides_stays_out_even_when_cut() -> None:
    """An English preference in a session held in Japanese is left out of the profile and
    of recall (s15); a budget cut does not bring it back."""
    japanese = (ActiveEntity(kind="language", value="japanese", turn_index=3, updated_at=T0),)
    for budget in (1_200, 1_800, 4_000):
        window = _window(budget, japanese)
        assert _shown(window, PREFERENCES[-1]) == [], budget
        assert PREFERENCES[-1].memory_id not in window.stats.profile_cut


def test_a_profile_left_out_entirely_names_every_line() -> None:
    window = _window(700)
    assert not [i for i in window.items if i.kind == "profile"]
    assert window.stats.sections_dropped >= 1
    assert window.stats.profile_cut == tuple(p.memory_id for p in PREFERENCES)
