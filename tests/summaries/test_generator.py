"""The seeded conversation generator: shape, ground truth and determinism."""

from __future__ import annotations

import pytest

from tiermem.errors import ValidationError
from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock, text_of
from tiermem.summaries.structured import states_value
from tiermem.testing.conversations import generate_conversation
from tiermem.tokens import TiktokenCounter

DOMAINS = ["manga", "assistant"]


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_same_seed_gives_the_same_conversation(domain: str) -> None:
    a = generate_conversation(7, domain=domain)  # type: ignore[arg-type]
    b = generate_conversation(7, domain=domain)  # type: ignore[arg-type]
    c = generate_conversation(8, domain=domain)  # type: ignore[arg-type]
    assert a == b
    assert a.turns != c.turns


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_truth_matches_the_turns(domain: str, seed: int) -> None:
    conv = generate_conversation(seed, turns=300, facts=30, corrections=10, domain=domain)  # type: ignore[arg-type]
    assert len(conv.turns) == 300
    assert len(conv.facts) == 30
    assert len({f.slot for f in conv.facts}) == 30  # one fact per slot
    assert len(conv.corrections) == 10
    for fact in conv.facts:
        planted = conv.turns[fact.turn_index]
        assert planted.role == "user"
        first = fact.superseded[0] if fact.superseded else fact.value
        assert states_value(planted.text, first, slot=fact.slot), (fact, planted.text)
        if fact.superseded:
            assert fact.corrected_at is not None
            assert fact.corrected_at > fact.turn_index
            correction = conv.turns[fact.corrected_at]
            assert states_value(correction.text, fact.value, slot=fact.slot), correction.text
        else:
            assert fact.corrected_at is None


@pytest.mark.parametrize("domain", DOMAINS)
def test_values_never_collide(domain: str) -> None:
    conv = generate_conversation(3, domain=domain)  # type: ignore[arg-type]
    values = [v.casefold() for f in conv.facts for v in (f.value, *f.superseded)]
    values += [d.value.casefold() for d in conv.distractors]
    assert len(values) == len(set(values))


@pytest.mark.parametrize("domain", DOMAINS)
def test_a_superseded_value_is_not_mentioned_after_its_correction(domain: str) -> None:
    # So a stale value in a summary comes from the summary, not from a later mention.
    conv = generate_conversation(4, domain=domain)  # type: ignore[arg-type]
    for fact in conv.corrections:
        assert fact.corrected_at is not None
        for turn in conv.turns[fact.corrected_at + 1 :]:
            for old in fact.superseded:
                assert not states_value(turn.text, old, slot=fact.slot), (fact, turn.text)


def test_roles_alternate_and_tool_calls_pair_with_large_results() -> None:
    conv = generate_conversation(5)
    counter = TiktokenCounter()
    assert [t.role for t in conv.turns[:4]] == ["user", "assistant", "user", "assistant"]
    assert all(t.role == ("user" if i % 2 == 0 else "assistant") for i, t in enumerate(conv.turns))
    calls = 0
    for i, turn in enumerate(conv.turns):
        uses = [b for b in turn.content if isinstance(b, ToolUseBlock)]
        if uses:
            calls += 1
            [result] = conv.turns[i + 1].content
            assert isinstance(result, ToolResultBlock)
            assert result.tool_use_id == uses[0].tool_use_id
            assert counter.count(text_of(result.content)) > 1000
    assert calls == 300 // 25


def test_distractors_are_in_their_turns_and_are_not_the_users_values() -> None:
    conv = generate_conversation(6)
    assert conv.distractors
    truth = {v.casefold() for f in conv.facts for v in (f.value, *f.superseded)}
    for distractor in conv.distractors:
        assert distractor.value in conv.turns[distractor.turn_index].text
        assert distractor.value.casefold() not in truth
        assert distractor.kind in {"quoted_email", "third_party", "hypothetical"}


def test_items_and_filler_are_user_text() -> None:
    conv = generate_conversation(2)
    assert {i.kind for i in conv.items} == {"decision", "goal", "unresolved"}
    for item in conv.items:
        assert conv.turns[item.turn_index].text == item.text
    texts = [b for t in conv.turns for b in t.content if isinstance(b, TextBlock)]
    assert len(texts) > 250


def test_indexed_turns_number_from_zero() -> None:
    conv = generate_conversation(1, turns=60, facts=5, corrections=2)
    indexed = conv.indexed()
    assert [t.index for t in indexed] == list(range(60))
    assert indexed[0].content == conv.turns[0].content


def test_timestamps_advance() -> None:
    conv = generate_conversation(1, turns=40, facts=3, corrections=1)
    stamps = [t.timestamp for t in conv.turns]
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == 40


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"facts": 99}, "slots"),
        ({"facts": 3, "corrections": 4}, "corrections"),
        ({"turns": 20, "facts": 30}, "cannot hold"),
        ({"domain": "cooking"}, "unknown domain"),
        ({"paraphrase": 1.5}, "paraphrase"),
    ],
)
def test_impossible_requests_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        generate_conversation(0, **kwargs)  # type: ignore[arg-type]


def test_paraphrase_changes_only_the_phrasing_not_the_truth_or_other_turns() -> None:
    plain = generate_conversation(9, paraphrase=0.0)
    free = generate_conversation(9, paraphrase=1.0)
    assert [f.slot for f in plain.facts] == [f.slot for f in free.facts]
    assert [f.turn_index for f in plain.facts] == [f.turn_index for f in free.facts]
    changed = [i for i, (a, b) in enumerate(zip(plain.turns, free.turns, strict=True)) if a != b]
    assert changed  # some statements are phrased otherwise
    planted = {f.turn_index for f in free.facts} | {f.corrected_at for f in free.facts}
    assert set(changed) <= planted
    for fact in free.facts:  # the truth still holds: each value is said where it is planted
        said = fact.superseded[0] if fact.superseded else fact.value
        assert states_value(free.turns[fact.turn_index].text, said, slot=fact.slot)
