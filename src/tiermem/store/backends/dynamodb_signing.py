"""Signature V4 for the DynamoDB clients tiermem opens, at a fraction of botocore's CPU.

botocore's :class:`~botocore.auth.SigV4Auth` costs about a tenth of a DynamoDB request's
client instructions: it builds the headers to sign twice, each time in an
``email.message``-based header map, parses the URL twice, derives the signing key (four
HMACs) on every request, and hashes the payload through ``request.body``, which prepares
the whole request (a copy of every header) to hand back the same bytes.
:class:`FastSigV4Auth` is the same algorithm with those costs taken out: one pass over the
headers into a plain dict, the URL's parts and the signing key kept (both bounded), the
body hashed as it is; the rest (the date header, the session token, an unsigned or
streamed payload, query parameters) is done by botocore's own methods, so a request gets
exactly the headers botocore's signer would give it. A header name with spaces around it
(botocore strips it in one place and not in another) is signed by botocore's code itself.
``tests/unit/test_dynamodb_signing.py`` compares both signers' headers on many requests.

It is installed through botocore's public extension points: the class is registered in
:data:`botocore.auth.AUTH_TYPE_MAPS` under :data:`SIGNATURE_VERSION`, and
:func:`install` registers a ``choose-signer`` handler on one client's events that picks it
wherever botocore would sign with plain ``v4``. Only clients the DynamoDB stores open
themselves get it; a client passed in is left as its owner configured it. And only with a
botocore it agrees with (:func:`supported`): every helper it calls is there, and once per
process both signers sign a probe request alike; otherwise botocore's signer stays.
"""

from __future__ import annotations

import hmac
import logging
from hashlib import sha256
from typing import Any

import botocore.auth
from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.compat import urlsplit
from botocore.credentials import ReadOnlyCredentials
from botocore.exceptions import NoCredentialsError

__all__ = ["SIGNATURE_VERSION", "FastSigV4Auth", "install", "supported"]

SIGNATURE_VERSION = "v4-tiermem"
"""The name :class:`FastSigV4Auth` is registered under in botocore's signer table."""

CACHE_ENTRIES = 64
"""Most entries each of the two caches (signing keys, URL parts) keeps; a full cache is
emptied and refilled. Keys change once a day per credential and region, URLs once per
endpoint, so either fills only with that many credentials or endpoints in one process.
The signing keys' cache is keyed by the secret itself, which botocore holds in memory
anyway; a rotated secret's entries go when the cache next fills."""

# botocore's stubs leave out the signer's private helpers, which this module reuses so that
# every step it does not change stays botocore's own.
_botocore_auth: Any = botocore.auth
_log = logging.getLogger("botocore.auth")
_keys: dict[tuple[str, str, str, str], bytes] = {}
_urls: dict[str, tuple[str, str, str]] = {}


class FastSigV4Auth(SigV4Auth):
    """:class:`~botocore.auth.SigV4Auth` with its per-request overhead taken out; the
    headers it sets are the same (see the module docstring)."""

    def add_auth(self, request: Any) -> None:
        this: Any = self  # for botocore's private helpers (see ``_botocore_auth``)
        credentials = this.credentials
        if credentials is None:
            raise NoCredentialsError()
        headers = request.headers
        # The module's attribute, looked up now, as botocore's signer does (tests freeze it).
        timestamp = _botocore_auth.get_current_datetime().strftime(SIGV4_TIMESTAMP)
        request.context["timestamp"] = timestamp
        this._modify_request_before_signing(request)
        signed: dict[str, list[str]] = {}
        unsigned = _botocore_auth.SIGNED_HEADERS_BLACKLIST  # read as botocore reads it
        for name, value in headers.items():
            lname = name.lower()
            if lname not in unsigned:
                if lname != lname.strip():  # botocore strips such a name in one place only
                    super().add_auth(request)
                    return
                values = signed.get(lname)
                if values is None:
                    signed[lname] = [value]
                else:
                    values.append(value)
        url = request.url
        parts = _urls.get(url)
        if parts is None:
            parts = _url_parts(this, url)
        path, query, host = parts
        if request.params:
            query = self.canonical_query_string(request)
        if "host" not in signed:
            signed["host"] = [host]
        names = sorted(signed)
        canonical_headers = "\n".join(
            f"{name}:{','.join(' '.join(v.split()) for v in signed[name])}" for name in names
        )
        signed_names = ";".join(names)
        body_hash = headers.get("X-Amz-Content-SHA256")
        if body_hash is None:
            data = request.data
            if type(data) is bytes and not this._is_streaming_checksum_payload(request):
                # ``payload``, without ``request.body``, which prepares the whole request
                # (a copy of every header) to hand back the same bytes. (An unsigned
                # payload has its X-Amz-Content-SHA256 header by now.)
                body_hash = sha256(data).hexdigest()
            else:
                body_hash = self.payload(request)
        canonical_request = "\n".join(
            (request.method.upper(), path, query, canonical_headers + "\n", signed_names, body_hash)
        )
        day = timestamp[:8]
        scope = f"{day}/{this._region_name}/{this._service_name}/aws4_request"
        string_to_sign = (
            f"AWS4-HMAC-SHA256\n{timestamp}\n{scope}\n"
            f"{sha256(canonical_request.encode('utf-8')).hexdigest()}"
        )
        if _log.isEnabledFor(logging.DEBUG):  # what botocore's signer logs, to the same logger
            _log.debug("CanonicalRequest:\n%s", canonical_request)
            _log.debug("StringToSign:\n%s", string_to_sign)
        signature = hmac.new(
            _signing_key(credentials.secret_key, day, this._region_name, this._service_name),
            string_to_sign.encode("utf-8"),
            sha256,
        ).hexdigest()
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
            f"SignedHeaders={signed_names}, Signature={signature}"
        )


