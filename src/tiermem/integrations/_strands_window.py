"""How a Strands agent's working window is written down: the per-agent record (a state
blob) and the bookkeeping that maps the agent's message objects to the turns they became.

The window is a list of runs of the agent's turn indexes and inline messages (those that
are not turns: a summary, a shortened copy, a redaction's replacement). An entry stands
for a message the session manager appended; a message still *is* its turn while it is the
same object with the same content list (Strands edits in place by assigning a new list).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field
from strands.types.content import Message as StrandsMessage

from tiermem.errors import TierMemError
from tiermem.models import FrozenModel, JsonValue, Message, Turn


class Run(FrozenModel):
    """The agent's turns with ``first <= index <= last`` (every later one when ``last`` is
    None)."""

    first: int = Field(ge=0)
    last: int | None = Field(default=None, ge=0)


class Inline(FrozenModel):
    """A message of the window that is not a turn (a summary, a shortened copy)."""

    message: Message
    strands: dict[str, JsonValue] = Field(default_factory=dict)


class AgentRecord(FrozenModel):
    """One agent's blob: its Strands state and the shape of its working window."""

    schema_version: int = 1
    agent: dict[str, JsonValue]
    window: tuple[Run | Inline, ...] = ()
    through: int = -1
    """The newest turn this record accounts for: later ones are appended on restore
    (unless the window ends in an open run, which takes them anyway)."""


@dataclass(eq=False, slots=True)
class Entry:
    """A message of the agent that is (or is being written as) a turn."""

    message: StrandsMessage
    content: Any
    seq: int
    turn_index: int | None = None

    def unchanged(self, message: StrandsMessage) -> bool:
        # Identity, not equality: Strands edits in place by assigning a new content list.
        return self.message is message and self.content is message.get("content")


@dataclass(slots=True)
class AgentLog:
    """One agent's entries (by ``id`` of their message; only those still in the window and
    the newest are kept), the next sequence number, and the record last written."""

    entries: dict[int, Entry] = field(default_factory=dict)
    last: Entry | None = None
    next_seq: int = 0
    restored_through: int = -1
    written: dict[str, Any] | None = None

    def add(self, entry: Entry) -> None:
        self.entries[id(entry.message)] = entry
        self.last = entry
        self.next_seq = entry.seq + 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The window as it was when a sync was asked for; turn indexes resolved later."""

    items: tuple[Entry | Inline, ...]
    agent: dict[str, JsonValue]
    last: Entry | None
    restored_through: int


def record_of(snap: Snapshot) -> AgentRecord:
    """The record of a snapshot: consecutive entries become runs of turn indexes, the
    trailing run is left open when it ends at the newest entry."""
    window: list[Run | Inline] = []
    previous: Entry | None = None
    for item in snap.items:
        if isinstance(item, Inline):
            window.append(item)
            previous = None
            continue
        if item.turn_index is None:
            raise TierMemError("a message's turn was not written before the window referring to it")
        head = window[-1] if window else None
        if previous is not None and isinstance(head, Run) and item.seq == previous.seq + 1:
            window[-1] = Run(first=head.first, last=item.turn_index)
        else:
            window.append(Run(first=item.turn_index, last=item.turn_index))
        previous = item
    last_index = snap.last.turn_index if snap.last is not None else None
    through = max(snap.restored_through, -1 if last_index is None else last_index)
    tail = window[-1] if window else None
    if previous is not None and previous is snap.last and isinstance(tail, Run):
        window[-1] = Run(first=tail.first)  # open: later turns belong to the window too
        through = -1
    return AgentRecord(agent=snap.agent, window=tuple(window), through=through)


def restore_window(
    turns: Sequence[Turn], record: AgentRecord | None
) -> list[tuple[Message, dict[str, JsonValue], Turn | None]]:
    """The window a record describes over the agent's turns: (message, extras, its turn)."""

    def of(turn: Turn) -> tuple[Message, dict[str, JsonValue], Turn | None]:
        extras = turn.metadata.get("strands")
        return turn.to_message(), dict(extras) if isinstance(extras, dict) else {}, turn

    if record is None:
        return [of(t) for t in turns]
    out: list[tuple[Message, dict[str, JsonValue], Turn | None]] = []
    for item in record.window:
        if isinstance(item, Inline):
            out.append((item.message, dict(item.strands), None))
        else:
            last = item.last
            out += [
                of(t) for t in turns if item.first <= t.index and (last is None or t.index <= last)
            ]
    tail = record.window[-1] if record.window else None
    if not (isinstance(tail, Run) and tail.last is None):
        out += [of(t) for t in turns if t.index > record.through]
    return out
