"""Python client SDK of the tiermem REST API (needs ``httpx``: the ``llm`` or ``api`` extra).

:class:`AsyncTierMemClient` has the in-process library's method names
(``open_session``/``session``, ``add_turn``, ``get_turn(s)``, ``context``, ``close``,
``remember``, ``recall``, ``forget``, ``purge_user``...); :class:`TierMemClient` is its one
blocking facade. Errors are tiermem's own (:mod:`tiermem.client.errors`).
"""

from tiermem.client._async import AsyncTierMemClient, RemoteSession
from tiermem.client._sync import TierMemClient
from tiermem.client.errors import (
    ApiResponseError,
    AuthenticationError,
    RateLimitedError,
    RemoteToolError,
    RequestRejectedError,
)

__all__ = [
    "ApiResponseError",
    "AsyncTierMemClient",
    "AuthenticationError",
    "RateLimitedError",
    "RemoteSession",
    "RemoteToolError",
    "RequestRejectedError",
    "TierMemClient",
]
