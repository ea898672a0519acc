"""Bad input, each answered with a clear error and the data before it intact.

Over REST (the real ASGI app, embedded SQLite): invalid UTF-8 and control characters in
bodies, paths and headers; deeply nested tool inputs; oversized turns; ids built to collide
store keys (``:``, ``{``, ``}``, ``%``, ``#``, Unicode confusables) between users and
between tenants. In the library, with hypothesis: arbitrary ids, content blocks and JSONL
records. tests/api covers the API's own 401/413/422/429 paths and a seeded body fuzz;
tests/reliability/test_openapi_fuzz.py runs schemathesis over every operation.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.interfaces.api import create_app
from tiermem.interfaces.jsonl import export_user, import_lines
from tiermem.interfaces.tenancy import KeyStore
from tiermem.models.shape import MAX_JSON_DEPTH
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing import FakeClock

SECRET = {"tenant-a": "alpha-7731", "tenant-b": "bravo-9912"}


class Api:
    def __init__(self, a: httpx.AsyncClient, b: httpx.AsyncClient, service: MemoryService):
        self.a, self.b, self.service = a, b, service


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    settings = TierMemSettings(
        sqlite_path=tmp_path / "t.db",
        api_keys_file=tmp_path / "keys.json",
        api_max_body_bytes=64 * 1024,
        api_rate_limit_per_minute=1_000_000,
        api_rate_limit_burst=100_000,
    )
    keystore = KeyStore(tmp_path / "keys.json")
    keys = {tenant: keystore.create(tenant)[1] for tenant in ("tenant-a", "tenant-b")}
    async with MemoryService.from_settings(settings) as service:
        app = create_app(settings, service=service, keystore=keystore)

        def client(tenant: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                transport=httpx.ASGITransport(app),
                base_url="http://testserver",
                headers={"Authorization": f"Bearer {keys[tenant]}"},
            )

        async with client("tenant-a") as a, client("tenant-b") as b:
            yield Api(a, b, service)


def _clear_error(r: httpx.Response, *statuses: int) -> dict[str, Any]:
    assert r.status_code in statuses, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"]
    assert len(error["message"]) > 10
    return dict(error)


async def _seed(client: httpx.AsyncClient) -> list[str]:
    r = await client.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
    assert r.status_code == 200, r.text
    texts = [f"turn {n}" for n in range(3)]
    for text in texts:
        r = await client.post("/v1/sessions/s-1/turns", json={"role": "user", "content": text})
        assert r.status_code == 201, r.text
    return texts


async def _texts(client: httpx.AsyncClient, session_id: str = "s-1") -> list[str]:
    r = await client.get(f"/v1/sessions/{session_id}/turns")
    assert r.status_code == 200, r.text
    return [block.get("text", "") for t in r.json()["turns"] for block in t["content"]]


# -- encodings and control characters ------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"role": "user", "content": "\xff\xfe caf\xe9"}',  # not UTF-8 at all
        b'{"role": "user", "content": "\xed\xa0\x80"}',  # a UTF-8-encoded surrogate
        b'{"role": "user", "content": "\\ud800"}',  # a lone surrogate as a JSON escape
        b'{"role": "user", "content": [{"type": "text", "text": "\\udfff x"}]}',
        b'\xef\xbb\xbf{"role": "user", "content": "BOM first"}',
        b'{"role": "us\x00er", "content": "NUL in the role"}',
        b'{"role": "user", "content": "x", "metadata": {"k\\u0000": 1}}',
        b"\x00\x00\x00",
    ],
)
async def test_undecodable_bodies_are_a_clear_4xx_and_change_nothing(api: Api, body: bytes) -> None:
    texts = await _seed(api.a)
    r = await api.a.post(
        "/v1/sessions/s-1/turns", content=body, headers={"content-type": "application/json"}
    )
    if r.status_code == 201:  # only when it was valid JSON in UTF-8, stored as sent
        sent = json.loads(body.decode("utf-8-sig"))
        stored = r.json()
        assert stored["content"][0]["text"] == sent["content"]
        assert sent.get("metadata", {}).items() <= stored["metadata"].items()
        texts.append(stored["content"][0]["text"])
    else:
        _clear_error(r, 400, 422)
    assert await _texts(api.a) == texts


async def test_control_characters_in_text_are_kept_and_in_ids_refused(api: Api) -> None:
    texts = await _seed(api.a)
    text = "tab\there, bell\x07, esc\x1b[31m, NUL\x00 end"
    r = await api.a.post("/v1/sessions/s-1/turns", json={"role": "user", "content": text})
    assert r.status_code == 201, r.text  # content is data: stored exactly
    assert await _texts(api.a) == [*texts, text]
    for bad in ("s\x00", "s\n1", "s\x1b", "\u200bs\x7f"):
        r = await api.a.post("/v1/sessions", json={"user_id": "u-1", "session_id": bad})
        _clear_error(r, 422)
    r = await api.a.get("/v1/sessions/s%001/turns")
    _clear_error(r, 404, 422)
    r = await api.a.get("/v1/sessions/s%FF%FE/turns")  # invalid UTF-8 in the path
    _clear_error(r, 404, 422)
    r = await api.a.post(
        "/v1/sessions/s-1/turns",
        json={"role": "user", "content": "keyed"},
        headers={"Idempotency-Key": "k\x01y"},
    )
    assert r.status_code in (201, 422), r.text
    assert r.status_code == 201 or (await _texts(api.a))[-1] == text


# -- nesting and size -------------------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for n in range(depth):
        value = {"k": value} if n % 2 else [value]
    return value


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 200, 5_000])
async def test_deeply_nested_tool_inputs_are_refused_and_the_session_stays_readable(
    api: Api, depth: int
) -> None:
    texts = await _seed(api.a)
    # Written by hand: json.dumps itself cannot encode 5,000 levels.
    deep = "[" * depth + '"leaf"' + "]" * depth
    body = (
        '{"role": "assistant", "content": [{"type": "tool_use", "tool_use_id": "t1", '
        f'"name": "search", "input": {deep}}}]}}'
    )
    r = await api.a.post(
        "/v1/sessions/s-1/turns", content=body, headers={"content-type": "application/json"}
    )
    error = _clear_error(r, 413, 422)
    if r.status_code == 422:
        assert "deep" in error["message"] or "nest" in error["message"], error
    assert await _texts(api.a) == texts  # every read still works
    r = await api.a.post("/v1/sessions/s-1/context", json={"budget": 2000})
    assert r.status_code == 200, r.text
    # The deepest shape that is allowed is stored and read back.
    ok = {"type": "tool_use", "tool_use_id": "t2", "name": "s", "input": _nested(20)}
    r = await api.a.post("/v1/sessions/s-1/turns", json={"role": "assistant", "content": [ok]})
    assert r.status_code == 201, r.text
    assert (await api.a.get("/v1/sessions/s-1/turns/3")).json()["content"][0]["input"] == (
        _nested(20)
    )


async def test_oversized_messages_are_413_and_earlier_turns_stay(api: Api) -> None:
    texts = await _seed(api.a)
    many_blocks = [{"type": "text", "text": "y" * 100} for _ in range(1_000)]  # ~110 KB
    for body in (
        {"role": "user", "content": "x" * 70_000},
        {"role": "user", "content": many_blocks},
    ):
        r = await api.a.post("/v1/sessions/s-1/turns", json=body)
        assert _clear_error(r, 413)["code"] == "too_large"
    assert await _texts(api.a) == texts


# -- ids built to collide ---------------------------------------------------------------------

COLLIDING_IDS = [
    "u",
    "u:",
    ":u",
    "u:1",
    "u:1:s",
    "u{1}",
    "{u}",
    "u}",
    "u%",
    "u%3A",
    "u%253A",
    "u#1",
    "u#",
    "u\u2236",  # RATIO, looks like ':'
    "u\uff1a",  # FULLWIDTH COLON
    "u\ua789",  # MODIFIER LETTER COLON
    "U",
    "u ",
    " u",
    "u\u200b",  # zero-width space
    "\u0075\u0301",  # u + combining acute
    "\u00fa",  # ú precomposed (NFC of the one above)
    "tenant-b:u",  # another tenant's prefix, typed as an id
    "tenant-a:u",
    "*",
    "?",
    "[u]",
]


async def test_ids_built_to_collide_keys_stay_apart_between_users_and_tenants(api: Api) -> None:
    """Every id above is a user of its own and a session of its own in both tenants: each
    sees only its own turn and memory, whatever the stores' key syntax is."""
    marks: dict[tuple[str, str], str] = {}
    for tenant, client in (("tenant-a", api.a), ("tenant-b", api.b)):
        for n, uid in enumerate(COLLIDING_IDS):
            mark = f"{SECRET[tenant]}-{n}"
            marks[(tenant, uid)] = mark
            r = await client.post("/v1/sessions", json={"user_id": uid, "session_id": uid})
            assert r.status_code == 200, (uid, r.text)
            assert r.json()["metadata"]["session_id"] == uid
            path = f"/v1/sessions/{_quote(uid)}/turns"
            r = await client.post(path, json={"role": "user", "content": mark})
            assert r.status_code == 201, (uid, r.text)
            assert r.json()["index"] == 0
            r = await client.post(f"/v1/users/{_quote(uid)}/memories", json={"content": mark})
            assert r.status_code in (200, 201), (uid, r.text)
    await api.service.drain()
    for tenant, client in (("tenant-a", api.a), ("tenant-b", api.b)):
        for uid in COLLIDING_IDS:
            mark = marks[(tenant, uid)]
            assert await _texts(client, _quote(uid)) == [mark], (tenant, uid)
            r = await client.get(f"/v1/users/{_quote(uid)}/memories")
            assert [m["content"] for m in r.json()["memories"]] == [mark], (tenant, uid)
            r = await client.get(f"/v1/users/{_quote(uid)}/sessions")
            assert [s["session_id"] for s in r.json()["sessions"]] == [uid], (tenant, uid)
    # Purging one of them removes that one only.
    assert (await api.a.delete(f"/v1/users/{_quote('u:1')}")).status_code == 200
    assert (await api.a.get(f"/v1/sessions/{_quote('u:1')}")).status_code == 404
    for uid in ("u", "u:", "u:1:s", "u%3A", "u\uff1a"):
        assert await _texts(api.a, _quote(uid)) == [marks[("tenant-a", uid)]]
    assert await _texts(api.b, _quote("u:1")) == [marks[("tenant-b", "u:1")]]


