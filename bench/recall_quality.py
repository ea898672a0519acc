"""Per-turn recall quality on the multi-session fixture (``tiermem.testing.recall_fixture``:
20 users × 6 dated sessions × 60 turns, 280 questions with recorded evidence turns).

For each question and budget (512 / 2k / 4k tokens): is every evidence turn in the
assembled context, by provenance? Three methods through the same harness
(``tiermem.testing.recall_harness``): the last-N window, the hot window plus BM25 over raw
turns, and the hot window plus the recall engine. The sessions are summarized as they load
(offline engines, as the service does) and the engine also searches earlier sessions'
summary lines. Then ablations at 2k (each idea of the engine switched alone).

**Expired variant** (run ``expired``): the same fixture with turns kept 24 h and summaries
30 days, as the service keeps them, asked at the same time: every earlier session's raw
turns are gone, for every method. Reported: the three methods, the engine without summary
lines and without structured items, and the share of questions whose evidence is still
there at all (live turns or named by a stored summary line), the ceiling of any method.

With ``--embeddings``, the engine also runs hybrid with the local all-MiniLM-L6-v2 (every
turn embedded once at index time, batched; a query embeds itself). Writes
``bench/results/recall_quality.json`` and ``.png``::

    python bench/recall_quality.py [--conversations 20] [--embeddings]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tiermem.longterm.recall_context import ContextRecallPolicy
from tiermem.testing.recall_fixture import generate_recall_fixture
from tiermem.testing.recall_harness import METHODS, RECALL_K, evaluate_recall_quality
from workload import RESULTS, write_results

BUDGETS = (512, 2048, 4096)


class CachedEmbedder:
    """Remembers vectors by text, so the second fusion run does not embed the fixture again."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.model_id = inner.model_id
        self.dimensions = inner.dimensions
        self._cache: dict[str, list[float]] = {}

    async def embed(self, texts: list[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for text, vector in zip(missing, await self._inner.embed(missing), strict=True):
                self._cache[text] = vector
        return [self._cache[t] for t in texts]


ABLATIONS: dict[str, dict[str, Any]] = {
    "no date resolution": {"dates": False},
    "with second hop (off by default)": {"second_hop": True},
    "no neighbours": {"neighbours": False},
    "no diversity (no per-session cap)": {"per_session": RECALL_K},
    "no summary lines (earlier sessions' summaries not searched)": {"summaries": False},
}


def plot(shares: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(shares)
    for i, (method, by_budget) in enumerate(shares.items()):
        xs = [j + i * width for j in range(len(BUDGETS))]
        ax.bar(xs, [by_budget[str(b)] * 100 for b in BUDGETS], width, label=method)
    ax.set_xticks([j + width * (len(shares) - 1) / 2 for j in range(len(BUDGETS))])
    ax.set_xticklabels([f"{b} tokens" for b in BUDGETS])
    ax.set_ylabel("questions with all evidence in context (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Per-turn recall, multi-session fixture")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--embeddings", action="store_true")
    args = parser.parse_args()
    fixture = generate_recall_fixture(args.conversations)
    started = time.perf_counter()
    cache: dict[object, object] = {}  # each variant loaded and summarized once
    report = await evaluate_recall_quality(fixture, budgets=BUDGETS, cache=cache)
    main_json = report.to_json()
    print(json.dumps(main_json["share"]))
    results: list[dict[str, Any]] = [{"run": "main", **main_json}]
    base = ContextRecallPolicy(k=RECALL_K)
    ablations: dict[str, float] = {"engine (all on)": report.share("engine", 2048)}
    for name, change in ABLATIONS.items():
        ablated = await evaluate_recall_quality(
            fixture, budgets=(2048,), policy=replace(base, **change), cache=cache
        )
        ablations[name] = round(ablated.share("engine", 2048), 4)
        print(name, ablations[name])
    results.append({"run": "ablations_at_2048", "engine_share": ablations})
    unsummarized = await evaluate_recall_quality(fixture, budgets=BUDGETS, summaries=False)
    results.append({"run": "main_without_summarizing", **unsummarized.to_json()})
    print("without summarizing", json.dumps(unsummarized.to_json()["share"]))

    expired = await evaluate_recall_quality(fixture, budgets=BUDGETS, expired=True, cache=cache)
    expired_json = expired.to_json()
    no_lines = await evaluate_recall_quality(
        fixture,
        budgets=BUDGETS,
        expired=True,
        policy=replace(base, summaries=False),
        cache=cache,
    )
    no_items = await evaluate_recall_quality(
        fixture, budgets=BUDGETS, expired=True, structured=False
    )
    results.append(
        {
            "run": "expired",
            **expired_json,
            "engine_without_summaries": no_lines.to_json()["share"]["engine"],  # type: ignore[index]
            "engine_without_structured_items": no_items.to_json()["share"]["engine"],  # type: ignore[index]
        }
    )
    print("expired", json.dumps(expired_json["share"]), expired_json["evidence_available"])
    print("expired, engine without summaries", json.dumps(no_lines.to_json()["share"]["engine"]))  # type: ignore[index]
    print("expired, no structured items", json.dumps(no_items.to_json()["share"]["engine"]))  # type: ignore[index]
    shares = {m: main_json["share"][m] for m in METHODS}  # type: ignore[index]
    if args.embeddings:
        from tiermem.llm.embeddings_local import LocalMiniLMEmbedder

        embedder = CachedEmbedder(LocalMiniLMEmbedder())  # each text embedded once
        for fusion in ("convex", "rrf"):
            t0 = time.perf_counter()
            hybrid = await evaluate_recall_quality(
                fixture, budgets=BUDGETS, embedder=embedder, fusion=fusion
            )
            hybrid_json = hybrid.to_json()
            results.append(
                {
                    "run": f"hybrid_minilm_{fusion}",
                    "seconds": round(time.perf_counter() - t0, 1),
                    **hybrid_json,
                }
            )
            shares[f"engine + MiniLM ({fusion})"] = hybrid_json["share"]["engine"]  # type: ignore[index]
            print("hybrid", fusion, json.dumps(hybrid_json["share"]), flush=True)
    write_results(
        RESULTS / "recall_quality.json",
        results,
        fixture=(
            f"{args.conversations} users x 6 dated sessions x 60 turns, "
            f"{report.questions} questions (tiermem.testing.recall_fixture, seeds 0..)"
        ),
        budgets=list(BUDGETS),
        recall_k=RECALL_K,
        hot_turns=20,
        seconds=round(time.perf_counter() - started, 1),
    )
    plot(shares, RESULTS / "recall_quality.png")


if __name__ == "__main__":
    asyncio.run(main())
