"""Where redis-server's instructions per turn go (issue #8), from two callgrind replays.

``bench/redis_script_replay.sh`` replays a capture of N turns and one of M turns on a
private redis-server under callgrind; this reads both profiles and splits the difference,
per turn, into the parts of a script call: request and reply handling, ``EVALSHA``'s own
dispatch, the ``KEYS``/``ARGV`` tables, the commands a script runs and what ``redis.call``
costs around them, Lua's string library, ``tonumber``, ``cjson``, ``struct``, garbage
collection, closures, and the Lua interpreter's own work (the rest of the script's
time: bytecode, tables, concatenation). The parts are callgrind's inclusive counts of the
functions named below, so they overlap a little (a garbage-collection step can start
inside any allocation); "Lua, the rest" is what the script's time leaves after the others.

A stripped redis-server (Debian's) names few of these functions; build one with symbols
with ``bench/redis_server_symbols.sh`` and replay on it (``REDIS_SERVER=...``)::

    dir=$(bench/redis_server_symbols.sh)
    PYTHONPATH=src:bench python bench/redis_script_replay.py capture \\
        --redis-url redis://127.0.0.1:6379/0 --turns 500 --out /tmp/c500.pkl   # and 2500
    REDIS_SERVER=$dir/redis-server bench/redis_script_replay.sh "$PWD" /tmp/c500.pkl /tmp/rs-500
    REDIS_SERVER=$dir/redis-server bench/redis_script_replay.sh "$PWD" /tmp/c2500.pkl /tmp/rs-2500
    python bench/redis_server_profile.py --long /tmp/rs-2500 --short /tmp/rs-500 --turns 2000

Add ``--skip NAME`` to both replays to take a script out (the difference between two
such runs is that script's share), or pass ``--label`` to name the row.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

from workload import RESULTS, write_results

_LINE = re.compile(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(?:\S*:)?([^\s:]+) ")

STRING_LIBRARY = (
    "str_find_aux",  # string.find and string.match
    "str_sub",
    "str_format",
    "str_gsub",
    "gmatch_aux",
    "str_rep",
    "str_byte",
    "str_char",
    "str_len",
    "str_lower",
    "str_upper",
)
CLOSURES = ("luaF_newLclosure", "luaF_findupval", "luaF_close", "luaF_freeclosure")


def inclusive(directory: Path) -> dict[str, int]:
    """Each function's inclusive instructions in the callgrind profile in ``directory``."""
    (profile,) = directory.glob("cg.*")
    text = subprocess.run(  # noqa: S603 -- valgrind's own tool on our profile
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(profile)],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[str, int] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            name, value = match.group(2), int(match.group(1).replace(",", ""))
            counts[name] = max(counts.get(name, 0), value)
    return counts


def split(long: dict[str, int], short: dict[str, int], turns: int) -> dict[str, float]:
    """The parts, in instructions per turn (serverCron, driven by the wall clock, out)."""

    def per_turn(*names: str) -> float:
        return sum(long.get(n, 0) - short.get(n, 0) for n in names) / turns

    missing = [n for n in ("luaCallFunction", "luaRedisGenericCommand") if n not in long]
    if missing:
        raise SystemExit(
            f"the profile does not name {', '.join(missing)}: replay on a redis-server "
            "with symbols (bench/redis_server_symbols.sh)"
        )
    total = per_turn("main") - per_turn("serverCron")
    script = per_turn("luaCallFunction")
    parts = {
        "request and reply handling (outside the command)": per_turn("aeProcessEvents.part.0")
        - per_turn("processCommand")
        - per_turn("serverCron"),
        "EVALSHA dispatch (outside the script)": per_turn("processCommand") - script,
        "KEYS and ARGV tables": per_turn("luaCreateArray"),
        "script reply to RESP": per_turn("luaReplyToRedisReply"),
        "redis.call: the commands": per_turn("call'2"),
        "redis.call: arguments and replies": per_turn("luaRedisGenericCommand")
        - per_turn("call'2"),
        "Lua string library": per_turn(*STRING_LIBRARY),
        "tonumber": per_turn("luaB_tonumber"),
        "cjson": per_turn("json_decode", "json_encode"),
        "struct": per_turn("b_pack", "b_unpack"),
        "garbage collection": per_turn("luaC_step", "lua_gc"),
        "closures": per_turn(*CLOSURES),
    }
    accounted = sum(
        v
        for k, v in parts.items()
        if not k.startswith(("request", "EVALSHA"))  # those are outside the script
    )
    parts["Lua, the rest (bytecode, tables, concatenation, calls)"] = script - accounted
    parts["other (outside the event loop)"] = total - sum(parts.values()) if total else 0.0
    return {"total": round(total), **{k: round(v) for k, v in parts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=Path, required=True, help="the longer replay's dir")
    parser.add_argument("--short", type=Path, required=True, help="the shorter replay's dir")
    parser.add_argument("--turns", type=int, required=True, help="long turns - short turns")
    parser.add_argument("--label", default="redis+redis, plain turn")
    parser.add_argument("--out", type=Path, default=RESULTS / "redis_server_profile.json")
    args = parser.parse_args()
    row = {"label": args.label, **split(inclusive(args.long), inclusive(args.short), args.turns)}
    for key, value in row.items():
        print(f"{value:>10}  {key}" if isinstance(value, int) else f"{'':>10}  {value}")
    previous = json.loads(args.out.read_text())["results"] if args.out.exists() else []
    rows = [r for r in previous if r.get("label") != args.label] + [row]
    write_results(args.out, rows, unit="redis-server instructions per turn")


if __name__ == "__main__":
    main()
