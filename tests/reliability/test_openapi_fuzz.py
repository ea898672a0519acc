"""Schemathesis over the REST API's OpenAPI schema, in process against the ASGI app: every
operation gets schema-shaped and schema-breaking requests (a bounded number per operation,
so CI stays fast), with a valid key; none may answer with a server error.

The app runs on the embedded default (in-process hot tier, SQLite in a temporary
directory). Schemathesis drives the ASGI app on one event loop of its own for the whole
module, so the app builds and closes its own service there (its lifespan).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.python import asgi

from tiermem.interfaces.api import create_app
from tiermem.interfaces.tenancy import KeyStore
from tiermem.settings import TierMemSettings

EXAMPLES_PER_OPERATION = 12
"""~30 operations x 12 examples: about 360 requests, seconds in process."""


@pytest.fixture(scope="module")
def fuzzed_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    root: Path = tmp_path_factory.mktemp("openapi")
    keystore = KeyStore(root / "keys.json")
    _, key = keystore.create("tenant-a")
    app_settings = TierMemSettings(
        sqlite_path=root / "t.db",
        api_keys_file=root / "keys.json",
        api_rate_limit_per_minute=1_000_000,
        api_rate_limit_burst=100_000,
    )
    app = create_app(app_settings, keystore=keystore)
    return app, key


@pytest.fixture(scope="module")
def asgi_client(fuzzed_app: tuple[Any, str]) -> Iterator[asgi.ASGIClient]:
    with asgi.get_client(fuzzed_app[0]) as client:
        # One session that exists, so session routes get past their 404 sometimes.
        headers = {"Authorization": f"Bearer {fuzzed_app[1]}"}
        opened = client.post(
            "/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"}, headers=headers
        )
        assert opened.status_code == 200, opened.text
        yield client


def test_no_operation_answers_a_server_error(
    asgi_client: asgi.ASGIClient, fuzzed_app: tuple[Any, str]
) -> None:
    app, key = fuzzed_app
    headers = {"Authorization": f"Bearer {key}"}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    # Schemathesis's own pytest plugin does not load under this pytest; the same cases come
    # from each operation's hypothesis strategy.
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 28
    tried: dict[str, int] = {}

    def checker(operation: Any) -> Any:
        name = f"{operation.method.upper()} {operation.path}"

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,  # the same requests every run: a failure reproduces
            database=None,
        )
        def check(case: Any) -> None:
            response = case.call(session=asgi_client, headers=headers)
            tried[name] = tried.get(name, 0) + 1
            assert response.status_code < 500, (
                f"{name} -> {response.status_code}: {response.text[:500]}"
                f"\n{case.as_curl_command(headers=headers)}"
            )
            kind = (response.headers.get("content-type") or [""])[0]  # values are lists
            if response.status_code >= 400 and kind.startswith("application/json"):
                error = response.json().get("error")
                assert isinstance(error, dict), response.text  # one error shape everywhere
                assert error["message"]

        return check

    for operation in operations:
        checker(operation)()
    assert set(tried) == {f"{o.method.upper()} {o.path}" for o in operations}
    print(f"\nschemathesis: {sum(tried.values())} requests over {len(tried)} operations, 0 5xx")
