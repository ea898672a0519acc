"""Summaries and structured memory: rolling tiers made from raw turns, validated, committed
off the response path, handed off to long-term memory and rolled up over weeks and months.

See ``docs/summaries.md`` for the design. The parts:

* :mod:`~tiermem.summaries.models` -- what a summary is, and the two engine protocols;
* engines: the offline :class:`~tiermem.summaries.offline.ExtractiveSummarizer` and
  :class:`~tiermem.summaries.structured.RuleStructuredExtractor` (default), or
  :class:`~tiermem.summaries.llm_engine.LLMSummarizer` and
  :class:`~tiermem.summaries.llm_engine.LLMStructuredExtractor` over a chat model;
* :mod:`~tiermem.summaries.rolling` -- tiers, triggers, quality-aware compression;
* :mod:`~tiermem.summaries.validate` -- the closed loop;
* :mod:`~tiermem.summaries.jobs` -- records, watermarks, idempotent jobs;
* :mod:`~tiermem.summaries.handoff` -- session handoff into long-term memory;
* :mod:`~tiermem.summaries.rollup` -- progressive roll-up of session summaries;
* :mod:`~tiermem.summaries.patterns` -- habits observed across sessions, kept by the roll-up.
"""

from tiermem.summaries.handoff import HANDOFF_RECORD, SessionHandoff
from tiermem.summaries.jobs import (
    STRUCTURED_RECORD,
    SUMMARY_RECORD,
    WATERMARKS_RECORD,
    JobOutcome,
    SessionSummaries,
    SummaryJobs,
    Watermarks,
)
from tiermem.summaries.llm_engine import LLMStructuredExtractor, LLMSummarizer
from tiermem.summaries.models import (
    Fact,
    Item,
    SessionSummarizer,
    StructuredExtractor,
    StructuredMemory,
    SummaryText,
    SummaryTier,
)
from tiermem.summaries.patterns import PatternPolicy
from tiermem.summaries.rolling import Compression, SummaryPolicy, TierTargets
from tiermem.summaries.rollup import ProgressiveRollup, RollupPolicy, UserHistory
from tiermem.summaries.validate import PassQuality

__all__ = [
    "HANDOFF_RECORD",
    "STRUCTURED_RECORD",
    "SUMMARY_RECORD",
    "WATERMARKS_RECORD",
    "Compression",
    "Fact",
    "Item",
    "JobOutcome",
    "LLMStructuredExtractor",
    "LLMSummarizer",
    "PassQuality",
    "PatternPolicy",
    "ProgressiveRollup",
    "RollupPolicy",
    "SessionHandoff",
    "SessionSummaries",
    "SessionSummarizer",
    "StructuredExtractor",
    "StructuredMemory",
    "SummaryJobs",
    "SummaryPolicy",
    "SummaryText",
    "SummaryTier",
    "TierTargets",
    "UserHistory",
    "Watermarks",
]
