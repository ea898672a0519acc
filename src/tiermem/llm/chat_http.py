"""One JSON POST for the HTTP chat adapters (OpenAI-compatible, Anthropic), with httpx's
errors and the server's error answers mapped to tiermem's at this boundary::

    timeout                               -> BackendTimeoutError (retried)
    cannot connect                        -> BackendUnavailableError (retried)
    HTTP 408, 409, 429, 5xx, 529          -> BackendError, retryable
    other HTTP errors (400, 401, 403, 404) -> BackendError, not retryable
    a 2xx body that is not a JSON object  -> BackendError, not retryable (wrong base_url?)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    UnsupportedCapabilityError,
    ValidationError,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["open_http_client", "post_json", "retryable_status"]

_ADVICE = {
    400: "check llm_model and max_tokens; if the server does not support response_format, "
    "turn json_mode off",
    401: "check the API key (TIERMEM_LLM_API_KEY)",
    403: "check the API key's permissions for this model",
    404: "check llm_base_url (OpenAI-compatible servers usually end in /v1) and llm_model",
    429: "the server is rate limiting: slow down or raise the quota",
}


def open_http_client(
    owner: str,
    *,
    base_url: str,
    timeout: float,
    max_attempts: int,
    http_client: httpx.AsyncClient | None,
) -> httpx.AsyncClient:
    """The client an HTTP chat adapter uses, after the checks every adapter shares:
    ``http_client`` if given, else a new one with ``timeout``.

    Raises:
        UnsupportedCapabilityError: httpx is not installed (``owner`` names the adapter).
        ValidationError: ``base_url`` is not http(s), ``timeout`` <= 0 or
            ``max_attempts`` < 1.
    """
    try:
        import httpx
    except ImportError as exc:
        raise UnsupportedCapabilityError(
            f"{owner} needs httpx; install it with `pip install 'tiermem[llm]'`"
        ) from exc
    if not base_url.startswith(("http://", "https://")):
        raise ValidationError(f"base_url must start with http:// or https://, got {base_url!r}")
    if timeout <= 0:
        raise ValidationError(f"timeout must be > 0 seconds, got {timeout}")
    if max_attempts < 1:
        raise ValidationError(f"max_attempts must be >= 1, got {max_attempts}")
    return http_client or httpx.AsyncClient(timeout=timeout)


def retryable_status(status: int) -> bool:
    """Whether the same request may succeed later (timeouts, conflicts, rate limits, 5xx)."""
    return status in (408, 409, 429) or status >= 500


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str],
    backend: str,
) -> dict[str, Any]:
    """The JSON object ``url`` answers to ``body``.

    Raises:
        BackendError: see the module docstring for the mapping and which are retryable.
    """
    import httpx

    try:
        response = await client.post(url, json=body, headers=headers)
    except httpx.TimeoutException as exc:
        raise BackendTimeoutError(
            f"{url} did not answer in time ({exc!r}); raise llm_timeout_seconds for slow models",
            backend=backend,
        ) from exc
    except httpx.TransportError as exc:
        raise BackendUnavailableError(
            f"cannot reach {url}: {exc!r}; is the server running and llm_base_url right?",
            backend=backend,
        ) from exc
    status = response.status_code
    if not 200 <= status < 300:
        retryable = retryable_status(status)
        advice = _ADVICE.get(status, "retry later" if retryable else "check the request")
        raise BackendError(
            f"{url} answered HTTP {status}: {_error_text(response)}; {advice}",
            backend=backend,
            retryable=retryable,
        )
    try:
        payload = response.json()
    except ValueError as exc:
        raise BackendError(
            f"{url} answered HTTP {status} with a body that is not JSON ({response.text[:200]!r});"
            " is llm_base_url the API root?",
            backend=backend,
        ) from exc
    if not isinstance(payload, dict):
        raise BackendError(
            f"{url} answered with a JSON {type(payload).__name__}, expected an object",
            backend=backend,
        )
    return payload


def _error_text(response: httpx.Response) -> str:
    """The server's own error message (OpenAI and Anthropic both use ``error.message``)."""
    try:
        payload = response.json()
    except ValueError:
        return repr(response.text[:300])
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = error.get("type") or error.get("code")
            return f"{kind}: {error['message']}" if kind else str(error["message"])
        if isinstance(error, str):
            return error
    return repr(response.text[:300])
