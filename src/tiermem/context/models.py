"""What context assembly takes and returns: sections, tool definitions, the allocation,
and the assembled :class:`ContextWindow` with its :class:`ContextItem` list and
:class:`ContextStats`.

Every item of a window says where it came from (:class:`ItemProvenance`: the session and
turn indexes, memory ids, summary id, and the tier that served it) and what it costs in
tokens, so a caller can explain any line of a prompt.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from tiermem.models.base import FrozenModel, JsonValue
from tiermem.models.content import ContentBlock, Message, Role, text_of
from tiermem.models.convert import SystemBlock

__all__ = [
    "Allocation",
    "CachePoint",
    "ContextItem",
    "ContextSection",
    "ContextStats",
    "ContextWindow",
    "ItemKind",
    "ItemProvenance",
    "SourceTier",
    "ToolDefinition",
    "ViewOptimization",
]

ItemKind = Literal[
    "system",
    "tools",
    "profile",
    "summary",
    "structured_memory",
    "entities",
    "state",
    "recall",
    "turn",
    "current",
]
"""What an item is, in layout order."""

SourceTier = Literal["request", "hot", "session", "archive", "longterm", "knowledge"]
"""Where an item was read from: the caller's request, the hot window, the session's durable
records (summaries, structured memory), the archive (recalled turns), long-term memory, or
the knowledge base."""


class ItemProvenance(FrozenModel):
    """Where one context item came from."""

    tier: SourceTier = "request"
    session_id: str | None = None
    turn_indexes: tuple[int, ...] = ()
    memory_ids: tuple[str, ...] = ()
    summary_id: str | None = None


class ContextSection(FrozenModel):
    """A block of derived memory to place in the context: the user profile (for example
    :meth:`LongTermMemory.build_user_context`'s text), a rolling summary, or structured
    memory. ``counts`` (structured memory: ``{"facts": 12, ...}``) feed the stats."""

    kind: Literal["profile", "summary", "structured_memory"]
    text: str
    name: str | None = None
    """A summary's tier (``recent``, ``middle``, ``ancient``) or any label."""
    provenance: ItemProvenance = Field(default_factory=ItemProvenance)
    counts: dict[str, int] = Field(default_factory=dict)


class ToolDefinition(FrozenModel):
    """One tool of the manifest, in the provider-neutral shape every renderer maps."""

    name: str = Field(min_length=1, max_length=256)
    description: str = ""
    input_schema: dict[str, JsonValue] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    @classmethod
    def of(cls, tool: Any) -> ToolDefinition:
        """A definition from a mapping (``input_schema``, ``inputSchema`` or ``parameters``
        for the schema) or from an object with ``name``/``description``/``input_schema``
        attributes, such as :class:`tiermem.tools.ToolSpec`."""
        if isinstance(tool, ToolDefinition):
            return tool
        if isinstance(tool, dict):
            schema = tool.get("input_schema", tool.get("inputSchema", tool.get("parameters")))
            fields = {"name": tool.get("name"), "description": tool.get("description", "")}
        else:
            schema = getattr(tool, "input_schema", None)
            fields = {"name": getattr(tool, "name", None)}
            fields["description"] = getattr(tool, "description", "")
        if schema is not None:
            fields["input_schema"] = dict(schema)
        return cls.model_validate(fields)

    def canonical(self) -> dict[str, JsonValue]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


class Allocation(FrozenModel):
    """How the budget is shared (seed 004): recent turns, derived memory (profile,
    summaries, structured memory, entities, recall), and a buffer kept free for counting
    error and mid-loop tool results. Shares must add up to 1.

    Optional content never reaches into the buffer; required content (the system prompt,
    the tool manifest, the current message, the first user turn, the latest turn, pinned
    turns) may, and is truncated only when it would exceed the whole budget.
    """

    hot: float = Field(default=0.65, ge=0.0, le=1.0)
    memory: float = Field(default=0.20, ge=0.0, le=1.0)
    buffer: float = Field(default=0.15, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _adds_up(self) -> Allocation:
        if not math.isclose(self.hot + self.memory + self.buffer, 1.0, abs_tol=1e-9):
            raise ValueError(
                f"allocation shares must add up to 1, got hot={self.hot} + "
                f"memory={self.memory} + buffer={self.buffer}"
            )
        return self


class ContextItem(FrozenModel):
    """One piece of the window: a system section, a tool manifest, a turn or the current
    message, with its token count and provenance."""

    kind: ItemKind
    role: Role | Literal["system"]
    content: tuple[ContentBlock, ...]
    tokens: int = Field(ge=0)
    provenance: ItemProvenance = Field(default_factory=ItemProvenance)
    name: str | None = None
    truncated: bool = False
    """Cut to fit the budget; the content says so with a visible marker."""

    @property
    def text(self) -> str:
        return text_of(self.content)


class CachePoint(FrozenModel):
    """A prompt-cache boundary: everything before it is the cacheable prefix."""

    name: Literal["static", "slow"]
    """``static``: after the system prompt and tool manifest; ``slow``: after the profile
    and summaries."""
    after_item: int
    """Index in :attr:`ContextWindow.items` of the last item before the boundary."""
    fingerprint: str
    """sha256 (hex) of everything before the boundary."""


class ViewOptimization(FrozenModel):
    """What the pre-save optimization (:mod:`tiermem.context.optimize`) did to the hot
    turns a window was offered: :meth:`Session.context <tiermem.session.Session.context>`
    runs it unless called with ``optimize=False``. The archive is never changed: every turn
    it touched is whole in ``session.get_turn(index)``."""

    tokens_saved: int = 0
    """Tokens of the offered turns before, less after, as assembly counts them (a turn left
    out saves its message overhead too). Counted before the budget evicts anything, so a
    window under its budget sends exactly this many fewer tokens of turns."""
    actions: dict[str, int] = Field(default_factory=dict)
    """Actions per kind: ``superseded_failure`` (a failed call that later succeeded,
    dropped with its result), ``duplicate_call``, ``redundant_text`` (an assistant text
    said again in the same agent loop) and ``output_reference`` (a seen, superseded tool
    output replaced by a reference to its turn)."""
    referenced_turn_indexes: tuple[int, ...] = ()
    """Turns whose tool output the window shows as a reference."""
    changed_turn_indexes: tuple[int, ...] = ()
    """Turns whose content changed (those left out included)."""
    dropped_turn_indexes: tuple[int, ...] = ()
    """Turns left out: everything they held went (a repeated filler text, a dropped call)."""


class ContextStats(FrozenModel):
    """Seed 004's ``context_stats``, plus what the budget did."""

    total_turns: int
    """Turns in the session (the log), not only those in the window."""
    total_tokens: int
    budget_tokens: int
    context_window_percent: float
    """``total_tokens`` as a share of the model's context window (of the budget when no
    model is named), in percent."""
    tokens_by_tier: dict[str, int]
    """Tokens per item kind: system, tools, profile, summary, structured_memory, entities,
    recall, turn, current."""
    allocation_tokens: dict[str, int]
    """The budget split: hot, memory, buffer."""
    summary_active: bool = False
    summary_tiers: dict[str, int] = Field(default_factory=dict)
    structured_memory: dict[str, int] | None = None
    hot_turns: int = 0
    """Turns offered by the hot window (less those the optimization left out:
    :attr:`optimization`)."""
    kept_turns: int = 0
    evicted_count: int = 0
    evicted_turn_indexes: tuple[int, ...] = ()
    truncated_turn_indexes: tuple[int, ...] = ()
    current_truncated: bool = False
    recall_hits: int = 0
    recall_dropped: int = 0
    sections_dropped: int = 0
    profile_cut: tuple[str, ...] = ()
    """Memory ids of the profile's lines (preferences, recalled memories) that the budget
    cut: the profile item is then marked ``truncated`` (or left out, in
    ``sections_dropped``) and lists only the lines it shows. A per-turn recall hit of one
    of them is placed in the recall block, by its score, if it fits (it is left out while
    the profile shows the line)."""
    quality_metrics: dict[str, float] = Field(default_factory=dict)
    """The latest summarization pass's quality for this session (seed 004's
    ``quality_metrics``); empty before the first pass. Keys, each present when the pass
    could measure it (shares in [0, 1]):

    * ``context_retention``: share of the structured slots (entities, facts, decisions,
      intentions) of the summarized turns that the final summary states;
    * ``first_attempt_retention``: the same share for the summarizer's first attempt,
      before the pass re-summarized or appended what it lost (what quality-aware
      compression reacts to);
    * ``entity_drift``: share of the entity values the previous summary mentioned that the
      new one no longer does (0 is no drift);
    * ``compression_ratio``: summary tokens over the raw tokens they summarize (above 1
      when a summary is longer than a short stretch of turns);
    * ``overall_score``: ``context_retention * (1 - entity_drift)`` (whichever of the two
      the pass measured, alone): the share of what should survive that did.
    """
    optimization: ViewOptimization | None = None
    """What the view's optimization did; None when the turns were not optimized."""


class ContextWindow(FrozenModel):
    """An assembled context, provider-neutral; render it with :mod:`tiermem.context.render`.

    ``system`` holds text and cache point blocks; ``messages`` alternate roles (adjacent
    turns of one role are merged, tool results first); ``items`` list every piece in layout
    order with its provenance. ``total_tokens <= budget_tokens`` always.
    """

    system: tuple[SystemBlock, ...]
    tools: tuple[ToolDefinition, ...]
    messages: tuple[Message, ...]
    items: tuple[ContextItem, ...]
    cache_points: tuple[CachePoint, ...]
    prefix_fingerprint: str
    """sha256 of the cacheable prefix (through the last cache point): when it changes,
    the provider's prompt cache misses."""
    tools_cache_point: bool = False
    """The static cache point falls on the tool manifest (there is no system prompt)."""
    budget_tokens: int
    total_tokens: int
    stats: ContextStats
