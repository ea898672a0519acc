"""Limits and errors: 413, 429 with Retry-After, 401, 422 naming the field, 503 with
Retry-After on a backend outage, and never a 500 for bad input."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tiermem.composition import open_durable_store, open_search_index
from tiermem.errors import BackendUnavailableError
from tiermem.interfaces.api import create_app
from tiermem.interfaces.api.limits import RateLimiter
from tiermem.interfaces.tenancy import KeyStore
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryHotStore

from .conftest import ClientFactory, Keys


async def _open(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
    assert r.status_code == 200, r.text


def _error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "field"}, body
    assert body["error"]["message"]
    return dict(body["error"])


# -- 413 ---------------------------------------------------------------------------------


async def test_a_body_over_the_limit_is_413_before_anything_is_written(
    tmp_path: Path, service: MemoryService, keys: Keys, client_for: ClientFactory
) -> None:
    settings = TierMemSettings(sqlite_path=tmp_path / "t.db", api_max_body_bytes=4096)
    app = create_app(settings, service=service, keystore=keys.store)
    client = client_for(keys.a, target=app)
    await _open(client)
    big = {"role": "user", "content": "x" * 5000}
    r = await client.post("/v1/sessions/s-1/turns", json=big)
    assert r.status_code == 413
    assert _error(r)["code"] == "too_large"
    assert "4096" in _error(r)["message"]

    # A streamed body with no Content-Length is counted as it arrives.
    async def chunks() -> AsyncIterator[bytes]:
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    r = await client.post(
        "/v1/sessions/s-1/turns", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    r = await client.get("/v1/sessions/s-1")
    assert r.json()["stats"]["turn_count"] == 0
    r = await client.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "small"})
    assert r.status_code == 201


# -- 429 ---------------------------------------------------------------------------------


def test_the_token_bucket_admits_a_burst_then_the_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=3, monotonic=lambda: now[0])
    assert [limiter.take("k") for _ in range(3)] == [None, None, None]
    wait = limiter.take("k")
    assert wait == pytest.approx(1.0)
    assert RateLimiter.retry_after_header(wait) == "1"
    assert limiter.take("other") is None  # buckets are per key
    now[0] += 1.0
    assert limiter.take("k") is None
    assert limiter.take("k") is not None


def test_the_bucket_map_is_bounded() -> None:
    limiter = RateLimiter(per_minute=60, burst=1, max_keys=100, monotonic=lambda: 0.0)
    for n in range(1_000):
        limiter.take(f"k{n}")
    assert len(limiter) == 100


async def test_a_key_over_its_rate_gets_429_with_retry_after(
    tmp_path: Path, service: MemoryService, keys: Keys, client_for: ClientFactory
) -> None:
    settings = TierMemSettings(
        sqlite_path=tmp_path / "t.db", api_rate_limit_per_minute=6, api_rate_limit_burst=2
    )
    now = [0.0]
    app = create_app(settings, service=service, keystore=keys.store, monotonic=lambda: now[0])
    a, b = client_for(keys.a, target=app), client_for(keys.b, target=app)
    assert (await a.get("/v1/stats")).status_code == 200
    assert (await a.get("/v1/stats")).status_code == 200
    r = await a.get("/v1/stats")
    assert r.status_code == 429
    assert _error(r)["code"] == "rate_limited"
    assert int(r.headers["Retry-After"]) == 10  # 6 per minute: one token every 10 s
    assert (await b.get("/v1/stats")).status_code == 200  # another key has its own bucket
    now[0] += 10.0
    assert (await a.get("/v1/stats")).status_code == 200
    assert (await a.get("/v1/stats")).status_code == 429
    metrics = await b.get("/metrics")
    assert "tiermem_rate_limited_total 2.0" in metrics.text


# -- 401 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Bearer tm_0123456789abcdef_" + "a" * 43,
        "Bearer not-a-key",
    ],
)
async def test_a_missing_or_bad_key_is_401(client_for: ClientFactory, header: str | None) -> None:
    client = client_for(None)
    headers = {"Authorization": header} if header is not None else {}
    r = await client.get("/v1/users/u-1/memories", headers=headers)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert _error(r)["code"] == "unauthorized"


async def test_wrong_keys_are_limited_per_client_address_before_hashing(
    settings: TierMemSettings, service: MemoryService, keys: Keys, client_for: ClientFactory
) -> None:
    now = [0.0]  # frozen: no refill while the test runs
    app = create_app(settings, service=service, keystore=keys.store, monotonic=lambda: now[0])
    right = client_for(keys.a, target=app)
    assert (await right.get("/v1/stats")).status_code == 200  # verified once, then cached
    guesser = client_for(None, target=app)
    bad = keys.a[:-4] + ("AAAA" if keys.a[-4:] != "AAAA" else "BBBB")
    wrong = {"Authorization": f"Bearer {bad}"}
    codes = [(await guesser.get("/v1/stats", headers=wrong)).status_code for _ in range(31)]
    assert codes == [401] * 30 + [429]
    # A key verified before is served from the cache (no hashing, no charge) ...
    assert (await right.get("/v1/stats")).status_code == 200
    # ... a key never seen needs hashing, and the address is refused that until it refills.
    other = client_for(keys.b, target=app)
    assert (await other.get("/v1/stats")).status_code == 429
    now[0] += 60.0
    assert (await other.get("/v1/stats")).status_code == 200
    assert (await guesser.get("/v1/stats", headers=wrong)).status_code == 401


async def test_an_unreadable_keys_file_is_503_and_its_path_stays_in_the_log(
    keys: Keys, client_a: httpx.AsyncClient
) -> None:
    keys.store.path.write_text("{broken")
    r = await client_a.get("/v1/stats")
    assert r.status_code == 503
    assert _error(r)["code"] == "unavailable"
    assert str(keys.store.path) not in r.text


async def test_a_revoked_key_is_refused_at_its_next_request(
    keys: Keys, client_a: httpx.AsyncClient
) -> None:
    assert (await client_a.get("/v1/stats")).status_code == 200
    key_id = next(k.key_id for k in keys.store.list() if k.tenant == "tenant-a")
    KeyStore(keys.store.path).revoke(key_id)  # as `tiermem keys revoke` in another process
    assert (await client_a.get("/v1/stats")).status_code == 401


async def test_local_mode_serves_keyless_loopback_requests_only_without_keys(
    tmp_path: Path, service: MemoryService, client_for: ClientFactory
) -> None:
    settings = TierMemSettings(sqlite_path=tmp_path / "t.db")
    store = KeyStore(tmp_path / "local-keys.json")  # empty: the fixtures' keys are elsewhere
    local = create_app(settings, service=service, keystore=store, allow_anonymous=True)
    client = client_for(None, target=local)
    r = await client.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
    assert r.status_code == 200
    assert await service.tiers.view("local:s-1") is not None
    # Not from loopback: refused even in local mode.
    remote = httpx.AsyncClient(
        transport=httpx.ASGITransport(local, client=("203.0.113.7", 5000)),
        base_url="http://testserver",
    )
    async with remote:
        assert (await remote.get("/v1/stats")).status_code == 401
    # Once a key exists, keys are required even on loopback.
    store.create("acme")
    assert (await client.get("/v1/stats")).status_code == 401
    # An app not in local mode never serves keyless requests.
    strict = create_app(settings, service=service, keystore=KeyStore(tmp_path / "none.json"))
    assert (await client_for(None, target=strict).get("/v1/stats")).status_code == 401


# -- 422 ---------------------------------------------------------------------------------

DEEP: dict[str, Any] = {}
_cursor = DEEP
for _ in range(100):  # deeper than the 64 levels stored data may nest
    _cursor["a"] = {}
    _cursor = _cursor["a"]

BAD_REQUESTS: list[tuple[str, str, Any, str | None]] = [
    ("POST", "/v1/sessions", {"user_id": ""}, "user_id"),
    ("POST", "/v1/sessions", {"user_id": "u\n1"}, "user_id"),
    ("POST", "/v1/sessions", {"user_id": "u" * 300}, "user_id"),
    ("POST", "/v1/sessions", {"user_id": "u-1", "session_id": "s" * 250}, "session_id"),
    ("POST", "/v1/sessions", {"user_id": "u-1", "user_tier": "gold"}, "user_tier"),
    ("POST", "/v1/sessions", {"user_id": "u-1", "color": "red"}, "color"),
    ("POST", "/v1/sessions", [1, 2], None),
    ("POST", "/v1/sessions/s-1/turns", {"role": "system", "content": "x"}, "role"),
    ("POST", "/v1/sessions/s-1/turns", {"role": "user", "content": ""}, "content"),
    ("POST", "/v1/sessions/s-1/turns", {"role": "user", "content": []}, "content"),
    ("POST", "/v1/sessions/s-1/turns", {"role": "user"}, "content"),
    (
        "POST",
        "/v1/sessions/s-1/turns",
        {"role": "user", "content": "x", "importance": 2},
        "importance",
    ),
    (
        "POST",
        "/v1/sessions/s-1/turns",
        {"role": "user", "content": [{"type": "text"}]},
        "content.0.text.text",
    ),
    ("POST", "/v1/sessions/s-1/turns", {"role": "user", "content": "\ud800"}, "content"),
    ("GET", "/v1/sessions/s-1/turns/-1", None, "index"),
    ("GET", "/v1/sessions/s-1/turns/99999999999999999999", None, "index"),
    ("GET", "/v1/sessions/s-1/turns?start=5&end=2", None, "end"),
    ("GET", "/v1/sessions/s-1/turns?start=0&end=5000", None, "end"),
    ("POST", "/v1/sessions/s-1/context", {"budget": 0}, "budget"),
    ("POST", "/v1/sessions/s-1/context", {"model": "no-such-model"}, "model"),
    ("POST", "/v1/sessions/s-1/context", {"budget": 5, "system": "long " * 100}, "budget"),
    ("PUT", "/v1/sessions/s-1/state/plan", {"data": [1]}, "data"),
    (
        "PUT",
        "/v1/sessions/s-1/state/plan",
        {"data": {}, "expected_version": -1},
        "expected_version",
    ),
    ("POST", "/v1/users/u-1/memories", {"content": "x", "memory_type": "nonsense"}, "memory_type"),
    ("POST", "/v1/users/u-1/memories", {"content": ""}, "content"),
    ("POST", "/v1/users/u-1/recall", {"query": "x", "k": 0}, "k"),
    ("POST", "/v1/users/u-1/recall", {"query": "x", "scope": ["everything"]}, "scope.0"),
    ("GET", "/v1/users/u-1/memories?limit=0", None, "limit"),
    ("PUT", "/v1/sessions/s-1/state/plan", {"data": DEEP}, "data"),
    ("POST", "/v1/users/u-1/memories", {"content": "x", "metadata": DEEP}, "metadata"),
    ("POST", "/v1/sessions/s-1/context", {"tools": [{"name": "t", "input_schema": DEEP}]}, "tools"),
    ("POST", "/v1/users/u-1/recall", {"query": "\ud800"}, "query"),
    ("POST", "/v1/sessions/s-1/turns", "[" * 5000 + "]" * 5000, None),
    # The message asks for format= (the name's extension says nothing the server reads).
    ("POST", "/v1/users/u-1/documents/text", {"name": "a.exe", "text": "x"}, "format"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), BAD_REQUESTS)
async def test_bad_input_is_422_naming_the_field(
    client_a: httpx.AsyncClient, method: str, path: str, body: Any, field: str | None
) -> None:
    await _open(client_a)
    await client_a.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "hi"})
    # json.dumps escapes a lone surrogate as \ud800, as a client in another language would.
    content = None if body is None else (body if isinstance(body, str) else json.dumps(body))
    headers = {"content-type": "application/json"}
    r = await client_a.request(method, path, content=content, headers=headers)
    assert r.status_code == 422, r.text
    error = _error(r)
    assert error["field"] == field, error
    if "\n" in str(body):
        assert "control characters" in error["message"]
    r = await client_a.get("/v1/sessions/s-1")
    assert r.json()["stats"]["turn_count"] == 1  # nothing half-written


async def test_malformed_json_and_bad_idempotency_keys_are_422(client_a: httpx.AsyncClient) -> None:
    await _open(client_a)
    r = await client_a.post(
        "/v1/sessions/s-1/turns",
        content=b'{"role": "user", "content": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert _error(r)["code"] == "validation"
    r = await client_a.post(
        "/v1/sessions/s-1/turns",
        json={"role": "user", "content": "x"},
        headers={"Idempotency-Key": "k" * 300},
    )
    assert r.status_code == 422
    assert _error(r)["field"] == "Idempotency-Key"


async def test_random_bodies_never_make_a_500(client_a: httpx.AsyncClient) -> None:
    """A bounded, seeded fuzz over every JSON route (schemathesis covers this wider, #13)."""
    await _open(client_a)
    rng = random.Random(1234)
    atoms: list[Any] = [
        None,
        True,
        0,
        -1,
        2**70,
        1.5,
        float("1e308"),
        "",
        "x",
        "\x00",
        "\ud800",
        "é" * 300,
        "a:b",
        "%00",
        "../..",
        [],
        {},
        [[[[[]]]]],
    ]

    def value(depth: int = 0) -> Any:
        roll = rng.random()
        if depth > 3 or roll < 0.6:
            return rng.choice(atoms)
        if roll < 0.8:
            return [value(depth + 1) for _ in range(rng.randrange(3))]
        keys = [
            "role",
            "content",
            "user_id",
            "session_id",
            "query",
            "budget",
            "data",
            "k",
            "type",
            "text",
            "scope",
            "model",
            "tools",
            "name",
            "memory_type",
            "tags",
        ]
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randrange(4))}

    routes = [
        ("POST", "/v1/sessions"),
        ("POST", "/v1/sessions/s-1/turns"),
        ("POST", "/v1/sessions/s-1/context"),
        ("PUT", "/v1/sessions/s-1/state/x"),
        ("POST", "/v1/users/u-1/memories"),
        ("POST", "/v1/users/u-1/recall"),
        ("POST", "/v1/users/u-1/documents/text"),
    ]
    for _ in range(300):
        method, path = rng.choice(routes)
        body = json.dumps(value(), allow_nan=False) if rng.random() < 0.9 else "{not json"
        r = await client_a.request(
            method,
            path,
            content=body.encode("utf-8", "surrogatepass"),
            headers={"content-type": "application/json"},
        )
        assert r.status_code < 500, (method, path, body, r.text)
        if r.status_code >= 400:
            _error(r)


