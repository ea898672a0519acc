"""Server instructions per ``/healthz`` over a real socket, on each HTTP parser (issue #8):
the server ``tiermem serve`` builds (``build_server`` on ``create_app``; embedded default,
uvloop) runs under ``valgrind --tool=callgrind`` while this process sends it ``N``
keep-alive requests; two request counts, per request = the difference / the difference in
requests, so start-up cancels. What separates this from ``bench/rest_inprocess.py``'s
``healthz`` is the HTTP layer: the socket, uvicorn and the parser::

    PYTHONPATH=src python bench/rest_http_callgrind.py [--parsers h11,httptools] \
        [--long 1000 --short 200]

Each parser's two runs go side by side (two cores). Prints instructions per request.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

SERVER = """
import sys
from tiermem.interfaces.api import create_app, server
from tiermem.settings import TierMemSettings
if sys.argv[2] == "h11":
    server.http_protocol = lambda: "h11"
app = create_app(TierMemSettings(), allow_anonymous=True)
server.build_server(app, "127.0.0.1", int(sys.argv[1]), log_level="warning").run()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def instructions(parser: str, requests: int) -> int:
    """The server process's instructions, start to exit, having served ``requests``."""
    with tempfile.TemporaryDirectory() as tmp:
        port, out = free_port(), Path(tmp) / "callgrind.out"
        env = {
            **os.environ,
            "PYTHONHASHSEED": "0",
            "OPENBLAS_NUM_THREADS": "1",
            "TIERMEM_SQLITE_PATH": str(Path(tmp) / "bench.db"),
            "TIERMEM_API_KEYS_FILE": str(Path(tmp) / "keys.json"),
        }
        valgrind = shutil.which("valgrind")
        if valgrind is None:
            raise SystemExit("valgrind is not installed (apt-get install valgrind)")
        server = subprocess.Popen(  # noqa: S603 -- valgrind on our own interpreter and code
            [
                valgrind,
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-c",
                SERVER,
                str(port),
                parser,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                for _ in range(1200):  # up to 10 minutes to start under valgrind
                    try:
                        if client.get("/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        time.sleep(0.5)
                else:
                    raise RuntimeError("the server did not start")
                for _ in range(requests):
                    if client.get("/healthz").status_code != 200:
                        raise RuntimeError("/healthz did not answer 200")
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=600)
        for line in out.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError("no callgrind summary")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parsers", default="h11,httptools")
    parser.add_argument("--long", type=int, default=1000)
    parser.add_argument("--short", type=int, default=200)
    args = parser.parse_args()
    for name in args.parsers.split(","):
        with ThreadPoolExecutor(2) as pool:
            long, short = pool.map(functools.partial(instructions, name), (args.long, args.short))
        per = (long - short) // (args.long - args.short)
        print(f"{name:10s} {per:>10,d} server instructions per /healthz")


if __name__ == "__main__":
    main()
