"""Extraction from turns: entities now; structured memory and preferences to come.

The rule engines here run on every turn's hot path, so they take no LLM call and no I/O.
"""

from tiermem.extraction.entities import (
    DEFAULT_ENTITY_RULES,
    EntityExtractor,
    EntityRule,
    PhraseRule,
    RuleEntityExtractor,
    extract_entities,
)

__all__ = [
    "DEFAULT_ENTITY_RULES",
    "EntityExtractor",
    "EntityRule",
    "PhraseRule",
    "RuleEntityExtractor",
    "extract_entities",
]
