"""The REST API (FastAPI): :func:`create_app`, and :func:`run_server` for ``tiermem serve``.

Needs the ``api`` extra (``pip install 'tiermem[api]'``). Routes, auth, tenants, limits,
errors and metrics are described in ``docs/api.md``.
"""

from tiermem.interfaces.api.app import create_app
from tiermem.interfaces.api.server import run_server
from tiermem.interfaces.tenancy import check_bind_allowed

__all__ = ["check_bind_allowed", "create_app", "run_server"]
