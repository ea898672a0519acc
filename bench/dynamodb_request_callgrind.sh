#!/bin/bash
# Client instructions per DynamoDB request pair (a GetItem and a two-put TransactWriteItems,
# bench/dynamodb_requests.py) and per plain Redis + DynamoDB turn
# (bench/redis_turn_cpu.py --dynamodb-url), as docs/performance.md's session 21 counts them:
# each run twice under valgrind's callgrind, long and short, per unit = difference /
# (long - short), so start-up and warm-up cancel. <tree>'s src goes first on PYTHONPATH
# (compare two checkouts with one venv). Needs the servers: run it under scripts/test.sh
# (TIERMEM_TEST_SERVICES_ONLY=1), or set TIERMEM_TEST_REDIS_URL and TIERMEM_TEST_DYNAMODB_URL.
#
# usage: bench/dynamodb_request_callgrind.sh <tree> [requests|turns] [label] [asyncio|uvloop]
#   with a label, the result is also merged into bench/results/dynamodb_instructions.json
#   under that label (e.g. "before" and "after" for two trees); the last argument is the
#   turns' event loop (redis_turn_cpu.py --loop; asyncio by default).
set -euo pipefail
tree=$(cd "$1" && pwd); what=${2:-requests}; label=${3:-}; loop=${4:-asyncio}
[ "$what" = turns ] || [ "$loop" = asyncio ] || { echo "the loop applies to turns only" >&2; exit 2; }
[ -z "$label" ] || [ "$loop" = asyncio ] || label="$label ($loop)"  # kept apart in the JSON
bench=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
: "${TIERMEM_TEST_DYNAMODB_URL:?set it (or run under scripts/test.sh)}"
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-local} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-local}
total() {
  local n=$1 args
  if [ "$what" = requests ]; then
    args=("$bench/dynamodb_requests.py" --dynamodb-url "$TIERMEM_TEST_DYNAMODB_URL" --pairs "$n")
  else
    : "${TIERMEM_TEST_REDIS_URL:?set it (or run under scripts/test.sh)}"
    args=("$bench/redis_turn_cpu.py" --redis-url "$TIERMEM_TEST_REDIS_URL"
          --dynamodb-url "$TIERMEM_TEST_DYNAMODB_URL" --turns "$n" --out "$out/turns.$n.json" --loop "$loop")
  fi
  PYTHONHASHSEED=0 OPENBLAS_NUM_THREADS=1 PYTHONPATH="$tree/src:$bench" \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$n" \
    "$bench/../.venv/bin/python" "${args[@]}" > "$out/log.$n" 2>&1 \
    || { echo "run failed: $out/log.$n" >&2; tail -5 "$out/log.$n" >&2; exit 1; }
  grep -m1 '^summary:' "$out/cg.$n" | awk '{print $2}'
}
if [ "$what" = requests ]; then long=600 short=100; else long=400 short=100; fi
a=$(total "$long"); b=$(total "$short")
per=$(( (a - b) / (long - short) ))
echo "$tree $what long=$long:$a short=$short:$b per_unit=$per (files in $out)"
if [ -n "$label" ]; then
  "$bench/../.venv/bin/python" - "$bench/results/dynamodb_instructions.json" "$label" "$what" \
      "$tree" "$long" "$a" "$short" "$b" "$per" <<'PY'
import json, subprocess, sys
from pathlib import Path
path, label, what, tree, long, a, short, b, per = sys.argv[1:]
rev = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                     capture_output=True, text=True).stdout.strip() or None
file = Path(path)
data = json.loads(file.read_text()) if file.exists() else {}
data.setdefault(label, {})[what] = {
    "tree": tree, "rev": rev, "unit": "pair" if what == "requests" else "turn",
    "long": int(long), "long_instructions": int(a), "short": int(short),
    "short_instructions": int(b), "instructions_per_unit": int(per)}
file.write_text(json.dumps(data, indent=2) + "\n")
PY
fi
