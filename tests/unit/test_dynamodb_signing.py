"""The fast Signature V4 signer gives every request exactly the headers botocore's gives it.

Both signers sign copies of the same request at the same frozen instant (botocore's signer
and ours read the time through ``botocore.auth.get_current_datetime``), and every header is
compared, ``Authorization`` included. botocore's :class:`~botocore.auth.SigV4Auth` is the
reference: DynamoDB Local accepts any signature, so this comparison is what shows the
signatures would hold against AWS.
"""

from __future__ import annotations

import datetime
from typing import Any

import botocore.auth
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from tiermem.store.backends import dynamodb_signing
from tiermem.store.backends.dynamodb_signing import FastSigV4Auth

KEYS = ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None)
TOKEN = ReadOnlyCredentials("ASIAEXAMPLE", "secret/with+chars", "FwoGZXIvYXdzEXAMPLE//token==")
BODY = b'{"TableName": "t", "Key": {"pk": {"S": "S#x"}, "sk": {"S": "M"}}}'
HEADERS = {
    "X-Amz-Target": "DynamoDB_20120810.GetItem",
    "Content-Type": "application/x-amz-json-1.0",
    "User-Agent": "Botocore/1.40 ua/2.1 lib/tiermem#1",
    "amz-sdk-invocation-id": "7c1d-41",
    "amz-sdk-request": "attempt=1; max=3",
    "Content-Length": str(len(BODY)),
}


def _request(
    url: str = "https://dynamodb.us-east-1.amazonaws.com/",
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    context: dict[str, Any] | None = None,
    method: str = "POST",
    body: bytes | str = BODY,
    twice: tuple[str, ...] = (),
) -> AWSRequest:
    request = AWSRequest(
        method=method, url=url, data=body, headers=HEADERS if headers is None else headers
    )
    if params:
        request.params = params
    request.context = dict(context or {})
    for name, value in zip(twice[::2], twice[1::2], strict=True):
        request.headers[name] = value  # botocore's HTTPHeaders keeps both of a repeated name
    return request


def _signed(cls: type[SigV4Auth], request: AWSRequest, credentials: Any, region: str) -> Any:
    cls(credentials, "dynamodb", region).add_auth(request)
    return request


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> list[datetime.datetime]:
    """The instant both signers read; a test may move it."""
    now = [datetime.datetime(2026, 11, 24, 23, 59, 59)]
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: now[0])
    return now


