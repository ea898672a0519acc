#!/bin/bash
# Instructions per turn of bench/turn_cpu.py (issue #8), every thread counted, as the
# README's and docs/performance.md's instruction counts are measured: two runs under
# valgrind's callgrind, a long one and a short one, and per turn = (long - short) /
# (long turns - short turns), so start-up and shutdown cancel. <tree>'s src goes first on
# PYTHONPATH (compare two checkouts with one venv).
#
# Kept steady on purpose: PYTHONHASHSEED=0 (with random hashing the start-up's dict
# lookups differ between the two runs by up to ~17M instructions, ±8k a turn over 2,000
# turns) and OPENBLAS_NUM_THREADS=1 (numpy's BLAS threads, started by the optional
# embeddings import, spin under valgrind: ±15k a turn). The embedded pairing's checkpoint
# and group-commit batching depend on timing, which valgrind changes: a few k a turn.
#
# usage: bench/turn_callgrind.sh <tree> <pairing> [long turns=4500] [short turns=500] [turn_cpu.py args...]
#   e.g. bench/turn_callgrind.sh . embedded
#        bench/turn_callgrind.sh /tmp/old memory+memory 4500 500 --summaries
#        bench/turn_callgrind.sh . embedded 4500 500 --loop uvloop
#        bench/turn_callgrind.sh . redis+redis 2500 500   (needs TIERMEM_TEST_REDIS_URL;
#            the client process only, through bench/redis_turn_cpu.py)
set -euo pipefail
tree=$(cd "$1" && pwd); pairing=$2; long=${3:-4500}; short=${4:-500}
shift $(( $# < 4 ? $# : 4 ))
bench=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
if [ "$pairing" = redis+redis ]; then
  # The client process only (redis-server runs natively): bench/redis_turn_cpu.py.
  : "${TIERMEM_TEST_REDIS_URL:?set it (or run under TIERMEM_TEST_SERVICES_ONLY=1 scripts/test.sh)}"
  probe=("$tree/bench/redis_turn_cpu.py" --redis-url "$TIERMEM_TEST_REDIS_URL")
else
  probe=("$tree/bench/turn_cpu.py" --pairing "$pairing")
fi
total() {
  PYTHONHASHSEED=0 OPENBLAS_NUM_THREADS=1 PYTHONPATH="$tree/src:$tree/bench" \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1" \
    "$bench/../.venv/bin/python" "${probe[@]}" --turns "$1" \
    --out "$out/turn_cpu.$1.json" "${@:2}" > "$out/log.$1" 2>&1 \
    || { echo "turn_cpu.py failed: $out/log.$1" >&2; tail -5 "$out/log.$1" >&2; exit 1; }
  grep -m1 '^summary:' "$out/cg.$1" | awk '{print $2}'
}
a=$(total "$long" "$@"); b=$(total "$short" "$@")
echo "$tree $pairing $* long=$long:$a short=$short:$b per_turn=$(( (a - b) / (long - short) )) (files in $out)"
