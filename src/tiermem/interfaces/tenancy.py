"""Tenants and API keys: who is calling, and which ids in the stores are theirs.

Every network interface (REST, MCP over HTTP) authenticates a caller to a :class:`Tenant`
and then goes through that tenant's :class:`TenantScope`, which prefixes every user and
session id with ``"<tenant>:"`` before it reaches the service and strips it from every
answer. Tenant ids cannot contain ``:``, so the mapping is injective: tenant A's user
``u-1`` (``a:u-1``) and tenant B's ``u-1`` (``b:u-1``) are different users, and no id a
caller of A can send ever names anything of B.

API keys look like ``tm_<key_id>_<secret>``. The keys file (JSON, ``0600``, written
atomically) holds, per key, its tenant and an scrypt hash of the whole key with a per-key
salt; the plaintext is shown once by :meth:`KeyStore.create` and never stored. A key is
looked up by its ``key_id`` (no scan over hashes) and compared in constant time. The file
is re-read whenever its modification time changes, so ``tiermem keys revoke`` takes effect
on running servers at their next request.

With no keys at all, a server bound to loopback only (``127.0.0.1``, ``::1``) serves the
single tenant ``local``; binding beyond loopback requires at least one key
(:func:`check_bind_allowed`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import tempfile
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from tiermem.errors import NotFoundError, ValidationError
from tiermem.settings import TierMemSettings
from tiermem.store.keys import MAX_ID_LENGTH, validate_id

__all__ = [
    "KEY_PREFIX",
    "LOCAL_TENANT",
    "TENANT_PATTERN",
    "ApiKeyInfo",
    "InvalidIdError",
    "KeyStore",
    "Tenant",
    "TenantScope",
    "check_bind_allowed",
    "default_keys_path",
    "is_loopback_host",
    "validate_tenant_id",
]

logger = logging.getLogger(__name__)

KEY_PREFIX: Final = "tm"
TENANT_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
KEYS_FILE_NAME: Final = "api_keys.json"
_FILE_VERSION: Final = 1
_KEY_ID_BYTES: Final = 8  # 16 hex characters
_SECRET_BYTES: Final = 32  # 256 bits: the key itself is the entropy; scrypt guards the file
_KEY_RE: Final = re.compile(r"tm_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
# scrypt cost: ~16 MiB and a few tens of ms per hash. Verified keys are cached in process
# (see KeyStore._verified), so this is paid once per key per file version, not per request.
_SCRYPT_N: Final = 2**14
_SCRYPT_R: Final = 8
_SCRYPT_P: Final = 1
_SCRYPT_LEN: Final = 32
_MAX_CACHED_KEYS: Final = 4096


@dataclass(frozen=True, slots=True)
class Tenant:
    """An authenticated caller: the tenant id, and the key it used (None in local mode)."""

    id: str
    key_id: str | None = None


LOCAL_TENANT: Final = Tenant("local")
"""The one tenant of a loopback-only server that has no keys."""


@dataclass(frozen=True, slots=True)
class ApiKeyInfo:
    """What :meth:`KeyStore.list` shows of a key: never its secret or hash."""

    key_id: str
    tenant: str
    created_at: datetime
    label: str | None = None
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class InvalidIdError(ValidationError):
    """An id a caller sent cannot be used; ``field`` names the request field."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


def validate_tenant_id(value: object) -> str:
    """Check a tenant id (``[a-z0-9][a-z0-9-]{0,31}``); return it.

    Raises:
        InvalidIdError: it does not match.
    """
    if not isinstance(value, str) or not TENANT_PATTERN.fullmatch(value):
        raise InvalidIdError(
            f"tenant id {value!r} is not valid: use 1 to 32 lowercase letters, digits and "
            "'-', starting with a letter or digit",
            field="tenant",
        )
    return value


