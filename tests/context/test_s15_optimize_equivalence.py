"""Session 15 made the pre-save optimization cheaper, for the view that
``Session.context()`` now optimizes on every call: ``pair_tool_calls`` returns at once when
there is no tool result, ``drop_superseded_failures`` pairs nothing when nothing failed, and
``collapse_duplicate_calls`` dumps the results of repeated inputs only, and
``optimize_turns`` pairs the calls once and carries the pairs from step to step instead of
pairing before each step. Same results: each is compared with a copy of the old functions
on many generated conversations.

It also added ``OptimizePolicy.collapse_successful_calls`` (False in ``VIEW_POLICY``); the
guarantees of the pipeline are checked under it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.context.optimize import (
    OPTIMIZATION_STEPS,
    VIEW_POLICY,
    OptimizationAction,
    OptimizedTurns,
    OptimizePolicy,
    ToolCall,
    _action,
    _apply,
    _call_key,
    _is_reference,
    _Loc,
    _outcome,
    _size,
    collapse_duplicate_calls,
    collapse_redundant_assistant_text,
    drop_superseded_failures,
    final_successful_results,
    optimize_turns,
    output_reference,
    pair_tool_calls,
)
from tiermem.context.tool_pairs import answered_ids
from tiermem.models import TextBlock, ToolResultBlock, ToolUseBlock, Turn

from .test_optimize import final_successes, ids, random_conversations
from .tool_heavy import DISTINCT_CALLS, SIDE_EFFECT_TOOLS, TOOL_HEAVY, tool_heavy_conversation

# -- the old functions (b54ac72), for reference -------------------------------------------


def old_pair_tool_calls(turns: Sequence[Turn]) -> tuple[ToolCall, ...]:
    uses: dict[str, list[_Loc]] = {}
    results: dict[str, list[_Loc]] = {}
    for position, turn in enumerate(turns):
        for block_at, block in enumerate(turn.content):
            if isinstance(block, ToolUseBlock):
                uses.setdefault(block.tool_use_id, []).append((position, block_at))
            elif isinstance(block, ToolResultBlock):
                results.setdefault(block.tool_use_id, []).append((position, block_at))
    answered = answered_ids([turn.content for turn in turns])
    calls: list[ToolCall] = []
    for tool_use_id, result_locs in results.items():
        use_locs = uses.get(tool_use_id, [])
        if tool_use_id not in answered or len(use_locs) != 1 or len(result_locs) != 1:
            continue
        use_at, result_at = use_locs[0], result_locs[0]
        use = turns[use_at[0]].content[use_at[1]]
        result = turns[result_at[0]].content[result_at[1]]
        if not isinstance(use, ToolUseBlock) or not isinstance(result, ToolResultBlock):
            continue
        calls.append(
            ToolCall(
                use=use,
                result=result,
                use_at=use_at,
                result_at=result_at,
                use_turn=turns[use_at[0]].index,
                result_turn=turns[result_at[0]].index,
                key=_call_key(use),
            )
        )
    calls.sort(key=lambda call: call.result_at)
    return tuple(calls)


def old_drop_superseded_failures(turns: Sequence[Turn], policy: OptimizePolicy) -> OptimizedTurns:
    calls = old_pair_tool_calls(turns)
    finals = final_successful_results(calls)
    drops: set[_Loc] = set()
    actions: list[OptimizationAction] = []
    for call in calls:
        final = finals.get(call.key)
        if call.succeeded or final is None or final.result_at < call.result_at:
            continue
        drops |= {call.use_at, call.result_at}
        actions.append(
            _action(
                "drop_superseded_failures",
                "superseded_failure",
                call,
                f"failed {call.name} call succeeded later, at turn {final.result_turn}",
                kept_turn=final.result_turn,
                bytes_saved=_size(call.use) + _size(call.result),
            )
        )
    return _outcome(turns, _apply(turns, drops, {}), actions)


def old_collapse_duplicate_calls(turns: Sequence[Turn], policy: OptimizePolicy) -> OptimizedTurns:
    calls = old_pair_tool_calls(turns)
    latest: dict[tuple[str, str], ToolCall] = {}
    drops: set[_Loc] = set()
    actions: list[OptimizationAction] = []
    for call in reversed(calls):
        if _is_reference(call.result) or (call.succeeded and call.name in policy.side_effect_tools):
            continue
        outcome = (call.key, call.result.model_dump_json(exclude={"tool_use_id"}))
        kept = latest.setdefault(outcome, call)
        if kept is call:
            continue
        drops |= {call.use_at, call.result_at}
        actions.append(
            _action(
                "collapse_duplicate_calls",
                "duplicate_call",
                call,
                f"{call.name} called again with the same input and the same "
                f"{call.result.status} result at turn {kept.result_turn}",
                kept_turn=kept.result_turn,
                bytes_saved=_size(call.use) + _size(call.result),
            )
        )
    actions.reverse()
    return _outcome(turns, _apply(turns, drops, {}), actions)


# -- equivalence --------------------------------------------------------------------------

OLD_POLICIES = st.builds(
    OptimizePolicy,
    side_effect_tools=st.sampled_from([frozenset(), frozenset({"add_to_cart"})]),
    min_reference_bytes=st.sampled_from([0, 512]),
    reference_final_results=st.booleans(),
    keep_empty_turns=st.booleans(),
)


def _same(turns: Sequence[Turn], new: OptimizedTurns, old: OptimizedTurns) -> None:
    assert new.turns == old.turns
    assert new.report == old.report
    # Untouched turns are the input's objects in both (callers rely on it).
    assert [a is t for a, t in zip(new.turns, turns, strict=True)] == [
        b is t for b, t in zip(old.turns, turns, strict=True)
    ]


def _check(turns: Sequence[Turn], policy: OptimizePolicy) -> None:
    assert pair_tool_calls(turns) == old_pair_tool_calls(turns)
    _same(
        turns, drop_superseded_failures(turns, policy), old_drop_superseded_failures(turns, policy)
    )
    _same(
        turns, collapse_duplicate_calls(turns, policy), old_collapse_duplicate_calls(turns, policy)
    )
    # And chained, as optimize_turns runs them (the second step sees the first's output).
    first = drop_superseded_failures(turns, policy).turns
    _same(
        first, collapse_duplicate_calls(first, policy), old_collapse_duplicate_calls(first, policy)
    )


@settings(max_examples=400, deadline=None)
@given(random_conversations(), OLD_POLICIES)
def test_the_faster_steps_equal_the_old_ones_on_random_conversations(
    turns: list[Turn], policy: OptimizePolicy
) -> None:
    _check(turns, policy)


def test_the_faster_steps_equal_the_old_ones_on_the_tool_heavy_fixture() -> None:
    policies = [OptimizePolicy(), OptimizePolicy(side_effect_tools=SIDE_EFFECT_TOOLS)]
    for profile in (TOOL_HEAVY, DISTINCT_CALLS):
        for seed in range(6):
            turns = tool_heavy_conversation(seed, profile)
            for policy in policies:
                _check(turns, policy)
                for end in range(20, len(turns), 17):  # hot-window-sized slices
                    _check(turns[end - 20 : end], policy)


def test_untouched_turns_stay_the_same_objects_when_nothing_failed() -> None:
    turns = tool_heavy_conversation(0, DISTINCT_CALLS)
    failed = any(
        isinstance(b, ToolResultBlock) and b.status != "success" for t in turns for b in t.content
    )
    assert not failed  # the fast path
    done = drop_superseded_failures(turns, OptimizePolicy())
    assert all(a is b for a, b in zip(done.turns, turns, strict=True))
    texts = [t for t in turns if not any(isinstance(b, ToolResultBlock) for b in t.content)]
    assert texts
    assert pair_tool_calls(texts) == ()


# -- collapse_successful_calls=False (the view's default) ---------------------------------

VIEW_POLICIES = st.builds(
    replace,
    st.just(VIEW_POLICY),
    side_effect_tools=st.sampled_from([frozenset(), frozenset({"add_to_cart"})]),
    min_reference_bytes=st.sampled_from([0, 512]),
    reference_final_results=st.booleans(),
)


def _successful_ids(turns: Sequence[Turn]) -> list[str]:
    return [call.use.tool_use_id for call in pair_tool_calls(turns) if call.succeeded]


@settings(max_examples=300, deadline=None)
@given(random_conversations(), VIEW_POLICIES)
def test_the_view_policy_keeps_every_successful_call_pairs_and_finals(
    turns: list[Turn], policy: Any
) -> None:
    done = optimize_turns(turns, policy)
    after_ids = ids(done.turns)
    # No successful call is dropped: every paired successful call keeps its use and result.
    for tool_use_id in _successful_ids(turns):
        assert after_ids.count(f"use:{tool_use_id}") == 1
        assert after_ids.count(f"result:{tool_use_id}") == 1
    # Pairs whole: every id left appears as often as before.
    before_ids = ids(turns)
    assert all(after_ids.count(i) == before_ids.count(i) for i in set(after_ids))
    if not policy.reference_final_results:
        kept = {(call.use.name, call.key): call.result for call in pair_tool_calls(done.turns)}
        finals = final_successes(turns)
        sent = [b for t in done.turns for b in t.content if isinstance(b, ToolResultBlock)]
        assert all(result in sent for result in finals.values()), (kept, finals)
    assert optimize_turns(done.turns, policy).turns == done.turns  # idempotent


def test_a_repeated_successful_call_is_kept_by_the_view_policy() -> None:
    turns = tool_heavy_conversation(2)
    full = optimize_turns(turns, OptimizePolicy(keep_empty_turns=False))
    view = optimize_turns(turns, VIEW_POLICY)
    duplicates = [a for a in full.report.actions if a.kind == "duplicate_call"]
    assert any(
        a.tool_use_id in {c.use.tool_use_id for c in pair_tool_calls(turns) if c.succeeded}
        for a in duplicates
    )
    assert {f"use:{i}" for i in _successful_ids(turns)} <= set(ids(view.turns))


# -- optimize_turns pairs once and carries the pairs from step to step ---------------------


def old_reference_old_outputs(turns: Sequence[Turn], policy: OptimizePolicy) -> OptimizedTurns:
    calls = old_pair_tool_calls(turns)
    finals = {call.result_at for call in final_successful_results(calls).values()}
    last_assistant = max(
        (position for position, turn in enumerate(turns) if turn.role == "assistant"), default=-1
    )
    replacements: dict[_Loc, Any] = {}
    actions: list[OptimizationAction] = []
    for call in calls:
        final = call.result_at in finals
        if call.result_at[0] >= last_assistant or (final and not policy.reference_final_results):
            continue
        old_size = _size(call.result)
        if old_size < policy.min_reference_bytes or _is_reference(call.result):
            continue
        content_size = sum(_size(block) for block in call.result.content)
        reference = call.result.model_copy(
            update={
                "content": (
                    TextBlock(text=output_reference(call.result_turn, call.name, content_size)),
                )
            }
        )
        saved = old_size - _size(reference)
        if saved <= 0:
            continue
        replacements[call.result_at] = reference
        why = "final result, seen by the model" if final else "superseded or failed output"
        actions.append(
            _action(
                "reference_old_outputs",
                "output_reference",
                call,
                f"{why}; the full output stays in the archive at turn {call.result_turn}",
                bytes_saved=saved,
            )
        )
    return _outcome(turns, _apply(turns, set(), replacements), actions)


OLD_STEPS = (
    old_drop_superseded_failures,
    old_collapse_duplicate_calls,
    collapse_redundant_assistant_text,
    old_reference_old_outputs,
)


def _one_by_one() -> list[Any]:
    """The public steps, wrapped so that optimize_turns cannot carry pairs between them:
    each pairs its own input, as every step did before."""
    return [lambda turns, policy, step=step: step(turns, policy) for step in OPTIMIZATION_STEPS]


def _same_run(new: OptimizedTurns, old: OptimizedTurns) -> None:
    assert new.turns == old.turns
    assert new.report == old.report


@settings(max_examples=400, deadline=None)
@given(random_conversations(), OLD_POLICIES)
def test_optimize_turns_equals_the_old_pipeline_on_random_conversations(
    turns: list[Turn], policy: OptimizePolicy
) -> None:
    _same_run(optimize_turns(turns, policy), optimize_turns(turns, policy, steps=OLD_STEPS))


@settings(max_examples=300, deadline=None)
@given(random_conversations(), VIEW_POLICIES)
def test_carrying_the_pairs_equals_pairing_before_every_step(
    turns: list[Turn], policy: OptimizePolicy
) -> None:
    _same_run(optimize_turns(turns, policy), optimize_turns(turns, policy, steps=_one_by_one()))


def test_optimize_turns_equals_the_old_pipeline_on_the_tool_heavy_fixture() -> None:
    policies = [
        OptimizePolicy(),
        OptimizePolicy(side_effect_tools=SIDE_EFFECT_TOOLS, keep_empty_turns=False),
        OptimizePolicy(reference_final_results=True),
    ]
    for profile in (TOOL_HEAVY, DISTINCT_CALLS):
        for seed in range(6):
            turns = tool_heavy_conversation(seed, profile)
            windows = [turns, *(turns[end - 20 : end] for end in range(20, len(turns), 23))]
            for window in windows:
                for policy in policies:
                    old = optimize_turns(window, policy, steps=OLD_STEPS)
                    _same_run(optimize_turns(window, policy), old)
                new_view = optimize_turns(window, VIEW_POLICY)
                _same_run(new_view, optimize_turns(window, VIEW_POLICY, steps=_one_by_one()))