async def test_an_id_with_a_slash_is_refused_at_the_edge(api: Api) -> None:
    """REST routes match the decoded path: an id with '/' could be created (POST
    /v1/sessions takes it in the body) but never addressed, so the edge refuses it."""
    r = await api.a.post("/v1/sessions", json={"user_id": "u-1", "session_id": "a/b"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "session_id"
    assert "'/'" in r.json()["error"]["message"]
    r = await api.a.post("/v1/sessions", json={"user_id": "a/b", "session_id": "s-1"})
    assert r.status_code == 422, r.text


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


# -- hypothesis, in the library ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "options", "field"),
    [
        ([{"type": "tool_result", "tool_use_id": "x", "content": None}], {}, "content"),
        ([{"type": "image", "format": "bmp"}], {}, "format"),
        ([{"type": "text"}], {}, "text"),
        ("x", {"importance": "high"}, "importance"),
        ("x", {"latency_ms": -5}, "latency_ms"),
    ],
)
async def test_bad_blocks_and_options_raise_tiermems_validation_error(
    content: Any, options: dict[str, Any], field: str
) -> None:
    """Found here: these raised pydantic's own ValidationError out of add_turn (fixed in
    tiermem.session.invalid_turn); a caller catches one error type."""
    async with _service() as memory:
        session = await memory.session("s-1", user_id="u-1")
        await session.add_turn("user", "before")
        with pytest.raises(ValidationError, match=field) as info:
            await session.add_turn("user", content, **options)
        assert type(info.value).__module__.startswith("tiermem")
        assert [t.text for t in await session.get_turns()] == ["before"]


async def test_a_jsonl_refusal_by_the_service_names_the_line() -> None:
    """Found by the fuzz below: a session line naming another user's session was refused
    without its line number (fixed in tiermem.interfaces.jsonl)."""
    async with _service() as memory:
        await (await memory.session("s-1", user_id="u-1")).add_turn("user", "kept")
        line = json.dumps(
            {
                "type": "session",
                "session_id": "s-1",
                "user_id": "u-2",
                "created_at": "2025-01-01T00:00:00Z",
            }
        )
        with pytest.raises(ValidationError, match=r"^line 2: .*belongs to another user"):
            await import_lines(memory, ["", line])


_FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


def _service() -> MemoryService:
    clock = FakeClock()
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        index_turns=False,
        auto_detect=False,
        auto_summarize=False,
    )


