"""CPU of the turn analysis alone (``analyse_turn``: tokens, entities, importance), by kind
of turn, on the conversation workload (``workload.py``): plain text turns, tool calls and
tool outputs (catalogue rows: an ASIN, an ISBN, a price and a volume a row), with the
engines a default service builds. Also prints what a tool output yields: entity matches,
distinct entities, and the keys the extractor left unbuilt.

    python bench/turn_analysis_cpu.py [--turns 3000] [--passes 3]

Process CPU time, the best of ``--passes`` passes (each after one warm-up pass): a probe for
the piece, not the turn; ``bench/turn_cpu.py --workload conversation`` measures the turn.
Under callgrind, the difference of two runs with different ``--passes`` is that many
passes' instructions.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tiermem.extraction.entities import RuleEntityExtractor
from tiermem.extraction.turn_analysis import analyse_turn
from tiermem.models.content import ToolResultBlock, ToolUseBlock
from tiermem.policies.importance import RuleImportanceScorer
from tiermem.policies.turn_text import TurnText
from tiermem.session import content_blocks
from tiermem.tokens import TiktokenCounter
from workload import workload_turns


def _kind(blocks: tuple[Any, ...]) -> str:
    if any(isinstance(b, ToolResultBlock) for b in blocks):
        return "tool_output"
    if any(isinstance(b, ToolUseBlock) for b in blocks):
        return "tool_call"
    return "text"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=3_000)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    tokens, entities, importance = TiktokenCounter(), RuleEntityExtractor(), RuleImportanceScorer()
    by_kind: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
    for role, content in workload_turns("conversation", args.turns):
        blocks = content_blocks(content)
        by_kind.setdefault(_kind(blocks), []).append((role, blocks))
    for kind, turns in sorted(by_kind.items()):
        best = float("inf")
        for n in range(args.passes + 1):
            start = time.process_time()
            for role, blocks in turns:
                analyse_turn(role, blocks, tokens=tokens, entities=entities, importance=importance)
            if n:  # the first pass warms up
                best = min(best, time.process_time() - start)
        print(f"{kind:>11}: {len(turns):5} turns, {1e6 * best / len(turns):8.1f} µs CPU/turn")
    outputs = [TurnText.of_blocks(blocks) for _, blocks in by_kind.get("tool_output", [])]
    if outputs:
        matches = sum(len(entities.find(text)) for text in outputs) / len(outputs)
        found = sum(len(entities.extract(text)) for text in outputs) / len(outputs)
        unbuilt = sum(text.view._keys is None for text in outputs)
        chars = sum(len(text.text) for text in outputs) / len(outputs)
        print(
            f"tool outputs: {chars:.0f} chars, {matches:.1f} entity matches, "
            f"{found:.1f} distinct entities each; keys left unbuilt in {unbuilt} of "
            f"{len(outputs)}"
        )


if __name__ == "__main__":
    main()
