#!/bin/bash
# redis-server's instructions for N turns of bench/redis_hot_reads.py (issue #8), under
# callgrind, as bench/redis_server_callgrind.sh does for a whole service: a private
# redis-server under valgrind on a unix socket, driven by this tree's bench script with
# <tree>'s src first on PYTHONPATH; prints the server's total instructions and the
# driver's line. Per turn = (total at 1300 turns - total at 300) / 1000.
#
# usage: bench/redis_hot_reads_callgrind.sh <tree> <turns> <same|other> <out dir>
set -euo pipefail
tree=$1; turns=$2; reader=$3; out=$4
bench=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"; mkdir -p "$out"
sock=$out/redis.sock
valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" redis-server --port 0 \
  --unixsocket "$sock" --save '' --appendonly no --dir "$out" > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 1 200); do [ -S "$sock" ] && break; sleep 0.2; done
PYTHONHASHSEED=0 PYTHONPATH="$tree/src:$bench" "$bench/../.venv/bin/python" \
  "$bench/redis_hot_reads.py" --redis-url "unix://$sock?db=0&socket_timeout=300" \
  --turns "$turns" --reader "$reader" > "$out/driver.out" 2> "$out/driver.err" \
  || { echo "the driver failed: $out/driver.err"; tail -5 "$out/driver.err"; }
redis-cli -s "$sock" shutdown nosave > /dev/null 2>&1 || true
wait "$server" || true
total=0
for f in "$out"/cg.*; do
  n=$(grep -m1 '^summary:' "$f" | awk '{print $2}'); total=$((total + n))
done
echo "$tree reader=$reader turns=$turns redis_server_instructions=$total $(cat "$out/driver.out")"