@_FUZZ
@given(ids=st.lists(st.text(max_size=300), min_size=1, max_size=6))
async def test_any_id_is_refused_cleanly_or_names_exactly_one_session(ids: list[str]) -> None:
    async with _service() as memory:
        accepted: dict[str, int] = {}
        for sid in ids:
            try:
                session = await memory.session(sid, user_id=f"owner {sid}"[:256])
            except ValidationError:
                continue  # anything else fails the test
            turn = await session.add_turn("user", f"for {sid!r}")
            accepted[sid] = accepted.get(sid, 0) + 1
            assert turn.index == accepted[sid] - 1
        for sid, count in accepted.items():
            session = await memory.session(sid, user_id=f"owner {sid}"[:256])
            assert [t.text for t in await session.get_turns()] == [f"for {sid!r}"] * count


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)}),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "tool_use_id": st.text(max_size=10),
            "name": st.text(max_size=10),
            "input": _json,
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": st.text(max_size=10), "content": _json}
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "document", "json"]), "x": _json}),
    st.dictionaries(st.sampled_from(["type", "text", "json", "data", "uri"]), _json, max_size=3),
)


@_FUZZ
@given(blocks=st.lists(st.lists(_block, max_size=4), min_size=1, max_size=4))
async def test_any_content_blocks_are_stored_and_read_back_or_refused_cleanly(
    blocks: list[list[dict[str, Any]]],
) -> None:
    async with _service() as memory:
        session = await memory.session("s-1", user_id="u-1")
        stored = [await session.add_turn("user", "before the fuzz")]
        for content in blocks:
            # Refused with tiermem's error, or stored; a pydantic error fails the test.
            with contextlib.suppress(ValidationError):
                stored.append(await session.add_turn("assistant", content))
        archived = await session.get_turns()
        assert [t.model_dump() for t in archived] == [t.model_dump() for t in stored]


