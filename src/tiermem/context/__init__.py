"""Context assembly (pure, no I/O): what an agent sends its model on every turn.

:func:`assemble_context` lays out the system prompt and tool manifest, the user profile
and summaries, structured memory and active entities, per-turn recall, the hot turns and
the current message within a token budget, with prompt-cache points and the provenance of
every item; the renderers turn the :class:`ContextWindow` into Bedrock Converse, Anthropic
Messages or OpenAI chat requests. The tool-pair rule lives in
:mod:`tiermem.context.tool_pairs`, eviction in :mod:`tiermem.context.eviction`.
"""

from tiermem.context.assemble import assemble_context, check_context_call, resolve_budget
from tiermem.context.eviction import EvictionPlan, PlannedMessage, plan_eviction
from tiermem.context.models import (
    Allocation,
    CachePoint,
    ContextItem,
    ContextSection,
    ContextStats,
    ContextWindow,
    ItemProvenance,
    ToolDefinition,
    ViewOptimization,
)
from tiermem.context.render import render_anthropic, render_converse, render_openai
from tiermem.context.tool_pairs import close_orphans, tool_pair_groups
from tiermem.context.truncate import message_tokens, truncate_content

__all__ = [
    "Allocation",
    "CachePoint",
    "ContextItem",
    "ContextSection",
    "ContextStats",
    "ContextWindow",
    "EvictionPlan",
    "ItemProvenance",
    "PlannedMessage",
    "ToolDefinition",
    "ViewOptimization",
    "assemble_context",
    "check_context_call",
    "close_orphans",
    "message_tokens",
    "plan_eviction",
    "render_anthropic",
    "render_converse",
    "render_openai",
    "resolve_budget",
    "tool_pair_groups",
    "truncate_content",
]
