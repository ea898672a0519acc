"""Pre-save optimization: each step on small conversations, the pipeline's guarantees as
hypothesis properties over random tool-heavy conversations, and the size reduction on the
seeded tool-heavy fixture."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.context.optimize import (
    OPTIMIZATION_STEPS,
    OptimizePolicy,
    collapse_duplicate_calls,
    collapse_redundant_assistant_text,
    drop_superseded_failures,
    optimize_snapshot,
    optimize_turns,
    output_reference,
    pair_tool_calls,
    reference_old_outputs,
    state_size,
)
from tiermem.errors import ValidationError
from tiermem.models import (
    ContentBlock,
    JsonBlock,
    SessionSnapshot,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Turn,
    text_of,
)
from tiermem.tokens import TiktokenCounter

from .tool_heavy import DISTINCT_CALLS, SIDE_EFFECT_TOOLS, TOOL_HEAVY, tool_heavy_conversation

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
BIG = "result line with some detail\n" * 60  # ~1.7 KB: worth a reference
FIXTURE_SEEDS = range(5)


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


def turn(index: int, role: str, *content: ContentBlock) -> Turn:
    return Turn.model_validate(
        {
            "index": index,
            "role": role,
            "content": content,
            "timestamp": T0 + timedelta(seconds=index),
        }
    )


def use(tool_id: str, name: str = "search", **tool_input: Any) -> ToolUseBlock:
    return ToolUseBlock(tool_use_id=tool_id, name=name, input=tool_input)


def ok(tool_id: str, text: str = BIG) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=tool_id, content=(TextBlock(text=text),))


def failed(tool_id: str, text: str = "upstream timeout") -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=tool_id, status="error", content=(TextBlock(text=text),))


def conversation(*steps: tuple[str, tuple[ContentBlock, ...]], start: int = 0) -> list[Turn]:
    return [turn(start + i, role, *blocks) for i, (role, blocks) in enumerate(steps)]


def say(role: str, *blocks: ContentBlock | str) -> tuple[str, tuple[ContentBlock, ...]]:
    return role, tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)


def ids(turns: Sequence[Turn]) -> list[str]:
    """Every tool block as 'use:<id>' or 'result:<id>', in order."""
    out = []
    for t in turns:
        for b in t.content:
            if isinstance(b, ToolUseBlock):
                out.append(f"use:{b.tool_use_id}")
            elif isinstance(b, ToolResultBlock):
                out.append(f"result:{b.tool_use_id}")
    return out


def results(turns: Sequence[Turn]) -> dict[str, ToolResultBlock]:
    return {b.tool_use_id: b for t in turns for b in t.content if isinstance(b, ToolResultBlock)}


def json_bytes(turns: Sequence[Turn]) -> int:
    return sum(len(t.model_dump_json().encode()) for t in turns)


# --- step 1: failed attempts ------------------------------------------------------------


def test_failed_call_is_dropped_once_the_same_call_succeeded() -> None:
    turns = conversation(
        say("user", "find Berserk"),
        say("assistant", use("t1", q="Berserk")),
        say("user", failed("t1")),
        say("assistant", "Retrying.", use("t2", q="Berserk")),
        say("user", ok("t2")),
        say("assistant", "Found it."),
    )
    done = optimize_turns(turns)
    assert ids(done.turns) == ["use:t2", "result:t2"]
    [action] = [a for a in done.report.actions if a.kind == "superseded_failure"]
    assert (action.turn_indexes, action.kept_turn, action.tool_use_id) == ((1, 2), 4, "t1")
    assert action.step == "drop_superseded_failures"
    assert done.report.emptied_turns == (1, 2)


def test_failure_with_other_input_or_after_the_success_is_kept() -> None:
    # "Not found" for another id is a fact; a failure after the success is the latest news.
    turns = conversation(
        say("user", "order 123, then 124"),
        say("assistant", use("t1", "get_order", id=123)),
        say("user", failed("t1", "order 123 not found")),
        say("assistant", use("t2", "get_order", id=124), use("t3", "get_order", id=124)),
        say("user", ok("t2", "order 124: shipped"), failed("t3", "rate limited")),
        say("assistant", "124 has shipped; 123 does not exist."),
    )
    done = optimize_turns(turns)
    assert ids(done.turns) == ids(turns)
    assert done.report.actions == ()


# --- step 2: duplicates -----------------------------------------------------------------


def test_duplicate_call_with_the_same_outcome_keeps_the_latest() -> None:
    turns = conversation(
        say("user", "policy?"),
        say("assistant", use("t1", "read_policy", section="shipping")),
        say("user", ok("t1")),
        say("assistant", "Free over ¥3000."),
        say("user", "and again?"),
        say("assistant", use("t2", "read_policy", section="shipping")),
        say("user", ok("t2")),
        say("assistant", "Still free over ¥3000."),
    )
    done = optimize_turns(turns)
    assert ids(done.turns) == ["use:t2", "result:t2"]
    [action] = done.report.actions
    assert (action.kind, action.turn_indexes, action.kept_turn) == ("duplicate_call", (1, 2), 6)
    assert "same input" in action.reason


def test_input_key_order_does_not_make_a_call_different() -> None:
    turns = conversation(
        say("assistant", ToolUseBlock(tool_use_id="t1", name="s", input={"a": 1, "b": 2})),
        say("user", ok("t1")),
        say("assistant", ToolUseBlock(tool_use_id="t2", name="s", input={"b": 2, "a": 1})),
        say("user", ok("t2")),
        say("assistant", "done"),
    )
    assert ids(optimize_turns(turns).turns) == ["use:t2", "result:t2"]


def test_repeat_with_a_new_result_is_a_newer_reading_and_the_old_one_becomes_a_reference() -> None:
    turns = conversation(
        say("user", "where is my order?"),
        say("assistant", use("t1", "order_status", id=7)),
        say("user", ok("t1", "processing " + BIG)),
        say("assistant", use("t2", "order_status", id=7)),
        say("user", ok("t2", "shipped " + BIG)),
        say("assistant", "It has shipped."),
    )
    done = optimize_turns(turns)
    out = results(done.turns)
    assert out["t2"] == turns[4].content[0]  # the final result, verbatim
    size = sum(len(b.model_dump_json().encode()) for b in results(turns)["t1"].content)
    assert out["t1"].content == (TextBlock(text=output_reference(2, "order_status", size)),)
    assert out["t1"].status == "success"
    assert [a.kind for a in done.report.actions] == ["output_reference"]


def test_side_effect_calls_are_actions_and_never_collapsed() -> None:
    turns = conversation(
        say("user", "two copies please"),
        say("assistant", use("t1", "add_to_cart", item="M1", qty=1)),
        say("user", ok("t1", "added")),
        say("assistant", use("t2", "add_to_cart", item="M1", qty=1)),
        say("user", ok("t2", "added")),
        say("assistant", "Added two."),
    )
    policy = OptimizePolicy(side_effect_tools=frozenset({"add_to_cart"}))
    assert ids(optimize_turns(turns, policy).turns) == ids(turns)
    assert ids(optimize_turns(turns).turns) == ["use:t2", "result:t2"]


def test_dropping_one_of_parallel_calls_keeps_the_other_and_the_turn() -> None:
    turns = conversation(
        say("assistant", "Checking both.", use("t1", q="a"), use("t2", q="b")),
        say("user", ok("t1", "A"), ok("t2", "B")),
        say("assistant", use("t3", q="a")),
        say("user", ok("t3", "A")),
        say("assistant", "Both found."),
    )
    done = optimize_turns(turns)
    assert ids(done.turns) == ["use:t2", "result:t2", "use:t3", "result:t3"]
    assert done.turns[0].content[0] == TextBlock(text="Checking both.")
    assert done.report.changed_turns == (0, 1)


# --- step 3: assistant text -------------------------------------------------------------


def test_text_repeated_within_one_loop_is_kept_once_at_its_latest() -> None:
    turns = conversation(
        say("user", "stock of vol 1 and 2?"),
        say("assistant", "Let me check that.", use("t1", v=1)),
        say("user", ok("t1", "3 left")),
        say("assistant", "Let me  check that.\n", use("t2", v=2)),
        say("user", ok("t2", "none")),
        say("assistant", "   "),
        say("assistant", "Vol 1: 3 left; vol 2: sold out."),
    )
    done = optimize_turns(turns)
    kinds = [(a.kind, a.turn_indexes, a.kept_turn) for a in done.report.actions]
    assert kinds == [("redundant_text", (1,), 3), ("redundant_text", (5,), None)]
    assert done.turns[1].content == (use("t1", v=1),)
    assert done.turns[3].content[0] == TextBlock(text="Let me  check that.\n")
    assert done.report.emptied_turns == (5,)


def test_the_same_words_answering_different_user_messages_are_kept() -> None:
    turns = conversation(
        say("user", "Is it in stock?"),
        say("assistant", "Yes."),
        say("user", "Does it ship to Japan?"),
        say("assistant", "Yes."),
    )
    done = optimize_turns(turns)
    assert done.turns == tuple(turns)
    assert done.report.actions == ()


# --- step 4: references -----------------------------------------------------------------


def test_reference_text_names_turn_tool_size_and_how_to_get_it() -> None:
    assert output_reference(12, "search", 48 * 1024) == (
        "[tool output of turn 12 (search, 48 KB): retrievable with session.get_turn(12)]"
    )
    assert "(search, 700 B)" in output_reference(3, "search", 700)
    assert "(search, 2.5 MB)" in output_reference(3, "search", 5 * 512 * 1024)


def test_an_output_the_model_has_not_seen_yet_is_never_referenced() -> None:
    turns = conversation(
        say("assistant", use("t1", "order_status", id=7)),
        say("user", ok("t1", "processing " + BIG)),
        say("assistant", use("t2", "order_status", id=7)),
        say("user", ok("t2", "shipped " + BIG)),
    )
    # t1 was seen (turn 2 follows it) so it goes; t2 waits for the model's reply.
    policy = OptimizePolicy(reference_final_results=True)
    out = results(optimize_turns(turns, policy).turns)
    assert out["t2"] == turns[3].content[0]
    assert text_of(out["t1"].content).startswith("[tool output of turn 1 (order_status")


def test_small_outputs_stay_verbatim() -> None:
    turns = conversation(
        say("assistant", use("t1", "status")),
        say("user", ok("t1", "processing")),
        say("assistant", use("t2", "status")),
        say("user", ok("t2", "shipped")),
        say("assistant", "Shipped."),
    )
    assert optimize_turns(turns).turns == tuple(turns)
    # Even with no threshold, a reference longer than the output is not used.
    policy = OptimizePolicy(min_reference_bytes=0)
    assert optimize_turns(turns, policy).turns == tuple(turns)


def test_view_mode_references_final_results_after_first_use() -> None:
    turns = conversation(
        say("user", "find Berserk"),
        say("assistant", use("t1", q="Berserk")),
        say("user", ok("t1")),
        say("assistant", "Found 16 volumes."),
    )
    assert optimize_turns(turns).turns == tuple(turns)
    viewed = optimize_turns(turns, OptimizePolicy(reference_final_results=True))
    [action] = viewed.report.actions
    assert (action.kind, action.turn_indexes) == ("output_reference", (1, 2))
    assert "final result" in action.reason
    reference = text_of(results(viewed.turns)["t1"].content)
    assert reference.startswith("[tool output of turn 2 (search, 2 KB)")


# --- what is never touched --------------------------------------------------------------


def test_unpaired_blocks_are_left_alone() -> None:
    turns = conversation(
        say("user", failed("t0")),  # its call is before the window
        say("assistant", use("t1", q="a")),
        say("user", ok("t1")),
        say("assistant", use("dup", q="a"), use("dup", q="a")),  # one id, two calls
        say("user", ok("dup")),
        say("assistant", use("t9", q="a")),  # still waiting for its result
        start=40,
    )
    calls = pair_tool_calls(turns)
    assert [c.use.tool_use_id for c in calls] == ["t1"]
    assert ids(optimize_turns(turns).turns) == ids(turns)


def test_a_result_before_its_call_is_not_a_pair() -> None:
    turns = conversation(say("user", ok("t1")), say("assistant", use("t1")))
    assert pair_tool_calls(turns) == ()


def test_input_is_never_modified_and_untouched_turns_are_the_same_objects() -> None:
    turns = tool_heavy_conversation(3)
    dumped = [t.model_dump_json() for t in turns]
    done = optimize_turns(turns)
    assert [t.model_dump_json() for t in turns] == dumped
    changed = set(done.report.changed_turns)
    for before, after in zip(turns, done.turns, strict=True):
        assert (after is before) == (before.index not in changed)


def test_slots_are_kept_by_default_and_dropped_for_the_view() -> None:
    turns = conversation(
        say("user", "policy?"),
        say("assistant", use("t1", "read_policy")),
        say("user", ok("t1")),
        say("assistant", use("t2", "read_policy")),
        say("user", ok("t2")),
        say("assistant", "Here it is."),
        start=100,
    )
    kept = optimize_turns(turns)
    assert [t.index for t in kept.turns] == list(range(100, 106))
    assert [t.content for t in kept.turns[1:3]] == [(), ()]
    assert (kept.report.emptied_turns, kept.report.dropped_turns) == ((101, 102), ())
    view = optimize_turns(turns, OptimizePolicy(keep_empty_turns=False))
    assert [t.index for t in view.turns] == [100, 103, 104, 105]
    assert view.report.dropped_turns == (101, 102)


def test_counter_recounts_only_changed_turns(counter: TiktokenCounter) -> None:
    turns = [
        t.model_copy(update={"token_count": counter.count_blocks(t.content)})
        for t in tool_heavy_conversation(1)
    ]
    done = optimize_turns(turns, counter=counter)
    for after in done.turns:
        assert after.token_count == counter.count_blocks(after.content)
    plain = optimize_turns(turns)
    assert [t.token_count for t in plain.turns] == [t.token_count for t in turns]


def test_snapshot_keeps_its_version_and_next_index() -> None:
    turns = tool_heavy_conversation(2)
    snapshot = SessionSnapshot(
        session_id="s-1",
        turns=tuple(turns),
        version=9,
        next_index=len(turns),
        expires_at=T0 + timedelta(days=1),
    )
    optimized, report = optimize_snapshot(snapshot)
    assert (optimized.version, optimized.next_index) == (9, len(turns))
    assert optimized.turns == optimize_turns(turns).turns
    assert report.bytes_saved > 0


def test_policy_rejects_a_negative_threshold() -> None:
    with pytest.raises(ValidationError, match="min_reference_bytes"):
        OptimizePolicy(min_reference_bytes=-1)


def test_steps_run_alone_and_report_their_own_name() -> None:
    turns = tool_heavy_conversation(4)
    for step in OPTIMIZATION_STEPS:
        done = step(turns, OptimizePolicy())
        assert {a.step for a in done.report.actions} <= {step.__name__}
        assert len(done.turns) == len(turns)
    expected = (
        drop_superseded_failures,
        collapse_duplicate_calls,
        collapse_redundant_assistant_text,
        reference_old_outputs,
    )
    assert expected == OPTIMIZATION_STEPS


def test_report_counts_and_bytes_match_the_measured_saving() -> None:
    turns = tool_heavy_conversation(0)
    done = optimize_turns(turns, OptimizePolicy(side_effect_tools=SIDE_EFFECT_TOOLS))
    counts = done.report.counts()
    assert set(counts) <= {"superseded_failure", "duplicate_call", "redundant_text",
                           "output_reference"}  # fmt: skip
    assert sum(counts.values()) == len(done.report.actions)
    measured = json_bytes(turns) - json_bytes(done.turns)
    # Block sizes leave out the commas between blocks: within 1%.
    assert abs(done.report.bytes_saved - measured) <= measured / 100


# --- properties over random tool-heavy conversations ------------------------------------

NAMES = ("search", "get_item", "add_to_cart")
INPUTS = ({"q": "a"}, {"q": "b"}, {})
OUTPUTS = ("ok", "other", BIG, BIG + "v2", "")


@st.composite
def random_conversations(draw: st.DrawFn) -> list[Turn]:
    """Random conversations made of user messages, assistant texts and tool steps (1-3
    parallel calls, success or error, small pools of inputs and outputs so that repeats and
    retries are common), with unpaired blocks at the edges and an id used twice now and then."""
    steps: list[tuple[str, tuple[ContentBlock, ...]]] = []
    if draw(st.booleans()):
        steps.append(("user", (failed("orphan"),)))
    next_id = 0
    for kind in draw(st.lists(st.sampled_from(["user", "text", "tool", "tool", "tool"]),
                              max_size=25)):  # fmt: skip
        if kind == "user":
            steps.append(("user", (TextBlock(text=draw(st.sampled_from(["hi", "more?"]))),)))
        elif kind == "text":
            text = draw(st.sampled_from(["Let me check.", "Done.", "Let me  check.", " "]))
            steps.append(("assistant", (TextBlock(text=text),)))
        else:
            uses: list[ContentBlock] = []
            outs: list[ContentBlock] = []
            for _ in range(draw(st.integers(1, 3))):
                next_id += 1
                tool_id = "same" if draw(st.integers(0, 30)) == 0 else f"t{next_id}"
                name = draw(st.sampled_from(NAMES))
                uses.append(ToolUseBlock(tool_use_id=tool_id, name=name,
                                         input=draw(st.sampled_from(INPUTS))))  # fmt: skip
                body = draw(st.sampled_from(OUTPUTS))
                content: tuple[Any, ...] = (
                    (JsonBlock(json={"body": body}),) if draw(st.booleans()) else
                    (TextBlock(text=body),)
                )  # fmt: skip
                status = draw(st.sampled_from(["success", "success", "error"]))
                outs.append(ToolResultBlock(tool_use_id=tool_id, content=content, status=status))
            filler = (TextBlock(text="Let me check."),) if draw(st.booleans()) else ()
            steps.append(("assistant", (*filler, *uses)))
            steps.append(("user", tuple(outs)))
    if draw(st.booleans()):
        steps.append(("assistant", (use("pending", "search", q="a"),)))
    start = draw(st.integers(0, 500))
    return conversation(*steps, start=start)


POLICIES = st.builds(
    OptimizePolicy,
    side_effect_tools=st.sampled_from([frozenset(), frozenset({"add_to_cart"})]),
    min_reference_bytes=st.sampled_from([0, 512]),
    reference_final_results=st.booleans(),
    keep_empty_turns=st.booleans(),
)


def final_successes(turns: Sequence[Turn]) -> dict[tuple[str, str], ToolResultBlock]:
    """Independently of the module: the latest successful result per (tool, input), among
    calls whose id appears once as a call and once, later, as a result."""
    uses: dict[str, list[tuple[int, ToolUseBlock]]] = {}
    outs: dict[str, list[tuple[int, ToolResultBlock]]] = {}
    for position, t in enumerate(turns):
        for b in t.content:
            if isinstance(b, ToolUseBlock):
                uses.setdefault(b.tool_use_id, []).append((position, b))
            elif isinstance(b, ToolResultBlock):
                outs.setdefault(b.tool_use_id, []).append((position, b))
    finals: dict[tuple[str, str], tuple[int, ToolResultBlock]] = {}
    for tool_id, found in outs.items():
        calls = uses.get(tool_id, [])
        if len(found) != 1 or len(calls) != 1 or found[0][0] <= calls[0][0]:
            continue
        (position, result), call = found[0], calls[0][1]
        key = (call.name, json.dumps(call.input, sort_keys=True))
        if result.status == "success" and (key not in finals or finals[key][0] <= position):
            finals[key] = (position, result)
    return {key: result for key, (_, result) in finals.items()}


@settings(max_examples=300, deadline=None)
@given(random_conversations(), POLICIES)
def test_a_tool_call_and_its_result_are_never_parted(turns: list[Turn], policy: Any) -> None:
    before, after = ids(turns), ids(optimize_turns(turns, policy).turns)
    paired = {c.use.tool_use_id for c in pair_tool_calls(turns)}
    for tool_id in paired:
        assert (f"use:{tool_id}" in after) == (f"result:{tool_id}" in after)
    unpaired = [b for b in before if b.split(":", 1)[1] not in paired]
    assert [b for b in after if b.split(":", 1)[1] not in paired] == unpaired


@settings(max_examples=300, deadline=None)
@given(random_conversations(), POLICIES)
def test_every_final_successful_result_stays_verbatim(turns: list[Turn], policy: Any) -> None:
    if policy.reference_final_results:
        policy = OptimizePolicy(side_effect_tools=policy.side_effect_tools)
    after = [b for t in optimize_turns(turns, policy).turns for b in t.content]
    for result in final_successes(turns).values():
        assert result in after


@settings(max_examples=300, deadline=None)
@given(random_conversations(), POLICIES)
def test_output_is_never_larger_and_keeps_indexes(turns: list[Turn], policy: Any) -> None:
    done = optimize_turns(turns, policy)
    assert json_bytes(done.turns) <= json_bytes(turns)
    indexes = [t.index for t in done.turns]
    if policy.keep_empty_turns:
        assert indexes == [t.index for t in turns]
    else:
        assert set(indexes) <= {t.index for t in turns}
        assert indexes == sorted(indexes)
        assert all(t.content for t in done.turns)


def test_references_that_read_alike_are_not_duplicates_on_a_second_pass() -> None:
    # Two parallel reads of one thing with different answers of about the same size get
    # the same reference text; a second pass must not take them for duplicates.
    turns = conversation(
        say("assistant", use("t1", "stock", v=1), use("t2", "stock", v=1)),
        say("user", ok("t1", BIG + "a"), ok("t2", BIG + "b")),
        say("assistant", "Done."),
    )
    policy = OptimizePolicy(reference_final_results=True)
    once = optimize_turns(turns, policy)
    assert [a.kind for a in once.report.actions] == ["output_reference"] * 2
    assert optimize_turns(once.turns, policy).turns == once.turns


@settings(max_examples=300, deadline=None)
@given(random_conversations(), POLICIES)
def test_optimizing_twice_is_optimizing_once(turns: list[Turn], policy: Any) -> None:
    once = optimize_turns(turns, policy)
    twice = optimize_turns(once.turns, policy)
    assert twice.turns == once.turns
    assert twice.report.actions == ()


# --- the tool-heavy fixture and the size target -----------------------------------------


def test_fixture_is_deterministic_and_tool_heavy() -> None:
    first = tool_heavy_conversation(7)
    assert first == tool_heavy_conversation(7)
    assert first != tool_heavy_conversation(8)
    assert [t.index for t in first] == list(range(len(first)))
    tool_bytes = sum(
        len(b.model_dump_json()) for t in first for b in t.content
        if isinstance(b, ToolResultBlock)
    )  # fmt: skip
    assert len(pair_tool_calls(first)) >= 30
    assert tool_bytes >= 0.6 * json_bytes(first)


@pytest.mark.parametrize("seed", FIXTURE_SEEDS)
def test_default_policy_removes_every_superseded_output(seed: int) -> None:
    """After optimization, every tool output left verbatim is a final successful result,
    an output the model has not seen yet, or too small to be worth a reference."""
    turns = tool_heavy_conversation(seed)
    policy = OptimizePolicy(side_effect_tools=SIDE_EFFECT_TOOLS)
    done = optimize_turns(turns, policy)
    finals = list(final_successes(turns).values())
    for call in pair_tool_calls(done.turns):
        result = call.result
        is_reference = result.content[0] == TextBlock(
            text=output_reference(call.result_turn, call.name, _content_bytes(turns, call))
        )
        small = len(result.model_dump_json().encode()) < policy.min_reference_bytes
        assert result in finals or is_reference or small or call.name in SIDE_EFFECT_TOOLS


def _content_bytes(turns: Sequence[Turn], call: Any) -> int:
    original = results(turns)[call.use.tool_use_id]
    return sum(len(b.model_dump_json().encode()) for b in original.content)


def test_snapshot_policy_cuts_the_superseded_share_of_the_state(counter: TiktokenCounter) -> None:
    """Keeping every final successful result verbatim, the cut is the share of the state
    that is superseded: 43% of this fixture's bytes and 60% of its tokens (bench/results/
    optimize.json), short of seed 002's 70%, which only the view mode below reaches."""
    policy = OptimizePolicy(side_effect_tools=SIDE_EFFECT_TOOLS)
    before = after = 0
    for seed in FIXTURE_SEEDS:
        turns = tool_heavy_conversation(seed)
        size, kept = state_size(turns, counter), optimize_turns(turns, policy).turns
        assert state_size(kept, counter).bytes <= 0.8 * size.bytes
        before += size.bytes
        after += state_size(kept, counter).bytes
    assert after <= 0.65 * before


