"""The reduction steps that need no model: :class:`Slide` drops the oldest messages,
:class:`ShortenToolOutputs` shortens the oldest tool outputs; and :func:`cut_points`, the
places a conversation can be cut without parting a tool call from its result.

Both follow Strands (seed 003): a slide keeps the newest ``window_size`` messages and
starts the rest at a user message; shortening keeps the first and last 200 characters of
each large tool output of the oldest message that has one, with the context's truncation
marker in between (:func:`tiermem.context.truncate.mark_cut`, the one rule for cutting a
text), and turns images and documents in tool results into a line that says what they
were. Unlike Strands, both return new values and never edit a message in place.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tiermem.context.tool_pairs import tool_pair_groups
from tiermem.context.truncate import TRUNCATION_MARKER, mark_cut, truncation_marker
from tiermem.managers.base import Protection, Reduction, StepName
from tiermem.models.content import (
    DocumentBlock,
    ImageBlock,
    JsonBlock,
    Message,
    TextBlock,
    ToolResultBlock,
)
from tiermem.tokens import TokenCounter

__all__ = [
    "SHORTENED_MARKER",
    "ShortenToolOutputs",
    "Slide",
    "cut_points",
    "removed_note",
    "starts_cleanly",
]

SHORTENED_MARKER = TRUNCATION_MARKER
"""Starts the marker left where part of a tool output was cut out (the context's marker,
:func:`tiermem.context.truncate.truncation_marker`); output that holds it is not shortened
again."""


def cut_points(messages: Sequence[Message]) -> list[int]:
    """Positions ``c`` (1 ≤ c < len) where ``messages[:c]`` and ``messages[c:]`` share no
    tool-pair group (:func:`tiermem.context.tool_pairs.tool_pair_groups`), ascending."""
    crossed = [False] * (len(messages) + 1)
    for group in tool_pair_groups([m.content for m in messages]):
        for c in range(group[0] + 1, group[-1] + 1):
            crossed[c] = True
    return [c for c in range(1, len(messages)) if not crossed[c]]


def starts_cleanly(message: Message) -> bool:
    """Whether a conversation may start with ``message``: a user message that answers no
    tool call (providers reject a history that opens with a tool result or the model)."""
    return message.role == "user" and not any(
        isinstance(b, ToolResultBlock) for b in message.content
    )


def removed_note(count: int) -> Message:
    """The user message that stands where ``count`` messages were dropped and no user
    message was left to start the rest."""
    plural = "s were" if count != 1 else " was"
    return Message.text("user", f"[{count} earlier message{plural} removed to fit the context]")


@dataclass(slots=True)
class Slide:
    """Drop the oldest messages, keeping the newest ``window_size`` (Strands' sliding window).

    The cut moves forward to the first place that parts no tool pair and leaves a clean
    start (:func:`starts_cleanly`), or, when there is none, back to the nearest one (the
    window is then larger than ``window_size``). On overflow with no more than
    ``window_size`` messages, the two oldest go (``minimum_drop``). With no clean start
    anywhere (a long run of tool calls), the cut falls before an assistant message and
    :func:`removed_note` opens the rest. Kept positions (pinned, latest) stay where they
    were.
    """

    window_size: int
    tokens: TokenCounter
    minimum_drop: int = 2
    name: StepName = field(default="slide", init=False)

    def start(self, count: int) -> int:
        """Where the cut is looked for from, in a conversation of ``count`` messages (the
        latest message always stays, so a window of 0 keeps it too)."""
        if count > self.window_size:
            return min(count - self.window_size, count - 1)
        return min(self.minimum_drop, count)

    async def __call__(self, messages: Sequence[Message], protect: Protection) -> Reduction | str:
        return self.cut(messages, protect, self.start(len(messages)))

    def cut(self, messages: Sequence[Message], protect: Protection, start: int) -> Reduction | str:
        """Drop what precedes the best cut near ``start``: the first good one at or after
        it, else the last before it (keeping more than the window beats keeping all)."""
        cuts = [c for c in cut_points(messages) if any(i not in protect.keep for i in range(c))]
        order = [c for c in cuts if c >= start] + [c for c in reversed(cuts) if c < start]
        clean = next((c for c in order if starts_cleanly(messages[c])), None)
        if clean is not None:
            return self._drop_before(messages, protect, clean, note=False)
        fallback = next((c for c in order if messages[c].role == "assistant"), None)
        if fallback is not None:
            return self._drop_before(messages, protect, fallback, note=True)
        if not any(i not in protect.keep for i in range(len(messages))):
            return "every message is pinned or the latest one"
        return (
            "no place to cut without parting a tool call from its result, with something "
            "unpinned before it and a user or assistant message to start from"
        )

    def _drop_before(
        self, messages: Sequence[Message], protect: Protection, cut: int, *, note: bool
    ) -> Reduction:
        kept = [i for i in range(cut) if i in protect.keep]
        out = [messages[i] for i in kept]
        origins: list[int | None] = list(kept)
        if note:
            out.append(removed_note(cut - len(kept)))
            origins.append(None)
        out += messages[cut:]
        origins += range(cut, len(messages))
        return Reduction.by_step(self.name, messages, out, origins, self.tokens)


@dataclass(slots=True)
class ShortenToolOutputs:
    """Shorten the tool outputs of the oldest message that has a long one.

    Text longer than twice ``keep_chars`` keeps its first and last ``keep_chars``
    characters around the truncation marker (:data:`SHORTENED_MARKER` starts it) that says
    how many tokens the original had;
    JSON is shortened as its text; images and documents become a line naming them. Pinned
    messages are left alone; the latest message is not (it is often the large one).
    """

    tokens: TokenCounter
    keep_chars: int = 200
    name: StepName = field(default="shorten_tool_outputs", init=False)

    async def __call__(self, messages: Sequence[Message], protect: Protection) -> Reduction | str:
        for position, message in enumerate(messages):
            if position in protect.pinned:
                continue
            shortened = self.shorten(message)
            if shortened is not None:
                out = (*messages[:position], shortened, *messages[position + 1 :])
                origins = range(len(messages))
                return Reduction.by_step(self.name, messages, out, origins, self.tokens)
        return "no unpinned tool output is long enough to shorten"

    def shorten(self, message: Message) -> Message | None:
        """``message`` with its tool outputs shortened, or None if none is long enough."""
        blocks: list[Any] = []
        changed = False
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                items = [self._item(item) for item in block.content]
                if any(new is not None for new in items):
                    changed = True
                    content = tuple(
                        old if new is None else new
                        for old, new in zip(block.content, items, strict=True)
                    )
                    block = block.model_copy(update={"content": content})
            blocks.append(block)
        return message.model_copy(update={"content": tuple(blocks)}) if changed else None

    def _item(self, item: Any) -> TextBlock | None:
        if isinstance(item, ImageBlock):
            size = f", {len(item.data)} bytes" if item.data is not None else ""
            return TextBlock(text=f"[image: {item.format}{size}, removed to fit the context]")
        if isinstance(item, DocumentBlock):
            return TextBlock(
                text=f"[document {item.name!r} ({item.format}), removed to fit the context]"
            )
        if isinstance(item, JsonBlock):
            text = json.dumps(item.json_, ensure_ascii=False, default=str)
        elif isinstance(item, TextBlock):
            text = item.text
        else:
            return None
        if SHORTENED_MARKER in text or len(text) <= 2 * self.keep_chars:
            return None
        marker = truncation_marker(self.tokens.count(text))
        return TextBlock(
            text=mark_cut(text, head=self.keep_chars, tail=self.keep_chars, marker=marker)
        )
