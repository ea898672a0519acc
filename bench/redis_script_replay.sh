#!/bin/bash
# Replay a capture of bench/redis_script_replay.py on a private redis-server under callgrind
# and print the server's instructions, serverCron (wall-clock driven) subtracted.
#
# usage: bench/redis_script_replay.sh <tree> <capture> <out dir> [replay options...]
#   e.g. bench/redis_script_replay.sh "$PWD" /tmp/c2500.pkl /tmp/rp-2500
#   per turn = (net at 2500 turns - net at 500) / 2000, same tree and options.
# REDIS_SERVER: the server binary (default: redis-server on PATH; a build with symbols,
# bench/redis_server_symbols.sh, gives a named profile, bench/redis_server_profile.py).
set -euo pipefail
tree=$1; capture=$2; out=$3; shift 3
bench=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"; mkdir -p "$out"
sock=$out/redis.sock
valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" "${REDIS_SERVER:-redis-server}" --port 0 \
  --unixsocket "$sock" --save '' --appendonly no --dir "$out" > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.2; done
PYTHONPATH="$tree/src:$bench" "$bench/../.venv/bin/python" "$bench/redis_script_replay.py" \
  replay --socket "$sock" --capture "$capture" "$@" > "$out/replay.log" 2>&1 \
  || { echo "the replay failed: $out/replay.log"; tail -5 "$out/replay.log"; }
redis-cli -s "$sock" shutdown nosave > /dev/null 2>&1 || true
wait "$server" || true
f=$(ls "$out"/cg.* | head -1)
total=$(grep -m1 '^summary:' "$f" | awk '{print $2}')
cron=$(callgrind_annotate --inclusive=yes --threshold=100 "$f" 2>/dev/null \
  | grep -m1 ':serverCron ' | awk '{gsub(",", "", $1); print $1}' || true)
echo "$tree $(basename "$capture") server_instructions=$total cron=${cron:-0}" \
  "net=$((total - ${cron:-0})) ($(cat "$out/replay.log"))"
