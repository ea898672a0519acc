"""Extraction from turns: entities, and the analysis of a new turn that runs every engine.

The rule engines here run on every turn's hot path, so they take no LLM call and no I/O.
:func:`analyse_turn` reads a turn once for all of them (tokens, entities, importance,
memory detection); :func:`analyse_turn_async` moves large turns off the event loop.
"""

from tiermem.extraction.entities import (
    DEFAULT_ENTITY_RULES,
    EntityExtractor,
    EntityRule,
    PhraseRule,
    RuleEntityExtractor,
    extract_entities,
)
from tiermem.extraction.turn_analysis import (
    LARGE_TURN_CHARS,
    TurnAnalysis,
    analyse_turn,
    analyse_turn_async,
    is_large_turn,
)

__all__ = [
    "DEFAULT_ENTITY_RULES",
    "LARGE_TURN_CHARS",
    "EntityExtractor",
    "EntityRule",
    "PhraseRule",
    "RuleEntityExtractor",
    "TurnAnalysis",
    "analyse_turn",
    "analyse_turn_async",
    "extract_entities",
    "is_large_turn",
]