CASES: dict[str, dict[str, Any]] = {
    "plain https": {},
    "session token": {"credentials": TOKEN},
    "http on a port (DynamoDB Local)": {"url": "http://127.0.0.1:8000/"},
    "https on its default port": {"url": "https://dynamodb.eu-west-1.amazonaws.com:443/"},
    "ipv6 endpoint": {"url": "http://[::1]:8000/"},
    "upper-case host and a path": {"url": "https://DynamoDB.example.COM/a b/../c/"},
    "query in the url": {"url": "https://dynamodb.example.com/?b=2&a=1&a=0"},
    "query as params": {"params": {"Z": "1", "a b": "x/y"}},
    "values with runs of spaces": {
        "headers": HEADERS | {"X-Custom": "  a   b\t c  ", "x-amz-meta": "1,2"},
    },
    "a host header already set": {"headers": HEADERS | {"Host": "proxy.internal:8443"}},
    "payload hash header given": {
        "headers": HEADERS | {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"},
    },
    "unsigned payload over https": {"context": {"payload_signing_enabled": False}},
    "no body": {"body": b""},
    "a text body": {"body": BODY.decode()},
    "a streaming checksum": {"context": {"checksum": {"request_algorithm": {"in": "trailer"}}}},
    "another region": {"region": "ap-southeast-2"},
    "a GET": {"method": "get"},
    "a Date header (botocore rewrites it)": {
        "headers": HEADERS | {"Date": "Mon, 01 Jan 2001 00:00:00 GMT"},
    },
    "a non-ASCII value": {"headers": HEADERS | {"X-Note": "café"}},
    "a header botocore never signs (Lambda's trace id)": {
        "headers": HEADERS | {"X-Amzn-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793"},
    },
    "a header set twice": {"twice": ("X-Dup", "a  b", "x-dup", "c")},
    # Not on the fast path: botocore's own code signs it.
    "a header name with spaces": {"headers": HEADERS | {" X-Spaced ": "v"}},
    "a stale Authorization header (a retry)": {
        "headers": HEADERS | {"Authorization": "old", "X-Amz-Date": "20000101T000000Z"},
    },
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_fast_signer_sets_the_headers_botocore_sets(
    case: str, frozen: list[datetime.datetime], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = dict(CASES[case])
    credentials = spec.pop("credentials", KEYS)
    region = spec.pop("region", "us-east-1")
    reference = _signed(SigV4Auth, _request(**spec), credentials, region)
    # botocore's own add_auth, run for the fast signer: only the case it hands over.
    handed_over: list[object] = []
    stock = SigV4Auth.add_auth

    def add_auth(self: SigV4Auth, request: Any) -> None:
        if type(self) is FastSigV4Auth:
            handed_over.append(request)
        stock(self, request)

    monkeypatch.setattr(SigV4Auth, "add_auth", add_auth)
    ours = _signed(FastSigV4Auth, _request(**spec), credentials, region)
    assert len(handed_over) == (1 if case == "a header name with spaces" else 0)
    assert list(ours.headers.items()) == list(reference.headers.items())
    assert ours.headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=")
    assert ours.context["timestamp"] == reference.context["timestamp"]


def test_a_new_day_signs_with_a_new_key(frozen: list[datetime.datetime]) -> None:
    """The signing key is kept per day: a request after midnight is signed with the new
    day's key, as botocore derives it."""
    signatures = []
    for instant in (frozen[0], frozen[0] + datetime.timedelta(seconds=1)):
        frozen[0] = instant
        reference = _signed(SigV4Auth, _request(), KEYS, "us-east-1")
        ours = _signed(FastSigV4Auth, _request(), KEYS, "us-east-1")
        assert ours.headers["Authorization"] == reference.headers["Authorization"]
        signatures.append(ours.headers["Authorization"])
    assert "/20261125/" in signatures[1]
    assert signatures[0] != signatures[1]


def test_rotated_credentials_sign_with_their_own_key(frozen: list[datetime.datetime]) -> None:
    rotated = ReadOnlyCredentials(KEYS.access_key, "another-secret", None)
    for credentials in (KEYS, rotated, KEYS):
        reference = _signed(SigV4Auth, _request(), credentials, "us-east-1")
        ours = _signed(FastSigV4Auth, _request(), credentials, "us-east-1")
        assert ours.headers["Authorization"] == reference.headers["Authorization"]


def test_no_credentials_is_botocores_error() -> None:
    from botocore.exceptions import NoCredentialsError

    with pytest.raises(NoCredentialsError):
        FastSigV4Auth(None, "dynamodb", "us-east-1").add_auth(_request())


def test_the_caches_stay_bounded(frozen: list[datetime.datetime]) -> None:
    limit = dynamodb_signing.CACHE_ENTRIES
    for i in range(limit * 3):
        credentials = ReadOnlyCredentials("AKID", f"secret-{i}", None)
        _signed(FastSigV4Auth, _request(f"http://127.0.0.1:{8000 + i}/"), credentials, "r")
        assert len(dynamodb_signing._keys) <= limit
        assert len(dynamodb_signing._urls) <= limit
    # Still right after the caches were emptied and refilled.
    reference = _signed(SigV4Auth, _request(), KEYS, "us-east-1")
    ours = _signed(FastSigV4Auth, _request(), KEYS, "us-east-1")
    assert ours.headers["Authorization"] == reference.headers["Authorization"]


def test_choose_signer_replaces_only_plain_v4() -> None:
    assert dynamodb_signing._choose(signature_version="v4") == dynamodb_signing.SIGNATURE_VERSION
    for other in ("v4a", "v4-query", "s3v4", None):
        assert dynamodb_signing._choose(signature_version=other) is None
    assert botocore.auth.AUTH_TYPE_MAPS[dynamodb_signing.SIGNATURE_VERSION] is FastSigV4Auth


class _Events:
    def __init__(self) -> None:
        self.registered: list[str] = []

    def register(self, event: str, handler: Any) -> None:
        self.registered.append(event)


class _Client:
    def __init__(self) -> None:
        self.meta = type("Meta", (), {"events": _Events()})()


@pytest.fixture(autouse=True)
def fresh_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test decides anew whether the fast signer agrees with botocore's."""
    monkeypatch.setattr(dynamodb_signing, "_agreed", [])


def test_it_is_installed_on_the_botocore_it_was_tested_with() -> None:
    client = _Client()
    assert dynamodb_signing.supported()
    assert dynamodb_signing.install(client)
    assert client.meta.events.registered == ["choose-signer.dynamodb"]


@pytest.mark.parametrize(
    ("owner", "helper"),
    [(SigV4Auth, name) for name in dynamodb_signing._HELPERS]
    # get_current_datetime: botocore before 1.40.2 has none
    + [(botocore.auth, name) for name in dynamodb_signing._MODULE_HELPERS],
)
def test_an_older_botocore_keeps_its_own_signer(
    owner: Any, helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dynamodb extra allows botocore releases whose signer lacks a helper the fast
    signer calls: the client is then left to botocore's signer, not broken."""
    monkeypatch.delattr(owner, helper)
    client = _Client()
    assert not dynamodb_signing.supported()
    assert not dynamodb_signing.install(client)
    assert client.meta.events.registered == []


def test_a_botocore_that_signs_differently_keeps_its_own_signer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Should a botocore release change how it canonicalises a header, the probe request
    is signed differently by the two and the fast signer is not installed: a signature
    AWS would refuse is never sent."""
    monkeypatch.setattr(SigV4Auth, "_header_value", lambda self, value: value.lower())
    client = _Client()
    assert not dynamodb_signing.install(client)
    assert client.meta.events.registered == []


def test_the_probe_is_signed_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    probes: list[int] = []
    real = dynamodb_signing._signs_alike
    monkeypatch.setattr(dynamodb_signing, "_signs_alike", lambda: probes.append(1) or real())
    for _ in range(3):
        assert dynamodb_signing.install(_Client())
    assert probes == [1]


def test_urls_that_differ_only_in_their_query_are_kept_apart(
    frozen: list[datetime.datetime],
) -> None:
    for url in ("http://127.0.0.1:8000/?a=1", "http://127.0.0.1:8000/?a=2"):
        reference = _signed(SigV4Auth, _request(url), KEYS, "us-east-1")
        ours = _signed(FastSigV4Auth, _request(url), KEYS, "us-east-1")
        assert ours.headers["Authorization"] == reference.headers["Authorization"]


@pytest.mark.parametrize("context", [{"unsigned_payload": True}, {"auth_type": "v4a"}])
def test_an_operation_with_its_own_auth_is_left_to_botocore(context: dict[str, Any]) -> None:
    """botocore's own handler, which runs after this one, marks an unsigned payload in the
    context or picks another signer; the fast signer does not take those requests."""
    assert dynamodb_signing._choose(signature_version="v4", context=context) is None
    assert dynamodb_signing._choose(signature_version="v4", context={"auth_type": "v4"}) == (
        dynamodb_signing.SIGNATURE_VERSION
    )
