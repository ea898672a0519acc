"""ContextStats.quality_metrics: the latest summarization pass's quality (seed 004's
``quality_metrics``), session 15. It was always ``{}``."""

from __future__ import annotations

import math

import pytest

from tiermem.service import MemoryService
from tiermem.session_context import quality_metrics
from tiermem.settings import TierMemSettings
from tiermem.summaries.validate import PassQuality

KEYS = {
    "context_retention",
    "first_attempt_retention",
    "entity_drift",
    "compression_ratio",
    "overall_score",
}


async def test_quality_metrics_are_empty_before_a_pass_and_the_last_pass_after() -> None:
    settings = TierMemSettings(hot_backend="memory", durable_backend="memory")
    async with MemoryService.from_settings(settings, auto_summarize=True) as memory:
        session = await memory.session(user_id="u-quality")
        await session.add_turn("user", "I prefer seinen. My budget is 8000 yen.")
        await memory.drain()
        assert (await session.context(budget=4_000)).stats.quality_metrics == {}
        for i in range(40):
            await session.add_turn("user", f"Is Berserk vol {i + 1} in stock? Order ORD-{i}.")
            await session.add_turn("assistant", f"Berserk vol {i + 1}: {i % 4} copies left.")
        await memory.drain()
        assert (await session.watermarks()).summarized_through > 0  # the passes ran

        window = await session.context(budget=4_000)
        quality = (await memory.summaries.read(session.id)).quality
        assert quality is not None
        metrics = window.stats.quality_metrics
        assert metrics
        assert set(metrics) <= KEYS
        assert "overall_score" in metrics
        shares = {key: value for key, value in metrics.items() if key != "compression_ratio"}
        assert all(0.0 <= value <= 1.0 for value in shares.values())
        assert metrics == quality_metrics(quality)
        if quality.fact_preservation is not None:
            assert metrics["context_retention"] == pytest.approx(
                quality.fact_preservation, abs=1e-4
            )
        if quality.entity_drift is not None:
            assert metrics["entity_drift"] == pytest.approx(quality.entity_drift, abs=1e-4)


@pytest.mark.parametrize(
    ("quality", "expected"),
    [
        (None, {}),
        (PassQuality(), {}),
        (
            PassQuality(fact_preservation_first=0.75, fact_preservation=1.0, entity_drift=0.2,
                        compression_ratio=0.18),
            {"context_retention": 1.0, "first_attempt_retention": 0.75, "entity_drift": 0.2,
             "compression_ratio": 0.18, "overall_score": 0.8},
        ),
        (
            PassQuality(fact_preservation_first=0.5, fact_preservation=0.9),
            {"context_retention": 0.9, "first_attempt_retention": 0.5, "overall_score": 0.9},
        ),
        (PassQuality(entity_drift=0.25), {"entity_drift": 0.25, "overall_score": 0.75}),
        (
            PassQuality(fact_preservation=0.94, entity_drift=0.067),
            {"context_retention": 0.94, "entity_drift": 0.067,
             "overall_score": round(0.94 * (1 - 0.067), 4)},
        ),
    ],
)  # fmt: skip
def test_quality_metrics_of_a_pass(quality: PassQuality | None, expected: dict[str, float]) -> None:
    metrics = quality_metrics(quality)
    assert metrics == expected
    assert all(math.isfinite(value) for value in metrics.values())
