"""Rendering a :class:`~tiermem.context.models.ContextWindow` as a provider request.

Each renderer returns the keyword arguments of one call, messages converted by
:mod:`tiermem.models.convert`:

* :func:`render_converse`: ``system``, ``messages`` and ``toolConfig`` for Bedrock
  ``converse``; cache points are ``cachePoint`` blocks.
* :func:`render_anthropic`: ``system``, ``messages`` and ``tools`` for Anthropic
  ``messages.create``; a cache point is ``cache_control`` on the block before it.
* :func:`render_openai`: ``messages`` (led by the system message) and ``tools`` for
  OpenAI chat completions, which caches prefixes by itself and has no markers.

Raises :class:`~tiermem.errors.ValidationError` for content a format cannot carry.
"""

from __future__ import annotations

from typing import Any

from tiermem.context.models import ContextWindow
from tiermem.models.convert import (
    to_anthropic,
    to_anthropic_system,
    to_converse,
    to_converse_system,
    to_openai,
)

__all__ = ["render_anthropic", "render_converse", "render_openai"]


def render_converse(window: ContextWindow) -> dict[str, Any]:
    """Keyword arguments for Bedrock ``converse`` (without ``modelId``)."""
    request: dict[str, Any] = {}
    if window.system:
        request["system"] = to_converse_system(window.system)
    request["messages"] = to_converse(window.messages)
    if window.tools:
        tools: list[dict[str, Any]] = []
        for tool in window.tools:
            spec: dict[str, Any] = {"name": tool.name}
            if tool.description:
                spec["description"] = tool.description
            spec["inputSchema"] = {"json": tool.input_schema}
            tools.append({"toolSpec": spec})
        if window.tools_cache_point:
            tools.append({"cachePoint": {"type": "default"}})
        request["toolConfig"] = {"tools": tools}
    return request


def render_anthropic(window: ContextWindow) -> dict[str, Any]:
    """Keyword arguments for Anthropic ``messages.create`` (without ``model`` and
    ``max_tokens``)."""
    request: dict[str, Any] = {}
    if window.system:
        request["system"] = to_anthropic_system(window.system)
    request["messages"] = to_anthropic(window.messages)
    if window.tools:
        tools = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in window.tools
        ]
        if window.tools_cache_point:
            tools[-1] = {**tools[-1], "cache_control": {"type": "ephemeral"}}
        request["tools"] = tools
    return request


def render_openai(window: ContextWindow) -> dict[str, Any]:
    """Keyword arguments for OpenAI chat completions (without ``model``)."""
    request: dict[str, Any] = {"messages": to_openai(window.messages, system=window.system)}
    if window.tools:
        request["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                },
            }
            for t in window.tools
        ]
    return request
