"""Closed-loop validation: every branch (nothing lost, fixed by the retry, appended
verbatim, kept tier), its metrics, and the LLM engines driven by a scripted model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from tiermem.clock import FakeClock
from tiermem.llm.chat_scripted import ScriptedChatModel
from tiermem.models import TextBlock, Turn
from tiermem.summaries.llm_engine import LLMStructuredExtractor, LLMSummarizer
from tiermem.summaries.models import Fact, Item, StructuredMemory, SummaryText, SummaryTier
from tiermem.summaries.rolling import RollingBuilder, TierTargets, plan_tiers
from tiermem.summaries.validate import (
    SlotItem,
    lost_slots,
    mentions,
    slot_items,
    validated_pass,
)
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
T0 = datetime(2030, 1, 1, tzinfo=UTC)

MEMORY = StructuredMemory(
    entities={"series": Fact(slot="series", value="Berserk", turn_index=2)},
    facts={
        "budget": Fact(slot="budget", value="¥8,000", turn_index=5, previous=("¥5,000",)),
        "name": Fact(slot="name", value="Ken Sato", turn_index=30),  # in the hot turns
    },
    decisions=(Item(text="I'll take volume 3 in the Japanese edition", turn_index=7),),
    unresolved=(Item(text="remind me when volume 43 ships", turn_index=9),),
    through_index=30,
)


def turn(index: int, text: str) -> Turn:
    return Turn(
        index=index,
        role="user",
        content=(TextBlock(text=text),),
        timestamp=T0,
        token_count=COUNTER.count(text),
    )


TURNS = {i: turn(i, f"Filler turn number {i} about nothing in particular.") for i in range(12)}


class ScriptedSummarizer:
    """Answers each call with ``reply(call_number, must_keep)`` (a test double)."""

    name = "scripted-summary"

    def __init__(self, reply: Callable[[int, Sequence[str]], str]) -> None:
        self.reply = reply
        self.must_keep: list[tuple[str, ...]] = []

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        self.must_keep.append(tuple(must_keep))
        return self.reply(len(self.must_keep), must_keep)


def make_builder(summarizer: ScriptedSummarizer, turns: dict[int, Turn] = TURNS) -> RollingBuilder:
    async def source(first: int, through: int) -> list[Turn]:
        return [turns[i] for i in range(first, through + 1) if i in turns]

    return RollingBuilder(
        summarizer, targets=TierTargets(), counter=COUNTER, clock=FakeClock(), turns=source
    )


FULL = (
    "Ken asked about Berserk; budget 8000円. Decided: I'll take volume 3 in the Japanese "
    "edition. Open: remind me when volume 43 ships."
)


def test_slots_are_only_those_the_pass_summarized() -> None:
    items = slot_items(MEMORY, through=11)
    assert {i.text for i in items} == {
        "Berserk",
        "¥8,000",
        "I'll take volume 3 in the Japanese edition",
        "remind me when volume 43 ships",
    }


def test_values_match_as_the_same_value_and_sentences_by_their_words() -> None:
    budget = SlotItem("fact", "budget", "¥8,000", 5, exact=True)
    assert mentions("The budget is now 8000円.", budget)
    assert not mentions("The budget was ¥18,000.", budget)
    decision = SlotItem("decision", None, "I'll take volume 3 in the Japanese edition", 7, False)
    assert mentions("User decided to take volume 3, Japanese edition.", decision)
    assert not mentions("User asked about editions.", decision)
    assert lost_slots("nothing", [budget, decision]) == [budget, decision]


async def test_nothing_lost_means_one_call_and_full_preservation() -> None:
    summarizer = ScriptedSummarizer(lambda n, keep: FULL)
    tiers, quality = await validated_pass(make_builder(summarizer), plan_tiers((), 11), (), MEMORY)
    assert summarizer.must_keep == [()]
    assert tiers[0].text.text == FULL
    assert quality.checked == 4
    assert quality.lost_first == ()
    assert quality.fact_preservation_first == quality.fact_preservation == 1.0
    assert quality.retried_tiers == ()
    assert quality.appended == ()
    raw = sum(t.token_count for t in TURNS.values())
    assert quality.raw_tokens == raw
    assert quality.compression_ratio == COUNTER.count(FULL) / raw


async def test_a_lost_slot_is_summarized_again_with_must_keep() -> None:
    def reply(n: int, keep: Sequence[str]) -> str:
        if n == 1:
            return "Ken asked about various titles; budget 8000円."  # drops three slots
        return FULL

    summarizer = ScriptedSummarizer(reply)
    tiers, quality = await validated_pass(make_builder(summarizer), plan_tiers((), 11), (), MEMORY)
    assert set(summarizer.must_keep[1]) == {
        "series: Berserk",  # a slot as a readable line, not the bare value
        "I'll take volume 3 in the Japanese edition",
        "remind me when volume 43 ships",
    }
    assert tiers[0].text.text == FULL
    assert quality.fact_preservation_first == 0.25
    assert quality.fact_preservation == 1.0
    assert quality.retried_tiers == ("recent",)
    assert quality.appended == ()


async def test_still_lost_after_the_retry_is_appended_verbatim() -> None:
    summarizer = ScriptedSummarizer(lambda n, keep: "Ken talked about manga; budget ¥8,000.")
    tiers, quality = await validated_pass(make_builder(summarizer), plan_tiers((), 11), (), MEMORY)
    assert len(summarizer.must_keep) == 2  # one retry, no more
    text = tiers[0].text.text
    assert text.startswith("Ken talked about manga; budget ¥8,000.\nAlso: ")
    for item in ("series: Berserk", "remind me when volume 43 ships"):
        assert item in text
    assert tiers[0].text.tokens == COUNTER.count(text)
    assert quality.fact_preservation_first == 0.25
    assert quality.fact_preservation == 1.0
    assert len(quality.appended) == 3


async def test_a_kept_tier_is_not_summarized_again_its_losses_are_appended() -> None:
    # Turns 0..13 expired; the old summary of them did not state the budget.
    turns = {i: turn(i, f"Later turn {i} mentions Berserk.") for i in range(14, 28)}
    memory = StructuredMemory(
        entities={"series": Fact(slot="series", value="Berserk", turn_index=20)},
        facts={"budget": Fact(slot="budget", value="¥8,000", turn_index=5)},
        through_index=27,
    )
    old = [
        SummaryText(
            tier=SummaryTier.RECENT,
            text="The user browsed.",
            tokens=4,
            first_index=0,
            through_index=13,
            created_at=T0,
            engine="old",
        )
    ]
    summarizer = ScriptedSummarizer(lambda n, keep: "Berserk again.")
    tiers, quality = await validated_pass(
        make_builder(summarizer, turns), plan_tiers(old, 27), old, memory
    )
    middle, recent = tiers
    assert not middle.from_raw
    assert middle.text.text.startswith("The user browsed.")
    assert "Also: budget: ¥8,000." in middle.text.text
    assert quality.kept_tiers == ("middle",)
    assert quality.retried_tiers == ()  # a kept tier has no raw turns to retry with
    assert len(summarizer.must_keep) == 1
    assert recent.text.text == "Berserk again."


async def test_entity_drift_counts_entities_the_previous_summary_had() -> None:
    old = [
        SummaryText(
            tier=SummaryTier.RECENT,
            text="Berserk and Vagabond were discussed.",
            tokens=8,
            first_index=0,
            through_index=5,
            created_at=T0,
            engine="old",
        )
    ]
    memory = StructuredMemory(
        entities={
            "series": Fact(slot="series", value="Berserk", turn_index=2),
            "title": Fact(slot="title", value="Vagabond", turn_index=3),
        },
        through_index=11,
    )
    summarizer = ScriptedSummarizer(
        lambda n, keep: "Various titles." if n <= 2 else "Berserk and Vagabond."
    )
    _, quality = await validated_pass(make_builder(summarizer), plan_tiers(old, 11), old, memory)
    assert quality.entity_drift == 1.0  # the first attempt dropped both names
    assert quality.fact_preservation == 1.0


# -- the LLM engines -------------------------------------------------------------------------


async def test_llm_summarizer_sends_raw_turns_prior_and_must_keep() -> None:
    model = ScriptedChatModel([{"summary": "  Budget ¥8,000; Berserk vol 3.  "}])
    summarizer = LLMSummarizer(model)
    text = await summarizer.summarize(
        [turn(4, "My budget is ¥8,000."), turn(5, "Berserk vol 3 please.")],
        prior="Earlier: the user greeted us.",
        target_tokens=120,
        must_keep=["Berserk"],
    )
    assert text == "Budget ¥8,000; Berserk vol 3."
    call = model.calls[0]
    prompt = call.messages[0].text
    assert "[turn 4] user: My budget is ¥8,000." in prompt
    assert "Earlier: the user greeted us." in prompt
    assert "- Berserk" in prompt
    assert call.system is not None
    assert "120 tokens" in call.system
    assert "latest" in call.system
    assert "Never invent" in call.system


async def test_llm_summarizer_is_tolerant_of_a_fenced_reply() -> None:
    model = ScriptedChatModel(['```json\n{"summary": "ok",}\n```'])
    assert await LLMSummarizer(model).summarize([turn(0, "hi")], target_tokens=50) == "ok"


async def test_llm_extractor_merges_latest_wins_and_drops_invented_turns() -> None:
    prior = StructuredMemory(
        facts={"budget": Fact(slot="budget", value="¥5,000", turn_index=1)}, through_index=3
    )
    model = ScriptedChatModel(
        [
            {
                "entities": [
                    {"kind": "series", "value": "Berserk", "turn": 4},
                    {"kind": "volume", "value": 42, "turn": 999},  # invented turn number
                    {"kind": "", "value": "x"},  # malformed: ignored
                    "garbage",
                ],
                "facts": [{"slot": "budget", "value": "¥8,000", "turn": 5}],
                "decisions": [{"text": "take vol 42", "turn": 5}, "take vol 42", 7],
                # "goals" and "unresolved" left out: a partial reply is still used
            }
        ]
    )
    memory = await LLMStructuredExtractor(model).extract(
        [turn(4, "Berserk?"), turn(5, "Budget is ¥8,000 now; I'll take vol 42.")], prior=prior
    )
    assert memory.entities["series"].value == "Berserk"
    assert memory.entities["volume"].value == "42"
    assert memory.entities["volume"].turn_index == 5  # attributed to the last turn given
    assert memory.facts["budget"].value == "¥8,000"
    assert memory.facts["budget"].previous == ("¥5,000",)
    assert [d.text for d in memory.decisions] == ["take vol 42"]
    assert memory.unresolved == ()
    assert memory.through_index == 5


async def test_llm_extractor_with_an_empty_reply_keeps_the_prior() -> None:
    prior = StructuredMemory(
        facts={"budget": Fact(slot="budget", value="¥5,000", turn_index=1)}, through_index=3
    )
    model = ScriptedChatModel([{}])
    memory = await LLMStructuredExtractor(model).extract([turn(4, "ok")], prior=prior)
    assert memory.facts == prior.facts
    assert memory.through_index == 4
