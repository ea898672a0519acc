"""Raw scans of every store a deployment writes to, for the erasure tests: every SQLite
table row, every Redis key under a prefix (names and values), every DynamoDB item of a
table (large payloads decompressed). A scan returns the places where any needle occurs, so
a test can assert that a redacted or purged value is nowhere at all."""

from __future__ import annotations

import contextlib
import sqlite3
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["scan_dynamodb", "scan_redis", "scan_sqlite"]


def _hits(where: str, blob: str, needles: Iterable[str]) -> list[str]:
    return [f"{where}: {needle!r}" for needle in needles if needle in blob]


def scan_sqlite(path: Path, needles: Iterable[str]) -> list[str]:
    """Every row of every table (FTS shadow tables included) of a SQLite file."""
    needles = list(needles)
    found: list[str] = []
    with sqlite3.connect(path) as db:
        tables = [
            row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        for table in tables:
            try:
                rows = db.execute(f'SELECT * FROM "{table}"').fetchall()  # noqa: S608 -- names from sqlite_master
            except sqlite3.OperationalError:
                continue  # a virtual table whose module is not loaded here
            for row in rows:
                blob = " ".join(
                    cell.decode("utf-8", "replace") if isinstance(cell, bytes) else str(cell)
                    for cell in row
                )
                found += _hits(f"sqlite {table}", blob, needles)
    return found


async def scan_redis(client: Any, pattern: str, needles: Iterable[str]) -> list[str]:
    """Every key matching ``pattern``: its name and its whole value, whatever its type."""
    needles = list(needles)
    found: list[str] = []
    async for raw_key in client.scan_iter(match=pattern, count=1000):
        key = raw_key.decode("utf-8", "replace")
        kind = (await client.type(raw_key)).decode()
        value: Any
        if kind == "string":
            value = await client.get(raw_key)
        elif kind == "hash":
            value = await client.hgetall(raw_key)
        elif kind == "list":
            value = await client.lrange(raw_key, 0, -1)
        elif kind == "set":
            value = await client.smembers(raw_key)
        elif kind == "zset":
            value = await client.zrange(raw_key, 0, -1, withscores=True)
        elif kind == "stream":
            value = await client.xrange(raw_key)
        else:
            value = kind
        found += _hits(f"redis {key}", key + " " + _text(value), needles)
    return found


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        data = bytes(value)
        with contextlib.suppress(zlib.error):
            data = zlib.decompress(data)
        return data.decode("utf-8", "replace")
    if isinstance(value, dict):
        return " ".join(_text(k) + " " + _text(v) for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return " ".join(_text(v) for v in value)
    return str(value)


async def scan_dynamodb(client: Any, table: str, needles: Iterable[str]) -> list[str]:
    """Every item of ``table`` (a full Scan: test tables are small)."""
    needles = list(needles)
    found: list[str] = []
    paginator = client.get_paginator("scan")
    async for page in paginator.paginate(TableName=table, ConsistentRead=True):
        for item in page["Items"]:
            blob = _item_text(item)
            where = f"dynamodb {item.get('pk', {}).get('S')}|{item.get('sk', {}).get('S')}"
            found += _hits(where, blob, needles)
    return found


def _item_text(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(k + " " + _item_text(v) for k, v in value.items())
    if isinstance(value, list):
        return " ".join(_item_text(v) for v in value)
    return _text(value)
