"""Turn analysis: what is computed from a new turn's content before it is written.

:func:`analyse_turn` counts a turn's tokens, extracts its entities, scores its importance
and, for a user turn, detects the memories in it, reading the text once: one
:class:`~tiermem.policies.turn_text.TurnText` is shared by every engine, and the rule
engines read only its rule window (the first 8,000 and last 4,000 characters, see
:mod:`tiermem.policies.turn_text`). The token count reads everything and is exact: it is the
context budget. With ``index_terms``, the search terms of the whole text are computed from
the same normal form.

Everything here is pure and safe to run in a worker thread (the engines are stateless, and
the token counter is thread-safe). :func:`analyse_turn_async` is what a coroutine calls: it
runs the analysis in place for a turn of up to :data:`LARGE_TURN_CHARS` characters and in a
worker thread (``asyncio.to_thread``) above, so that a pasted document does not stall the
event loop for every other session. Rules hold the GIL while they run, so the thread does
not make them faster; it lets the loop take turns with it (every 5 ms by default) instead of
waiting for all of it. Token counting (tiktoken) releases the GIL.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tiermem.errors import ValidationError
from tiermem.longterm.text import doc_terms
from tiermem.models.content import DocumentBlock, TextBlock, ToolResultBlock, text_of
from tiermem.models.turns import Entity
from tiermem.policies.importance import ImportanceScore, ImportanceScorer
from tiermem.policies.turn_text import TurnText
from tiermem.tokens import TiktokenCounter

if TYPE_CHECKING:
    from tiermem.extraction.entities import EntityExtractor
    from tiermem.longterm.detect import DetectedMemory, MemoryDetector
    from tiermem.tokens import TokenCounter

__all__ = [
    "LARGE_TURN_CHARS",
    "TurnAnalysis",
    "analyse_text_block",
    "analyse_turn",
    "analyse_turn_async",
    "is_large_turn",
]

LARGE_TURN_CHARS = 4_000
"""Above this many characters of text, :func:`analyse_turn_async` analyses a turn in a
worker thread. Up to it the analysis takes at most about 1 ms of CPU, 2 ms with memory
detection (a 1,000-character turn: 0.3 and 0.6 ms), which the loop can afford; a turn of
16,000 characters takes 3 and 7 ms, which it cannot. Measured with ``bench/large_turn.py``'s
text on a 2-CPU machine."""


@dataclass(frozen=True)
class TurnAnalysis:
    """What :func:`analyse_turn` found in one turn."""

    text: TurnText
    """The turn's text, as every engine read it."""
    token_count: int
    """Exact tokens of the content (text, plus the estimates for images and documents)."""
    entities: tuple[Entity, ...]
    importance: ImportanceScore | None
    """None when no scorer was given (the caller set the importance itself)."""
    drafts: tuple[DetectedMemory, ...] = ()
    """Memories detected in a user turn, when a detector was given."""
    terms: Counter[str] | None = None
    """Search terms of the whole text (:func:`tiermem.longterm.text.doc_terms`), when asked."""


