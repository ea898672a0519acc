"""Pre-save optimization: a pure pipeline that shrinks a conversation before it is saved as
a snapshot or shown to a model (seed 002), without losing a final result.

This module owns the optimization steps and their composition. Each step is a pure function
from turns to an :class:`OptimizedTurns` (new turns, plus a report of what it removed or
replaced, why, and from which turns); :func:`optimize_turns` runs them in this order:

1. :func:`drop_superseded_failures`: a failed tool call is dropped once the same call (same
   tool, identical input) succeeded later.
2. :func:`collapse_duplicate_calls`: a call repeated with identical input *and* an identical
   outcome is kept once, at its latest occurrence. A repeat whose result differs is a newer
   reading, not a duplicate: the older one is left to step 4. Successful calls of the tools
   in :attr:`OptimizePolicy.side_effect_tools` are actions (``add_to_cart`` twice is two
   items), so they are never collapsed.
3. :func:`collapse_redundant_assistant_text`: an assistant text said again within one agent
   loop (between two user messages) is kept once, at its latest occurrence; empty texts go.
   The same words across loops answer different questions ("Yes.") and are kept.
4. :func:`reference_old_outputs`: a tool output the model has already seen (an assistant
   turn follows it) and that is not the final successful result of its call is replaced by
   a reference to its archived turn::

       [tool output of turn 12 (search, 48 KB): retrievable with session.get_turn(12)]

Guarantees, property-tested over random tool-heavy conversations:

* a tool call and its result are dropped, kept or referenced together: a reference keeps
  the ``tool_use_id`` and status, so the pair stays whole (:func:`pair_tool_calls`);
* every final successful result (the latest successful result of each call) stays verbatim,
  unless the caller opts into :attr:`OptimizePolicy.reference_final_results`;
* every turn keeps its slot and its ``index``: the output has the input's length and order,
  and a turn whose every block went keeps its slot with no content, so the output can be
  stored where indexes must be consecutive (renderers skip empty turns; two turns of the same
  role may then meet, which renderers merge);
* the output is never larger than the input, optimizing twice equals optimizing once, and
  the input is never modified.

Optimization applies to snapshots and to the view, never to the archive: the archive keeps
every full output, which is what makes a reference retrievable by turn index.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from tiermem.context.models import ViewOptimization
from tiermem.context.tool_pairs import answered_ids
from tiermem.context.truncate import message_tokens
from tiermem.errors import ValidationError
from tiermem.models.base import FrozenModel
from tiermem.models.content import ContentBlock, TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.models.session import SessionSnapshot
from tiermem.models.turns import Turn
from tiermem.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter

__all__ = [
    "OPTIMIZATION_STEPS",
    "VIEW_POLICY",
    "ActionKind",
    "OptimizationAction",
    "OptimizationReport",
    "OptimizationStep",
    "OptimizePolicy",
    "OptimizedTurns",
    "StateSize",
    "ToolCall",
    "collapse_duplicate_calls",
    "collapse_redundant_assistant_text",
    "drop_superseded_failures",
    "final_successful_results",
    "optimize_snapshot",
    "optimize_turns",
    "optimize_view",
    "output_reference",
    "pair_tool_calls",
    "reference_old_outputs",
    "state_size",
]

ActionKind = Literal["superseded_failure", "duplicate_call", "redundant_text", "output_reference"]
"""What a step did: dropped a failed call that later succeeded, dropped a repeated call with
the same outcome, dropped a repeated assistant text, replaced an output by a reference."""

# A block's place: (position in the turn sequence, position in the turn's content).
_Loc = tuple[int, int]

_REFERENCE = re.compile(
    r"\[tool output of turn \d+ \(.*\): retrievable with session\.get_turn\(\d+\)\]", re.DOTALL
)


@dataclass(frozen=True, slots=True)
class OptimizePolicy:
    """What the optimization may do.

    ``side_effect_tools``: tools whose every successful call is an action, never collapsed
    as a duplicate. ``min_reference_bytes``: outputs smaller than this (JSON bytes of the
    result block) stay verbatim, since a reference would save little. ``reference_final_results``:
    also replace final successful results once the model has seen them (seed 004's view
    mode); off by default, because a snapshot must keep every final result.
    ``collapse_successful_calls``: collapse repeated successful calls (those of
    ``side_effect_tools`` aside); False keeps every successful call, for a caller that
    cannot tell which tools act (:data:`VIEW_POLICY`): their older outputs still give way
    to references, so the calls stay visible and the bulk still goes.
    ``keep_empty_turns``: a turn whose every block went keeps its slot, with no content, so
    indexes stay consecutive (the hot tier's ``restore`` needs that); set it to False for a
    view, which then leaves such turns (and any turn that had no content) out.

    Raises:
        ValidationError: ``min_reference_bytes`` is negative.
    """

    side_effect_tools: frozenset[str] = frozenset()
    min_reference_bytes: int = 512
    reference_final_results: bool = False
    collapse_successful_calls: bool = True
    keep_empty_turns: bool = True

    def __post_init__(self) -> None:
        if self.min_reference_bytes < 0:
            raise ValidationError(
                f"min_reference_bytes must be >= 0, got {self.min_reference_bytes}"
            )


@dataclass(frozen=True, slots=True)
class OptimizationAction:
    """One thing a step removed or replaced, and why.

    ``turn_indexes`` are the turns it touched (a call's turn and its result's turn);
    ``kept_turn`` is the turn holding what supersedes it, when something does;
    ``bytes_saved`` counts the JSON bytes of the blocks removed, less any replacement.
    """

    step: str
    kind: ActionKind
    turn_indexes: tuple[int, ...]
    reason: str
    tool_name: str | None = None
    tool_use_id: str | None = None
    kept_turn: int | None = None
    bytes_saved: int = 0


@dataclass(frozen=True, slots=True)
class OptimizationReport:
    """What an optimization did: its actions in order, the turns whose content changed, those
    it left with no content, and those left out of the output for having no content
    (:attr:`OptimizePolicy.keep_empty_turns` False)."""

    actions: tuple[OptimizationAction, ...] = ()
    changed_turns: tuple[int, ...] = ()
    emptied_turns: tuple[int, ...] = ()
    dropped_turns: tuple[int, ...] = ()

    @property
    def bytes_saved(self) -> int:
        """JSON bytes of content removed, less the references that replaced some of it."""
        return sum(action.bytes_saved for action in self.actions)

    def counts(self) -> dict[str, int]:
        """Number of actions of each kind, e.g. ``{"duplicate_call": 3}``."""
        return dict(Counter(action.kind for action in self.actions))


@dataclass(frozen=True, slots=True)
class OptimizedTurns:
    """Optimized turns and the report of how they were obtained."""

    turns: tuple[Turn, ...]
    report: OptimizationReport = field(default_factory=OptimizationReport)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call and its result, with where each block sits.

    ``use_at`` and ``result_at`` are (sequence position, block position); ``use_turn`` and
    ``result_turn`` are the turns' indexes. ``key`` identifies the call: tool name and
    canonical input, so two calls with identical parameters share it.
    """

    use: ToolUseBlock
    result: ToolResultBlock
    use_at: _Loc
    result_at: _Loc
    use_turn: int
    result_turn: int
    key: str

    @property
    def name(self) -> str:
        return self.use.name

    @property
    def succeeded(self) -> bool:
        return self.result.status == "success"


@dataclass(frozen=True, slots=True)
class StateSize:
    """The size of some turns: JSON bytes as stored, and tokens as sent to a model."""

    bytes: int
    tokens: int


OptimizationStep = Callable[[Sequence[Turn], OptimizePolicy], OptimizedTurns]
"""A step: turns and a policy in, optimized turns and a report out. Pure."""


def pair_tool_calls(turns: Sequence[Turn]) -> tuple[ToolCall, ...]:
    """The tool calls of ``turns`` that have their result, ordered by the result's place.

    A call is paired when its result sits in a later turn (the rule of
    :func:`tiermem.context.tool_pairs.answered_ids`) and no other call or result carries
    its id. Anything else (a call still waiting for its result, a result whose call is
    outside the window, an id used twice) is not paired, and no step touches it.
    """
    uses: dict[str, list[_Loc]] = {}
    results: dict[str, list[_Loc]] = {}
    for position, turn in enumerate(turns):
        for block_at, block in enumerate(turn.content):
            if isinstance(block, ToolUseBlock):
                uses.setdefault(block.tool_use_id, []).append((position, block_at))
            elif isinstance(block, ToolResultBlock):
                results.setdefault(block.tool_use_id, []).append((position, block_at))
    if not results:
        return ()
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
            continue  # unreachable: the locations were taken from these types; narrows them
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


def final_successful_results(calls: Sequence[ToolCall]) -> dict[str, ToolCall]:
    """The final successful result of each call key: its latest successful call."""
    finals: dict[str, ToolCall] = {}
    for call in calls:
        if call.succeeded and (
            call.key not in finals or call.result_at > finals[call.key].result_at
        ):
            finals[call.key] = call
    return finals


def output_reference(turn_index: int, tool_name: str, size_bytes: int) -> str:
    """The text that stands in for a tool output kept only in the archive."""
    return (
        f"[tool output of turn {turn_index} ({tool_name}, {_human_size(size_bytes)}): "
        f"retrievable with session.get_turn({turn_index})]"
    )


def drop_superseded_failures(turns: Sequence[Turn], policy: OptimizePolicy) -> OptimizedTurns:
    """Drop each failed call (and its result) when the same call succeeded later."""
    if not any(
        isinstance(block, ToolResultBlock) and block.status != "success"
        for turn in turns
        for block in turn.content
    ):
        return OptimizedTurns(turns=tuple(turns))  # nothing failed: no pairing to do
    return _drop_superseded_failures(turns, policy, pair_tool_calls(turns))


def _drop_superseded_failures(
    turns: Sequence[Turn], policy: OptimizePolicy, calls: Sequence[ToolCall]
) -> OptimizedTurns:
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


def collapse_duplicate_calls(turns: Sequence[Turn], policy: OptimizePolicy) -> OptimizedTurns:
    """Keep one of each set of calls with identical input and identical outcome: the latest.

    Successful calls of ``policy.side_effect_tools`` (of every tool, without
    ``policy.collapse_successful_calls``) are never collapsed; outputs already replaced by a
    reference are not compared.
    """
    return _collapse_duplicate_calls(turns, policy, pair_tool_calls(turns))


def _collapse_duplicate_calls(
    turns: Sequence[Turn], policy: OptimizePolicy, calls: Sequence[ToolCall]
) -> OptimizedTurns:
    candidates = [
        call
        for call in calls
        if not (
            call.succeeded
            and (not policy.collapse_successful_calls or call.name in policy.side_effect_tools)
        )
        and not _is_reference(call.result)
    ]
    # Only calls whose input repeats can be duplicates: the others' outcomes (a JSON dump of
    # each result, the costly part) are not needed.
    repeated = Counter(call.key for call in candidates)
    latest: dict[tuple[str, str], ToolCall] = {}
    drops: set[_Loc] = set()
    actions: list[OptimizationAction] = []
    for call in reversed(candidates):
        if repeated[call.key] < 2:
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


def collapse_redundant_assistant_text(
    turns: Sequence[Turn], policy: OptimizePolicy
) -> OptimizedTurns:
    """Drop assistant texts said again later in the same agent loop, and empty ones.

    An agent loop runs from a user message (a user turn with anything besides tool
    results) to the next. Texts compare with runs of whitespace folded.
    """
    drops: set[_Loc] = set()
    actions: list[OptimizationAction] = []
    said_later: dict[str, int] = {}  # folded text -> turn index of its latest occurrence
    for position in range(len(turns) - 1, -1, -1):
        turn = turns[position]
        if turn.role == "user":
            if any(not isinstance(block, ToolResultBlock) for block in turn.content):
                said_later = {}  # the loops before this message answered something else
            continue
        for block_at in range(len(turn.content) - 1, -1, -1):
            block = turn.content[block_at]
            if not isinstance(block, TextBlock):
                continue
            folded = " ".join(block.text.split())
            if folded and folded not in said_later:
                said_later[folded] = turn.index
                continue
            kept_turn = said_later.get(folded)
            drops.add((position, block_at))
            actions.append(
                OptimizationAction(
                    step="collapse_redundant_assistant_text",
                    kind="redundant_text",
                    turn_indexes=(turn.index,),
                    reason=(
                        f"assistant said the same again at turn {kept_turn}"
                        if folded
                        else "empty assistant text"
                    ),
                    kept_turn=kept_turn,
                    bytes_saved=_size(block),
                )
            )
    actions.reverse()
    return _outcome(turns, _apply(turns, drops, {}), actions)


def reference_old_outputs(turns: Sequence[Turn], policy: OptimizePolicy) -> OptimizedTurns:
    """Replace each output the model has seen, and that no longer is the final successful
    result of its call, by a reference to its archived turn.

    Seen means an assistant turn follows it. An output stays when it is smaller than
    ``policy.min_reference_bytes`` or than its reference, or already is a reference.
    """
    return _reference_old_outputs(turns, policy, pair_tool_calls(turns))


def _reference_old_outputs(
    turns: Sequence[Turn], policy: OptimizePolicy, calls: Sequence[ToolCall]
) -> OptimizedTurns:
    finals = {call.result_at for call in final_successful_results(calls).values()}
    last_assistant = max(
        (position for position, turn in enumerate(turns) if turn.role == "assistant"), default=-1
    )
    replacements: dict[_Loc, ContentBlock] = {}
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


OPTIMIZATION_STEPS: tuple[OptimizationStep, ...] = (
    drop_superseded_failures,
    collapse_duplicate_calls,
    collapse_redundant_assistant_text,
    reference_old_outputs,
)
"""The steps :func:`optimize_turns` runs, in order. Failures go before duplicates so that a
failed attempt is reported as superseded rather than as a duplicate."""

_PairedStep = Callable[[Sequence[Turn], OptimizePolicy, Sequence[ToolCall]], OptimizedTurns]
# The built-in steps given the pairs of their input, and whether their output's pairs are
# the input's still there (True: they only drop whole pairs or text, so no pair is created,
# changed or parted; False: they replace result blocks). optimize_turns pairs once and
# carries the pairs along (:func:`_relocated`) instead of pairing before every step.
_PAIRED_STEPS: dict[OptimizationStep, tuple[_PairedStep | None, bool]] = {
    drop_superseded_failures: (_drop_superseded_failures, True),
    collapse_duplicate_calls: (_collapse_duplicate_calls, True),
    collapse_redundant_assistant_text: (None, True),
    reference_old_outputs: (_reference_old_outputs, False),
}


def optimize_turns(
    turns: Sequence[Turn],
    policy: OptimizePolicy | None = None,
    *,
    counter: TokenCounter | None = None,
    steps: Sequence[OptimizationStep] = OPTIMIZATION_STEPS,
) -> OptimizedTurns:
    """``turns`` with every step of ``steps`` applied in order, and the merged report.

    With a ``counter``, each changed turn's ``token_count`` is recounted; without one it
    keeps its old count, an over-count, which is the safe side for a budget. Turns left with
    no content are dropped at the end when ``policy.keep_empty_turns`` is False.

    Raises nothing of its own: the input is validated turns, and no step can fail on them.
    """
    policy = policy or OptimizePolicy()
    original = tuple(turns)
    current = original
    actions: list[OptimizationAction] = []
    calls: tuple[ToolCall, ...] | None = None  # the pairs of ``current``, when known
    for step in steps:
        paired, keeps_pairs = _PAIRED_STEPS.get(step, (None, False))
        if paired is None:
            done = step(current, policy)
        else:
            calls = pair_tool_calls(current) if calls is None else calls
            done = paired(current, policy, calls)
        if not keeps_pairs:
            calls = None
        elif calls is not None and done.report.changed_turns:
            calls = _relocated(calls, current, done.turns)
        actions.extend(done.report.actions)
        current = done.turns
    if counter is not None:
        current = tuple(
            turn
            if turn is before
            else turn.model_copy(update={"token_count": counter.count_blocks(turn.content)})
            for before, turn in zip(original, current, strict=True)
        )
    done = _outcome(original, current, actions)
    if policy.keep_empty_turns:
        return done
    return OptimizedTurns(
        turns=tuple(turn for turn in current if turn.content),
        report=replace(
            done.report, dropped_turns=tuple(turn.index for turn in current if not turn.content)
        ),
    )


VIEW_POLICY = OptimizePolicy(collapse_successful_calls=False, keep_empty_turns=False)
"""What :meth:`Session.context <tiermem.session.Session.context>` runs by default on the hot
turns it offers: final successful results verbatim, every successful call kept (the view
cannot know which tools act; their older outputs are still referenced), turns left empty
left out."""


def optimize_view(
    turns: Sequence[Turn], policy: OptimizePolicy, counter: TokenCounter
) -> tuple[tuple[Turn, ...], ViewOptimization]:
    """``turns`` optimized for a context window under ``policy`` (turns left empty are left
    out whatever ``policy.keep_empty_turns`` says: a window has no use for an empty
    message), and what that did, in tokens as assembly counts them with ``counter``.

    A pinned turn is sent as it is: when the optimization would change or drop one (a
    pinned failed result superseded later, a pinned output turned into a reference), the
    turns are offered unoptimized (a partial undo could split a call from its result)."""
    if policy.keep_empty_turns:
        policy = replace(policy, keep_empty_turns=False)
    done = optimize_turns(turns, policy)
    report = done.report
    if not report.actions:
        return done.turns, ViewOptimization()
    changed = set(report.changed_turns)
    if any(turn.pinned and turn.index in changed for turn in turns):
        return tuple(turns), ViewOptimization()
    after = {turn.index: turn for turn in done.turns if turn.index in changed}
    saved = 0
    for turn in turns:
        if turn.index in changed:
            kept = after.get(turn.index)
            saved += message_tokens(turn.content, counter) - (
                message_tokens(kept.content, counter) if kept is not None else 0
            )
    return done.turns, ViewOptimization(
        tokens_saved=saved,
        actions=report.counts(),
        referenced_turn_indexes=tuple(
            sorted(
                {
                    action.turn_indexes[-1]
                    for action in report.actions
                    if action.kind == "output_reference"
                }
            )
        ),
        changed_turn_indexes=report.changed_turns,
        dropped_turn_indexes=report.dropped_turns,
    )


def optimize_snapshot(
    snapshot: SessionSnapshot,
    policy: OptimizePolicy | None = None,
    *,
    counter: TokenCounter | None = None,
) -> tuple[SessionSnapshot, OptimizationReport]:
    """``snapshot`` with its turns optimized (same version, indexes and ``next_index``).

    Keep ``policy.keep_empty_turns`` True if the snapshot is restored to the hot tier, which
    needs consecutive indexes.
    """
    done = optimize_turns(snapshot.turns, policy, counter=counter)
    return snapshot.model_copy(update={"turns": done.turns}), done.report


def state_size(turns: Sequence[Turn], counter: TokenCounter) -> StateSize:
    """The JSON bytes of ``turns`` as stored, and their tokens as messages (a turn with no
    content is not sent, so it costs no tokens)."""
    return StateSize(
        bytes=sum(len(turn.model_dump_json().encode()) for turn in turns),
        tokens=sum(
            counter.count_blocks(turn.content) + MESSAGE_OVERHEAD_TOKENS
            for turn in turns
            if turn.content
        ),
    )


def _relocated(
    calls: Sequence[ToolCall], before: Sequence[Turn], after: Sequence[Turn]
) -> tuple[ToolCall, ...]:
    """The pairs of ``after``, given ``calls``, the pairs of ``before``, when ``after`` is
    ``before`` less whole pairs or non-tool blocks (which creates no pair: a dropped pair's
    id was used once): the calls whose two blocks are still there, at their new places, in
    the same order. Only the turns that changed (new objects) are looked into."""
    changed = {p for p, (old, new) in enumerate(zip(before, after, strict=True)) if new is not old}
    where: dict[int, _Loc] = {}
    for position in changed:
        for block_at, block in enumerate(after[position].content):
            if isinstance(block, ToolUseBlock | ToolResultBlock):
                where[id(block)] = (position, block_at)
    out: list[ToolCall] = []
    for call in calls:
        # The calls hold their blocks, so an id found here is that very block.
        use_at = where.get(id(call.use)) if call.use_at[0] in changed else call.use_at
        result_at = where.get(id(call.result)) if call.result_at[0] in changed else call.result_at
        if use_at is None or result_at is None:
            continue
        if use_at != call.use_at or result_at != call.result_at:
            call = replace(call, use_at=use_at, result_at=result_at)
        out.append(call)
    return tuple(out)


def _call_key(use: ToolUseBlock) -> str:
    return json.dumps(
        [use.name, use.input],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )


def _size(block: FrozenModel) -> int:
    return len(block.model_dump_json().encode())


def _human_size(size_bytes: int) -> str:
    if size_bytes < 1024:
        return f"{size_bytes} B"
    if size_bytes < 1024 * 1024:
        return f"{round(size_bytes / 1024)} KB"
    return f"{size_bytes / (1024 * 1024):.1f} MB"


def _is_reference(result: ToolResultBlock) -> bool:
    return (
        len(result.content) == 1
        and isinstance(result.content[0], TextBlock)
        and _REFERENCE.fullmatch(result.content[0].text) is not None
    )


def _action(
    step: str,
    kind: ActionKind,
    call: ToolCall,
    reason: str,
    *,
    kept_turn: int | None = None,
    bytes_saved: int,
) -> OptimizationAction:
    return OptimizationAction(
        step=step,
        kind=kind,
        turn_indexes=tuple(dict.fromkeys((call.use_turn, call.result_turn))),
        reason=reason,
        tool_name=call.name,
        tool_use_id=call.use.tool_use_id,
        kept_turn=kept_turn,
        bytes_saved=bytes_saved,
    )


def _apply(
    turns: Sequence[Turn], drops: Collection[_Loc], replacements: dict[_Loc, ContentBlock]
) -> tuple[Turn, ...]:
    """``turns`` with the blocks at ``drops`` removed and those at ``replacements`` swapped;
    untouched turns are the same objects."""
    touched = {position for position, _ in drops} | {position for position, _ in replacements}
    out: list[Turn] = []
    for position, turn in enumerate(turns):
        if position not in touched:
            out.append(turn)
            continue
        content = tuple(
            replacements.get((position, block_at), block)
            for block_at, block in enumerate(turn.content)
            if (position, block_at) not in drops
        )
        out.append(turn.model_copy(update={"content": content}))
    return tuple(out)


def _outcome(
    before: Sequence[Turn], after: tuple[Turn, ...], actions: Sequence[OptimizationAction]
) -> OptimizedTurns:
    changed = [old for old, new in zip(before, after, strict=True) if new is not old]
    return OptimizedTurns(
        turns=after,
        report=OptimizationReport(
            actions=tuple(actions),
            changed_turns=tuple(turn.index for turn in changed),
            emptied_turns=tuple(
                old.index
                for old, new in zip(before, after, strict=True)
                if new is not old and old.content and not new.content
            ),
        ),
    )
