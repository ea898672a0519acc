"""Session names written into prose lose the caller's tenant prefix."""

from __future__ import annotations

import pytest

from tiermem.interfaces.display import unscope_text
from tiermem.interfaces.tenancy import TenantScope


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("[pref, session acme:s-1 turn 0]", "[pref, session s-1 turn 0]"),
        ("Session acme:s-1 — Sunday 2026-11-22:", "Session s-1 — Sunday 2026-11-22:"),
        ("sessions acme:s-1 and acme:s-2", "sessions s-1 and acme:s-2"),
        ("session beta:s-1", "session beta:s-1"),  # not this tenant's: left alone
        ("I wrote acme:s-1 myself", "I wrote acme:s-1 myself"),  # not a session name
    ],
)
def test_unscope_text(text: str, shown: str) -> None:
    assert unscope_text(text, TenantScope("acme")) == shown


def test_without_a_scope_text_is_unchanged() -> None:
    assert unscope_text("session acme:s-1", None) == "session acme:s-1"
