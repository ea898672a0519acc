"""Adapters between tiermem and agent frameworks, each behind its own optional extra.

* :mod:`tiermem.integrations.strands` (extra ``strands``): a Strands Agents
  ``SessionManager`` that keeps an agent's messages as tiermem turns, and a
  ``ConversationManager`` that delegates to :mod:`tiermem.managers`.

This package imports no framework; each module imports its own when it is imported.
"""
