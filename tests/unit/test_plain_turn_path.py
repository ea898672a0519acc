"""A plain turn's short path gives exactly what the general path gives.

``Session.add_turn(role, "text")`` with no option skips the :class:`TurnInput` and the
per-item dispatch (``MemoryService.analyse_text_turn``); the turn, its analysis and the
errors must be those of ``add_turns([TurnInput(...)])``. Checked on generated text made of
what the rules look for (cues, entities, CJK, curly apostrophes, full-width digits, lone
surrogates), with one fake clock so that the timestamps agree too. The importance scorer,
made faster, scores as the scorer first written. The fields sets that trusted models share
must never be changed through one of them.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.models import ContentBlock, NewTurn, TextBlock, ToolResultBlock, Turn
from tiermem.models.turns import Entity
from tiermem.policies.importance import (
    _CJK_CHAR,
    _NUMBER,
    _SPACED_WORD,
    ImportanceScore,
    RuleImportanceScorer,
)
from tiermem.policies.phrases import TextView
from tiermem.policies.turn_text import TurnText
from tiermem.service import MemoryService
from tiermem.session import TurnInput
from tiermem.store.backends.memory import MemoryDurableStore, MemoryHotStore
from tiermem.testing import FakeClock

WORDS = [
    "Hello!", "ok", "thanks", "I prefer", "seinen", "horror", "I meant", "how about",
    "Berserk", "vol", "42", "42巻", "ORD-12345", "B0ABCDEFGH", "¥1,200", "500 yen",
    "978-4-08-851234-1", "a@b.co", "2024-01-15", "2024年1月15日", "好き", "ベルセルク",
    "セイネン", "I\u2019m into", "ＯＫ４２", "Japanese", "日本語", "\ud800", "İstanbul", "!",
    "\n", "  ", "...", "you might like", "またね", "違います",
]  # fmt: skip

texts = st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join)


def _service(clock: FakeClock) -> MemoryService:
    return MemoryService(
        MemoryHotStore(clock=clock),
        MemoryDurableStore(clock=clock),
        clock=clock,
        auto_summarize=False,
    )


def _general(service: MemoryService, role: str, text: str) -> NewTurn:
    return service.prepare_turn(TurnInput(role=role, content=text))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["user", "assistant", "system", "User"]), texts)
def test_the_short_path_prepares_the_turn_the_general_path_prepares(role: str, text: str) -> None:
    service = _service(FakeClock())
    refused: str | None = None
    try:
        expected = _general(service, role, text)
    except ValidationError as exc:
        refused = str(exc)
    if refused is not None:
        with pytest.raises(ValidationError) as raised:
            service.analyse_text_turn(role, text)
        assert str(raised.value) == refused
        return
    turn, analysis = service.analyse_text_turn(role, text)
    assert turn == expected
    assert turn.__pydantic_fields_set__ == expected.__pydantic_fields_set__
    assert turn.content[0].__pydantic_fields_set__ == expected.content[0].__pydantic_fields_set__
    assert turn.model_dump(mode="json") == expected.model_dump(mode="json")
    assert analysis.token_count == turn.token_count
    assert analysis.entities == turn.entities


async def test_add_turn_stores_what_add_turns_stores() -> None:
    clock = FakeClock()
    async with _service(clock) as service:
        short = await service.session(user_id="u", session_id="short")
        general = await service.session(user_id="u", session_id="general")
        for i, text in enumerate(["I prefer seinen", "Berserk vol 42?", "ok thanks", "日本語"]):
            role = "user" if i % 2 == 0 else "assistant"
            a = await short.add_turn(role, text)
            (b,) = await general.add_turns([TurnInput(role=role, content=text)])
            assert a == b
        assert (await short.view()).entities.keys() == (await general.view()).entities.keys()
        with pytest.raises(ValidationError, match="role must be"):
            await short.add_turn("system", "hi")
        with pytest.raises(ValidationError, match="surrogate"):
            await short.add_turn("user", "bad \ud800")
        assert len(await short.history()) == 4


def test_a_shared_fields_set_is_never_changed_through_a_copy() -> None:
    block = TextBlock.trusted({"type": "text", "text": "a"})
    other = TextBlock.trusted({"type": "text", "text": "b"})
    assert block.__pydantic_fields_set__ is other.__pydantic_fields_set__
    validated = TextBlock.model_validate({"type": "text", "text": "a"})
    assert block.__pydantic_fields_set__ == validated.__pydantic_fields_set__
    turn = NewTurn.trusted(
        {
            "schema_version": 1,
            "role": "user",
            "content": (block,),
            "timestamp": datetime(2030, 1, 1, tzinfo=UTC),
            "token_count": 1,
            "importance": 0.5,
            "pinned": False,
            "agent_name": None,
            "intent": None,
            "latency_ms": None,
            "entities": (),
            "redacted": False,
            "metadata": {},
        },
        {"role", "content", "timestamp"},
    )
    first, second = turn.with_index(0), turn.with_index(1)
    assert first.__pydantic_fields_set__ is second.__pydantic_fields_set__
    before = set(first.__pydantic_fields_set__)
    copied = first.model_copy(update={"pinned": True})
    assert "pinned" in copied.__pydantic_fields_set__
    assert first.__pydantic_fields_set__ == second.__pydantic_fields_set__ == before
    assert first.model_dump(exclude_unset=True).keys() == {
        "role",
        "content",
        "timestamp",
        "index",
    }
    assert isinstance(first, Turn)
    assert first.index == 0


class _ReferenceScorer(RuleImportanceScorer):
    """The scorer as first written (a score built per turn, the social test by edges,
    every entity hashed): what the faster one must keep giving."""

    def score(
        self,
        role: str,
        content: tuple[ContentBlock, ...],
        *,
        entities: tuple[Entity, ...] = (),
        text: TurnText | None = None,
    ) -> ImportanceScore:
        rules = self.rules
        read = text if text is not None else TurnText.of_blocks(content)
        said = read.said
        if role == "user" and self._preference.search(said):
            return ImportanceScore(rules.preference, "preference")
        if role == "user" and self._correction.search(said):
            return ImportanceScore(rules.correction, "correction")
        if role == "assistant" and self._recommendation.search(said):
            return ImportanceScore(rules.recommendation, "recommendation")
        if any(isinstance(b, ToolResultBlock) for b in content):
            return ImportanceScore(rules.tool_result, "tool_result")
        if not entities and self._social_as_written(said):
            if self._acknowledgement.search(said):
                return ImportanceScore(rules.acknowledgement, "acknowledgement")
            return ImportanceScore(rules.greeting, "greeting")
        window = read.view.folded[: self.DENSITY_WINDOW_CHARS]
        d = (
            0.5 * min(len(set(entities)), 4) / 4
            + 0.2 * min(len(_NUMBER.findall(window)), 3) / 3
            + 0.3 * min(_words_as_written(window), 60) / 60
        )
        score = rules.density_floor + (rules.density_ceiling - rules.density_floor) * d
        return ImportanceScore(
            min(max(score, rules.density_floor), rules.density_ceiling), "density"
        )

    def _social_as_written(self, said: TextView) -> bool:
        if len(said.folded) > self.rules.social_max_chars:
            return False
        cues = self._social.find(said)
        if not cues:
            return False
        edges = [0, *(edge for start, end, _ in cues for edge in (start, end)), len(said.folded)]
        rest = " ".join(said.folded[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True))
        return not _NUMBER.search(rest) and _words_as_written(rest) <= 3


def _words_as_written(text: str) -> int:
    return len(_SPACED_WORD.findall(text)) + (len(_CJK_CHAR.findall(text)) + 1) // 2


ENTITIES = [Entity(kind="genre", value="seinen"), Entity(kind="volume", value="42")]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(["user", "assistant"]),
    texts.filter(lambda t: "\ud800" not in t),
    st.lists(st.sampled_from(ENTITIES), max_size=3).map(tuple),
    st.booleans(),
)
def test_the_scorer_scores_as_first_written(
    role: str, text: str, entities: tuple[Entity, ...], tool_result: bool
) -> None:
    content: tuple[ContentBlock, ...] = (TextBlock(text=text),)
    if tool_result:
        content += (ToolResultBlock(tool_use_id="t", content=(TextBlock(text="42"),)),)
    read = TurnText.of_blocks(content)
    expected = _ReferenceScorer().score(role, content, entities=entities, text=read)
    assert RuleImportanceScorer().score(role, content, entities=entities, text=read) == expected
