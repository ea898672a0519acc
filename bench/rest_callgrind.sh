#!/bin/bash
# Server-side instructions per REST request, in process (issue #8): bench/rest_inprocess.py
# under valgrind's callgrind at two request counts, per request = (long - short) /
# (long requests - short requests), so start-up and shutdown cancel. <tree>'s src goes
# first on PYTHONPATH (compare two checkouts with one venv). PYTHONHASHSEED=0 and
# OPENBLAS_NUM_THREADS=1 as in bench/turn_callgrind.sh.
#
# usage: bench/rest_callgrind.sh <tree> <scenario: healthz|add_turn|library> [long=600] [short=200]
#   e.g. bench/rest_callgrind.sh . add_turn
set -euo pipefail
tree=$(cd "$1" && pwd); scenario=$2; long=${3:-600}; short=${4:-200}
bench=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
total() {
  PYTHONHASHSEED=0 OPENBLAS_NUM_THREADS=1 PYTHONPATH="$tree/src:$bench" \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1" \
    "$bench/../.venv/bin/python" "$bench/rest_inprocess.py" --requests "$1" \
    --scenarios "$scenario" > "$out/log.$1" 2>&1 \
    || { echo "rest_inprocess.py failed: $out/log.$1" >&2; tail -5 "$out/log.$1" >&2; exit 1; }
  grep -m1 '^summary:' "$out/cg.$1" | awk '{print $2}'
}
a=$(total "$long"); b=$(total "$short")
echo "$tree $scenario long=$long:$a short=$short:$b per_request=$(( (a - b) / (long - short) )) (files in $out)"