def analyse_turn(
    role: str,
    blocks: tuple[Any, ...] | list[Any],
    *,
    tokens: TokenCounter,
    entities: EntityExtractor,
    importance: ImportanceScorer | None,
    detector: MemoryDetector | None = None,
    index_terms: bool = False,
) -> TurnAnalysis:
    """Analyse one turn's content blocks; pure and safe to run in a worker thread.

    ``importance`` None skips scoring (the caller gives the score); ``detector`` None skips
    memory detection (it runs on user turns with text only); ``index_terms`` computes the
    search terms of the whole text. One scored text block with neither is
    :func:`analyse_text_block`'s (for the built-in engines, inlined:
    :func:`~tiermem.extraction.plain_analysis.analyse_plain_text`); the same analysis.

    Raises:
        ValidationError: a role other than ``"user"`` or ``"assistant"``, or no blocks.
    """
    if role not in ("user", "assistant"):
        raise ValidationError(f"role must be 'user' or 'assistant', got {role!r}")
    if not blocks:
        raise ValidationError("a turn needs at least one content block")
    content = tuple(blocks)
    single = len(content) == 1 and type(content[0]) is TextBlock
    if single and importance is not None and detector is None and not index_terms:
        # One text block, scored, nothing else asked (most turns given as blocks): what
        # ``add_turn`` of a string does, inlined for the built-in engines.
        if is_plain_analysis(tokens, entities, importance):
            # The exact built-in classes (checked): mypy cannot narrow three at once.
            return analyse_plain_text(
                role,
                content,
                tokens,  # type: ignore[arg-type]
                entities,  # type: ignore[arg-type]
                importance,  # type: ignore[arg-type]
            )
        return analyse_text_block(role, content, tokens, entities, importance)
    text = TurnText.of_blocks(content)
    found = entities.extract(text)
    score = importance.score(role, content, entities=found, text=text) if importance else None
    drafts: tuple[DetectedMemory, ...] = ()
    if detector is not None and role == "user" and text.said_text.strip():
        drafts = detector.detect(text)
    if type(tokens) is TiktokenCounter:
        # ``count_blocks``, with the text ``text_of`` would build again (a tool output's
        # join, a tool call's JSON) taken from ``text``, which holds it.
        token_count = tokens.count(text.text)
        if not single:
            token_count += tokens._non_text_tokens(content)
    else:
        token_count = tokens.count_blocks(content)
    # ``TurnAnalysis(...)`` in one step: a frozen dataclass's ``__init__`` sets each field
    # with ``object.__setattr__``, and this runs for every turn.
    analysis = _new(TurnAnalysis)
    _set(
        analysis,
        "__dict__",
        {
            "text": text,
            "token_count": token_count,
            "entities": found,
            "importance": score,
            "drafts": drafts,
            "terms": doc_terms(text) if index_terms else None,
        },
    )
    return analysis


def analyse_text_block(
    role: str,
    blocks: tuple[TextBlock],
    tokens: TokenCounter,
    entities: EntityExtractor,
    importance: ImportanceScorer,
) -> TurnAnalysis:
    """:func:`analyse_turn` of a checked role and one text block, scored, with no memory
    detection or search terms: every plain ``add_turn``, without the general path's
    checks and dispatch (the caller checked the role; the block is one)."""
    text = TurnText.of(blocks[0].text)
    found = entities.extract(text)
    analysis = _new(TurnAnalysis)
    _set(
        analysis,
        "__dict__",
        {
            "text": text,
            "token_count": tokens.count_blocks(blocks),
            "entities": found,
            "importance": importance.score(role, blocks, entities=found, text=text),
            "drafts": (),
            "terms": None,
        },
    )
    return analysis


_new = object.__new__
_set = object.__setattr__


async def analyse_turn_async(
    role: str,
    blocks: tuple[Any, ...] | list[Any],
    *,
    tokens: TokenCounter,
    entities: EntityExtractor,
    importance: ImportanceScorer | None,
    detector: MemoryDetector | None = None,
    index_terms: bool = False,
) -> TurnAnalysis:
    """:func:`analyse_turn`, in a worker thread when :func:`is_large_turn`. Raises what
    :func:`analyse_turn` raises."""
    if not is_large_turn(blocks):
        return analyse_turn(
            role,
            blocks,
            tokens=tokens,
            entities=entities,
            importance=importance,
            detector=detector,
            index_terms=index_terms,
        )
    return await asyncio.to_thread(
        analyse_turn,
        role,
        blocks,
        tokens=tokens,
        entities=entities,
        importance=importance,
        detector=detector,
        index_terms=index_terms,
    )


def is_large_turn(blocks: tuple[Any, ...] | list[Any]) -> bool:
    """Whether the content holds over :data:`LARGE_TURN_CHARS` characters to read: its
    text (:func:`~tiermem.models.text_of`) plus the bytes of inline documents, whose text
    is counted too."""
    if len(blocks) == 1 and type(blocks[0]) is TextBlock:
        return len(blocks[0].text) > LARGE_TURN_CHARS  # most turns
    return len(text_of(blocks)) + _document_bytes(blocks) > LARGE_TURN_CHARS


def _document_bytes(blocks: tuple[Any, ...] | list[Any]) -> int:
    total = 0
    for block in blocks:
        if isinstance(block, DocumentBlock) and block.data is not None:
            total += len(block.data)
        elif isinstance(block, ToolResultBlock):
            total += _document_bytes(block.content)
    return total


# Last: ``plain_analysis`` builds this module's ``TurnAnalysis`` (the package imports this
# module first, so the class exists when it is read there).
from tiermem.extraction.plain_analysis import (  # noqa: E402
    analyse_plain_text,
    is_plain_analysis,
)
