"""Tests of context assembly and pre-save optimization."""
