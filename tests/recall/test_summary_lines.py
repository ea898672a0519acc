"""Summary lines as recall documents, pure parts: how a tier's text is split into lines
with their turns, and how the recall block lays them out with their provenance."""

from __future__ import annotations

from datetime import UTC, datetime

from tiermem.context.recall_block import plan_recall_block
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.recall import parse_summary_doc_id, summary_doc_id
from tiermem.models import Provenance, TextBlock, Turn
from tiermem.summaries.models import Fact, Item, StructuredMemory, SummaryText, SummaryTier
from tiermem.summaries.recall_docs import summary_docs, summary_lines
from tiermem.tokens import TiktokenCounter

T0 = datetime(2026, 3, 10, 15, tzinfo=UTC)  # a Tuesday


def tier(text: str, which: SummaryTier = SummaryTier.RECENT) -> SummaryText:
    return SummaryText(
        tier=which, text=text, tokens=1, first_index=0, through_index=40, created_at=T0,
        engine="test",
    )  # fmt: skip


def test_extractive_lines_keep_their_turn_and_speaker_and_are_indexed_without_the_label() -> None:
    lines = summary_lines([tier("- [12] User: My budget is ¥8,000.\n- [13] Assistant: Noted.")])
    assert [(ln.turn_index, ln.text, ln.search_text) for ln in lines] == [
        (12, "User: My budget is ¥8,000.", "My budget is ¥8,000."),
        (13, "Assistant: Noted.", "Noted."),
    ]


def test_a_kept_tier_with_its_lines_joined_by_spaces_is_split_back_into_lines() -> None:
    kept = "- [3] User: I live in Sapporo. - [7] User: I prefer seinen manga."
    assert [(ln.turn_index, ln.search_text) for ln in summary_lines([tier(kept)])] == [
        (3, "I live in Sapporo."),
        (7, "I prefer seinen manga."),
    ]


def test_prose_is_split_into_sentences_without_a_turn_and_validation_items_kept() -> None:
    text = "The user wants Berserk. They asked about shipping!\nAlso: budget: ¥8,000."
    lines = summary_lines([tier(text)])
    assert [(ln.turn_index, ln.search_text) for ln in lines] == [
        (None, "The user wants Berserk."),
        (None, "They asked about shipping!"),
        (None, "budget: ¥8,000."),
    ]


def test_a_line_in_two_tiers_is_one_document_and_its_id_is_stable_across_passes() -> None:
    line = "- [5] User: My cat is called Mochi."
    twice = summary_lines([tier(line, SummaryTier.MIDDLE), tier(line)])
    assert len(twice) == 1
    assert twice[0].label == "middle"
    again = summary_lines([tier(f"- [1] User: Hello there.\n{line}")])
    assert twice[0].key in {ln.key for ln in again}
    # The same words from another turn are another line.
    assert summary_lines([tier("- [6] User: My cat is called Mochi.")])[0].key != twice[0].key


def test_structured_items_are_lines_with_their_turn_and_only_current_values() -> None:
    memory = StructuredMemory(
        facts={"budget": Fact(slot="budget", value="¥8,000", turn_index=9, previous=("¥5,000",))},
        decisions=(Item(text="ship to Sapporo", turn_index=11),),
    )
    lines = summary_lines([], memory)
    assert [(ln.source, ln.turn_index, ln.text) for ln in lines] == [
        ("structured", 9, "budget: ¥8,000"),
        ("structured", 11, "decision: ship to Sapporo"),
    ]
    assert all(ln.key.startswith("f") for ln in lines)


def test_documents_are_dated_by_their_turn_and_resolve_its_relative_dates() -> None:
    (line,) = summary_lines([tier("- [4] User: I picked up Monster volume 4 yesterday.")])
    said = datetime(2026, 3, 9, 20, tzinfo=UTC)
    (doc,) = summary_docs("u1", "s1", [line], said_at={4: said}, default_at=T0, expires_at=None)
    assert doc.created_at == said
    assert doc.kind == "chunk"
    assert "dt20260308" in doc.tags  # "yesterday" said on 9 March
    assert parse_summary_doc_id(doc.doc_id) == ("s1", line.key)
    assert parse_summary_doc_id("s1#4") is None
    assert parse_summary_doc_id("doc#3") is None
    assert summary_doc_id("a#b", "lx") == "a#b#summary-lx"


def _turn_hit(session: str, index: int, text: str, score: float) -> RecallHit:
    turn = Turn(
        role="user", content=(TextBlock(text=text),), timestamp=T0, index=index, token_count=5
    )
    return RecallHit(
        kind="turn", doc_id=f"{session}#{index}", text=text, score=score, turn=turn,
        session_id=session,
        provenance=Provenance(source="archive", session_id=session, turn_indexes=(index,)),
    )  # fmt: skip


def _line_hit(session: str, index: int, text: str, score: float) -> RecallHit:
    return RecallHit(
        kind="chunk", doc_id=f"{session}#summary-l{index}", text=text, score=score,
        session_id=session, created_at=datetime(2026, 3, 2, 9, tzinfo=UTC),
        provenance=Provenance(
            source="summary", session_id=session, turn_indexes=(index,),
            memory_ids=(f"{session}:summary:v3:recent",),
        ),
    )  # fmt: skip


def test_the_block_shows_summary_lines_under_their_dated_session_with_provenance() -> None:
    counter = TiktokenCounter()
    hits = [
        _line_hit("s1", 12, "User: I picked up Monster volume 4 yesterday.", 0.9),
        _turn_hit("s2", 3, "My cat is called Mochi.", 0.8),
        _line_hit("s1", 4, "User: My budget is ¥8,000.", 0.7),
    ]
    items, dropped = plan_recall_block(hits, 500, counter)
    assert dropped == 0
    assert [i.text.splitlines()[-1] for i in items] == [
        "- [summary, turn 4] User: My budget is ¥8,000.",
        "- [summary, turn 12] User: I picked up Monster volume 4 yesterday. "
        "(yesterday → 2026-03-01)",
        "- [user, turn 3] My cat is called Mochi.",
    ]
    assert "Session s1 — Monday 2026-03-02:" in items[0].text
    assert "Session s2 — Tuesday 2026-03-10:" in items[2].text
    first = items[0].provenance
    assert (first.tier, first.session_id, first.turn_indexes, first.summary_id) == (
        "session", "s1", (4,), "s1:summary:v3:recent",
    )  # fmt: skip
    assert all(i.tokens > 0 for i in items)
    # A small room takes the best hits only, and never more than the room.
    small, left_out = plan_recall_block(hits, 60, counter)
    assert sum(i.tokens for i in small) <= 60
    assert left_out >= 1
