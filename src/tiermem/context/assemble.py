"""``assemble_context``: the pure function from what is known to what the model is sent.

Layout (seed 001), cache-friendly from the most stable part to the least::

    system prompt + tool manifest          static          ── cache point "static"
    user profile, rolling summaries        slow-changing   ── cache point "slow"
    structured memory, active entities     per session
    per-turn recall                        per request (never written into the history)
    hot turns                              the conversation
    current message

The conversation overrides the profile (seed 001): a preference an active entity
contradicts (``preferred_language: English`` while ``language: japanese`` is active) is
left out of the profile. The cached prefix then changes when the user switches, once, and
never from turn to turn while the entities and preferences stay the same.

Budget (seed 004): the budget is the explicit ``budget``, or the model's usable input
(window minus output reservation, shrunk by its safety margin), or the smaller of the two
(the explicit budget shrunk by the model's margin). ``allocation.buffer`` of it is kept
free for optional content; derived memory (profile, summaries, structured memory,
entities, recall) takes at most ``allocation.memory`` plus the part of ``allocation.hot``
the conversation does not need, and never what the required messages need. Within it,
structured memory is served first when it fits whole (it states every slot's current value
in a few hundred tokens; a summary cut short loses facts), and when recall has hits the
profile and summaries leave it at least a quarter of the room; hot turns take the rest
(their nominal share, plus what memory left unused). Which turns stay is
:func:`~tiermem.context.eviction.plan_eviction`'s decision; tool pairs are
:mod:`~tiermem.context.tool_pairs`' rule.

Every count is :func:`~tiermem.context.truncate.message_tokens` (cl100k plus a per-message
overhead) of what is rendered, and ``total_tokens <= budget_tokens`` always holds: content
that cannot fit even truncated raises :class:`~tiermem.errors.BudgetExceededError`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError as PydanticValidationError

from tiermem.context.eviction import (
    PlannedMessage,
    plan_eviction,
    required_positions,
    required_tokens,
)
from tiermem.context.models import (
    Allocation,
    CachePoint,
    ContextItem,
    ContextSection,
    ContextStats,
    ContextWindow,
    ItemKind,
    ItemProvenance,
    SourceTier,
    ToolDefinition,
)
from tiermem.context.recall_block import RECALL_HEADER, plan_recall_block
from tiermem.context.tool_pairs import close_orphans
from tiermem.context.truncate import (
    mark_cut,
    message_tokens,
    truncate_content,
    truncate_text,
    truncation_marker,
)
from tiermem.errors import BudgetExceededError, ValidationError
from tiermem.models.base import problems
from tiermem.models.content import (
    CachePointBlock,
    ContentBlock,
    Message,
    TextBlock,
    ToolResultBlock,
)
from tiermem.models.convert import SystemBlock
from tiermem.models.session import ActiveEntity
from tiermem.models.turns import Turn
from tiermem.tokens import ModelRegistry, ModelSpec, TiktokenCounter, TokenCounter, default_registry

if TYPE_CHECKING:
    from tiermem.longterm.hits import RecallHit

__all__ = [
    "ENTITIES_HEADER",
    "MAX_RECALL_K",
    "RECALL_HEADER",
    "SECTION_MIN_TOKENS",
    "assemble_context",
    "check_context_call",
    "resolve_budget",
]

ENTITIES_HEADER = "Currently active entities (use these unless overridden):"
SECTION_MIN_TOKENS = 48
"""A section that does not fit is cut to the room left when that is at least this many
tokens (less would leave a marker and little else), and left out otherwise."""
OPENING_SHARE = 4
"""The opening (``assemble_context(opening=...)``: a task's request read back from the
archive) takes at most 1/OPENING_SHARE of the hot share of the budget: it is never
evicted, so a long request (a pasted document) kept whole would evict the task's own
recent turns, the work the model is continuing."""


class _UserContextLike(Protocol):
    # LongTermMemory.build_user_context's UserContext, read without importing longterm.
    @property
    def text(self) -> str: ...

    @property
    def items(self) -> Sequence[Any]: ...


def resolve_budget(budget: int | None, spec: ModelSpec | None) -> int:
    """The token budget from an explicit ``budget``, a model's spec, or both (see module
    docstring).

    Raises:
        ValidationError: neither is given, or the budget is not positive.
    """
    if budget is None and spec is None:
        raise ValidationError("give a token budget (budget=...) or a model (model=...)")
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
    ):
        raise ValidationError(f"budget must be a positive integer of tokens, got {budget!r}")
    if spec is None:
        assert budget is not None
        return budget
    if budget is None:
        return spec.usable_input_tokens
    return min(math.floor(budget * (1 - spec.safety_margin)), spec.usable_input_tokens)


MAX_RECALL_K = 100
"""The most recall hits one context may ask for (the REST API's bound too)."""


def check_context_call(
    *, query: object = None, model: object = None, recall_k: object = 8, allocation: object = None
) -> Allocation:
    """Check the arguments ``Session.context`` uses before :func:`assemble_context` (which
    checks the rest); returns the allocation (default, given, or parsed from a mapping).

    Raises:
        ValidationError: ``query`` or ``model`` that is not a string, ``recall_k`` that is
            not an integer from 1 to :data:`MAX_RECALL_K`, a bad allocation.
    """
    if query is not None and not isinstance(query, str):
        raise ValidationError(f"query must be a string or None, got {type(query).__name__}")
    if model is not None and not isinstance(model, str):
        raise ValidationError(
            f"model must be a model id string (e.g. 'gpt-4o') or None, got {type(model).__name__}"
        )
    if type(recall_k) is not int or not 1 <= recall_k <= MAX_RECALL_K:
        raise ValidationError(
            f"recall_k must be an integer from 1 to {MAX_RECALL_K} (recall hits), got {recall_k!r}"
        )
    return _allocation(allocation)


def _allocation(allocation: object) -> Allocation:
    if allocation is None:
        return Allocation()
    if isinstance(allocation, Allocation):
        return allocation
    if not isinstance(allocation, Mapping):
        raise ValidationError(
            f"allocation must be an Allocation or a mapping of hot, memory and buffer shares, "
            f"got {type(allocation).__name__}"
        )
    try:
        return Allocation.model_validate(allocation)
    except PydanticValidationError as exc:
        raise ValidationError(f"allocation is not valid: {problems(exc)}") from None


def _manifest(tools: Sequence[Any]) -> tuple[ToolDefinition, ...]:
    # Checked on the way (the manifest is read on every context call): a list or tuple
    # goes straight on; what a bad item is gets worked out only when it fails to parse.
    if type(tools) not in (list, tuple) and (
        isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence)
    ):
        raise ValidationError(
            f"tools must be a list of tool definitions, got {type(tools).__name__}"
        )
    manifest: list[ToolDefinition] = []
    for position, tool in enumerate(tools):
        try:
            manifest.append(ToolDefinition.of(tool))
        except (TypeError, ValueError) as exc:  # pydantic's error is a ValueError
            raise _bad_tool(position, tool, exc) from None
    return tuple(manifest)