_record = st.fixed_dictionaries(
    {"type": st.sampled_from(["session", "turn", "memory", "other"])},
    optional={
        "session_id": st.sampled_from(["s-1", "s-2", "", "s:1"]),
        "user_id": st.sampled_from(["u-1", "u-2", ""]),
        "index": st.integers(-2, 4),
        "role": st.sampled_from(["user", "assistant", "system", 3]),
        "content": st.one_of(st.text(max_size=10), st.lists(_block, max_size=2), _json),
        "timestamp": st.sampled_from(["2025-01-01T00:00:00Z", "yesterday", 0]),
        "created_at": st.sampled_from(["2025-01-01T00:00:00Z", None]),
        "memory_type": st.sampled_from(["fact", "preference", "nonsense"]),
        "format": st.sampled_from(["tiermem.jsonl/1", "tiermem.jsonl/9"]),
        "extra": _json,
    },
)


@_FUZZ
@given(
    records=st.lists(
        st.one_of(_record.map(json.dumps), st.text(max_size=30)), min_size=1, max_size=8
    )
)
async def test_any_jsonl_import_fails_cleanly_and_keeps_what_was_there(records: list[str]) -> None:
    async with _service() as memory:
        session = await memory.session("s-1", user_id="u-1")
        await session.add_turn("user", "kept")
        await memory.longterm.remember("u-1", "kept memory")
        before = [json.dumps(r, sort_keys=True) async for r in export_user(memory, "u-1")]
        refusal: ValidationError | None = None
        try:
            await import_lines(memory, records)
        except ValidationError as exc:  # anything else (a backend error too) fails the test
            refusal = exc
        if refusal is not None:
            assert "line" in str(refusal)
        after = [json.dumps(r, sort_keys=True) async for r in export_user(memory, "u-1")]
        # What was there is still there (an import only adds).
        kept = [line for line in before if '"type": "turn"' in line or '"type": "memory"' in line]
        assert all(line in after for line in kept)


