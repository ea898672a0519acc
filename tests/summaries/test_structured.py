"""The rule structured extractor: each rule, corrections, switches, malformed ids."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tiermem.errors import ValidationError
from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.models.turns import NewTurn, Turn
from tiermem.summaries.models import StructuredExtractor, StructuredMemory
from tiermem.summaries.structured import (
    RuleStructuredExtractor,
    render_structured,
    same_value,
    states_value,
    value_key,
)

TITLES = {"Berserk": "Berserk", "Naruto": "Naruto", "ベルセルク": "Berserk"}
EXTRACTOR = RuleStructuredExtractor(TITLES)
WHEN = datetime(2026, 1, 5, tzinfo=UTC)


def turns(*said: str | tuple[str, str], start: int = 0) -> list[Turn]:
    out = []
    for offset, item in enumerate(said):
        role, text = ("user", item) if isinstance(item, str) else item
        turn = NewTurn(role=role, content=(TextBlock(text=text),), timestamp=WHEN)  # type: ignore[arg-type]
        out.append(turn.with_index(start + offset))
    return out


def memory_of(*said: str | tuple[str, str]) -> StructuredMemory:
    return EXTRACTOR.extract_sync(turns(*said))


def current(memory: StructuredMemory) -> dict[str, str]:
    return {slot: f.value for slot, f in (*memory.entities.items(), *memory.facts.items())}


def test_it_is_a_structured_extractor() -> None:
    assert isinstance(EXTRACTOR, StructuredExtractor)
    assert EXTRACTOR.name == "rules"


@pytest.mark.parametrize(
    ("said", "slot", "value"),
    [
        ("Is Berserk vol 42 in stock?", "series", "Berserk"),
        ("Is Berserk vol 42 in stock?", "volume", "42"),
        ("ベルセルクの42巻はありますか？", "series", "Berserk"),
        ("I'm asking about order ORD-48213.", "order_id", "ORD-48213"),
        ("The ASIN is B0C4X7K2PQ.", "asin", "B0C4X7K2PQ"),
        ("The ISBN is 978-4-08-851234-1.", "isbn", "9784088512341"),
        ("I want the Japanese edition.", "language", "japanese"),
        ("Is it ¥990?", "price", "JPY 990"),
        ("My email is ken.sato@example.com.", "email", "ken.sato@example.com"),
        ("My budget is ¥5,000.", "budget", "¥5,000"),
        ("I can spend up to ¥5,000 on this.", "budget", "¥5,000"),
        ("Please keep it under $40.", "budget", "$40"),
        ("予算は8000円です。", "budget", "8000円"),
        ("I need it delivered by 2026-03-14.", "delivery_date", "2026-03-14"),
        ("My postcode is 150-0001.", "postcode", "150-0001"),
        ("Our team size is 12 people.", "team_size", "12 people"),
        ("My zip code is 94107.", "postcode", "94107"),
        ("I live in Osaka.", "location", "Osaka"),
        ("My name is Ken Sato.", "name", "Ken Sato"),
        ("Call me Ken.", "addressed_as", "Ken"),
        ("My favorite genre is seinen.", "preference:favorite_genre", "seinen"),
        ("I prefer seinen.", "preference:favorite_genre", "seinen"),
        ("My preferred delivery time is evening.", "preference:favorite_delivery_time", "evening"),
    ],
)
def test_each_rule_reads_its_slot(said: str, slot: str, value: str) -> None:
    assert current(memory_of(said)).get(slot) == value


@pytest.mark.parametrize(
    "said",
    [
        "My point is that it was late.",  # a stop noun, not a slot
        "What is my budget?",  # a question states no fact
        "My budget is tight.",  # a budget must be an amount
        "I live in a small flat.",  # a place is a name
    ],
)
def test_statements_that_name_no_slot_value_store_nothing(said: str) -> None:
    memory = memory_of(said)
    assert not memory.facts, memory.facts


def test_the_remembered_value_of_a_slot_keeps_the_turn_that_said_it() -> None:
    memory = memory_of("Hello!", "My budget is ¥5,000.", "Thanks.")
    assert memory.facts["budget"].turn_index == 1
    assert memory.through_index == 2


@pytest.mark.parametrize(
    ("first", "correction", "slot", "new", "old"),
    [
        ("My budget is ¥5,000.", "Actually, my budget is ¥8,000, not ¥5,000.", "budget",
         "¥8,000", "¥5,000"),
        ("My budget is ¥5,000.", "Actually my budget is ¥8,000", "budget", "¥8,000", "¥5,000"),
        ("Is Berserk vol 42 in stock?", "No, I meant vol 3, not vol 42.", "volume", "3", "42"),
        ("I need vol 42.", "3巻じゃなくて4巻です。", "volume", "4", "42"),
        ("My order number is ORD-48213.", "Sorry, the order number is ORD-48231, not ORD-48213.",
         "order_id", "ORD-48231", "ORD-48213"),
        ("My postcode is 150-0001.", "Correction: my postcode is now 150-0002.", "postcode",
         "150-0002", "150-0001"),
        ("I live in Osaka.", "Actually, I live in Kyoto now, not Osaka.", "location", "Kyoto",
         "Osaka"),
        ("My favorite genre is seinen.", "Quick update: my favorite genre is horror these days.",
         "preference:favorite_genre", "horror", "seinen"),
    ],
)  # fmt: skip
def test_a_correction_supersedes_and_keeps_the_old_value_in_previous(
    first: str, correction: str, slot: str, new: str, old: str
) -> None:
    memory = memory_of(first, correction)
    fact = memory.entities.get(slot) or memory.facts[slot]
    assert fact.value == new
    assert fact.previous == (old,)
    assert fact.turn_index == 1


def test_the_wrong_value_a_correction_names_is_never_taken() -> None:
    memory = memory_of("Actually it's ORD-11111, not ORD-22222.")
    assert memory.entities["order_id"].value == "ORD-11111"
    assert memory.entities["order_id"].previous == ()


def test_returning_to_an_earlier_value_does_not_list_it_as_previous() -> None:
    memory = memory_of("My budget is ¥5,000.", "My budget is ¥8,000.", "My budget is 5000円.")
    fact = memory.facts["budget"]
    assert fact.value == "5000円"
    assert fact.previous == ("¥8,000",)  # ¥5,000 is the current value again, not a stale one


def test_an_explicit_switch_expires_the_active_product_entities() -> None:
    memory = memory_of(
        "Is Berserk vol 42 in stock? The ASIN is B0C4X7K2PQ.",
        "My email is ken@example.com.",
        "Forget that, show me Naruto.",
    )
    assert memory.entities["series"].value == "Naruto"
    assert "volume" not in memory.entities
    assert "asin" not in memory.entities
    assert memory.entities["email"].value == "ken@example.com"  # not a subject: stays


def test_a_new_entity_of_a_kind_replaces_the_old_one() -> None:
    memory = memory_of("Is Berserk vol 42 in stock?", "And vol 43?")
    assert memory.entities["volume"].value == "43"
    assert memory.entities["volume"].previous == ("42",)


@pytest.mark.parametrize(
    "said",
    [
        "My ASIN is B07-1234.",  # seed 001's malformed ASIN
        "My ASIN is B07X1234.",  # two characters short
        "My order number is ORD-12AB.",
        "My ISBN is 978-4-08-851234-2.",  # bad check digit
        "The ISBN is 9784088512342.",
        "My email is ken@localhost.",
    ],
)
def test_a_malformed_id_is_rejected_not_stored(said: str) -> None:
    memory = memory_of(said)
    assert not memory.entities, memory.entities
    assert not memory.facts, memory.facts


@pytest.mark.parametrize(
    "said",
    [
        "Someone forwarded me this:\n> Your order ORD-99999 has shipped.\nIs that mine?",
        "My friend's order is ORD-99999.",
        "Another customer's order ORD-99999 was mixed up with mine.",
        "Tanaka's order is ORD-99999.",
        "If my budget were ¥30,000 I'd buy the box set.",
        "My sister's budget is ¥30,000.",
    ],
)
def test_values_that_are_not_the_users_are_not_stored(said: str) -> None:
    memory = memory_of("My order number is ORD-12345. My budget is ¥5,000.", said)
    assert memory.entities["order_id"].value == "ORD-12345"
    assert memory.facts["budget"].value == "¥5,000"


def test_assistant_suggestions_and_tool_results_set_no_slot() -> None:
    tool = NewTurn(
        role="assistant",
        content=(
            TextBlock(text="Let me look."),
            ToolUseBlock(tool_use_id="t1", name="search", input={"q": "Naruto vol 7"}),
        ),
        timestamp=WHEN,
    ).with_index(1)
    result = NewTurn(
        role="user",
        content=(
            ToolResultBlock(
                tool_use_id="t1", content=(TextBlock(text="Naruto vol 7 | B0AAAAAAAA | ¥500"),)
            ),
        ),
        timestamp=WHEN,
    ).with_index(2)
    said = [
        *turns("Is Berserk vol 42 in stock?"),
        tool,
        result,
        *turns(("assistant", "You might like Naruto vol 7 at ¥500."), start=3),
    ]
    memory = EXTRACTOR.extract_sync(said)
    assert current(memory) == {"series": "Berserk", "volume": "42"}


def test_an_entity_inside_a_stated_value_belongs_to_that_slot() -> None:
    memory = memory_of("I'm looking for Berserk.", "My favorite series is Naruto.")
    assert memory.entities["series"].value == "Berserk"
    assert memory.facts["preference:favorite_series"].value == "Naruto"


def test_decisions_goals_and_unresolved_intentions_are_kept_as_said() -> None:
    memory = memory_of(
        "I'm looking for a gift for a friend.",
        "I'll take the deluxe edition.",
        "I'll think about the box set and come back later.",
        ("assistant", "I'll check the preorder date and get back to you."),
        ("assistant", "I've placed the order."),
        "Will you take cards?",  # a question: neither
    )
    assert [i.text for i in memory.goals] == ["I'm looking for a gift for a friend."]
    assert [i.text for i in memory.decisions] == [
        "I'll take the deluxe edition.",
        "I've placed the order.",
    ]
    assert [(i.text, i.turn_index) for i in memory.unresolved] == [
        ("I'll think about the box set and come back later.", 2),
        ("I'll check the preorder date and get back to you.", 3),
    ]


def test_an_item_naming_a_superseded_value_goes() -> None:
    memory = memory_of("I want the Japanese edition.", "Actually, make it the French edition.")
    assert memory.entities["language"].value == "french"
    assert all("Japanese" not in item.text for item in memory.goals)


def test_items_are_bounded_newest_kept() -> None:
    extractor = RuleStructuredExtractor(max_items=2)
    memory = extractor.extract_sync(
        turns("I want to read more.", "I want to save money.", "I want to learn Japanese.")
    )
    assert [i.text for i in memory.goals] == ["I want to save money.", "I want to learn Japanese."]


async def test_extraction_continues_from_prior_and_skips_turns_it_already_read() -> None:
    first = await EXTRACTOR.extract(turns("My budget is ¥5,000."))
    said = turns("My budget is ¥5,000.", "Actually, my budget is ¥8,000.")
    second = await EXTRACTOR.extract(said, prior=first)
    assert second.facts["budget"].value == "¥8,000"
    assert second.facts["budget"].previous == ("¥5,000",)
    again = await EXTRACTOR.extract(said, prior=second)  # a retried job adds nothing
    assert again == second


def test_redacted_turns_are_not_read() -> None:
    [turn] = turns("My budget is ¥5,000.")
    assert EXTRACTOR.extract_sync([turn.redact()]).facts == {}


def test_extraction_is_deterministic() -> None:
    said = turns("Is Berserk vol 42 in stock?", "My budget is ¥5,000.", "I live in Osaka.")
    assert EXTRACTOR.extract_sync(said) == RuleStructuredExtractor(TITLES).extract_sync(said)


def test_max_items_below_one_is_rejected() -> None:
    with pytest.raises(ValidationError, match="max_items"):
        RuleStructuredExtractor(max_items=0)


@pytest.mark.parametrize(
    ("a", "b", "slot", "same"),
    [
        ("¥8,000", "8000円", "budget", True),
        ("¥8,000", "¥18,000", "budget", False),
        ("vol 3", "3", "volume", True),
        ("volume 3", "vol. 3", "volume", True),
        ("JPY 990", "¥990", "price", True),
        ("Ken  Sato", "ken sato", "name", True),
        ("978-4-08-851234-1", "9784088512341", "isbn", True),
    ],
)
def test_values_are_compared_by_what_they_mean(a: str, b: str, slot: str, same: bool) -> None:
    assert same_value(a, b, slot=slot) is same
    assert (value_key(a, slot=slot) == value_key(b, slot=slot)) is same


@pytest.mark.parametrize(
    ("text", "value", "slot", "stated"),
    [
        ("My budget is 8000円.", "¥8,000", "budget", True),
        ("My budget is ¥18,000.", "¥8,000", "budget", False),
        ("Is volume 3 in?", "3", "volume", True),
        ("I need 3 copies.", "3", "volume", False),  # "3" alone is not volume 3
        ("I live in Kyoto.", "Kyoto", "location", True),
        ("I live in Kyotoshi.", "Kyoto", "location", False),
        ("Order ord-48213 shipped.", "ORD-48213", "order_id", True),
    ],
)
def test_states_value(text: str, value: str, slot: str, stated: bool) -> None:
    assert states_value(text, value, slot=slot) is stated


def test_render_shows_current_values_and_items_not_superseded_ones() -> None:
    memory = memory_of("My budget is ¥5,000.", "Actually, my budget is ¥8,000.", "I want to save.")
    text = render_structured(memory)
    assert "budget=¥8,000" in text
    assert "¥5,000" not in text
    assert "Goals: I want to save." in text
    assert render_structured(StructuredMemory()) == ""


@pytest.mark.parametrize(
    ("said", "slot", "value"),
    [
        ("Change the postcode to 150-0002.", "postcode", "150-0002"),
        ("Please update my phone number to 090-1111-2222.", "phone_number", "090-1111-2222"),
        ("Use sora752 as the username from now on.", "username", "sora752"),
        ("Put M-395911 down as my membership number.", "membership_number", "M-395911"),
        ("Takehiko Inoue is my favorite author.", "preference:favorite_author", "Takehiko Inoue"),
        ("Set my language to French.", "language", "french"),
        ("Switch the order to ORD-55555.", "order_id", "ORD-55555"),
    ],
)
def test_a_slot_said_another_way_is_read(said: str, slot: str, value: str) -> None:
    assert current(memory_of(said)).get(slot) == value


@pytest.mark.parametrize(
    "said",
    ["It is my turn.", "Use it as the base.", "Change the subject to something else."],
)
def test_restatement_rules_skip_vague_values(said: str) -> None:
    assert current(memory_of(said)) == {}


def test_a_restatement_supersedes_the_earlier_value() -> None:
    memory = memory_of("My postcode is 150-0001.", "Change the postcode to 150-0002.")
    assert memory.facts["postcode"].value == "150-0002"
    assert memory.facts["postcode"].previous == ("150-0001",)


def test_only_the_rule_window_of_a_long_paste_is_read() -> None:
    filler = "Lorem ipsum dolor sit amet. " * 400  # about 11,000 characters
    paste = f"My budget is ¥5,000. Here is the thread:\n{filler}My budget is ¥99,999.\n{filler}"
    memory = memory_of(paste)
    assert memory.facts["budget"].value == "¥5,000"  # the middle is someone else's text
    assert memory.facts["budget"].previous == ()