def _url_parts(auth: Any, url: str) -> tuple[str, str, str]:
    """The canonical path, the canonical query string of the URL, and the host header
    value, by botocore's own functions; kept for the next request to ``url``."""
    split = urlsplit(url)
    parts = (
        auth._normalize_url_path(split.path),
        auth._canonical_query_string_url(split),
        _botocore_auth._host_from_url(url),
    )
    if len(_urls) >= CACHE_ENTRIES:
        _urls.clear()
    _urls[url] = parts
    return parts


def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    """The SigV4 signing key of ``secret`` for ``day`` (YYYYMMDD), region and service:
    four chained HMACs, computed once per day and kept."""
    cache_key = (secret, day, region, service)
    key = _keys.get(cache_key)
    if key is None:
        key = f"AWS4{secret}".encode()
        for part in (day, region, service, "aws4_request"):
            key = hmac.new(key, part.encode("utf-8"), sha256).digest()
        if len(_keys) >= CACHE_ENTRIES:
            _keys.clear()
        _keys[cache_key] = key
    return key


def _choose(
    signature_version: Any = None, context: dict[str, Any] | None = None, **_: Any
) -> str | None:
    """``choose-signer`` handler: this signer wherever botocore would use plain ``v4``
    (None leaves botocore's choice as it is). It runs before botocore's own handler
    (``set_operation_specific_signer``), so an operation with an auth type of its own, or
    an unsigned payload (which that handler marks in the context), is left to botocore."""
    if signature_version != "v4":
        return None
    if context and (
        context.get("unsigned_payload") or context.get("auth_type") not in (None, "v4")
    ):
        return None
    return SIGNATURE_VERSION


_HELPERS = (
    "_modify_request_before_signing",
    "_is_streaming_checksum_payload",
    "_normalize_url_path",
    "_canonical_query_string_url",
    "canonical_query_string",
    "payload",
)
_MODULE_HELPERS = ("get_current_datetime", "_host_from_url")


_agreed: list[bool] = []
"""The outcome of :func:`_signs_alike`, once per process."""


def supported() -> bool:
    """Whether :class:`FastSigV4Auth` may sign with the installed botocore: its signer has
    every helper the fast one calls, and both sign a probe request alike.

    The dynamodb extra allows botocore releases older than the one the tests run
    (``botocore.auth.get_current_datetime``, the signer's clock, came with 1.40.2; before,
    its ``add_auth`` read ``utcnow`` itself), and a later release could change how it
    signs. With either, requests keep botocore's own signer rather than carry a signature
    AWS would refuse."""
    if not (
        all(hasattr(SigV4Auth, name) for name in _HELPERS)
        and all(hasattr(_botocore_auth, name) for name in _MODULE_HELPERS)
    ):
        return False
    if not _agreed:
        _agreed.append(_signs_alike())
    return _agreed[0]


def _signs_alike() -> bool:
    """Whether botocore's signer and :class:`FastSigV4Auth` give a DynamoDB-shaped request
    (session token, the headers botocore sends) the same headers; compared again if the
    clock ticked to the next second between the two."""
    credentials = ReadOnlyCredentials("AKIDPROBE", "probe/secret+key", "probe-token")
    for _ in range(3):
        signed = []
        for signer in (SigV4Auth, FastSigV4Auth):
            request = AWSRequest(
                method="POST",
                url="https://dynamodb.us-east-1.amazonaws.com/",
                data=b'{"TableName": "probe"}',
                headers={
                    "X-Amz-Target": "DynamoDB_20120810.GetItem",
                    "Content-Type": "application/x-amz-json-1.0",
                    "User-Agent": "probe",
                    "amz-sdk-request": "attempt=1; max=3",
                },
            )
            signer(credentials, "dynamodb", "us-east-1").add_auth(request)
            signed.append(request)
        reference, ours = signed
        if reference.context["timestamp"] == ours.context["timestamp"]:
            return dict(reference.headers) == dict(ours.headers)
    return False


def install(client: Any) -> bool:
    """Sign ``client``'s ``v4`` requests with :class:`FastSigV4Auth` (one client's events;
    other clients are untouched); False, and nothing changed, when the installed botocore
    is not one it supports (:func:`supported`)."""
    if not supported():
        return False
    client.meta.events.register("choose-signer.dynamodb", _choose)
    return True


botocore.auth.AUTH_TYPE_MAPS[SIGNATURE_VERSION] = FastSigV4Auth
