"""Fact preservation of the offline summary engine against two baselines (issue #9).

Each run generates a 300-turn conversation (``tiermem.testing.conversations``: 30 planted
facts, 10 corrections, distractors, filler, tool calls with large outputs) and keeps a
bounded context of it four ways, all measured with ``tiermem.summaries.quality``:

* ``engine``: the offline engine as the rolling tiers call it — spans of 20 raw turns,
  each summarized by ``ExtractiveSummarizer`` with the prior summary as context
  (``target_tokens``), and structured memory updated by ``RuleStructuredExtractor``.
  What it keeps is the final summary + structured memory (rendered); its size in tokens
  is the budget the baselines get;
* ``last_n``: the last N whole turns, N as large as fits the same budget;
* ``fifo``: the transcript trimmed from the front, token by token, to the same budget;
* ``hot_window``: the last 20 turns, the default hot window, whatever their size
  (a reference: usually several times the budget, because of tool outputs).

The runs at each summary target use the generator's usual phrasings (the ones the slot
rules read); one more run, at the largest target, phrases half of the noun-slot statements
and corrections in ways the rules were not written for (``paraphrase``: "Put 150-0001 down
as my postcode.", "Change the budget to ¥8,000."), to show how the rules do outside their
phrase list.

Reported per method and configuration: preservation (share of planted facts whose latest
value is stated), stale rate (share of corrected facts with a superseded value presented
as current), distractor rate (share of distractors held as a slot's current value; only
structured memory can hold one), tokens, and the engine's CPU time per 20-turn span.
Writes ``bench/results/summaries.json`` and ``bench/results/summaries.png``::

    .venv/bin/python bench/summaries.py [--seeds 10] [--targets 200 400 800] [--paraphrase 0.5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tiktoken

from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock, text_of
from tiermem.models.turns import Turn
from tiermem.summaries.models import StructuredMemory
from tiermem.summaries.offline import ExtractiveSummarizer
from tiermem.summaries.quality import measure
from tiermem.summaries.structured import RuleStructuredExtractor, render_structured
from tiermem.testing.conversations import Conversation, generate_conversation
from tiermem.tokens import ENCODING_NAME, TiktokenCounter

RESULTS = Path(__file__).parent / "results"
SPAN = 20
COUNTER = TiktokenCounter()
ENCODING = tiktoken.get_encoding(ENCODING_NAME)


def render_turn(turn: Turn) -> str:
    """A turn as a transcript line, as a baseline would put it in a prompt."""
    who = "User" if turn.role == "user" else "Assistant"
    parts = []
    for block in turn.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(f"[calls {block.name} {json.dumps(block.input, ensure_ascii=False)}]")
        elif isinstance(block, ToolResultBlock):
            who = "Tool"
            parts.append(text_of(block.content))
    return f"{who}: " + "\n".join(parts)


def last_n(turns: Sequence[Turn], budget: int) -> str:
    kept: list[str] = []
    used = 0
    for turn in reversed(turns):
        line = render_turn(turn)
        cost = COUNTER.count(line) + 1
        if used + cost > budget:
            break
        kept.append(line)
        used += cost
    return "\n".join(reversed(kept))


def fifo(turns: Sequence[Turn], budget: int) -> str:
    transcript = "\n".join(render_turn(t) for t in turns)
    tokens = ENCODING.encode(transcript, disallowed_special=())
    return ENCODING.decode(tokens[-budget:]) if budget > 0 else ""


def run_engine(conv: Conversation, target: int) -> tuple[str, StructuredMemory, float]:
    extractor = RuleStructuredExtractor(conv.known_titles)
    summarizer = ExtractiveSummarizer(COUNTER, extractor=extractor)
    turns = conv.indexed()
    text: str | None = None
    structured: StructuredMemory | None = None
    spent: list[float] = []
    for start in range(0, len(turns), SPAN):
        span = turns[start : start + SPAN]
        began = time.process_time()
        text = summarizer.summarize_sync(span, prior=text, target_tokens=target)
        structured = extractor.extract_sync(span, prior=structured)
        spent.append(time.process_time() - began)
    assert text is not None
    assert structured is not None
    return text, structured, statistics.fmean(spent) * 1000


def distractor_rate(conv: Conversation, structured: StructuredMemory | None) -> float:
    if not conv.distractors or structured is None:
        return 0.0
    held = 0
    for distractor in conv.distractors:
        fact = structured.entities.get(distractor.slot) or structured.facts.get(distractor.slot)
        held += fact is not None and distractor.value in fact.value
    return held / len(conv.distractors)


def one_run(seed: int, domain: str, target: int, paraphrase: float) -> dict[str, Any]:
    conv = generate_conversation(
        seed,
        turns=300,
        facts=30,
        corrections=10,
        domain=domain,  # type: ignore[arg-type]
        paraphrase=paraphrase,
    )
    turns = conv.indexed()
    source = sum(COUNTER.count_blocks(t.content) for t in turns)
    text, structured, ms_per_span = run_engine(conv, target)
    rendered = render_structured(structured)
    budget = COUNTER.count(text) + 1 + COUNTER.count(rendered)
    extractor = RuleStructuredExtractor(conv.known_titles).entities
    windows = {
        "engine": (text, structured),
        "engine_text_only": (text, None),
        "engine_structured_only": ("", structured),
        "last_n": (last_n(turns, budget), None),
        "fifo": (fifo(turns, budget), None),
        "hot_window": ("\n".join(render_turn(t) for t in turns[-20:]), None),
    }
    out: dict[str, Any] = {
        "seed": seed,
        "domain": domain,
        "target": target,
        "paraphrase": paraphrase,
        "source_tokens": source,
        "budget_tokens": budget,
        "engine_ms_per_span": ms_per_span,
    }
    sizes = {"engine": budget, "engine_structured_only": COUNTER.count(rendered)}
    for name, (window_text, memory) in windows.items():
        tokens = sizes.get(name) or COUNTER.count(window_text)
        report = measure(
            conv.facts,
            summary_text=window_text,
            structured=memory,
            source_tokens=source,
            summary_tokens=tokens,
            extractor=extractor,
        )
        out[name] = {
            "preservation": report.preservation,
            "stale_rate": report.stale_rate,
            "distractor_rate": distractor_rate(conv, memory),
            "tokens": tokens,
            "lost": list(report.lost),
            "stale": list(report.stale),
        }
    return out


METHODS = ("engine", "engine_text_only", "engine_structured_only", "last_n", "fifo", "hot_window")


def config_name(target: int, paraphrase: float) -> str:
    return f"target={target} paraphrase={paraphrase:g}"


def aggregate(runs: list[dict[str, Any]], configs: Sequence[tuple[int, float]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for target, paraphrase in configs:
        mine = [r for r in runs if r["target"] == target and r["paraphrase"] == paraphrase]
        row: dict[str, Any] = {
            "budget_tokens_mean": statistics.fmean(r["budget_tokens"] for r in mine),
            "engine_ms_per_span_mean": statistics.fmean(r["engine_ms_per_span"] for r in mine),
        }
        for method in METHODS:
            values = [r[method] for r in mine]
            row[method] = {
                "preservation_mean": statistics.fmean(v["preservation"] for v in values),
                "preservation_min": min(v["preservation"] for v in values),
                "stale_rate_mean": statistics.fmean(v["stale_rate"] for v in values),
                "stale_rate_max": max(v["stale_rate"] for v in values),
                "distractor_rate_mean": statistics.fmean(v["distractor_rate"] for v in values),
                "tokens_mean": statistics.fmean(v["tokens"] for v in values),
                "runs_with_loss": sum(1 for v in values if v["lost"]),
            }
        table[config_name(target, paraphrase)] = row
    return table


def plot(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = list(table)
    methods = ("engine", "engine_text_only", "last_n", "fifo")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        xs = [t + (i - (len(methods) - 1) / 2) * width for t in range(len(targets))]
        axes[0].bar(
            xs, [table[t][method]["preservation_mean"] for t in targets], width, label=method
        )
        axes[1].bar(xs, [table[t][method]["stale_rate_mean"] for t in targets], width, label=method)
    for ax, title in zip(axes, ("fact preservation (latest values)", "stale rate"), strict=True):
        ax.set_xticks(range(len(targets)))
        ax.set_xticklabels(
            [
                t.replace(" ", "\n") + f"\n(budget ≈{table[t]['budget_tokens_mean']:.0f})"
                for t in targets
            ],
            fontsize=7,
        )
        ax.set_ylim(0, 1.05)
        ax.set_title(title)
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle("300 turns, 30 facts, 10 corrections: offline engine vs baselines (same budget)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--targets", type=int, nargs="+", default=[200, 400, 800])
    parser.add_argument(
        "--paraphrase",
        type=float,
        default=0.5,
        help="share of held-out phrasings in the extra run at the largest target",
    )
    args = parser.parse_args()
    configs = [(t, 0.0) for t in args.targets]
    if args.paraphrase > 0:
        configs.append((max(args.targets), args.paraphrase))
    runs = [
        one_run(seed, domain, target, paraphrase)
        for target, paraphrase in configs
        for domain in ("manga", "assistant")
        for seed in range(args.seeds)
    ]
    table = aggregate(runs, configs)
    RESULTS.mkdir(exist_ok=True)
    result = {
        "benchmark": "summaries",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "setup": {
            "turns": 300,
            "facts": 30,
            "corrections": 10,
            "span": SPAN,
            "seeds_per_domain": args.seeds,
            "domains": ["manga", "assistant"],
            "targets": args.targets,
            "paraphrase_run": args.paraphrase,
        },
        "summary": table,
        "runs": runs,
    }
    (RESULTS / "summaries.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
    plot(table, RESULTS / "summaries.png")
    for target, row in table.items():
        print(
            f"{target}: budget ≈ {row['budget_tokens_mean']:.0f} tokens, "
            f"engine {row['engine_ms_per_span_mean']:.1f} ms CPU per span"
        )
        for method in METHODS:
            m = row[method]
            print(
                f"  {method:24} preservation {m['preservation_mean']:.3f} "
                f"(min {m['preservation_min']:.3f})  stale {m['stale_rate_mean']:.3f} "
                f"distractors {m['distractor_rate_mean']:.3f}  tokens {m['tokens_mean']:.0f}"
            )


if __name__ == "__main__":
    main()