def _bad_tool(position: int, tool: object, exc: Exception) -> ValidationError:
    if not isinstance(tool, Mapping) and getattr(tool, "name", None) is None:
        return ValidationError(
            f"tools[{position}] must be a ToolDefinition, a mapping with name, description "
            f"and input_schema, or a ToolSpec; got {type(tool).__name__}"
        )
    if isinstance(exc, PydanticValidationError):
        return ValidationError(f"tools[{position}] is not a valid tool definition: {problems(exc)}")
    # dict() of an input schema that is not a mapping
    return ValidationError(
        f"tools[{position}] is not a valid tool definition: its input schema must be a "
        f"JSON Schema object ({exc})"
    )


def _current(current: object) -> Message | None:
    if current is None or isinstance(current, Message):
        return current
    if isinstance(current, str):
        return Message.text("user", current)
    if not isinstance(current, Mapping):
        raise ValidationError(
            f"current must be a string, a Message or a mapping with role and content, got "
            f"{type(current).__name__}"
        )
    try:
        return Message.model_validate(current)
    except PydanticValidationError as exc:
        raise ValidationError(f"current is not a valid message: {problems(exc)}") from None


def _fingerprint(parts: Sequence[Any]) -> str:
    canonical = json.dumps(list(parts), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _system_texts(system: str | Sequence[SystemBlock] | None) -> tuple[TextBlock, ...]:
    if system is None:
        return ()
    if isinstance(system, str):
        return (TextBlock(text=system),) if system else ()
    if not isinstance(system, Sequence):
        raise ValidationError(
            f"system must be a string or a list of text blocks, got {type(system).__name__}"
        )
    texts: list[TextBlock] = []
    for block in system:
        if isinstance(block, Mapping) and block.get("type") == "text":
            try:
                block = TextBlock.model_validate(block)
            except PydanticValidationError as exc:
                raise ValidationError(f"a system block is not valid: {problems(exc)}") from None
        if isinstance(block, TextBlock):
            if block.text:
                texts.append(block)
        elif not isinstance(block, CachePointBlock):  # our cache points replace the caller's
            raise ValidationError(f"a system prompt holds text blocks, not {type(block).__name__}")
    return tuple(texts)


def _profile_section(
    user_context: ContextSection | _UserContextLike,
    entities: Sequence[ActiveEntity],
    counter: TokenCounter,
) -> tuple[ContextSection, frozenset[str]]:
    """The profile section, without the preferences the active ``entities`` override, and
    the memory ids of those left out (recall must not bring them back either)."""
    if isinstance(user_context, ContextSection):
        return user_context, frozenset()
    overridden: frozenset[str] = frozenset()
    if entities:
        # Imported here: assemble runs without long-term memory, and longterm's modules
        # are needed only for its UserContext.
        from tiermem.longterm.context import UserContext, override_by_entities

        if isinstance(user_context, UserContext):
            user_context = override_by_entities(user_context, entities, counter=counter)
            overridden = frozenset(user_context.overridden)
    memory_ids: list[str] = []
    for item in user_context.items:
        memory_id = getattr(item, "memory_id", None)
        if isinstance(memory_id, str):
            memory_ids.append(memory_id)
    section = ContextSection(
        kind="profile",
        text=user_context.text,
        name="user",
        provenance=ItemProvenance(tier="longterm", memory_ids=tuple(memory_ids)),
    )
    return section, overridden


def _cut_from_profile(
    b: _Builder, user_context: ContextSection | _UserContextLike, overridden: frozenset[str]
) -> tuple[str, ...]:
    """The memory ids of the profile's lines that the budget cut (the profile item cut
    short, or left out), in the profile's order; the placed item's provenance then lists
    only the lines it shows. Lines the conversation overrides were never in it; a profile
    given as a section has no lines: nothing."""
    if isinstance(user_context, ContextSection):
        return ()
    position = next((n for n, i in enumerate(b.items) if i.kind == "profile"), None)
    if position is not None and not b.items[position].truncated:
        return ()
    lines = [
        (memory_id, line)
        for item in user_context.items
        if isinstance(memory_id := getattr(item, "memory_id", None), str)
        and memory_id not in overridden
        and isinstance(line := getattr(item, "line", None), str)
    ]
    shown = "" if position is None else b.items[position].text
    cut = tuple(memory_id for memory_id, line in lines if line not in shown)
    if position is not None and cut:
        placed = b.items[position]
        kept = tuple(m for m in placed.provenance.memory_ids if m not in cut)
        provenance = placed.provenance.model_copy(update={"memory_ids": kept})
        b.items[position] = placed.model_copy(update={"provenance": provenance})
    return cut


def _merge_messages(messages: Sequence[tuple[str, tuple[ContentBlock, ...]]]) -> list[Message]:
    # Providers want alternating roles: adjacent messages of one role become one, with tool
    # results first (Anthropic requires them before any text of a user message).
    merged: list[tuple[str, list[ContentBlock]]] = []
    for role, content in messages:
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(content)
        else:
            merged.append((role, list(content)))
    out: list[Message] = []
    for role, blocks in merged:
        if role == "user":
            results = [b for b in blocks if isinstance(b, ToolResultBlock)]
            blocks = results + [b for b in blocks if not isinstance(b, ToolResultBlock)]
        out.append(Message(role=role, content=tuple(blocks)))
    return out


class _Builder:
    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.items: list[ContextItem] = []
        self.sections_dropped = 0

    def add(
        self,
        kind: ItemKind,
        text: str,
        provenance: ItemProvenance,
        *,
        name: str | None = None,
        room: int | None = None,
        whole_lines: bool = False,
    ) -> int:
        """Add a system-side item; with ``room``, cut or leave it out to fit (with
        ``whole_lines``, cut after a line's end, never within a line). Returns its tokens
        (0 when left out)."""
        blocks: tuple[ContentBlock, ...] = (TextBlock(text=text),)
        tokens = message_tokens(blocks, self.counter)
        truncated = False
        if room is not None and tokens > room:
            if room < SECTION_MIN_TOKENS:
                self.sections_dropped += 1
                return 0
            marker = truncation_marker(tokens)
            keep = room - message_tokens((TextBlock(text=marker),), self.counter) - 2
            while True:
                head = len(truncate_text(text, keep, self.counter))
                if whole_lines and head < len(text) and text[head] != "\n":
                    head = max(0, text.rfind("\n", 0, head))
                blocks = (TextBlock(text=mark_cut(text, head=head, marker=marker)),)
                tokens = message_tokens(blocks, self.counter)
                if tokens <= room or keep <= 0:
                    break
                keep -= tokens - room
            if tokens > room:
                self.sections_dropped += 1
                return 0
            truncated = True
        self.items.append(
            ContextItem(
                kind=kind,
                role="system",
                content=blocks,
                tokens=tokens,
                provenance=provenance,
                name=name,
                truncated=truncated,
            )
        )
        return tokens


def assemble_context(
    *,
    system: str | Sequence[SystemBlock] | None = None,
    tools: Sequence[Any] = (),
    user_context: ContextSection | _UserContextLike | None = None,
    sections: Sequence[ContextSection] = (),
    entities: Mapping[str, ActiveEntity] | Sequence[ActiveEntity] = (),
    recall: Sequence[RecallHit] = (),
    turns: Sequence[Turn] = (),
    current: str | Message | None = None,
    opening: Turn | Message | None = None,
    state: str | None = None,
    model: str | ModelSpec | None = None,
    budget: int | None = None,
    allocation: Allocation | None = None,
    session_id: str | None = None,
    total_turns: int | None = None,
    counter: TokenCounter | None = None,
    models: ModelRegistry | None = None,
) -> ContextWindow:
    """Assemble a :class:`ContextWindow` from values; no I/O.

    ``system``: the static system prompt (text, or text blocks). ``tools``: the tool
    manifest (:class:`ToolDefinition`, mappings, or objects like
    :class:`tiermem.tools.ToolSpec`). ``user_context``: a profile section (placed as
    given), or :meth:`LongTermMemory.build_user_context`'s result, from which the
    preferences an active entity contradicts are left out
    (:func:`tiermem.longterm.context.override_by_entities`: the conversation overrides
    the profile, seed 001). ``sections``: rolling summaries and
    structured memory. ``entities``: the session's active entities. ``recall``: per-turn
    recall hits (hits of turns in ``turns`` are skipped). ``turns``: the hot window, oldest
    first. ``current``: the message being answered (a user message). ``opening``: a user
    message placed before ``turns`` when they start inside a task (with an assistant's
    turn or a tool result, which providers refuse as a conversation's first message):
    the task's opening user turn read from the archive, or a line saying the task
    continues (:func:`tiermem.session_context.opening_message`); it is never evicted.
    ``state``: the
    session's state block (``StateCoordinator.to_agent_context(...).text``: intent, slots,
    task, environment), placed after the active entities (seed 000 injects it into the
    system prompt), cut to the room left like the other sections. ``model`` and
    ``budget``: see the module docstring. ``total_turns``: the session's turn count, for
    the stats (default: one past the last hot turn's index).

    Raises:
        ValidationError: no budget and no model, a bad budget, model, allocation, system
            block, tool definition or current message, an assistant current message.
        UnknownModelError: ``model`` is not in the registry.
        BudgetExceededError: the system prompt and tool manifest, or the required
            messages even truncated, do not fit the budget.
    """
    counter = counter if counter is not None else TiktokenCounter()
    allocation = _allocation(allocation)
    if model is not None and not isinstance(model, str | ModelSpec):
        raise ValidationError(
            f"model must be a model id string or a ModelSpec, got {type(model).__name__}"
        )
    spec = (models or default_registry()).get(model) if isinstance(model, str) else model
    total_budget = resolve_budget(budget, spec)
    buffer = math.floor(total_budget * allocation.buffer)
    memory_cap = math.floor(total_budget * allocation.memory)
    fill = total_budget - buffer
    b = _Builder(counter)

    # 1. Static: system prompt and tool manifest.
    static_texts = _system_texts(system)
    manifest = _manifest(tools)
    static_used = 0
    if static_texts:
        tokens = message_tokens(static_texts, counter)
        b.items.append(
            ContextItem(kind="system", role="system", content=static_texts, tokens=tokens)
        )
        static_used += tokens
    if manifest:
        manifest_json = json.dumps(
            [t.canonical() for t in manifest], sort_keys=True, ensure_ascii=False
        )
        static_used += b.add("tools", manifest_json, ItemProvenance())
    if static_used > total_budget:
        raise BudgetExceededError(
            f"the system prompt and tool manifest take {static_used} tokens, over the whole "
            f"budget of {total_budget}; shorten them or raise the budget"
        )
    static_end = len(b.items) - 1

    # 2. The conversation, prepared first: derived memory must leave the required turns room.
    current_message = _current(current)
    if current_message is not None and current_message.role != "user":
        raise ValidationError("the current message is the user's: its role must be 'user'")
    lead = _opening(opening)
    offset = 0 if lead is None else 1  # the opening goes first
    raw = [t.content for t in turns] + ([current_message.content] if current_message else [])
    if lead is not None:
        raw.insert(0, lead.content)
    closed = close_orphans(raw, open_last=current_message is None)
    lead_cut = False
    if lead is not None:
        cap = max(SECTION_MIN_TOKENS, math.floor(total_budget * allocation.hot) // OPENING_SHARE)
        if message_tokens(closed[0], counter) > cap:
            closed[0], lead_cut = _cut_opening(closed[0], cap, counter), True
    planned = [
        PlannedMessage(
            role=t.role,
            content=closed[i],
            turn_index=t.index,
            tokens=message_tokens(closed[i], counter),
            importance=t.importance,
            pinned=t.pinned,
        )
        for i, t in enumerate(turns, offset)
    ]
    if lead is not None:
        planned.insert(
            0,
            PlannedMessage(
                role="user",
                content=closed[0],
                turn_index=lead.index if isinstance(lead, Turn) else None,
                tokens=message_tokens(closed[0], counter),
                pinned=True,
            ),
        )
    if current_message is not None:
        planned.append(
            PlannedMessage(
                role="user",
                content=closed[-1],
                turn_index=None,
                tokens=message_tokens(closed[-1], counter),
                pinned=True,
            )
        )
    required = required_tokens(planned)

    # 3. Derived memory, in layout order, within its share -- plus whatever of the hot
    # share the conversation does not need (a short hot window must not leave the budget
    # empty while summaries crowd recall out).
    hot_need = sum(m.tokens for m in planned)
    spare_hot = max(0, math.floor(total_budget * allocation.hot) - hot_need)
    memory_room = max(0, min(memory_cap + spare_hot, fill - static_used - required))
    used = 0

    def room() -> int:
        return memory_room - used

    entity_list = list(entities.values()) if isinstance(entities, Mapping) else list(entities)
    profile: ContextSection | None = None
    profile_ids: set[str] = set()
    overridden: frozenset[str] = frozenset()
    if user_context is not None:
        profile, overridden = _profile_section(user_context, entity_list, counter)
        profile_ids = {*profile.provenance.memory_ids, *overridden}
    hot_indexes = {t.index for t in turns}
    if isinstance(lead, Turn):
        hot_indexes.add(lead.index)
    seen: set[tuple[str, str]] = set()
    fresh_hits = []
    # Hits of the profile's own lines: left out while the profile shows them; back in if
    # the budget cuts them from it (not those the conversation overrides).
    profile_hits: list[RecallHit] = []
    for hit in sorted(recall, key=lambda h: -h.score):
        in_hot = (
            hit.kind == "turn"
            and hit.turn is not None
            and hit.turn.index in hot_indexes
            and (hit.session_id is None or hit.session_id == session_id)
        )
        in_profile = hit.kind == "memory" and hit.doc_id in profile_ids
        if in_hot or in_profile or (hit.kind, hit.doc_id) in seen:
            if in_profile and not in_hot and hit.doc_id not in overridden:
                profile_hits.append(hit)
            continue
        seen.add((hit.kind, hit.doc_id))
        fresh_hits.append(hit)
    # Recall answers this turn's question: when there are hits, the profile and summaries
    # leave it at least a quarter of the room (what it does not use goes to hot turns).
    recall_reserve = 0
    if fresh_hits:
        wanted, _ = plan_recall_block(fresh_hits, memory_room, counter)
        recall_reserve = min(sum(i.tokens for i in wanted), memory_room // 4)
    summaries = [s for s in sections if s.kind == "summary"]
    structured = [s for s in sections if s.kind == "structured_memory"]
    slow = ([profile] if profile is not None else []) + summaries
    # Structured memory is placed after the slow block (layout) but, when it fits whole,
    # served first: a few hundred tokens holding every slot's current value, where a
    # summary cut short loses facts. The profile and summaries share what it leaves. When
    # it does not fit whole, layout order: a summary cut short kept more facts than the
    # list cut short (bench/context_facts.py at 512 tokens).
    reserved = sum(message_tokens((TextBlock(text=s.text),), counter) for s in structured)
    if reserved > room():
        reserved = 0
    for section in slow:
        used += b.add(
            section.kind,
            section.text,
            section.provenance,
            name=section.name,
            room=room() - reserved - recall_reserve,
            # A preference cut within its line can say the opposite ("likes horror, not"):
            # the profile loses whole lines, least important first.
            whole_lines=section is profile,
        )
    slow_end = len(b.items) - 1
    profile_cut: tuple[str, ...] = ()
    if profile is not None and user_context is not None:
        profile_cut = _cut_from_profile(b, user_context, overridden)
        back = [h for h in profile_hits if h.doc_id in profile_cut]
        if back:
            for hit in back:
                seen.add((hit.kind, hit.doc_id))
            fresh_hits = sorted([*fresh_hits, *back], key=lambda h: -h.score)
    for section in structured:
        used += b.add(
            section.kind, section.text, section.provenance, name=section.name, room=room()
        )
    if entity_list:
        lines = [ENTITIES_HEADER] + [f"{e.kind}: {e.value}" for e in entity_list]
        provenance = ItemProvenance(
            tier="hot",
            session_id=session_id,
            turn_indexes=tuple(
                sorted({e.turn_index for e in entity_list if e.turn_index is not None})
            ),
        )
        used += b.add("entities", "\n".join(lines), provenance, room=room())
    if state:
        if not isinstance(state, str):
            raise ValidationError(
                "state is the text of the session's state block (StateCoordinator."
                f"to_agent_context(...).text), got {type(state).__name__}"
            )
        state_provenance = ItemProvenance(tier="session", session_id=session_id)
        used += b.add("state", state, state_provenance, room=room())
    recall_items, recall_dropped = plan_recall_block(fresh_hits, room(), counter)
    for item in recall_items:
        used += b.add("recall", item.text, item.provenance, name=item.name)
    recall_kept = (
        len(fresh_hits) - recall_dropped - sum(1 for h in fresh_hits if h.neighbour_of is not None)
    )

    # 4. Hot turns and the current message.
    plan = plan_eviction(
        planned,
        optional_room=max(0, fill - static_used - used),
        required_room=total_budget - static_used - used,
        counter=counter,
    )
    messages: list[tuple[str, tuple[ContentBlock, ...]]] = []
    truncated_set = set(plan.truncated)
    if lead_cut:
        truncated_set.add(0)
    kept = _from_a_user_message(plan.kept, planned, plan.content)
    evicted = sorted((*plan.evicted, *plan.kept[: len(plan.kept) - len(kept)]))
    current_at = len(planned) - 1 if current_message is not None else None
    for position in kept:
        message = planned[position]
        is_turn = position != current_at
        tier: SourceTier = "hot" if is_turn else "request"
        if position < offset:  # the opening: an archived turn, or the continuation line
            tier = "archive" if message.turn_index is not None else "session"
        b.items.append(
            ContextItem(
                kind="turn" if is_turn else "current",
                role=message.role,
                content=plan.content[position],
                tokens=plan.tokens[position],
                provenance=ItemProvenance(
                    tier=tier,
                    session_id=session_id,
                    turn_indexes=(message.turn_index,) if message.turn_index is not None else (),
                ),
                truncated=position in truncated_set,
            )
        )
        messages.append((message.role, plan.content[position]))

    return _window(
        b,
        static_end=static_end,
        slow_end=slow_end,
        manifest=manifest,
        messages=_merge_messages(messages),
        total_budget=total_budget,
        spec=spec,
        stats_extra={
            "total_turns": total_turns
            if total_turns is not None
            else (turns[-1].index + 1 if turns else 0),
            "allocation_tokens": {
                "hot": total_budget - buffer - memory_cap,
                "memory": memory_cap,
                "buffer": buffer,
            },
            "hot_turns": len(turns),
            "kept_turns": sum(1 for i in kept if i >= offset and i != current_at),
            "evicted_count": len(evicted),
            "evicted_turn_indexes": tuple(
                planned[i].turn_index for i in evicted if planned[i].turn_index is not None
            ),
            "truncated_turn_indexes": tuple(
                planned[i].turn_index for i in plan.truncated if planned[i].turn_index is not None
            ),
            "current_truncated": current_at in truncated_set,
            "recall_hits": recall_kept,
            "recall_dropped": recall_dropped,
            "sections_dropped": b.sections_dropped,
            "profile_cut": profile_cut,
            "structured_memory": _structured_counts(structured),
        },
    )


def _cut_opening(
    blocks: Sequence[ContentBlock], cap: int, counter: TokenCounter
) -> tuple[ContentBlock, ...]:
    """An opening's ``blocks`` cut to ``cap`` tokens; a short text last (the marker of the
    turns not shown, :func:`~tiermem.session_context.opening_message`) is kept whole."""
    last = blocks[-1] if len(blocks) > 1 else None
    if type(last) is TextBlock and counter.count(last.text) <= SECTION_MIN_TOKENS:
        head = truncate_content(blocks[:-1], cap - counter.count(last.text) - 2, counter)
        return (*head, last)
    return truncate_content(blocks, cap, counter)


def _opening(opening: object) -> Turn | Message | None:
    if opening is None:
        return None
    if not isinstance(opening, Turn | Message):
        raise ValidationError(f"opening must be a Turn or a Message, got {type(opening).__name__}")
    if opening.role != "user" or any(type(b) is ToolResultBlock for b in opening.content):
        raise ValidationError(
            "opening opens the conversation: it must be a user's message without tool results"
        )
    return opening


def _from_a_user_message(
    kept: Sequence[int],
    planned: Sequence[PlannedMessage],
    content: Mapping[int, tuple[ContentBlock, ...]],
) -> Sequence[int]:
    """``kept`` from its first user message that answers no tool call: Bedrock Converse
    refuses a conversation that starts with the assistant, and every provider a tool
    result without its call. Eviction can cut a window there (it drops the oldest
    groups); the turns before such a start go, which loses less than a refused request.
    A message eviction may not drop (pinned, grouped with one) is never dropped here
    either: then ``kept`` stays as it is, as it does when no message can start it."""
    required = required_positions(planned)
    for at, position in enumerate(kept):
        message = planned[position]
        if message.role == "user" and not any(
            type(block) is ToolResultBlock for block in content[position]
        ):
            return kept[at:]
        if position in required:
            break
    return kept


def _structured_counts(sections: Sequence[ContextSection]) -> dict[str, int] | None:
    if not sections:
        return None
    counts: dict[str, int] = {}
    for section in sections:
        for key, value in section.counts.items():
            counts[key] = counts.get(key, 0) + value
    return counts


def _window(
    b: _Builder,
    *,
    static_end: int,
    slow_end: int,
    manifest: tuple[ToolDefinition, ...],
    messages: list[Message],
    total_budget: int,
    spec: ModelSpec | None,
    stats_extra: dict[str, Any],
) -> ContextWindow:
    items = b.items
    system: list[SystemBlock] = []
    cache_points: list[CachePoint] = []
    prefix: list[Any] = []
    has_static_text = False
    for position, item in enumerate(items):
        if item.role != "system":
            break
        if item.kind == "tools":
            prefix.append({"tools": [t.canonical() for t in manifest]})
        else:
            if position <= slow_end:
                prefix.append({item.kind: item.text})
            system.extend(b for b in item.content if isinstance(b, TextBlock))
            has_static_text = has_static_text or item.kind == "system"
        if position == static_end:
            cache_points.append(
                CachePoint(name="static", after_item=position, fingerprint=_fingerprint(prefix))
            )
            if has_static_text:
                system.append(CachePointBlock())
        elif position == slow_end and position > static_end:
            cache_points.append(
                CachePoint(name="slow", after_item=position, fingerprint=_fingerprint(prefix))
            )
            system.append(CachePointBlock())
    total = sum(item.tokens for item in items)
    if total > total_budget:  # pragma: no cover -- the plan guarantees it; kept as a guard
        raise BudgetExceededError(
            f"assembled {total} tokens over the budget of {total_budget}; this is a bug"
        )
    by_kind: dict[str, int] = {}
    summary_tiers: dict[str, int] = {}
    for item in items:
        by_kind[item.kind] = by_kind.get(item.kind, 0) + item.tokens
        if item.kind == "summary":
            key = item.name or "summary"
            summary_tiers[key] = summary_tiers.get(key, 0) + item.tokens
    stats = ContextStats(
        total_tokens=total,
        budget_tokens=total_budget,
        context_window_percent=round(
            100 * total / (spec.context_window if spec is not None else total_budget), 2
        ),
        tokens_by_tier=by_kind,
        summary_active=bool(summary_tiers),
        summary_tiers=summary_tiers,
        **stats_extra,
    )
    return ContextWindow(
        system=tuple(system),
        tools=manifest,
        messages=tuple(messages),
        items=tuple(items),
        cache_points=tuple(cache_points),
        prefix_fingerprint=cache_points[-1].fingerprint if cache_points else _fingerprint([]),
        tools_cache_point=bool(manifest) and not has_static_text and static_end >= 0,
        budget_tokens=total_budget,
        total_tokens=total,
        stats=stats,
    )
