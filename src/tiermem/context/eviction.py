"""Which hot turns stay in the window when they do not all fit: the eviction plan.

Rules, in order:

1. Tool calls and their results stay or go together: eviction works on the groups of
   :func:`~tiermem.context.tool_pairs.tool_pair_groups`, never on single messages.
2. Required messages are never evicted: the first user turn of the window, the latest turn,
   pinned turns, the current message, and every message grouped with one of them.
3. Other groups are evicted lowest importance first (a group is as important as its most
   important turn), then oldest first, until the rest fits ``optional_room``; then the
   evicted groups that fit the room left come back, most important first, then newest
   (a large tool pair evicted to make room must not take three short turns with it).
4. If the required messages alone exceed ``required_room``, the largest are truncated
   (with a visible marker) until they fit; if even their minimal forms do not fit,
   :class:`~tiermem.errors.BudgetExceededError` is raised.

The plan is pure: token costs come from the counter, nothing is read or written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tiermem.context.tool_pairs import tool_pair_groups
from tiermem.context.truncate import message_tokens, minimum_tokens, truncate_content
from tiermem.errors import BudgetExceededError
from tiermem.models.content import ContentBlock, Role
from tiermem.tokens import TokenCounter

__all__ = ["EvictionPlan", "PlannedMessage", "plan_eviction", "required_tokens"]


@dataclass(frozen=True, slots=True)
class PlannedMessage:
    """One message offered to the plan: a hot turn (``turn_index`` set) or the current
    message (``turn_index`` None)."""

    role: Role
    content: tuple[ContentBlock, ...]
    turn_index: int | None
    tokens: int
    """Cost of the message (:func:`~tiermem.context.truncate.message_tokens`)."""
    importance: float = 0.5
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    """What stays, in the original order, with each kept message's content and cost."""

    kept: tuple[int, ...]
    """Positions in the offered list."""
    content: dict[int, tuple[ContentBlock, ...]]
    tokens: dict[int, int]
    evicted: tuple[int, ...]
    truncated: tuple[int, ...]

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens[i] for i in self.kept)


def required_positions(messages: Sequence[PlannedMessage]) -> set[int]:
    """Positions of the messages never evicted (rule 2 above)."""
    required = {i for i, m in enumerate(messages) if m.pinned or m.turn_index is None}
    turns = [i for i, m in enumerate(messages) if m.turn_index is not None]
    if turns:
        required.add(turns[-1])
    first_user = next((i for i in turns if messages[i].role == "user"), None)
    if first_user is not None:
        required.add(first_user)
    return required


def required_tokens(messages: Sequence[PlannedMessage]) -> int:
    """Tokens of the messages :func:`plan_eviction` never evicts, before truncation."""
    required = required_positions(messages)
    groups = tool_pair_groups([m.content for m in messages])
    return sum(messages[i].tokens for g in groups if required.intersection(g) for i in g)


def plan_eviction(
    messages: Sequence[PlannedMessage],
    *,
    optional_room: int,
    required_room: int,
    counter: TokenCounter,
) -> EvictionPlan:
    """Plan which of ``messages`` (hot turns oldest first, then the current message) fit.

    ``required_room`` is what required messages may use in all; ``optional_room`` (at most
    ``required_room``) bounds everything kept, required and optional together, unless the
    required messages alone already exceed it.

    Raises:
        BudgetExceededError: the required messages do not fit ``required_room`` even
            truncated to their minimal forms (their tool calls and a marker).
    """
    cost = {i: m.tokens for i, m in enumerate(messages)}
    groups = tool_pair_groups([m.content for m in messages])
    never = required_positions(messages)
    required_groups = [g for g in groups if never.intersection(g)]
    optional_groups = [g for g in groups if not never.intersection(g)]
    required = sorted(i for g in required_groups for i in g)

    content = {i: messages[i].content for i in range(len(messages))}
    truncated: list[int] = []
    used = sum(cost[i] for i in required)
    if used > required_room:
        used = _truncate_required(
            messages, required, content, cost, truncated, required_room, counter
        )

    room = max(optional_room, used) - used
    total_optional = sum(cost[i] for g in optional_groups for i in g)
    evicted: set[int] = set()
    if total_optional > room:
        # Lowest importance first, then oldest: evict until the rest fits.
        order = sorted(
            optional_groups,
            key=lambda g: (max(messages[i].importance for i in g), g[0]),
        )
        dropped: list[tuple[int, ...]] = []
        for group in order:
            if total_optional <= room:
                break
            evicted.update(group)
            dropped.append(group)
            total_optional -= sum(cost[i] for i in group)
        # Room the evictions left over (the last one evicted may have freed much more than
        # was needed): give it back to what fits, most important first, then newest.
        dropped.sort(key=lambda g: (-max(messages[i].importance for i in g), -g[0]))
        for group in dropped:
            group_cost = sum(cost[i] for i in group)
            if total_optional + group_cost <= room:
                evicted.difference_update(group)
                total_optional += group_cost
    kept = tuple(i for i in range(len(messages)) if i not in evicted)
    return EvictionPlan(
        kept=kept,
        content={i: content[i] for i in kept},
        tokens={i: cost[i] for i in kept},
        evicted=tuple(sorted(evicted)),
        truncated=tuple(sorted(truncated)),
    )


def _truncate_required(
    messages: Sequence[PlannedMessage],
    required: list[int],
    content: dict[int, tuple[ContentBlock, ...]],
    cost: dict[int, int],
    truncated: list[int],
    room: int,
    counter: TokenCounter,
) -> int:
    floor = {i: minimum_tokens(messages[i].content, counter) for i in required}
    if sum(min(floor[i], cost[i]) for i in required) > room:
        raise BudgetExceededError(
            f"the required messages (first user turn, latest turn, pinned turns, the current "
            f"message and their tool pairs: {len(required)} messages) need at least "
            f"{sum(min(floor[i], cost[i]) for i in required)} tokens truncated, but only "
            f"{room} are left after the system prompt and tool manifest; raise the budget, "
            "shorten the system prompt or tool manifest, or unpin turns"
        )
    used = sum(cost[i] for i in required)
    while used > room:
        # The largest message that can still shrink gives up what is missing.
        shrinkable = [i for i in required if cost[i] > floor[i]]
        if not shrinkable:  # every one is at its minimal form and the sum still exceeds
            raise BudgetExceededError(
                f"the required messages cannot be truncated below {used} tokens; "
                f"{room} are available. Raise the budget."
            )
        largest = max(shrinkable, key=lambda i: (cost[i], -i))
        target = max(floor[largest], cost[largest] - (used - room))
        new = truncate_content(messages[largest].content, target, counter)
        new_cost = message_tokens(new, counter)
        if new_cost >= cost[largest]:
            floor[largest] = cost[largest]  # cannot shrink further
            if not any(cost[i] > floor[i] for i in required):
                raise BudgetExceededError(
                    f"the required messages cannot be truncated below {used} tokens; "
                    f"{room} are available. Raise the budget."
                )
            continue
        content[largest] = new
        used -= cost[largest] - new_cost
        cost[largest] = new_cost
        if largest not in truncated:
            truncated.append(largest)
    return used
