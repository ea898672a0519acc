"""LLM-backed summarization engines: :class:`LLMSummarizer` and :class:`LLMStructuredExtractor`.

Both send raw turns (``[turn 12] user: ...``) with a JSON schema and read the reply
tolerantly: a missing or malformed field is treated as absent, never as a crash, and a
value the model invented for a turn that was not in the request is dropped. What they keep
is said in the prompts, not left to the model's taste:

* keep names, titles, ids, numbers, prices, dates, preferences, decisions and open
  questions exactly as written;
* a correction supersedes the value it corrects: only the latest value is stated as
  current;
* never invent: nothing that the turns (or the prior summary) do not say.

A model that fails after its adapter's retries raises
:class:`~tiermem.llm.chat.ModelFailedError`; the summarization job logs it and leaves the
previous summary in place (see :mod:`tiermem.summaries.jobs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tiermem.llm.chat import ChatMessage, ChatModel
from tiermem.models.base import JsonValue
from tiermem.models.turns import Turn
from tiermem.summaries.models import Fact, Item, StructuredMemory

__all__ = [
    "EXTRACT_SCHEMA",
    "SUMMARY_SCHEMA",
    "LLMStructuredExtractor",
    "LLMSummarizer",
    "render_turns",
]

MAX_TURN_CHARS = 4_000
"""A turn longer than this is cut in the prompt (a large tool output says little per
character); the archive keeps it whole."""

SUMMARY_SCHEMA: Mapping[str, JsonValue] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "description": "the summary, plain prose"},
    },
    "required": ["summary"],
}

EXTRACT_SCHEMA: Mapping[str, JsonValue] = {
    "type": "object",
    "properties": {
        "entities": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"type": "string"},
                    "value": {"type": "string"},
                    "turn": {"type": "integer"},
                },
            },
        },
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "slot": {"type": "string"},
                    "value": {"type": "string"},
                    "turn": {"type": "integer"},
                },
            },
        },
        "decisions": {"type": "array"},
        "goals": {"type": "array"},
        "unresolved": {"type": "array"},
    },
}

_SUMMARY_SYSTEM = """You summarize a conversation between a user and an assistant.
Write plain prose of at most {target} tokens, covering only the turns given.
Keep, exactly as written: names of people, places and things; titles, series and volume
numbers; order ids, product ids, prices, budgets, dates and quantities; the user's stated
preferences; decisions taken; questions or requests that are still open.
When the user corrected something, state only the corrected (latest) value as current.
Never invent anything the turns do not say. Drop greetings, thanks and filler.
Answer with one JSON object: {{"summary": "..."}}."""

_EXTRACT_SYSTEM = """You extract structured memory from a conversation.
Return one JSON object with these arrays (leave an array empty when nothing applies):
- entities: {{"kind", "value", "turn"}} for named things in play (series, volume, order_id,
  asin, isbn, price, date, person, place, product...);
- facts: {{"slot", "value", "turn"}} for other facts about the user or the task (budget,
  name, address, "preference:<topic>"...);
- decisions, goals, unresolved: {{"text", "turn"}} (unresolved = requests or questions not
  answered yet).
