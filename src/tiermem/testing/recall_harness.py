"""The recall-quality harness over :mod:`tiermem.testing.recall_fixture`: for each question,
is every evidence turn in the assembled context (by provenance)?

Three methods, one harness, the same budgets and the same :func:`assemble_context`:

* ``last_n``: no recall; the most recent turns of the user's history (across sessions)
  that fit the budget less its buffer;
* ``bm25``: the hot window plus the top hits of BM25 over the raw turn texts (no date
  terms, no hot-window filtering before the top k, no second hop, no neighbours): per-turn
  recall as it was;
* ``engine``: the hot window plus :func:`~tiermem.longterm.recall_context.recall_for_context`
  over the dated index, as :meth:`Session.context` uses it.

Everything runs in memory (``MemoryDurableStore``, ``InProcessIndex``) with a fake clock
at the fixture's question time. Used by ``bench/recall_quality.py`` (the full fixture) and
``tests/recall/test_multisession_quality.py`` (a slice).

**Summaries** (``summaries=True``, the default, as the service runs): while each session's
turns are loaded (an exchange at a time, the clock at the turn's time), the summary jobs run
their passes as the service's trigger would (offline engines: extractive summaries,
rule-based structured memory) and index the lines for recall; the ``engine`` searches them
(:mod:`tiermem.summaries.recall_docs`). When an earlier session ends, what the service's
handoff does for it is done here too: a final pass through its last turn, then its summary
lines written to the index (passes write them at most every few hours,
:meth:`~tiermem.summaries.jobs.SummaryJobs.refresh_lines`); the session the question is
asked in has not ended.

**Expired variant** (``expired=True``): turns are kept ``turn_retention`` (24 h) after they
were said, and the summary records 30 days, as the service keeps them; at question time
every earlier session's raw turns are gone, for all three methods (the last-N window and
BM25 see only live turns). The engine can still answer from the summaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from tiermem.clock import FakeClock
from tiermem.context import Allocation, assemble_context
from tiermem.context.truncate import message_tokens
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index import DocKind, IndexedDoc
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.recall import Recaller, turn_doc_id, turn_docs
from tiermem.longterm.recall_context import ContextRecallPolicy, recall_for_context
from tiermem.models import Provenance, SessionRef, TextBlock, Turn
from tiermem.policies.recall import RecallPolicy
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.store.contract import MAX_TURNS_PER_APPEND
from tiermem.testing.recall_fixture import RecallConversation, RecallQuestion
from tiermem.tokens import TiktokenCounter, TokenCounter

if TYPE_CHECKING:
    from tiermem.summaries.jobs import SummaryJobs

TURN_RETENTION = timedelta(hours=24)
"""How long turns live in the expired variant (the session tier's default ``durable_ttl``)."""

__all__ = ["METHODS", "QualityReport", "evaluate_recall_quality"]

METHODS = ("last_n", "bm25", "engine")
_TURNS: tuple[DocKind, ...] = ("turn",)
RECALL_K = 8


@dataclass(slots=True)
class QualityReport:
    """Share of questions with all evidence in context, per method, budget and kind."""

    budgets: tuple[int, ...]
    questions: int = 0
    found: dict[str, dict[int, int]] = field(default_factory=dict)
    by_kind: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    available: int = 0
    """Questions whose evidence turns are all still there at question time: live turns, or
    named by a line or structured item of the stored summaries (with ``summaries`` on).
    What any method could put in the context at best (all of them within retention)."""

    def add(self, method: str, budget: int, kind: str, ok: bool) -> None:
        if ok:
            self.found.setdefault(method, {}).setdefault(budget, 0)
            self.found[method][budget] += 1
            per = self.by_kind.setdefault(method, {}).setdefault(kind, {})
            per[budget] = per.get(budget, 0) + 1

    def share(self, method: str, budget: int) -> float:
        return self.found.get(method, {}).get(budget, 0) / max(1, self.questions)

    def kind_share(self, method: str, kind: str, budget: int) -> float:
        count = self.by_kind.get(method, {}).get(kind, {}).get(budget, 0)
        return count / max(1, self.kinds.get(kind, 0))

    def to_json(self) -> dict[str, object]:
        return {
            "questions": self.questions,
            "questions_by_kind": dict(self.kinds),
            "evidence_available": round(self.available / max(1, self.questions), 4),
            "share": {
                m: {str(b): round(self.share(m, b), 4) for b in self.budgets} for m in METHODS
            },
            "share_by_kind": {
                m: {
                    kind: {str(b): round(self.kind_share(m, kind, b), 4) for b in self.budgets}
                    for kind in sorted(self.kinds)
                }
                for m in METHODS
            },
        }


@dataclass(slots=True)
class _Loaded:
    recaller: Recaller
    raw: InProcessIndex
    turns: dict[str, Turn]
    history: list[tuple[str, Turn]]
    hot: list[Turn]
    summarized: set[tuple[str, int]] = field(default_factory=set)
    """(session, turn) named by a line or item of the stored summaries."""
    live: set[tuple[str, int]] = field(default_factory=set)
    """(session, turn) of the turns still stored at question time."""


def _summary_jobs(
    store: MemoryDurableStore,
    index: InProcessIndex,
    recaller: Recaller,
    clock: FakeClock,
    *,
    structured: bool,
) -> SummaryJobs:
    """The service's summary jobs (offline engines), indexing their lines into ``index``."""
    from tiermem.background import BackgroundWork
    from tiermem.summaries.jobs import SummaryJobs
    from tiermem.summaries.offline import ExtractiveSummarizer
    from tiermem.summaries.recall_docs import SummaryRecall
    from tiermem.summaries.structured import RuleStructuredExtractor

    tokens = TiktokenCounter()
    jobs = SummaryJobs(
        store,
        summarizer=ExtractiveSummarizer(tokens),
        extractor=RuleStructuredExtractor(),
        background=BackgroundWork(),  # unused: the harness runs each pass itself
        clock=clock,
        tokens=tokens,
    )

    async def write(docs: list[IndexedDoc]) -> None:
        await index.upsert(await recaller.embed_documents(docs))

    jobs.recall = SummaryRecall(index, jobs.current_for_recall, write=write, structured=structured)
    recaller.register_summary_resolver(jobs.recall.resolve)
    return jobs


async def _load(
    conv: RecallConversation,
    hot_turns: int,
    embedder: Embedder | None,
    *,
    dated: bool = True,
    fusion: Literal["convex", "rrf"] = "convex",
    summaries: bool = False,
    expired: bool = False,
    structured: bool = True,
) -> _Loaded:
    clock = FakeClock(conv.sessions[0].started_at)
    store = MemoryDurableStore(clock=clock)
    index = InProcessIndex(clock=clock)
    raw = InProcessIndex(clock=clock)
    recaller = Recaller(
        store, index, clock=clock, embedder=embedder, policy=RecallPolicy(fusion=fusion)
    )
    jobs = (
        _summary_jobs(store, index, recaller, clock, structured=structured) if summaries else None
    )
    turns: dict[str, Turn] = {}
    history: list[tuple[str, Turn]] = []
    for session in conv.sessions:
        ref = SessionRef(
            session_id=session.session_id, user_id=conv.user_id, created_at=session.started_at
        )
        await store.register_session(ref)
        stored: list[Turn] = []
        # An exchange at a time when summarizing (a pass may fall due after any), else in
        # the largest appends the store takes.
        step = 2 if jobs is not None else MAX_TURNS_PER_APPEND
        for start in range(0, len(session.turns), step):
            chunk = session.turns[start : start + step]
            said = chunk[-1].timestamp
            if said is not None:
                clock.set(max(clock.now(), said))
            expires_at = clock.now() + TURN_RETENTION if expired else None
            batch = await store.append_turns(session.session_id, chunk, expires_at=expires_at)
            stored.extend(batch)
            if jobs is not None:
                await jobs.run(session.session_id)
        if jobs is not None and stored and session.session_id != conv.current.session_id:
            await jobs.wait_through(session.session_id, stored[-1].index)  # the handoff's
            await jobs.refresh_lines(session.session_id)
        vectors = None
        if embedder is not None:  # at index time, batched: a query embeds only itself
            vectors = await embedder.embed([t.text or " " for t in stored])
        docs = turn_docs(conv.user_id, session.session_id, stored, embeddings=vectors)
        if expired:  # each turn's document expires with the turn
            docs = [
                d.model_copy(update={"expires_at": d.created_at + TURN_RETENTION}) for d in docs
            ]
        await index.upsert(docs)
        await raw.upsert(
            [
                IndexedDoc(
                    user_id=d.user_id,
                    doc_id=d.doc_id,
                    kind=d.kind,
                    text=d.text,
                    created_at=d.created_at,
                    expires_at=d.expires_at,
                )
                for d in docs
            ]
        )
        for turn in stored:
            turns[turn_doc_id(session.session_id, turn.index)] = turn
            history.append((session.session_id, turn))
    clock.set(max(clock.now(), conv.asked_at))
    if expired:  # what is left at question time
        history = [(s, t) for s, t in history if t.timestamp + TURN_RETENTION > conv.asked_at]
    hot = [t for s, t in history[-hot_turns:] if s == conv.current.session_id]
    summarized: set[tuple[str, int]] = set()
    if jobs is not None and jobs.recall is not None:
        for session in conv.sessions:
            held = await jobs.current_for_recall(session.session_id, structured)
            for line in jobs.recall.lines(held.tiers, held.structured):
                if line.turn_index is not None:
                    summarized.add((session.session_id, line.turn_index))
    live = {(s, t.index) for s, t in history}
    return _Loaded(recaller, raw, turns, history, hot, summarized, live)


def _turn_hit(doc_id: str, turn: Turn, score: float) -> RecallHit:
    session_id = doc_id.rpartition("#")[0]
    return RecallHit(
        kind="turn",
        doc_id=doc_id,
        text=turn.text,
        score=score,
        turn=turn,
        session_id=session_id,
        provenance=Provenance(source="archive", session_id=session_id, turn_indexes=(turn.index,)),
    )


def _last_n(
    loaded: _Loaded, question: str, budget: int, counter: TokenCounter
) -> set[tuple[str, int]]:
    room = budget - int(budget * Allocation().buffer)
    room -= message_tokens((TextBlock(text=question),), counter)
    inside: set[tuple[str, int]] = set()
    for session_id, turn in reversed(loaded.history):
        cost = message_tokens(turn.content, counter)
        if cost > room:
            break
        room -= cost
        inside.add((session_id, turn.index))
    return inside


async def _question(
    loaded: _Loaded,
    conv: RecallConversation,
    q: RecallQuestion,
    budgets: Sequence[int],
    counter: TokenCounter,
    policy: ContextRecallPolicy,
    report: QualityReport,
) -> None:
    current = conv.current.session_id
    hot_indexes = {t.index for t in loaded.hot}
    searched = await loaded.raw.search(
        conv.user_id, q.text, kinds=_TURNS, limit=RECALL_K + len(hot_indexes)
    )
    bm25_hits = [_turn_hit(h.doc_id, loaded.turns[h.doc_id], h.score) for h in searched][:RECALL_K]
    engine_hits = await recall_for_context(
        loaded.recaller,
        conv.user_id,
        q.text,
        now=conv.asked_at,
        session_id=current,
        hot_indexes=hot_indexes,
        policy=policy,
    )
    evidence = set(q.evidence)
    report.available += all(e in loaded.summarized or e in loaded.live for e in evidence)
    for budget in budgets:
        report.add("last_n", budget, q.kind, evidence <= _last_n(loaded, q.text, budget, counter))
        for method, hits in (("bm25", bm25_hits), ("engine", engine_hits)):
            window = assemble_context(
                recall=hits,
                turns=loaded.hot,
                current=q.text,
                budget=budget,
                session_id=current,
                counter=counter,
            )
            inside = {
                (item.provenance.session_id, index)
                for item in window.items
                if item.provenance.session_id is not None
                for index in item.provenance.turn_indexes
            }
            report.add(method, budget, q.kind, evidence <= inside)


async def evaluate_recall_quality(
    conversations: Sequence[RecallConversation],
    *,
    budgets: Sequence[int] = (512, 2048, 4096),
    hot_turns: int = 20,
    embedder: Embedder | None = None,
    policy: ContextRecallPolicy | None = None,
    counter: TokenCounter | None = None,
    fusion: Literal["convex", "rrf"] = "convex",
    summaries: bool = True,
    expired: bool = False,
    structured: bool = True,
    cache: dict[object, object] | None = None,
) -> QualityReport:
    """Run every question of ``conversations`` through the three methods (module
    docstring). ``summaries``: summarize the sessions as they load and let the engine
    search the lines (``policy.summaries`` off searches none); ``expired``: the expired
    variant; ``structured``: index structured memory's items too. ``cache``: loaded
    conversations kept between calls with the same options (a bench running several
    policies over one fixture loads and summarizes it once)."""
    counter = counter or TiktokenCounter()
    policy = policy or ContextRecallPolicy(k=RECALL_K)  # dates off: undated index too
    report = QualityReport(budgets=tuple(budgets))
    for conv in conversations:
        key = (conv.user_id, hot_turns, id(embedder), fusion, summaries, expired, structured)
        loaded = cache.get(key) if cache is not None else None
        if not isinstance(loaded, _Loaded):
            loaded = await _load(
                conv,
                hot_turns,
                embedder,
                dated=policy.dates,
                fusion=fusion,
                summaries=summaries,
                expired=expired,
                structured=structured,
            )
            if cache is not None:
                cache[key] = loaded
        for q in conv.questions:
            report.questions += 1
            report.kinds[q.kind] = report.kinds.get(q.kind, 0) + 1
            await _question(loaded, conv, q, budgets, counter, policy, report)
    return report
