"""Structured extraction, made cheaper for issue #8 (a slot restated in a pass is one
tuple until the end, not a model copied at each statement), gives exactly the structured
memory it gave: the implementation before the change is kept here as the reference and
both extract the same turns -- generated conversations (facts, corrections, switches of
subject, tool output), in chunks as passes extract them (each from the last one's
memory), and a prior whose fact is filed under another slot name."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime

from tiermem.models.content import TextBlock
from tiermem.models.turns import Turn
from tiermem.summaries.models import Fact, StructuredMemory
from tiermem.summaries.structured import (
    SUBJECT_SLOTS,
    ProbeSet,
    RuleStructuredExtractor,
    SaidIn,
    _add_item,
    same_value,
    turn_said,
    value_probe,
)
from tiermem.testing.conversations import generate_conversation

# -- the reference: the implementation before the change ------------------------------------


def _ref_set(store: dict[str, Fact], slot: str, value: str, turn_index: int) -> None:
    old = store.get(slot)
    if old is None:
        store[slot] = Fact(slot=slot, value=value, turn_index=turn_index)
    elif same_value(old.value, value, slot=slot):
        store[slot] = old.model_copy(update={"turn_index": turn_index})
    else:
        previous = tuple(v for v in old.previous if not same_value(v, value, slot=slot))
        store[slot] = Fact(
            slot=slot, value=value, turn_index=turn_index, previous=(*previous, old.value)
        )


class RefExtractor(RuleStructuredExtractor):
    def extract_sync(
        self, turns: Sequence[Turn], *, prior: StructuredMemory | None = None
    ) -> StructuredMemory:
        base = prior or StructuredMemory()
        entities = dict(base.entities)
        facts = dict(base.facts)
        items = {
            "decision": list(base.decisions),
            "goal": list(base.goals),
            "unresolved": list(base.unresolved),
        }
        through = base.through_index
        for turn in turns:
            if turn.index <= base.through_index or turn.redacted:
                through = max(through, turn.index)
                continue
            through = max(through, turn.index)
            for reading in self._readings_of(turn_said(turn), turn.role == "user"):
                if reading.switch:
                    for slot in SUBJECT_SLOTS:
                        entities.pop(slot, None)
                for slot_value in reading.slots:
                    target = entities if slot_value.entity else facts
                    _ref_set(target, slot_value.slot, slot_value.value, turn.index)
                for kind in ("decision", "goal", "unresolved"):
                    if getattr(reading, kind):
                        _add_item(items[kind], reading.text, turn.index)
        superseded = [
            (slot, old)
            for slot, fact in (*entities.items(), *facts.items())
            for old in fact.previous
        ]
        if superseded:
            probes = ProbeSet([value_probe(old, slot=slot) for slot, old in superseded])
            for kind in items:
                items[kind] = [
                    item
                    for item in items[kind]
                    if not probes.stated_by(SaidIn(item.text, self._entities))
                ]
        return StructuredMemory(
            entities=entities,
            facts=facts,
            decisions=tuple(items["decision"][-self._max_items :]),
            goals=tuple(items["goal"][-self._max_items :]),
            unresolved=tuple(items["unresolved"][-self._max_items :]),
            through_index=through,
        )


def _dump(memory: StructuredMemory) -> str:
    return memory.model_dump_json()  # field order and dict order included


def test_chunked_extraction_gives_the_same_memory() -> None:
    """Passes extract the turns since the last one, from its memory: chunk by chunk, the
    same memory (values, turns, earlier values, their order) as the reference."""
    rng = random.Random(88)
    for seed in (1, 2, 6):
        conversation = generate_conversation(seed, turns=300, facts=24, corrections=10)
        turns = list(conversation.indexed())
        titles = conversation.known_titles
        new, ref = RuleStructuredExtractor(titles), RefExtractor(titles)
        got = want = None
        start = 0
        while start < len(turns):
            chunk = turns[start : start + rng.randrange(1, 30)]
            got = new.extract_sync(chunk, prior=got)
            want = ref.extract_sync(chunk, prior=want)
            assert _dump(got) == _dump(want), (seed, start)
            start += len(chunk)
        assert got is not None
        assert got.facts or got.entities


def test_a_prior_fact_under_another_slot_name_keeps_its_name() -> None:
    """A restated value keeps the prior fact as it was filed (only its turn moves), as a
    copy of the model did."""
    prior = StructuredMemory(
        facts={"budget": Fact(slot="spending_limit", value="¥8,000", turn_index=1)},
        through_index=1,
    )
    said = (TextBlock(text="My budget is ¥8,000."),)
    turns = [Turn(index=2, role="user", content=said, timestamp=datetime(2026, 1, 1, tzinfo=UTC))]
    new = RuleStructuredExtractor().extract_sync(turns, prior=prior)
    ref = RefExtractor().extract_sync(turns, prior=prior)
    assert _dump(new) == _dump(ref)
    assert new.facts["budget"].turn_index == 2


def _user_turns(first: int, *texts: str) -> list[Turn]:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        Turn(index=first + i, role="user", content=(TextBlock(text=text),), timestamp=at)
        for i, text in enumerate(texts)
    ]


def test_a_value_restated_another_way_keeps_its_first_writing() -> None:
    """ "¥8,000" then "8000円" (one value): the value stays as first written, at the later
    turn, within one extraction and across two; a new value then moves it to
    ``previous``."""
    said = (
        "My budget is ¥8,000.",
        "My budget is 8000円.",
        "Actually my budget is ¥5,000.",
        "My budget is ¥5,000 yes.",
        "Actually my budget is 8,000 yen, not ¥5,000.",
    )
    turns = _user_turns(0, *said)
    new, ref = RuleStructuredExtractor(), RefExtractor()
    whole = new.extract_sync(turns)
    assert _dump(whole) == _dump(ref.extract_sync(turns))
    assert whole.facts["budget"].value == "¥8,000" or whole.facts["budget"].previous
    got = want = None
    for turn in turns:
        got = new.extract_sync([turn], prior=got)
        want = ref.extract_sync([turn], prior=want)
        assert _dump(got) == _dump(want)
