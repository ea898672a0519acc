"""Summaries of the messages a summarizing manager folds away: the :class:`Summarizer`
protocol (an LLM call, in production) and :class:`RuleSummarizer`, a deterministic default
that needs no model.

The rule summary keeps what a later turn is likely to need, as the user or tool said it:
every sentence that names an entity (the rules of :mod:`tiermem.extraction.entities`:
volumes, order ids, prices, dates, genres...), holds a number, or states a preference, a
name or a correction (the rules of :mod:`tiermem.longterm.detect`); each tool call with its
arguments; and a closing line with the latest value of each entity kind. A sentence that
says none of that ("Thanks!", "Let me check.") is left out. When nothing qualifies, the
first sentence of each message with text is kept, so the summary always says what was
talked about, never only how many messages there were. An earlier rule summary among the messages
is carried over line by line, not summarized again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Protocol

from tiermem.extraction.entities import EntityExtractor, RuleEntityExtractor
from tiermem.longterm.detect import (
    MemoryDetector,
    RuleMemoryDetector,
    read_sentences,
    split_sentences,
)
from tiermem.models.content import (
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    text_of,
)

__all__ = ["RuleSummarizer", "Summarizer", "summary_header"]

_HEADER = re.compile(r"^\[Summary of (\d+) earlier messages?\]$")
_ENTITIES_PREFIX = "Entities: "


class Summarizer(Protocol):
    """Turns the messages a manager folds away into one summary message.

    The summary takes their place in the conversation as a user message; only its text
    blocks are kept. Raising makes the summarizing step give way to the next step of the
    fallback chain (the failure is logged and counted).
    """

    async def __call__(self, messages: Sequence[Message]) -> Message:
        """A summary of ``messages`` (oldest first)."""
        ...


def summary_header(count: int) -> str:
    """The first line of a rule summary of ``count`` messages."""
    return f"[Summary of {count} earlier message{'s' if count != 1 else ''}]"


class RuleSummarizer:
    """The deterministic :class:`Summarizer`: keeps the sentences with entities, numbers
    and preferences (see the module docstring). Pure and cheap; safe to share.

    ``max_sentence_chars`` cuts a long kept sentence (with "…"); ``max_lines`` keeps the
    newest lines of a long summary, since later statements supersede earlier ones.
    """

    def __init__(
        self,
        *,
        entities: EntityExtractor | None = None,
        detector: MemoryDetector | None = None,
        max_sentence_chars: int = 240,
        max_lines: int = 60,
        max_result_sentences: int = 3,
    ) -> None:
        self._entities = entities or RuleEntityExtractor()
        self._detector = detector or RuleMemoryDetector()
        self._max_chars = max_sentence_chars
        self._max_lines = max_lines
        self._max_result_sentences = max_result_sentences

    async def __call__(self, messages: Sequence[Message]) -> Message:
        return self.summarize(messages)

    def summarize(self, messages: Sequence[Message]) -> Message:
        """The summary of ``messages`` as one user message (the sync core of the call)."""
        count = 0
        lines: list[str] = []
        latest: dict[str, str] = {}
        tool_names: dict[str, str] = {}
        for message in messages:
            own = False
            for block in message.content:
                carried = self._carried(block) if message.role == "user" else None
                if carried is None:
                    own = True
                    lines += self._block_lines(message.role, block, tool_names, latest)
                    continue
                earlier, carried_lines, carried_entities = carried
                count += earlier
                lines += carried_lines
                for kind, value in carried_entities.items():
                    latest.pop(kind, None)
                    latest[kind] = value
            count += own
        if not lines:
            lines = self._topics(messages)
        lines = list(dict.fromkeys(lines))[-self._max_lines :]
        text = "\n".join([summary_header(count), *lines])
        if latest:
            text += "\n" + _ENTITIES_PREFIX + "; ".join(f"{k}={v}" for k, v in latest.items())
        return Message.text("user", text)

    # ------------------------------------------------------------------ pieces

    def _carried(self, block: object) -> tuple[int, list[str], dict[str, str]] | None:
        """An earlier rule summary's count, lines and entities; None for other blocks."""
        if not isinstance(block, TextBlock):
            return None
        first, _, rest = block.text.partition("\n")
        header = _HEADER.match(first)
        if header is None:
            return None
        lines, entities = [], {}
        for line in rest.splitlines():
            if line.startswith(_ENTITIES_PREFIX):
                for pair in line[len(_ENTITIES_PREFIX) :].split("; "):
                    kind, _, value = pair.partition("=")
                    if kind and value:
                        entities[kind] = value
            elif line.strip():
                lines.append(line)
        return int(header.group(1)), lines, entities

    def _block_lines(
        self, role: str, block: object, tool_names: dict[str, str], latest: dict[str, str]
    ) -> list[str]:
        who = "User" if role == "user" else "Assistant"
        if isinstance(block, TextBlock):
            return [f"- {who}: {s}" for s in self._kept(block.text, latest)]
        if isinstance(block, ToolUseBlock):
            tool_names[block.tool_use_id] = block.name
            args = json.dumps(block.input, ensure_ascii=False, default=str, sort_keys=True)
            return [f"- {who} called {block.name}({self._cut(args)})"]
        if isinstance(block, ToolResultBlock):
            name = tool_names.get(block.tool_use_id, "a tool")
            failed = " (failed)" if block.status == "error" else ""
            kept = self._kept(text_of(block.content), latest)[: self._max_result_sentences]
            if not kept and failed:
                return [f"- {name} failed"]
            return [f"- Result of {name}{failed}: {s}" for s in kept]
        if isinstance(block, DocumentBlock):
            return [f"- {who} shared the document {block.name!r}"]
        if isinstance(block, ImageBlock):
            return [f"- {who} shared an image ({block.format})"]
        return []

    def _kept(self, text: str, latest: dict[str, str]) -> list[str]:
        kept = []
        for sentence in read_sentences(text, entities=self._entities, detector=self._detector):
            for entity in sentence.entities:
                latest.pop(entity.kind, None)  # re-insert: the newest mention goes last
                latest[entity.kind] = entity.value
            if sentence.salient:
                kept.append(self._cut(sentence.text))
        return kept

    def _topics(self, messages: Sequence[Message]) -> list[str]:
        """The first sentence of each message with text: what was talked about."""
        lines = []
        for message in messages:
            said = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
            sentences = split_sentences(said)
            if sentences:
                who = "User" if message.role == "user" else "Assistant"
                lines.append(f"- {who}: {self._cut(sentences[0])}")
        if not lines:
            lines = ["- (the earlier messages held no text: tool calls, media or reasoning)"]
        return lines

    def _cut(self, text: str) -> str:
        return text if len(text) <= self._max_chars else text[: self._max_chars - 1] + "…"
