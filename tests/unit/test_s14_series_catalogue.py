"""``TIERMEM_SERIES_CATALOGUE``: a service built from settings finds series (session 14).

Series are found only with a catalogue, which could be given only in code
(``RuleEntityExtractor(titles)``), so REST, MCP and the CLI never extracted "series:
Berserk" (seed 001's first example). Review probe p4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiermem.errors import ValidationError
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


def _settings(path: Path | None) -> TierMemSettings:
    return TierMemSettings(hot_backend="memory", durable_backend="memory", series_catalogue=path)


@pytest.mark.parametrize(
    "catalogue",
    [
        {"berserk": "Berserk", "ベルセルク": "Berserk", "vagabond": "Vagabond"},
        ["Berserk", "Vagabond"],
    ],
)
async def test_a_catalogue_file_reaches_entities_and_structured_memory(
    tmp_path: Path, catalogue: object
) -> None:
    path = tmp_path / "series.json"
    path.write_text(json.dumps(catalogue, ensure_ascii=False), encoding="utf-8")
    async with MemoryService.from_settings(_settings(path)) as memory:
        session = await memory.session(user_id="u-series")
        turn = await session.add_turn("user", "Is Berserk vol 42 in stock?")
        assert {(e.kind, e.value) for e in turn.entities} >= {("series", "Berserk")}
        assert (await session.active_entities())["series"].value == "Berserk"
        for i in range(21):
            await session.add_turn("assistant" if i % 2 == 0 else "user", f"Noted, step {i}.")
        structured = await session.structured(wait_through=0)
        assert structured.entities["series"].value == "Berserk"
    async with MemoryService.from_settings(_settings(None)) as memory:  # without: none found
        session = await memory.session(user_id="u-series")
        turn = await session.add_turn("user", "Is Berserk vol 42 in stock?")
        assert "series" not in {e.kind for e in turn.entities}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot be read as JSON"),
        ('{"berserk": 5}', "alias to title"),
        ('["Berserk", ""]', "non-empty strings"),
        ('"Berserk"', "alias to title"),
    ],
)
def test_a_bad_catalogue_is_refused_at_start_up(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "series.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValidationError, match=message):
        MemoryService.from_settings(_settings(path))


def test_a_missing_catalogue_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ValidationError, match=r"nope\.json"):
        MemoryService.from_settings(_settings(path))
