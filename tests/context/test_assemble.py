"""assemble_context: layout, cache points, provenance, budget shares, stats."""

from __future__ import annotations

import pytest

from tests.context.conftest import T0, turn
from tiermem.context import (
    Allocation,
    ContextSection,
    ContextWindow,
    ItemProvenance,
    assemble_context,
    resolve_budget,
)
from tiermem.errors import BudgetExceededError, ValidationError
from tiermem.longterm.hits import RecallHit
from tiermem.models import (
    ActiveEntity,
    CachePointBlock,
    MemoryRecord,
    Provenance,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tiermem.tokens import TiktokenCounter, default_registry

PROFILE = ContextSection(
    kind="profile",
    text="Known about this user:\n- prefers seinen",
    provenance=ItemProvenance(tier="longterm", memory_ids=("m-1",)),
)
SUMMARY = ContextSection(
    kind="summary",
    name="recent",
    text="The user asked about Berserk vol 42; it is in stock.",
    provenance=ItemProvenance(
        tier="session", session_id="s-1", summary_id="sum-1", turn_indexes=(0, 1)
    ),
)
STRUCTURED = ContextSection(
    kind="structured_memory",
    text="Facts:\n- budget: 50 EUR",
    counts={"facts": 1, "entities": 2},
)
ENTITY = ActiveEntity(kind="series", value="Berserk", turn_index=0, updated_at=T0)


def _turn_hit(index: int, text: str, session_id: str = "s-1") -> RecallHit:
    return RecallHit(
        kind="turn",
        doc_id=f"{session_id}:{index}",
        text=text,
        score=0.5,
        turn=turn(index, "user", text),
        session_id=session_id,
    )


def _memory_hit(memory_id: str, text: str, score: float = 0.9) -> RecallHit:
    record = MemoryRecord(
        memory_id=memory_id, user_id="u-1", memory_type="fact", content=text, created_at=T0
    )
    return RecallHit(
        kind="memory",
        doc_id=memory_id,
        text=text,
        score=score,
        memory=record,
        provenance=Provenance(session_id="s-0", turn_indexes=(3,)),
    )


def _full(counter: TiktokenCounter, **overrides: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "system": "You are a manga shop assistant.",
        "tools": [
            {
                "name": "stock",
                "description": "Check stock",
                "input_schema": {"type": "object", "properties": {"vol": {"type": "integer"}}},
            }
        ],
        "user_context": PROFILE,
        "sections": [SUMMARY, STRUCTURED],
        "entities": {"series": ENTITY},
        "recall": [
            _memory_hit("m-2", "collects first editions"),
            _turn_hit(40, "my budget is 50 EUR", session_id="s-0"),
        ],
        "turns": [turn(0, "user", "Is Berserk vol 42 in stock?"), turn(1, "assistant", "Yes.")],
        "current": "And vol 43?",
        "budget": 4_000,
        "session_id": "s-1",
        "counter": counter,
    }
    args.update(overrides)
    return assemble_context(**args)  # type: ignore[arg-type]


def test_layout_follows_seed_001(counter: TiktokenCounter) -> None:
    window = _full(counter)
    assert [i.kind for i in window.items] == [
        "system",
        "tools",
        "profile",
        "summary",
        "structured_memory",
        "entities",
        "recall",
        "recall",
        "turn",
        "turn",
        "current",
    ]
    # Cache points after the static prefix and after the slow-changing block.
    assert [type(b).__name__ for b in window.system] == [
        "TextBlock",
        "CachePointBlock",
        "TextBlock",
        "TextBlock",
        "CachePointBlock",
        "TextBlock",
        "TextBlock",
        "TextBlock",
        "TextBlock",
    ]
    assert [(c.name, c.after_item) for c in window.cache_points] == [("static", 1), ("slow", 3)]
    assert window.prefix_fingerprint == window.cache_points[-1].fingerprint
    assert window.system[5] == TextBlock(text="Facts:\n- budget: 50 EUR")
    assert "series: Berserk" in window.items[5].text
    assert window.items[6].text.startswith("Recalled for this message")
    assert [m.role for m in window.messages] == ["user", "assistant", "user"]


def test_every_item_has_provenance_and_tokens(counter: TiktokenCounter) -> None:
    window = _full(counter)
    by_kind = {i.kind: i for i in window.items}
    assert by_kind["summary"].provenance.summary_id == "sum-1"
    assert by_kind["profile"].provenance.memory_ids == ("m-1",)
    assert by_kind["entities"].provenance.turn_indexes == (0,)
    recall = [i for i in window.items if i.kind == "recall"]
    assert recall[0].provenance.memory_ids == ("m-2",)
    assert recall[0].provenance.tier == "longterm"
    assert (recall[1].provenance.session_id, recall[1].provenance.turn_indexes) == ("s-0", (40,))
    assert recall[1].provenance.tier == "archive"
    turns = [i for i in window.items if i.kind == "turn"]
    assert [(t.provenance.session_id, t.provenance.turn_indexes) for t in turns] == [
        ("s-1", (0,)),
        ("s-1", (1,)),
    ]
    assert all(i.tokens > 0 for i in window.items)
    assert window.total_tokens == sum(i.tokens for i in window.items)


def test_stats_have_the_seed_004_shape(counter: TiktokenCounter) -> None:
    window = _full(counter, total_turns=87)
    stats = window.stats
    assert stats.total_turns == 87
    assert stats.total_tokens == window.total_tokens
    assert stats.budget_tokens == 4_000
    assert stats.context_window_percent == round(100 * window.total_tokens / 4_000, 2)
    assert stats.summary_active is True
    assert stats.summary_tiers == {"recent": window.items[3].tokens}
    assert stats.structured_memory == {"facts": 1, "entities": 2}
    assert stats.allocation_tokens == {"hot": 2_600, "memory": 800, "buffer": 600}
    assert sum(stats.tokens_by_tier.values()) == window.total_tokens
    assert stats.recall_hits == 2
    assert stats.structured_memory is not None


def test_no_structured_memory_means_no_counts(counter: TiktokenCounter) -> None:
    assert _full(counter, sections=[]).stats.structured_memory is None


def test_fingerprint_changes_only_with_the_cacheable_prefix(counter: TiktokenCounter) -> None:
    base = _full(counter)
    other_turns = _full(counter, turns=[turn(0, "user", "hello")], recall=[])
    assert other_turns.prefix_fingerprint == base.prefix_fingerprint
    assert other_turns.cache_points[0].fingerprint == base.cache_points[0].fingerprint
    new_summary = _full(counter, sections=[SUMMARY.model_copy(update={"text": "changed"})])
    assert new_summary.cache_points[0].fingerprint == base.cache_points[0].fingerprint
    assert new_summary.prefix_fingerprint != base.prefix_fingerprint
    new_system = _full(counter, system="You are terse.")
    assert new_system.cache_points[0].fingerprint != base.cache_points[0].fingerprint


def test_tools_take_the_static_cache_point_without_a_system_prompt(
    counter: TiktokenCounter,
) -> None:
    window = _full(counter, system=None, user_context=None, sections=[])
    assert window.tools_cache_point is True
    assert [c.name for c in window.cache_points] == ["static"]
    assert not any(isinstance(b, CachePointBlock) for b in window.system)


def test_recall_skips_hot_turns_duplicates_and_profile_memories(
    counter: TiktokenCounter,
) -> None:
    window = _full(
        counter,
        recall=[
            _turn_hit(0, "Is Berserk vol 42 in stock?"),  # in the hot window
            _memory_hit("m-1", "prefers seinen"),  # already in the profile
            _memory_hit("m-2", "collects first editions"),
            _memory_hit("m-2", "collects first editions"),
            _turn_hit(0, "an old turn of another session", session_id="s-0"),
        ],
    )
    recall = [i for i in window.items if i.kind == "recall"]
    assert [(i.provenance.memory_ids, i.provenance.session_id) for i in recall] == [
        (("m-2",), "s-0"),
        ((), "s-0"),
    ]


def test_memory_share_bounds_derived_memory(counter: TiktokenCounter) -> None:
    """Derived memory takes at most its 20% share plus the part of the 65% hot share the
    conversation does not need: with two short turns that spare part is large; with turns
    that fill the hot share, derived memory is held to its own share."""
    hits = [
        _memory_hit(f"h-{i}", f"fact number {i} " + "words " * 30, score=1 - i / 100)
        for i in range(40)
    ]
    kinds = ("profile", "summary", "structured_memory", "entities", "recall")

    def derived(w: ContextWindow) -> int:
        return sum(i.tokens for i in w.items if i.kind in kinds)

    def conversation(w: ContextWindow) -> int:
        return sum(i.tokens for i in w.items if i.kind in ("turn", "current"))

    long_turns = [
        turn(i, "user" if i % 2 == 0 else "assistant", f"turn {i} " + "chatter " * 40)
        for i in range(40)
    ]
    full = _full(counter, recall=hits, budget=2_000, turns=long_turns)
    kept_turns = sum(1 for i in full.items if i.kind == "turn")
    assert kept_turns < len(long_turns)  # the turns need more than the hot share...
    assert derived(full) <= 400  # ...so derived memory keeps to its own share
    window = _full(counter, recall=hits, budget=2_000)
    spare_hot = 1_300 - conversation(window)
    assert spare_hot > 1_000
    assert 400 < derived(window) <= 400 + spare_hot
    assert window.stats.recall_dropped > 0
    kept = [i.provenance.memory_ids[0] for i in window.items if i.kind == "recall"]
    assert kept == [f"h-{i}" for i in range(len(kept))]  # best scores first


def test_a_long_section_is_cut_with_a_marker(counter: TiktokenCounter) -> None:
    long = SUMMARY.model_copy(update={"text": "word " * 2_000})
    window = _full(counter, sections=[long], budget=2_000)
    summary = next(i for i in window.items if i.kind == "summary")
    assert summary.truncated
    assert "truncated to fit the context budget" in summary.text


def test_budget_from_a_model_uses_its_window_and_margin() -> None:
    spec = default_registry().get("claude-3-5-sonnet")
    assert resolve_budget(None, spec) == spec.usable_input_tokens
    assert resolve_budget(10_000, spec) == 8_500  # Claude's 15% margin
    assert resolve_budget(10_000, None) == 10_000
    with pytest.raises(ValidationError, match="budget"):
        resolve_budget(None, None)
    with pytest.raises(ValidationError, match="positive"):
        resolve_budget(0, None)


def test_model_name_sets_budget_and_window_percent(counter: TiktokenCounter) -> None:
    window = _full(counter, budget=None, model="claude-3-5-sonnet")
    spec = default_registry().get("claude-3-5-sonnet")
    assert window.budget_tokens == spec.usable_input_tokens
    assert window.stats.context_window_percent == round(
        100 * window.total_tokens / spec.context_window, 2
    )


def test_allocation_must_add_up() -> None:
    with pytest.raises(ValueError, match="add up to 1"):
        Allocation(hot=0.5, memory=0.2, buffer=0.2)
    assert Allocation(hot=0.7, memory=0.2, buffer=0.1).hot == 0.7


def test_static_prefix_over_budget_raises(counter: TiktokenCounter) -> None:
    with pytest.raises(BudgetExceededError, match="system prompt and tool manifest"):
        _full(counter, system="word " * 500, budget=100)


def test_an_orphan_tool_result_becomes_visible_text(counter: TiktokenCounter) -> None:
    window = assemble_context(
        turns=[
            turn(
                5,
                "user",
                (ToolResultBlock(tool_use_id="t-1", content=(TextBlock(text="3 left"),)),),
            ),
            turn(6, "assistant", "Three are left."),
        ],
        budget=500,
        counter=counter,
    )
    first = window.messages[0].content[0]
    assert isinstance(first, TextBlock)
    assert "3 left" in first.text
    assert "t-1" in first.text


def test_a_pending_tool_call_stays_open_without_a_current_message(
    counter: TiktokenCounter,
) -> None:
    call = ToolUseBlock(tool_use_id="t-9", name="stock", input={"vol": 43})
    turns = [turn(0, "user", "vol 43?"), turn(1, "assistant", (call,))]
    open_window = assemble_context(turns=turns, budget=500, counter=counter)
    assert open_window.messages[-1].content == (call,)
    closed = assemble_context(turns=turns, current="never mind", budget=500, counter=counter)
    assert isinstance(closed.messages[1].content[0], TextBlock)


def test_adjacent_user_messages_merge_with_tool_results_first(
    counter: TiktokenCounter,
) -> None:
    call = ToolUseBlock(tool_use_id="t-1", name="stock", input={})
    result = ToolResultBlock(tool_use_id="t-1", content=(TextBlock(text="ok"),))
    window = assemble_context(
        turns=[turn(0, "user", "check"), turn(1, "assistant", (call,)), turn(2, "user", (result,))],
        current="thanks",
        budget=500,
        counter=counter,
    )
    assert [m.role for m in window.messages] == ["user", "assistant", "user"]
    assert window.messages[-1].content == (result, TextBlock(text="thanks"))
    assert [i.kind for i in window.items][-2:] == ["turn", "current"]


def test_assistant_current_message_is_rejected(counter: TiktokenCounter) -> None:
    from tiermem.models import Message

    with pytest.raises(ValidationError, match="role"):
        assemble_context(current=Message.text("assistant", "hi"), budget=100, counter=counter)
