"""Pure policies: values in, values out, no I/O and no clock reads.

* :mod:`~tiermem.policies.importance` — how much a turn is worth keeping.
* :mod:`~tiermem.policies.phrases` — finding whole phrases in English and Japanese text.
* :mod:`~tiermem.policies.ttl` — when a session's hot state expires.
"""

from tiermem.policies.importance import (
    DEFAULT_IMPORTANCE_RULES,
    ImportanceRules,
    ImportanceScore,
    ImportanceScorer,
    RuleImportanceScorer,
    score_importance,
)
from tiermem.policies.phrases import PhraseIndex, TextView
from tiermem.policies.ttl import (
    SEED_TTL_TABLE,
    ActivityTtl,
    FixedTtl,
    HybridTtl,
    SlidingTtl,
    TierTtl,
    TierTtlTable,
    TtlEvent,
    TtlPolicy,
)

__all__ = [
    "DEFAULT_IMPORTANCE_RULES",
    "SEED_TTL_TABLE",
    "ActivityTtl",
    "FixedTtl",
    "HybridTtl",
    "ImportanceRules",
    "ImportanceScore",
    "ImportanceScorer",
    "PhraseIndex",
    "RuleImportanceScorer",
    "SlidingTtl",
    "TextView",
    "TierTtl",
    "TierTtlTable",
    "TtlEvent",
    "TtlPolicy",
    "score_importance",
]
