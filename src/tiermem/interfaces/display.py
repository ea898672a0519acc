"""Text shown to a tenant's caller: the session names that context assembly and the user
profile write into prose (``session acme:s-1``, ``Session acme:s-1 — Sunday``) carry the
store's tenant prefix, which the caller must never see. Ids in fields are unscoped by
:class:`~tiermem.interfaces.tenancy.TenantScope`; this does the same for prose.
"""

from __future__ import annotations

import re

from tiermem.interfaces.tenancy import TenantScope

__all__ = ["unscope_text"]


def unscope_text(text: str, scope: TenantScope | None) -> str:
    """``text`` with ``session <tenant>:<id>`` (any case) written as ``session <id>``."""
    if scope is None:
        return text
    pattern = rf"(?i)\b(sessions?\s+){re.escape(scope.tenant)}:"
    return re.sub(pattern, r"\1", text)