class TenantScope:
    """Maps one tenant's ids into the stores' ids and back.

    ``scope("u-1")`` is ``"<tenant>:u-1"``; ``unscope`` strips the prefix and refuses an id
    of another tenant (as not found, so nothing about it leaks).
    """

    __slots__ = ("_prefix", "tenant")

    def __init__(self, tenant: Tenant | str) -> None:
        tenant_id = tenant.id if isinstance(tenant, Tenant) else tenant
        self.tenant = validate_tenant_id(tenant_id)
        self._prefix = f"{self.tenant}:"

    @property
    def max_id_length(self) -> int:
        """The longest id this tenant's callers may send (the store limit less the prefix)."""
        return MAX_ID_LENGTH - len(self._prefix)

    def scope(self, value: object, *, field: str) -> str:
        """The store id for the caller's ``value``.

        Raises:
            InvalidIdError: not a string, empty, with control characters or '/', or too
                long once prefixed (the message gives this tenant's limit).
        """
        try:
            validate_id(value, what=field)
        except ValidationError as exc:
            raise InvalidIdError(str(exc), field=field) from None
        assert isinstance(value, str)  # validate_id checked it; this narrows the type
        if "/" in value:
            # REST routes match the decoded path, so such an id could be created but never
            # addressed again; every interface refuses it so the tenant's ids stay usable
            # from all of them.
            raise InvalidIdError(
                f"{field} {value!r} contains '/', which the API cannot address in a URL "
                "path; use another separator such as ':' or '-'",
                field=field,
            )
        if len(value) > self.max_id_length:
            raise InvalidIdError(
                f"{field} is {len(value)} characters long; the limit is {self.max_id_length} "
                f"for tenant {self.tenant!r} (the store limit of {MAX_ID_LENGTH} less the "
                "tenant prefix). Use a short stable id such as a UUID.",
                field=field,
            )
        return self._prefix + value

    def owns(self, stored: str) -> bool:
        """Whether a store id belongs to this tenant."""
        return stored.startswith(self._prefix)

    def unscope(self, stored: str, *, what: str = "id") -> str:
        """The caller's id for a store id of this tenant.

        Raises:
            NotFoundError: the id belongs to another tenant (never expected: every id this
                scope reads came from :meth:`scope`; refusing keeps a bug from leaking).
        """
        if not stored.startswith(self._prefix):
            raise NotFoundError(f"{what} not found")
        return stored[len(self._prefix) :]