# -- 503 ---------------------------------------------------------------------------------


class SwitchableDurable:
    """The real SQLite durable store, with a switch that makes every call fail as a lost
    connection would. A fake on purpose: SQLite is a file in this process and cannot be
    "down"; stopping real Redis and DynamoDB Local servers is #13's fault suite. What this
    tests is the API's mapping of the library's BackendUnavailableError to 503."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.down = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name == "aclose":
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:

                async def fail() -> Any:
                    raise BackendUnavailableError("connection lost (test)", backend="sqlite")

                return fail()
            return attr(*args, **kwargs)

        return call


async def test_a_backend_outage_is_503_with_retry_after_and_recovers(
    settings: TierMemSettings, keys: Keys, client_for: ClientFactory
) -> None:
    durable = SwitchableDurable(open_durable_store(settings))
    service = MemoryService(
        MemoryHotStore(),
        durable,
        index=open_search_index(settings),  # type: ignore[arg-type]
    )
    async with service:
        client = client_for(
            keys.a, target=create_app(settings, service=service, keystore=keys.store)
        )
        await _open(client)
        turn = {"role": "user", "content": "order Berserk 42"}
        assert (await client.post("/v1/sessions/s-1/turns", json=turn)).status_code == 201

        durable.down = True
        for method, path, body in [
            ("POST", "/v1/sessions/s-1/turns", turn),
            ("POST", "/v1/users/u-1/memories", {"content": "likes seinen"}),
            ("GET", "/v1/users/u-1/memories", None),
            ("POST", "/v1/sessions", {"user_id": "u-2", "session_id": "s-2"}),
        ]:
            r = await client.request(method, path, json=body)
            assert r.status_code == 503, (path, r.text)
            assert r.headers["Retry-After"] == "1"
            error = _error(r)
            assert error["code"] == "unavailable"
            assert "connection lost" not in error["message"]  # backend detail stays in the log
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["backends"]["durable"].startswith("unavailable")

        durable.down = False
        assert (await client.get("/readyz")).status_code == 200
        r = await client.post("/v1/sessions/s-1/turns", json=turn)
        assert r.status_code == 201
        assert r.json()["index"] == 1  # the refused write left nothing behind
