"""Large-turn benchmark: the CPU a 200 KB turn costs, and how long it holds the event loop.

Measures, on one deterministic 200 KB turn (English prose with entities, preferences and
some Japanese, like a pasted chat log):

* each engine alone, through its plain-string entry point (``time.process_time``, best of
  ``--repeat``): token counting, entity rules, importance, memory detection, and the search
  tokenizer; the service used to run all of them on the event loop;
* where :func:`tiermem.extraction.analyse_turn` exists: the whole analysis, and the event
  loop's share when a coroutine runs it inline or awaits ``analyse_turn_async``: the loop
  thread's CPU (``time.thread_time``, best run) and the longest gap a 1 ms heartbeat task
  saw (wall-clock, median run: noisy on a shared machine).

The engine rows run on older trees too, to compare before and after::

    .venv/bin/python bench/large_turn.py --label after
    git archive <rev> src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/src .venv/bin/python bench/large_turn.py --label before

Each run is merged into ``bench/results/large_turn.json`` under its label.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.longterm.detect import RuleMemoryDetector
from tiermem.longterm.text import tokenize
from tiermem.models import TextBlock
from tiermem.policies.importance import RuleImportanceScorer
from tiermem.tokens import TiktokenCounter

RESULTS = Path(__file__).parent / "results"
COUNTER = TiktokenCounter()
SENTENCES = [
    "I think Berserk vol 42 was better than vol 41, honestly.",
    "The order ORD-{n} shipped on 2024-0{m}-1{m} for ¥1,{k} total.",
    "Do you have the ISBN 978-4-08-851234-1 edition in stock?",
    "My friend likes horror but I prefer seinen these days.",
    "好きなジャンルはセイネンです。ベルセルク{m}巻はありますか？",
    "Here is the log line: status=ok latency={k}ms user=u-{n} path=/api/v1/items.",
    "Actually, I meant the hardcover, not the paperback.",
    "It was a long day and the weather was nice, so we walked to the shop.",
]


def large_text(size_bytes: int, seed: int = 7) -> str:
    """Paragraphs of six sentences each, until the UTF-8 text reaches ``size_bytes``."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    size = 0
    while size < size_bytes:
        paragraph = " ".join(
            rng.choice(SENTENCES).format(
                n=rng.randint(10_000, 99_999), m=rng.randint(1, 9), k=rng.randint(100, 999)
            )
            for _ in range(6)
        )
        paragraphs.append(paragraph)
        size += len(paragraph.encode()) + 2
    return "\n\n".join(paragraphs)


def cpu_ms(work: Callable[[], object], repeat: int) -> float:
    """Best-of-``repeat`` CPU time of ``work``, in milliseconds."""
    work()  # warm caches (compiled patterns, tiktoken)
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return round(best * 1000, 2)


def engines(text: str, repeat: int) -> dict[str, float]:
    blocks = (TextBlock(text=text),)
    counter = COUNTER
    extractor = RuleEntityExtractor()
    scorer = RuleImportanceScorer()
    detector = RuleMemoryDetector()
    entities = extractor.extract(text)
    rows = {
        "tokens": cpu_ms(lambda: counter.count_blocks(blocks), repeat),
        "entities": cpu_ms(lambda: extractor.extract(text), repeat),
        "importance": cpu_ms(lambda: scorer.score("user", blocks, entities=entities), repeat),
        "detection": cpu_ms(lambda: detector.detect(text), repeat),
        "index_tokenize": cpu_ms(lambda: tokenize(text), repeat),
    }
    rows["sum"] = round(sum(rows.values()), 2)
    return rows


async def loop_share(text: str, *, threaded: bool, heartbeat: bool) -> float:
    """The loop thread's CPU (``heartbeat`` off), or the longest gap a 1 ms heartbeat task
    saw (on), while a coroutine analyses ``text``; in milliseconds."""
    from tiermem.extraction import analyse_turn, analyse_turn_async

    blocks = (TextBlock(text=text),)
    engines: dict[str, Any] = {
        "tokens": COUNTER,
        "entities": RuleEntityExtractor(),
        "importance": RuleImportanceScorer(),
        "detector": RuleMemoryDetector(),
        "index_terms": True,
    }
    gaps: list[float] = [0.0]
    done = asyncio.Event()

    async def beat() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(beat()) if heartbeat else None
    await asyncio.sleep(0.01)
    start = time.thread_time()
    if threaded:
        await analyse_turn_async("user", blocks, **engines)
    else:
        analyse_turn("user", blocks, **engines)
    loop_cpu = time.thread_time() - start
    await asyncio.sleep(0.01)
    done.set()
    if task is not None:
        await task
    return round((max(gaps) if heartbeat else loop_cpu) * 1000, 2)


def analysis(text: str, repeat: int) -> dict[str, Any] | None:
    try:
        from tiermem.extraction import analyse_turn
    except ImportError:  # a tree from before analyse_turn
        return None
    blocks = (TextBlock(text=text),)
    counter, extractor = COUNTER, RuleEntityExtractor()
    scorer, detector = RuleImportanceScorer(), RuleMemoryDetector()

    def run(index_terms: bool) -> object:
        return analyse_turn(
            "user",
            blocks,
            tokens=counter,
            entities=extractor,
            importance=scorer,
            detector=detector,
            index_terms=index_terms,
        )

    def share(threaded: bool, heartbeat: bool) -> float:
        runs = [
            asyncio.run(loop_share(text, threaded=threaded, heartbeat=heartbeat))
            for _ in range(repeat)
        ]
        # CPU: the best run; stalls are wall-clock and noisy on a shared machine: the median.
        return min(runs) if not heartbeat else statistics.median(runs)

    return {
        "analyse_turn_ms": cpu_ms(lambda: run(False), repeat),
        "analyse_turn_with_index_terms_ms": cpu_ms(lambda: run(True), repeat),
        "loop_cpu_ms": {"inline": share(False, False), "analyse_turn_async": share(True, False)},
        "loop_max_stall_ms": {
            "inline": share(False, True),
            "analyse_turn_async": share(True, True),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after", help="key of this run in the results")
    parser.add_argument("--bytes", type=int, default=200_000, help="size of the turn")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "large_turn.json"))
    args = parser.parse_args()
    text = large_text(args.bytes)
    run: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "turn": {"chars": len(text), "bytes": len(text.encode())},
        "engines_cpu_ms": engines(text, args.repeat),
    }
    found = analysis(text, args.repeat)
    if found is not None:
        run["analysis"] = found
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out.read_text()) if out.exists() else {}
    results[args.label] = run
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(run, indent=2, ensure_ascii=False))
    print(f"wrote {out} [{args.label}]")


if __name__ == "__main__":
    main()
