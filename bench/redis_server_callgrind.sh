#!/bin/bash
# redis-server's instructions for N turns of a Redis + Redis service (issue #8), under
# callgrind: wall time on a shared machine is too noisy to compare scripts, instruction
# counts are not. Starts a private redis-server under valgrind on a unix socket, drives it
# with bench/redis_commandstats.py (no slowlog: it would be counted), shuts it down and
# prints the server's total instructions. The startup and the warm-up session are counted
# too, so compare differences: per turn = (total at 2500 turns - total at 500) / 2000,
# for the former and the current tree (its src is put first on PYTHONPATH).
#
# usage: bench/redis_server_callgrind.sh <tree> <turns> <out dir>
#   e.g. bench/redis_server_callgrind.sh "$PWD" 500 /tmp/cg-500
set -euo pipefail
tree=$1; turns=$2; out=$3
bench=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"; mkdir -p "$out"
sock=$out/redis.sock
valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" redis-server --port 0 \
  --unixsocket "$sock" --save '' --appendonly no --dir "$out" > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 1 200); do [ -S "$sock" ] && break; sleep 0.2; done
# The server runs ~50x slower under valgrind: a long socket timeout.
PYTHONHASHSEED=0 PYTHONPATH="$tree/src:$bench" "$bench/../.venv/bin/python" \
  "$bench/redis_commandstats.py" --redis-url "unix://$sock?db=0&socket_timeout=300" \
  --turns "$turns" --no-slowlog > "$out/driver.json" 2> "$out/driver.err" \
  || { echo "the driver failed: $out/driver.err"; tail -5 "$out/driver.err"; }
redis-cli -s "$sock" shutdown nosave > /dev/null 2>&1 || true
wait "$server" || true
total=0
for f in "$out"/cg.*; do
  n=$(grep -m1 '^summary:' "$f" | awk '{print $2}'); total=$((total + n))
done
echo "$tree turns=$turns redis_server_instructions=$total"