@pytest.mark.parametrize("stores", ["redis+dynamodb", "redis-cluster+sqlite"])
async def test_colliding_ids_stay_apart_in_redis_and_dynamodb_keys(
    stores: str, tmp_path: Path
) -> None:
    """The same ids through the library on the stores whose key syntax they imitate (Redis
    hash tags ``{...}`` and ``:`` separators, DynamoDB ``pk``/``sk`` strings), scoped by two
    tenants as the interfaces scope them."""
    from tests.backends.dynamodb import shared_table
    from tests.conftest import server_url
    from tiermem.interfaces.tenancy import TenantScope

    hot, durable = stores.split("+")
    run = f"x{uuid.uuid4().hex[:6]}"
    options: dict[str, Any] = {"sqlite_path": tmp_path / "t.db", "redis_prefix": run}
    options["hot_backend"] = "redis"
    options["redis_cluster"] = hot == "redis-cluster"
    options["redis_url"] = server_url(hot)
    if durable == "dynamodb":
        endpoint = server_url("dynamodb")
        options |= {
            "durable_backend": "dynamodb",
            "dynamodb_endpoint_url": endpoint,
            "dynamodb_table": await shared_table(endpoint),
            "aws_region": "us-east-1",
        }
    ids = [f"{uid}{run}" for uid in COLLIDING_IDS]  # unique per run: the servers are shared
    async with MemoryService.from_settings(
        TierMemSettings(**options), index_turns=False, auto_detect=False, auto_summarize=False
    ) as memory:
        for tenant in ("tenant-a", "tenant-b"):
            scope = TenantScope(tenant)
            for uid in ids:
                user = scope.scope(uid, field="user_id")
                session = await memory.session(scope.scope(uid, field="session_id"), user_id=user)
                await session.add_turn("user", f"{tenant}|{uid}")
                await session.put_state("who", {"v": f"{tenant}|{uid}"})
        for tenant in ("tenant-a", "tenant-b"):
            scope = TenantScope(tenant)
            for uid in ids:
                user = scope.scope(uid, field="user_id")
                session = await memory.session(scope.scope(uid, field="session_id"), user_id=user)
                assert [t.text for t in await session.get_turns()] == [f"{tenant}|{uid}"]
                assert [t.text for t in await session.history()] == [f"{tenant}|{uid}"]
                state = await session.get_state("who", fresh=True)
                assert state is not None
                assert state.data == {"v": f"{tenant}|{uid}"}
                listed = await memory.list_sessions(user)
                assert [ref.session_id for ref in listed] == [session.id]
