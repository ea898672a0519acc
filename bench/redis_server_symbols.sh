#!/bin/bash
# Build redis-server with its symbols, for a named profile of redis-server's work under
# callgrind (bench/redis_server_profile.py). Debian's package is stripped: its Lua and
# most of its own functions show as bare addresses. This builds the same upstream
# release (the source tarball of the installed Debian package, from Debian's archive)
# with the bundled Lua, jemalloc and Redis's own default flags (-O2, with -g), and
# prints the directory of the redis-server it made. Nothing is installed.
#
# usage: bench/redis_server_symbols.sh [work dir=/tmp/redis-symbols]
#   then: REDIS_SERVER=<that dir>/redis-server bench/redis_script_replay.sh ...
set -euo pipefail
work=${1:-/tmp/redis-symbols}
version=$(redis-server --version | sed -n 's/.* v=\([0-9.]*\).*/\1/p')
mkdir -p "$work"; cd "$work"
if [ ! -x "redis-$version/src/redis-server" ]; then
  if [ ! -f "redis_$version.orig.tar.gz" ]; then
    # apt-get source needs deb-src entries; add them beside the deb ones if missing.
    if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ \
        && ! grep -qs '^deb-src' /etc/apt/sources.list; then
      sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
        > /etc/apt/sources.list.d/debian-src.sources
      apt-get update -qq
    fi
    apt-get source --download-only redis > /dev/null
  fi
  tar xzf "redis_$version.orig.tar.gz"
  make -C "redis-$version" -j"$(nproc)" > build.log 2>&1
fi
echo "$work/redis-$version/src"
