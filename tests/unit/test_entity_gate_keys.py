"""The extractor runs a rule without its own gate test only when that test would pass.

The extractor tests every rule's gate strings at once, keeps the rule selection per set of
strings found, and then runs the selected rules' patterns directly. A gate string is looked
for in the form of the text its rule reads (folded or with its case), so two rules sharing
a string in different forms are still told apart. Entities for the same strings are one
shared frozen value.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError as PydanticValidationError

from tiermem.extraction.entities import EntityRule, RuleEntityExtractor
from tiermem.models.turns import Entity
from tiermem.policies.turn_text import as_turn_text


def _always(kind: str) -> EntityRule:
    """A rule whose pattern matches without its gate string: only the gate stops it."""
    return EntityRule(kind, r"y", lambda m: m.group(0), folded=False, requires=("x",))


def test_a_gate_string_found_in_the_other_form_of_the_text_does_not_select_a_rule() -> None:
    folded = EntityRule("low", r"x", lambda m: "x", requires=("x",))
    extractor = RuleEntityExtractor(rules=[folded, _always("cased")])
    # Both rules need "x": in "X y" the folded text has it (the folded rule runs) but the
    # text as written does not, so the cased rule's own gate fails and it must not run.
    assert extractor.extract("X y") == (Entity(kind="low", value="x"),)
    assert extractor.extract("x y") == (
        Entity(kind="low", value="x"),
        Entity(kind="cased", value="y"),
    )


@pytest.mark.parametrize("text", ["x y", "X y", "y", "xX y", "nothing"])
def test_the_selection_equals_each_rule_run_with_its_own_gate(text: str) -> None:
    rules = [EntityRule("low", r"x", lambda m: "x", requires=("x",)), _always("cased")]
    extractor = RuleEntityExtractor(rules=rules)
    for _ in range(2):  # the second time from the kept selection
        found = [(kind, value) for _, _, kind, value in extractor.find(text)]
        view = as_turn_text(text).view
        each = [(rule.kind, value) for rule in rules for _, _, value in rule.find(view)]
        assert sorted(found) == sorted(each)


def test_entities_of_the_same_strings_are_equal_and_frozen() -> None:
    extractor = RuleEntityExtractor({"Berserk": "Berserk"})
    first = extractor.extract("Berserk vol 42")
    second = extractor.extract("is Berserk vol 42 in stock?")
    assert (
        first
        == second
        == (
            Entity(kind="series", value="Berserk"),
            Entity(kind="volume", value="42"),
        )
    )
    with pytest.raises(PydanticValidationError):
        first[0].value = "Naruto"  # type: ignore[misc]
    assert second[0].value == "Berserk"


def test_a_custom_rule_value_that_is_not_a_string_is_validated() -> None:
    number = EntityRule("n", r"[0-9]+", lambda m: int(m.group(0)))  # type: ignore[arg-type,return-value]
    with pytest.raises(PydanticValidationError):
        RuleEntityExtractor(rules=[number]).extract("42")