def test_view_mode_cuts_70_percent_and_every_reference_leads_to_the_output(
    counter: TiktokenCounter,
) -> None:
    """Seed 002's target, with final results turned into references once the model has
    seen them (seed 004): every reference names the archived turn holding the full output."""
    view = OptimizePolicy(
        side_effect_tools=SIDE_EFFECT_TOOLS, keep_empty_turns=False, reference_final_results=True
    )
    for seed in FIXTURE_SEEDS:
        turns = tool_heavy_conversation(seed)
        size, viewed = state_size(turns, counter), optimize_turns(turns, view).turns
        assert state_size(viewed, counter).bytes <= 0.3 * size.bytes
        assert state_size(viewed, counter).tokens <= 0.15 * size.tokens
        archive = {t.index: t for t in turns}
        originals = results(turns)
        for tool_id, result in results(viewed).items():
            text = text_of(result.content)
            if text.startswith("[tool output of turn "):
                index = int(text.split()[4])
                assert originals[tool_id] in archive[index].content


def test_distinct_calls_leave_little_to_remove(counter: TiktokenCounter) -> None:
    """The control: without repeats or failures, the default policy keeps nearly all."""
    for seed in FIXTURE_SEEDS:
        turns = tool_heavy_conversation(seed, DISTINCT_CALLS)
        kept = optimize_turns(turns, OptimizePolicy(side_effect_tools=SIDE_EFFECT_TOOLS))
        assert state_size(kept.turns, counter).bytes >= 0.85 * state_size(turns, counter).bytes
    assert TOOL_HEAVY != DISTINCT_CALLS