def is_loopback_host(host: str) -> bool:
    """Whether binding ``host`` accepts connections from this machine only."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_bind_allowed(host: str, keystore: KeyStore) -> None:
    """Refuse to serve beyond loopback without keys.

    Raises:
        ValidationError: ``host`` is not loopback and the keys file holds no active key;
            the message says how to create one.
    """
    if is_loopback_host(host):
        return
    if keystore.has_active_keys():
        return
    raise ValidationError(
        f"refusing to listen on {host}: binding beyond localhost requires API keys, and "
        f"{keystore.path} holds no active key. Create one with `tiermem keys create "
        "<tenant>`, or bind 127.0.0.1 for local use without keys."
    )


def default_keys_path(settings: TierMemSettings) -> Path:
    """``settings.api_keys_file``, else ``api_keys.json`` next to the SQLite database."""
    if settings.api_keys_file is not None:
        return settings.api_keys_file
    if settings.sqlite_path is not None:
        return settings.sqlite_path.parent / KEYS_FILE_NAME
    from tiermem.store.backends.sqlite import default_database_path

    return default_database_path().parent / KEYS_FILE_NAME


@dataclass(frozen=True, slots=True)
class _KeyRecord:
    info: ApiKeyInfo
    salt: bytes
    digest: bytes
    n: int
    r: int
    p: int


def _hash(plaintext: str, salt: bytes, *, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        plaintext.encode("ascii"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        dklen=_SCRYPT_LEN,
        maxmem=128 * r * n * 2 + 1_048_576,
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


class KeyStore:
    """API keys per tenant in one JSON file, hashed with scrypt.

    Thread-safe; reads re-load the file when its modification time (or size or inode)
    changed. Writes (:meth:`create`, :meth:`revoke`) lock the file against other writers
    (POSIX ``flock`` on a sibling ``.lock`` file), re-read it, and replace it atomically.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._records: dict[str, _KeyRecord] = {}
        # key_id -> (sha256 of a key that passed scrypt, tenant); cleared on every reload.
        self._verified: OrderedDict[str, tuple[bytes, Tenant]] = OrderedDict()

    @classmethod
    def from_settings(cls, settings: TierMemSettings) -> KeyStore:
        return cls(default_keys_path(settings))

    # -- reading ----------------------------------------------------------------------

    def _refresh(self) -> None:
        """Re-read the file if it changed since the last read. Caller holds ``_lock``."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            if self._stamp is not None or self._records:
                self._records = {}
                self._verified.clear()
            self._stamp = None
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        self._records = self._parse(self.path.read_text(encoding="utf-8"))
        self._verified.clear()
        self._stamp = stamp

    def _parse(self, text: str) -> dict[str, _KeyRecord]:
        try:
            data = json.loads(text)
            if data.get("version") != _FILE_VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            records: dict[str, _KeyRecord] = {}
            for entry in data["keys"]:
                info = ApiKeyInfo(
                    key_id=entry["key_id"],
                    tenant=validate_tenant_id(entry["tenant"]),
                    created_at=datetime.fromisoformat(entry["created_at"]),
                    label=entry.get("label"),
                    revoked_at=_time(entry.get("revoked_at")),
                )
                h = entry["scrypt"]
                records[info.key_id] = _KeyRecord(
                    info=info,
                    salt=base64.b64decode(h["salt"]),
                    digest=base64.b64decode(h["hash"]),
                    n=int(h["n"]),
                    r=int(h["r"]),
                    p=int(h["p"]),
                )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValidationError(
                f"the API keys file {self.path} cannot be read ({exc}); restore it from a "
                "backup or move it away and create new keys"
            ) from exc
        return records

    def list(self) -> list[ApiKeyInfo]:
        """Every key in the file (active and revoked), oldest first."""
        with self._lock:
            self._refresh()
            return sorted(
                (r.info for r in self._records.values()), key=lambda i: (i.created_at, i.key_id)
            )

    def has_active_keys(self) -> bool:
        with self._lock:
            self._refresh()
            return any(r.info.active for r in self._records.values())

    def cached(self, plaintext: str) -> Tenant | None:
        """The tenant of a key already verified since the file was last read, else None.

        Cheap (a SHA-256); a caller on an event loop tries this first and runs
        :meth:`verify` in a thread only when it returns None.
        """
        match = _KEY_RE.fullmatch(plaintext)
        if match is None:
            return None
        with self._lock:
            self._refresh()
            hit = self._verified.get(match.group(1))
            if hit is None:
                return None
            fingerprint = hashlib.sha256(plaintext.encode("ascii")).digest()
            return hit[1] if hmac.compare_digest(hit[0], fingerprint) else None

    def verify(self, plaintext: str) -> Tenant | None:
        """The tenant of an active key, or None for anything else (malformed, unknown,
        revoked, wrong secret). Never raises for a bad key."""
        if not isinstance(plaintext, str):
            return None
        match = _KEY_RE.fullmatch(plaintext)
        if match is None:
            return None
        key_id = match.group(1)
        cached = self.cached(plaintext)
        if cached is not None:
            return cached
        with self._lock:
            self._refresh()
            record = self._records.get(key_id)
            stamp = self._stamp
        if record is None or not record.info.active:
            return None
        # scrypt outside the lock: it is the slow part and other keys need not wait.
        digest = _hash(plaintext, record.salt, n=record.n, r=record.r, p=record.p)
        if not hmac.compare_digest(digest, record.digest):
            return None
        tenant = Tenant(record.info.tenant, key_id=key_id)
        with self._lock:
            if self._stamp == stamp:  # not revoked while we hashed
                self._verified[key_id] = (
                    hashlib.sha256(plaintext.encode("ascii")).digest(),
                    tenant,
                )
                self._verified.move_to_end(key_id)
                while len(self._verified) > _MAX_CACHED_KEYS:
                    self._verified.popitem(last=False)
            else:
                current = self._records.get(key_id)
                if current is None or not current.info.active:
                    return None
        return tenant

    # -- writing ----------------------------------------------------------------------

    def create(self, tenant: str, *, label: str | None = None) -> tuple[str, str]:
        """Create a key for ``tenant``; return ``(key_id, plaintext)``.

        The plaintext is returned once and never stored: show it to the operator now.

        Raises:
            InvalidIdError: a bad tenant id.
            ValidationError: a label over 200 characters or the keys file is unreadable.
        """
        validate_tenant_id(tenant)
        if label is not None and len(label) > 200:
            raise ValidationError("a key label is at most 200 characters")
        key_id = secrets.token_hex(_KEY_ID_BYTES)
        secret = secrets.token_urlsafe(_SECRET_BYTES)
        plaintext = f"{KEY_PREFIX}_{key_id}_{secret}"
        salt = secrets.token_bytes(16)
        digest = _hash(plaintext, salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P)
        entry = {
            "key_id": key_id,
            "tenant": tenant,
            "label": label,
            "created_at": datetime.now(UTC).isoformat(),
            "revoked_at": None,
            "scrypt": {
                "n": _SCRYPT_N,
                "r": _SCRYPT_R,
                "p": _SCRYPT_P,
                "salt": _b64(salt),
                "hash": _b64(digest),
            },
        }
        with self._write() as entries:
            entries.append(entry)
        return key_id, plaintext

    def revoke(self, key_id: str) -> ApiKeyInfo:
        """Revoke a key; servers reading this file refuse it from their next request.

        Raises:
            NotFoundError: no key has this id.
        """
        with self._write() as entries:
            for entry in entries:
                if entry["key_id"] == key_id:
                    if entry.get("revoked_at") is None:
                        entry["revoked_at"] = datetime.now(UTC).isoformat()
                    break
            else:
                raise NotFoundError(f"no API key with id {key_id!r}; see `tiermem keys list`")
        with self._lock:
            self._refresh()
            return self._records[key_id].info

    @contextmanager
    def _write(self) -> Any:
        """Lock, read the raw entries, let the caller change them, write atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _flock(fd)
            entries: list[dict[str, Any]] = []
            if self.path.exists():
                self._parse(self.path.read_text(encoding="utf-8"))  # refuse a broken file
                entries = json.loads(self.path.read_text(encoding="utf-8"))["keys"]
            yield entries
            body = json.dumps({"version": _FILE_VERSION, "keys": entries}, indent=2) + "\n"
            _write_atomically(self.path, body)
        finally:
            os.close(fd)  # closing releases the flock


def _flock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: single-writer use only
        return
    fcntl.flock(fd, fcntl.LOCK_EX)


def _write_atomically(path: Path, body: str) -> None:
    """Write ``body`` to a 0600 temporary file in the same directory, fsync, rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.chmod(tmp, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
