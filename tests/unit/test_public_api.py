"""Every public module's ``__all__`` names things that exist, and private modules stay private."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import tiermem

OPTIONAL = (
    "redis",
    "dynamodb",
    "embeddings_local",
    "embeddings_remote",
    "index_redis",
    "knowledge",
    "extract_text",
    "mcp_invoker",
    "strands",
)


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(tiermem.__path__, "tiermem."):
        leaf = info.name.rsplit(".", 1)[-1]
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        if leaf.startswith(OPTIONAL) or "conformance" in leaf:
            continue
        names.append(info.name)
    return names


@pytest.mark.parametrize("module_name", _modules())
def test_all_names_exist(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in getattr(module, "__all__", []):
        assert hasattr(module, name), f"{module_name}.__all__ names missing {name!r}"


def test_top_level_exports_the_error_hierarchy() -> None:
    for name in (
        "TierMemError",
        "ValidationError",
        "ConflictError",
        "NotFoundError",
        "BackendError",
        "BackendUnavailableError",
        "BackendTimeoutError",
    ):
        assert issubclass(getattr(tiermem, name), Exception)
    assert issubclass(tiermem.ValidationError, tiermem.TierMemError)
    assert issubclass(tiermem.BackendTimeoutError, tiermem.BackendError)
