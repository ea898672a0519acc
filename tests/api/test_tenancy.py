"""API keys and tenant scopes (tiermem.interfaces.tenancy)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tiermem.errors import NotFoundError, ValidationError
from tiermem.interfaces.tenancy import (
    InvalidIdError,
    KeyStore,
    TenantScope,
    check_bind_allowed,
    default_keys_path,
    is_loopback_host,
    validate_tenant_id,
)
from tiermem.settings import TierMemSettings
from tiermem.store.keys import MAX_ID_LENGTH

ALL_INTERFACES = "0.0.0.0"  # noqa: S104 -- refusing to bind it is what is tested


def test_keys_are_stored_hashed_and_the_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    store = KeyStore(path)
    key_id, plaintext = store.create("acme", label="ci")
    text = path.read_text()
    # tm_<hex key id>_<urlsafe secret>: the secret itself may contain "_".
    secret = plaintext.split("_", 2)[2]
    assert len(secret) >= 16
    assert plaintext not in text
    assert secret[:16] not in text  # not even a prefix of the secret
    entry = json.loads(text)["keys"][0]
    assert entry["key_id"] == key_id
    assert entry["tenant"] == "acme"
    assert set(entry["scrypt"]) == {"n", "r", "p", "salt", "hash"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert store.verify(plaintext) is not None


def test_two_keys_get_different_salts(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    store.create("acme")
    store.create("acme")
    salts = {k["scrypt"]["salt"] for k in json.loads(store.path.read_text())["keys"]}
    assert len(salts) == 2


def test_verify_returns_the_keys_tenant_and_refuses_everything_else(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    key_id, plaintext = store.create("acme")
    tenant = store.verify(plaintext)
    assert tenant is not None
    assert (tenant.id, tenant.key_id) == ("acme", key_id)
    wrong_secret = plaintext[:-4] + ("AAAA" if not plaintext.endswith("AAAA") else "BBBB")
    other_id = "tm_" + "0" * 16 + plaintext[len("tm_") + 16 :]
    for bad in (wrong_secret, other_id, "", "tm_", plaintext + "x", plaintext.upper(), "Bearer"):
        assert store.verify(bad) is None, bad
    assert store.cached(wrong_secret) is None


def test_a_revocation_reaches_a_running_server_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    server_side = KeyStore(path)
    key_id, plaintext = KeyStore(path).create("acme")
    assert server_side.verify(plaintext) is not None
    assert server_side.cached(plaintext) is not None
    info = KeyStore(path).revoke(key_id)  # another process: `tiermem keys revoke`
    assert not info.active
    assert server_side.cached(plaintext) is None
    assert server_side.verify(plaintext) is None
    assert [k.active for k in server_side.list()] == [False]


def test_revoking_an_unknown_key_says_so(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    store.create("acme")
    with pytest.raises(NotFoundError, match="no API key"):
        store.revoke("0123456789abcdef")


def test_a_broken_keys_file_is_a_clear_error_not_an_open_door(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text("{not json")
    store = KeyStore(path)
    with pytest.raises(ValidationError, match="cannot be read"):
        store.verify("tm_0123456789abcdef_" + "a" * 43)
    with pytest.raises(ValidationError, match="cannot be read"):
        store.create("acme")


@pytest.mark.parametrize("tenant", ["", "A", "-a", "a:b", "a_b", "a" * 33, "é", "a b"])
def test_bad_tenant_ids_are_refused(tenant: str) -> None:
    with pytest.raises(InvalidIdError):
        validate_tenant_id(tenant)


@pytest.mark.parametrize("tenant", ["a", "0", "acme-eu-1", "a" * 32])
def test_good_tenant_ids_are_accepted(tenant: str) -> None:
    assert validate_tenant_id(tenant) == tenant


def test_scopes_are_injective_and_invertible() -> None:
    a, ab = TenantScope("a"), TenantScope("a-b")
    # "a" + ":" + "b:x" must not equal "a-b" + ":" + "x" or anything of another tenant.
    ids = ["u-1", "b:x", "x", ":", "a:u-1"]
    scoped = {(t.tenant, i): t.scope(i, field="user_id") for t in (a, ab) for i in ids}
    assert len(set(scoped.values())) == len(scoped)
    for (tenant, original), stored in scoped.items():
        scope = a if tenant == "a" else ab
        assert scope.unscope(stored) == original
        other = ab if tenant == "a" else a
        assert not other.owns(stored)
        with pytest.raises(NotFoundError):
            other.unscope(stored)


def test_an_id_too_long_after_scoping_names_the_tenants_limit() -> None:
    scope = TenantScope("acme")
    limit = MAX_ID_LENGTH - len("acme:")
    assert scope.scope("x" * limit, field="session_id") == "acme:" + "x" * limit
    with pytest.raises(InvalidIdError, match=f"the limit is {limit} for tenant 'acme'") as info:
        scope.scope("x" * (limit + 1), field="session_id")
    assert info.value.field == "session_id"


@pytest.mark.parametrize("value", ["", "a\nb", "\ud800", 5, None])
def test_bad_ids_are_refused_with_their_field(value: object) -> None:
    with pytest.raises(InvalidIdError) as info:
        TenantScope("acme").scope(value, field="user_id")
    assert info.value.field == "user_id"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        (ALL_INTERFACES, False),
        ("::", False),
        ("192.168.1.10", False),
        ("example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_binding_beyond_localhost_needs_an_active_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    check_bind_allowed("127.0.0.1", store)  # local use needs no key
    with pytest.raises(ValidationError, match="tiermem keys create"):
        check_bind_allowed(ALL_INTERFACES, store)
    key_id, _ = store.create("acme")
    check_bind_allowed(ALL_INTERFACES, store)
    store.revoke(key_id)
    with pytest.raises(ValidationError, match="no active key"):
        check_bind_allowed(ALL_INTERFACES, store)


def test_the_keys_file_defaults_to_the_sqlite_directory(tmp_path: Path) -> None:
    assert default_keys_path(TierMemSettings(sqlite_path=tmp_path / "db" / "t.db")) == (
        tmp_path / "db" / "api_keys.json"
    )
    explicit = tmp_path / "k.json"
    assert default_keys_path(TierMemSettings(api_keys_file=explicit)) == explicit
