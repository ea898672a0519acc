"""Cutting content down to a token budget with a visible marker.

A message too large for the budget is never dropped silently: its text (and the text inside
its tool results) is cut from the end, media it can no longer afford are left out, and a
marker says how large the original was. Tool calls and the ids of tool results are kept, so
a truncated message still satisfies the tool-pair invariant.

:func:`mark_cut` is the one rule for shortening a text with a visible marker: context
assembly (head only, to a token budget) and the conversation managers (head and tail of a
tool output, :class:`tiermem.managers.ShortenToolOutputs`) both call it, with
:func:`truncation_marker`'s text; text holding :data:`TRUNCATION_MARKER` has been cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tiermem.models.content import (
    ContentBlock,
    JsonBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    text_of,
)
from tiermem.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter

__all__ = [
    "TRUNCATION_MARKER",
    "mark_cut",
    "message_tokens",
    "minimum_tokens",
    "truncate_content",
    "truncate_text",
    "truncation_marker",
]


def message_tokens(blocks: Sequence[ContentBlock], counter: TokenCounter) -> int:
    """What a message (or a system section) with ``blocks`` costs: its content plus
    :data:`~tiermem.tokens.MESSAGE_OVERHEAD_TOKENS`. Every count in a window uses this."""
    return counter.count_blocks(blocks) + MESSAGE_OVERHEAD_TOKENS


TRUNCATION_MARKER = "[… truncated to fit the context budget"
"""How every truncation marker starts: text that holds it has been cut already."""


def truncation_marker(original_tokens: int) -> str:
    """The marker left where content was cut: it says how large the original was."""
    return f"{TRUNCATION_MARKER}; the original had {original_tokens} tokens]"


def mark_cut(text: str, *, head: int, tail: int = 0, marker: str) -> str:
    """``text`` shortened to its first ``head`` and last ``tail`` characters, with
    ``marker`` on its own line where the cut is. The marker is always placed (callers cut
    because the content did not fit as it was); head and tail never overlap.

    Raises nothing; negative lengths count as 0.
    """
    head = min(max(0, head), len(text))
    tail = min(max(0, tail), len(text) - head)
    parts = [text[:head], marker, text[len(text) - tail :] if tail else ""]
    return "\n".join(p for p in parts if p)


def truncate_text(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """The longest prefix of ``text`` (by characters) that counts at most ``max_tokens``."""
    if max_tokens <= 0:
        return ""
    if counter.count(text) <= max_tokens:
        return text
    lo, hi = 0, min(len(text), max_tokens * 16)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter.count(text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def _skeleton(blocks: Sequence[ContentBlock]) -> list[ContentBlock]:
    # What a message cannot lose: its tool calls, and its tool results' ids (emptied).
    kept: list[ContentBlock] = []
    for block in blocks:
        if isinstance(block, ToolUseBlock):
            kept.append(block)
        elif isinstance(block, ToolResultBlock):
            kept.append(block.model_copy(update={"content": ()}))
    return kept


def minimum_tokens(blocks: Sequence[ContentBlock], counter: TokenCounter) -> int:
    """Tokens of the smallest truncation of a message with ``blocks``: its tool skeleton,
    the marker, and the message overhead."""
    marker = counter.count(truncation_marker(counter.count_blocks(blocks)))
    return counter.count_blocks(_skeleton(blocks)) + marker + MESSAGE_OVERHEAD_TOKENS + 2


def _fill(
    blocks: Sequence[ContentBlock | JsonBlock], room: int, counter: TokenCounter, marker: str
) -> tuple[list[Any], int, bool]:
    """Blocks kept in order within ``room`` tokens; the marker goes where the cut is.

    Returns the blocks, the room left, and whether the marker was placed.
    """
    out: list[Any] = []
    placed = False
    for block in blocks:
        if isinstance(block, ToolUseBlock):
            out.append(block)
            room -= counter.count_blocks((block,))
            continue
        if isinstance(block, ToolResultBlock):
            inner, room, inner_placed = _fill(block.content, room, counter, marker)
            if not placed and not inner_placed and len(inner) < len(block.content):
                inner.append(TextBlock(text=marker))
                inner_placed = True
            placed = placed or inner_placed
            out.append(block.model_copy(update={"content": tuple(inner)}))
            continue
        cost = counter.count_blocks((block,))
        if not placed and cost <= room:
            out.append(block)
            room -= cost
        elif not placed:
            placed = True
            if isinstance(block, TextBlock | JsonBlock):
                text = block.text if isinstance(block, TextBlock) else text_of((block,))
                head = len(truncate_text(text, room, counter))
                out.append(TextBlock(text=mark_cut(text, head=head, marker=marker)))
            else:
                out.append(TextBlock(text=marker))
            room = 0
    return out, room, placed


def truncate_content(
    blocks: Sequence[ContentBlock], max_tokens: int, counter: TokenCounter
) -> tuple[ContentBlock, ...]:
    """``blocks`` cut so the message holding them counts at most ``max_tokens`` (overhead
    included), with a marker where the cut is. Raises nothing: when even
    :func:`minimum_tokens` does not fit, the minimal form is returned and the caller
    decides (the assembler raises :class:`~tiermem.errors.BudgetExceededError`)."""
    original = counter.count_blocks(blocks)
    if original + MESSAGE_OVERHEAD_TOKENS <= max_tokens:
        return tuple(blocks)
    marker = truncation_marker(original)
    marker_cost = counter.count(marker) + 2
    room = max_tokens - MESSAGE_OVERHEAD_TOKENS - marker_cost
    while True:
        out, _, placed = _fill(blocks, room, counter, marker)
        if not placed:
            out.append(TextBlock(text=marker))
        result = tuple(out)
        over = message_tokens(result, counter) - max_tokens
        if over <= 0 or room <= 0:
            return result
        # Joining text at the cut can merge tokens differently; tighten and retry.
        room -= over
