"""The tool-pair invariant: a tool call and its result are kept or dropped together.

This module is the one place the rule lives. :func:`tool_pair_groups` partitions messages
into groups that must stay or go as one (messages linked by a ``tool_use_id``, directly or
through a chain); eviction drops whole groups and nothing else. :func:`close_orphans`
handles pairs the input already split (a hot window that starts after a call, a call whose
result never came): providers reject a lone half, so its content is turned into visible
text rather than silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tiermem.models.content import ContentBlock, TextBlock, ToolResultBlock, ToolUseBlock, text_of

__all__ = ["answered_ids", "close_orphans", "tool_pair_groups", "tool_use_ids"]


def tool_use_ids(blocks: Sequence[ContentBlock]) -> tuple[set[str], set[str]]:
    """The ids of the tool calls and of the tool results among ``blocks``."""
    uses = {b.tool_use_id for b in blocks if isinstance(b, ToolUseBlock)}
    results = {b.tool_use_id for b in blocks if isinstance(b, ToolResultBlock)}
    return uses, results


def answered_ids(messages: Sequence[Sequence[ContentBlock]]) -> set[str]:
    """The pairing rule, in one place: the ids of tool calls whose result sits in a later
    message than the call."""
    seen_uses: set[str] = set()
    answered: set[str] = set()
    for blocks in messages:
        uses, results = tool_use_ids(blocks)
        answered |= results & seen_uses
        seen_uses |= uses
    return answered


def tool_pair_groups(messages: Sequence[Sequence[ContentBlock]]) -> list[tuple[int, ...]]:
    """Positions of ``messages`` grouped so that no tool call is parted from its result.

    Each group is sorted; groups are ordered by their first position; every position is in
    exactly one group. A message without tool blocks is a group of its own.
    """
    parent = list(range(len(messages)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_seen: dict[str, int] = {}
    for position, blocks in enumerate(messages):
        uses, results = tool_use_ids(blocks)
        for tool_id in uses | results:
            seen = first_seen.setdefault(tool_id, position)
            a, b = find(seen), find(position)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for position in range(len(messages)):
        groups.setdefault(find(position), []).append(position)
    return [tuple(g) for _, g in sorted(groups.items())]


def _call_text(block: ToolUseBlock) -> str:
    args = json.dumps(block.input, ensure_ascii=False, default=str, sort_keys=True)
    return (
        f"[tool call {block.tool_use_id}: {block.name}({args}); its result is not in this context]"
    )


def _result_text(block: ToolResultBlock) -> str:
    return (
        f"[result of tool call {block.tool_use_id}, whose call is not in this context "
        f"({block.status})]: {text_of(block.content)}"
    )


def close_orphans(
    messages: Sequence[Sequence[ContentBlock]], *, open_last: bool = False
) -> list[tuple[ContentBlock, ...]]:
    """``messages`` with every unpaired tool call or result turned into a text block that
    says so and keeps its content.

    A call is paired when a later message holds its result; a result when an earlier
    message holds its call. ``open_last`` leaves calls in the last message alone (the
    caller is about to send their results).
    """
    answered = answered_ids(messages)
    out: list[tuple[ContentBlock, ...]] = []
    last = len(messages) - 1
    for position, blocks in enumerate(messages):
        fixed: list[ContentBlock] = []
        for block in blocks:
            if isinstance(block, ToolUseBlock) and block.tool_use_id not in answered:
                keep = open_last and position == last
                fixed.append(block if keep else TextBlock(text=_call_text(block)))
            elif isinstance(block, ToolResultBlock) and block.tool_use_id not in answered:
                fixed.append(TextBlock(text=_result_text(block)))
            else:
                fixed.append(block)
        out.append(tuple(fixed))
    return out
