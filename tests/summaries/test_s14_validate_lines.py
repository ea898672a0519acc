"""Closed-loop validation checks a slot as a summary says it, and asks for it, appends it
and reports it as a readable line, never as a bare value (session 14, review probe p14).

Before: "I love seinen" is the slot ``preference:opinion:genre:seinen`` = ``loves``; the
check looked for the word "loves", which no summary writes, so every pass counted it lost
(``fact_preservation_first`` 0.75 in the probe, pulling quality-aware compression to its
maximum), the retry asked for ``loves`` and the summary, then the long-term
interaction summary, began with the junk line ``- loves``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.summaries.test_validate import ScriptedSummarizer, make_builder, turn
from tiermem.clock import FakeClock
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.summaries.models import Fact, StructuredMemory
from tiermem.summaries.rolling import plan_tiers
from tiermem.summaries.validate import (
    drop_stale,
    lost_slots,
    mentions,
    slot_items,
    validated_pass,
)

SEINEN = Fact(slot="preference:opinion:genre:seinen", value="loves", turn_index=1)
EDITIONS = Fact(slot="preference:opinion:japanese_editions", value="prefers", turn_index=2)
CATS = Fact(slot="preference:opinion:猫の本", value="likes", turn_index=3)
MEMORY = StructuredMemory(
    facts={
        SEINEN.slot: SEINEN,
        EDITIONS.slot: EDITIONS,
        CATS.slot: CATS,
        "budget": Fact(slot="budget", value="¥8,000", turn_index=4),
    },
    entities={"volume": Fact(slot="volume", value="42", turn_index=5)},
    through_index=11,
)


def items_by_slot() -> dict[str | None, list[str]]:
    out: dict[str | None, list[str]] = {}
    for item in slot_items(MEMORY, 11):
        out.setdefault(item.slot, []).append(item.line)
    return out


def test_an_opinion_is_found_where_the_sentence_that_said_it_is() -> None:
    seinen, editions, cats = (
        next(i for i in slot_items(MEMORY, 11) if i.turn_index == n) for n in (1, 2, 3)
    )
    # The quoted sentence, a paraphrase, another spelling of the genre entity.
    for text in ("- [1] User: I love seinen.", "The user is a big fan of seinen manga.",
                 "- [1] User: セイネンが大好き"):  # fmt: skip
        assert mentions(text, seinen), text
    assert not mentions("- [1] User: Is Berserk volume 42 in stock?", seinen)
    assert mentions("- [2] User: I prefer Japanese editions.", editions)
    assert not mentions("- [2] User: Which editions do you have?", editions)
    assert mentions("- [3] User: 猫の本が好きです", cats)
    assert not mentions("- [3] User: 犬の本", cats)


def test_every_item_reads_as_a_line_never_a_bare_value() -> None:
    assert items_by_slot() == {
        "genre": ["User loves seinen."],
        None: ["User prefers japanese editions.", "User likes 猫の本."],
        "budget": ["budget: ¥8,000"],
        "volume": ["volume: vol 42"],
    }
    # Each line states its item: an append or a retry that writes it keeps it.
    for item in slot_items(MEMORY, 11):
        assert lost_slots(item.line, [item]) == [], item


async def test_a_lost_opinion_is_asked_for_and_appended_as_a_sentence() -> None:
    def reply(n: int, keep: Sequence[str]) -> str:
        return "The user asked about volume 42 with a budget of ¥8,000."

    summarizer = ScriptedSummarizer(reply)
    turns = {i: turn(i, f"Filler turn {i}.") for i in range(12)}
    tiers, quality = await validated_pass(
        make_builder(summarizer, turns), plan_tiers((), 11), (), MEMORY
    )
    lines = ("User loves seinen.", "User prefers japanese editions.", "User likes 猫の本.")
    assert summarizer.must_keep[1] == lines
    assert quality.lost_first == quality.appended == lines
    assert tiers[0].text.text.endswith("\nAlso: " + "; ".join(lines) + ".")
    assert "- loves" not in tiers[0].text.text


async def test_a_session_that_says_i_love_seinen_keeps_it_without_a_junk_line() -> None:
    service = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory"), clock=FakeClock()
    )
    async with service:
        session = await service.session("s1", user_id="u1")
        await session.add_turn("user", "Is Berserk volume 42 in stock? I love seinen.")
        await session.add_turn("assistant", "Yes, volume 42 is in stock at ¥880.")
        await session.add_turn("user", "Great, I'll think about it and come back.")
        await session.close()
        await service.drain()
        summaries = await session.summaries()
        quality = summaries.quality
        assert quality is not None
        assert quality.lost_first == ()
        assert quality.fact_preservation_first == 1.0
        assert quality.retried_tiers == ()
        texts = [t.text for t in summaries.tiers]
        texts += [r.content for r in await service.longterm.list("u1")]
        for text in texts:
            assert "- loves" not in text, text
            assert "I love seinen." in text or text == "loves seinen", text


def test_a_changed_opinion_makes_only_lines_of_its_subject_stale() -> None:
    # "I love seinen", later "actually I hate seinen now". Before, the stale value was the
    # bare word "loves": every line that loved anything went, whatever it was about.
    flipped = StructuredMemory(
        facts={SEINEN.slot: SEINEN.model_copy(update={"value": "hates", "previous": ("loves",)})},
        through_index=9,
    )
    text = "\n".join(
        [
            "- [2] User: My son loves Naruto.",
            "User loves seinen.",  # a line validation appended before the change
            "- [8] User: Actually I hate seinen now.",
        ]
    )
    kept, dropped = drop_stale(text, flipped)
    assert kept.splitlines() == ["- [2] User: My son loves Naruto.", text.splitlines()[2]]
    assert dropped == 1