"turn" is the number in [turn N] of the turn that said it. Copy values exactly as written.
When a later turn corrects a value, give only the latest value for that kind or slot.
Never invent anything the turns do not say."""


def render_turns(turns: Sequence[Turn]) -> str:
    """Turns as prompt text: one ``[turn N] role: text`` paragraph each, long ones cut."""
    lines = []
    for turn in turns:
        text = turn.text.strip()
        if len(text) > MAX_TURN_CHARS:
            text = text[:MAX_TURN_CHARS] + " […]"
        lines.append(f"[turn {turn.index}] {turn.role}: {text}")
    return "\n\n".join(lines)


class LLMSummarizer:
    """:class:`~tiermem.summaries.models.SessionSummarizer` over a chat model."""

    def __init__(self, model: ChatModel, *, max_output_tokens: int = 2048) -> None:
        self.model = model
        self.name = f"llm:{model.name}"
        self.max_output_tokens = max_output_tokens

    async def summarize(
        self,
        turns: Sequence[Turn],
        *,
        prior: str | None = None,
        target_tokens: int,
        must_keep: Sequence[str] = (),
    ) -> str:
        """The model's summary; ``""`` when it returned no usable text (nothing to say).

        Raises:
            ModelFailedError: the model failed after its retries.
        """
        if not turns:
            return ""
        parts = []
        if prior:
            parts.append(
                "Summary of the conversation before these turns (context only; do not "
                f"repeat it):\n{prior}"
            )
        parts.append(f"Turns to summarize:\n{render_turns(turns)}")
        if must_keep:
            listed = "\n".join(f"- {item}" for item in must_keep)
            parts.append(
                "A previous summary lost these items. State each of them, as written:\n" + listed
            )
        reply = await self.model.complete(
            [ChatMessage("user", "\n\n".join(parts))],
            system=_SUMMARY_SYSTEM.format(target=target_tokens),
            json_schema=SUMMARY_SCHEMA,
            max_tokens=min(self.max_output_tokens, max(64, target_tokens * 2)),
        )
        data = reply.data or {}
        summary = data.get("summary")
        return summary.strip() if isinstance(summary, str) else ""


class LLMStructuredExtractor:
    """:class:`~tiermem.summaries.models.StructuredExtractor` over a chat model: the model
    reads the new turns; merging into ``prior`` (latest value wins, the old one moves to
    ``previous``) is done here, so the model never rewrites what it was not shown."""

    def __init__(self, model: ChatModel, *, max_output_tokens: int = 2048) -> None:
        self.model = model
        self.name = f"llm:{model.name}"
        self.max_output_tokens = max_output_tokens

    async def extract(
        self, turns: Sequence[Turn], *, prior: StructuredMemory | None = None
    ) -> StructuredMemory:
        """``prior`` updated with what the model found in ``turns``.

        Raises:
            ModelFailedError: the model failed after its retries.
        """
        base = prior or StructuredMemory()
        if not turns:
            return base
        reply = await self.model.complete(
            [ChatMessage("user", f"Turns:\n{render_turns(turns)}")],
            system=_EXTRACT_SYSTEM,
            json_schema=EXTRACT_SCHEMA,
            max_tokens=self.max_output_tokens,
        )
        data = reply.data or {}
        indexes = {t.index for t in turns}
        last = turns[-1].index
        entities = dict(base.entities)
        for kind, value, turn in _triples(data.get("entities"), "kind", indexes, last):
            entities[kind] = _updated(entities.get(kind), kind, value, turn)
        facts = dict(base.facts)
        for slot, value, turn in _triples(data.get("facts"), "slot", indexes, last):
            facts[slot] = _updated(facts.get(slot), slot, value, turn)
        return StructuredMemory(
            entities=entities,
            facts=facts,
            decisions=_merged(base.decisions, data.get("decisions"), indexes, last),
            goals=_merged(base.goals, data.get("goals"), indexes, last),
            unresolved=_merged(base.unresolved, data.get("unresolved"), indexes, last),
            through_index=max(base.through_index, last),
        )


def _turn_of(raw: object, indexes: set[int], last: int) -> int:
    # A turn number the model made up (or left out) is attributed to the last turn given.
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw in indexes else last


def _triples(
    raw: JsonValue | None, key: str, indexes: set[int], last: int
) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    if not isinstance(raw, list):
        return out
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        name, value = entry.get(key), entry.get("value")
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(name, str) or not isinstance(value, str):
            continue
        if name.strip() and value.strip():
            out.append((name.strip(), value.strip(), _turn_of(entry.get("turn"), indexes, last)))
    out.sort(key=lambda t: t[2])  # oldest first, so a correction lands last
    return out


def _updated(held: Fact | None, slot: str, value: str, turn: int) -> Fact:
    if held is None:
        return Fact(slot=slot, value=value, turn_index=turn)
    if held.value == value:
        return held
    previous = tuple(p for p in held.previous if p != held.value)
    return Fact(slot=slot, value=value, turn_index=turn, previous=(*previous, held.value))


def _merged(
    held: tuple[Item, ...], raw: JsonValue | None, indexes: set[int], last: int
) -> tuple[Item, ...]:
    items = list(held)
    seen = {i.text.casefold() for i in held}
    if not isinstance(raw, list):
        return held
    for entry in raw:
        if isinstance(entry, str):
            text, turn = entry, last
        elif isinstance(entry, dict) and isinstance(entry.get("text"), str):
            text, turn = str(entry["text"]), _turn_of(entry.get("turn"), indexes, last)
        else:
            continue
        text = text.strip()
        if text and text.casefold() not in seen:
            seen.add(text.casefold())
            items.append(Item(text=text, turn_index=turn))
    return tuple(items)
