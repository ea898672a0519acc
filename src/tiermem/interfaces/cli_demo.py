"""``tiermem demo``: a built-in manga-store story through every tier, with its numbers.

Three sessions of one customer over three simulated days (explicit turn timestamps: day 1
two days ago, day 2 yesterday, day 3 now), written as the ``local`` tenant -- the tenant a
keyless loopback server serves -- so ``tiermem serve`` and the inspector show them:

1. **Day 1**, a long chat: preferences, an order through a catalogue tool (a real tool call
   through the dispatcher, its output stored as a tool result), a correction, small talk,
   then a generated stretch of browsing (:mod:`tiermem.testing.conversations`) with planted
   facts, corrections and large tool outputs. The hot window keeps the newest turns, the
   archive all of them; rolling summaries fill their tiers and structured memory keeps the
   latest value of each fact. Losing the hot tier is survived by a reload. Closed: the
   handoff writes the session into long-term memory.
2. **Day 2**, a short follow-up: an order-status tool call, a new preference. Closed.
3. **Day 3**, a new session: the context assembled for the customer's question recalls
   what was said on day 1 and day 2, at a fraction of the tokens of the full history.

Every number printed is measured on the run. ``--serve`` then leaves the REST API and the
inspector running on loopback with the story loaded (it needs the ``api`` extra; without
``--serve`` nothing beyond the base install is imported).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from rich.panel import Panel
from rich.table import Table

from tiermem.interfaces.cli_common import console, fail
from tiermem.interfaces.tenancy import LOCAL_TENANT, TenantScope
from tiermem.models import JsonValue
from tiermem.models.content import TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.runtime import run as run_on_loop
from tiermem.session import Session, TurnInput
from tiermem.settings import TierMemSettings
from tiermem.testing.conversations import Conversation, generate_conversation
from tiermem.tools import FunctionInvoker, ToolDispatcher, ToolRegistry, ToolSpec
from tiermem.tools.invoker import PartialSink

if TYPE_CHECKING:
    from tiermem.service import MemoryService

__all__ = [
    "DEMO_SESSIONS",
    "DEMO_USER",
    "RECALL_CHECKS",
    "StoryResult",
    "demo",
    "demo_tools",
    "run_story",
]

DEMO_USER = "manga-fan"
"""The customer, as the ``local`` tenant's callers (and the inspector) name them."""
DEMO_SESSIONS = ("demo-day1", "demo-day2", "demo-day3")
CONTEXT_BUDGET = 4000
"""The budget of the context windows the demo assembles (tokens)."""
RECALL_CHECKS: Mapping[str, str] = {
    "seinen": "day 1: 'I prefer seinen'",
    "horror": "day 1: 'I don't like horror'",
    "41": "day 1: the order corrected to volume 41",
    "aki": "day 2: 'please call me Aki'",
}
"""What day 3's context must recall from the earlier sessions (a word and where it was said)."""
DAY3_QUESTION = (
    "Can you recommend something for the weekend? Remember what I like, and is my "
    "Berserk order still the right volume?"
)
_GENERATED_SEED = 12
_CATALOGUE: Mapping[str, tuple[tuple[int, int, int], ...]] = {
    # title: (volume, price in yen, copies in stock)
    "Berserk": ((40, 1200, 3), (41, 1200, 5), (42, 1200, 2)),
    "Vinland Saga": ((1, 1100, 9), (2, 1100, 7), (14, 1210, 1)),
    "Monster": ((1, 990, 4), (9, 990, 0)),
    "Vagabond": ((1, 1050, 6), (37, 1150, 2)),
    "Planetes": ((1, 1000, 3), (4, 1000, 1)),
}


# ---------------------------------------------------------------- the store's tools


def demo_tools() -> ToolRegistry:
    """The store's two tools (Python functions): a catalogue search and an order lookup."""

    async def search_catalog(args: Mapping[str, JsonValue], emit: PartialSink) -> str:
        query = str(args.get("query", "")).casefold()
        rows = [
            f"{title} vol {vol} | ¥{price:,} | {stock} in stock"
            for title, volumes in _CATALOGUE.items()
            if query in title.casefold()
            for vol, price, stock in volumes
        ]
        return "\n".join(rows) or f"no title matches {query!r}"

    async def order_status(args: Mapping[str, JsonValue], emit: PartialSink) -> dict[str, Any]:
        order_id = str(args.get("order_id", ""))
        return {"order_id": order_id, "status": "shipped", "carrier": "Yamato", "eta_days": 1}

    registry = ToolRegistry()
    invoker = FunctionInvoker({"search_catalog": search_catalog, "order_status": order_status})
    registry.register(
        ToolSpec(
            "search_catalog",
            "Search the store's catalogue by title: volumes, prices, stock.",
            {"type": "object", "properties": {"query": {"type": "string"}}},
        ),
        invoker,
    )
    registry.register(
        ToolSpec(
            "order_status",
            "Look up an order's shipping status.",
            {"type": "object", "properties": {"order_id": {"type": "string"}}},
        ),
        invoker,
    )
    return registry


# ---------------------------------------------------------------- the story


@dataclass
class SessionReport:
    """What one session of the story left behind."""

    session_id: str
    day: str
    turns: int
    full_tokens: int
    """Tokens of every turn of the session: what sending the full history costs."""
    hot_turns: int = 0
    archived_turns: int = 0
    summary_tiers: dict[str, int] = field(default_factory=dict)
    """Tier name to tokens of its summary text."""
    summarized_through: int = -1
    structured_facts: int = 0
    context_tokens: int = 0
    context_items: dict[str, int] = field(default_factory=dict)
    reload_source: str = ""
    handed_off: bool = False


@dataclass
class StoryResult:
    """The story's measured numbers (``tiermem demo`` prints them; tests read them)."""

    user_id: str
    sessions: list[SessionReport] = field(default_factory=list)
    facts_planted: int = 0
    facts_current: int = 0
    """Planted facts (generated stretch of day 1) whose latest value structured memory holds."""
    corrections_applied: int = 0
    corrections_planted: int = 0
    memories: list[tuple[str, str, str]] = field(default_factory=list)
    """Long-term memories: (type, content, "session #turns")."""
    recalled: dict[str, bool] = field(default_factory=dict)
    """Each of :data:`RECALL_CHECKS` and whether day 3's context holds it."""
    history_tokens: int = 0
    """Tokens of every turn of every session: the full history."""
    context_tokens: int = 0
    """Tokens of day 3's assembled context window."""
    context_by_kind: dict[str, int] = field(default_factory=dict)
    context_text: str = ""
    tools: list[tuple[str, str, int]] = field(default_factory=list)
    """(tool, breaker status, calls) after the story."""

    @property
    def savings(self) -> float:
        """The share of tokens day 3's context saves against sending the full history."""
        if not self.history_tokens:
            return 0.0
        return 1.0 - self.context_tokens / self.history_tokens


def _text(role: str, text: str, when: datetime) -> TurnInput:
    return TurnInput(role=role, content=text, timestamp=when)


class _Story:
    """Writes the story through one service, as one tenant, with one tool dispatcher."""

    def __init__(self, memory: MemoryService, scope: TenantScope, tools: ToolDispatcher) -> None:
        self.memory = memory
        self.scope = scope
        self.tools = tools
        self.user = scope.scope(DEMO_USER, field="user_id")
        self.result = StoryResult(user_id=DEMO_USER)

    def sid(self, name: str) -> str:
        return self.scope.scope(name, field="session_id")

    async def tool_exchange(
        self, session: Session, when: datetime, tool: str, args: dict[str, JsonValue], call_id: str
    ) -> str:
        """The assistant asks for ``tool``, the dispatcher runs it, its output is stored as
        the tool result turn. Returns the output's text."""
        await session.add_turns(
            [
                TurnInput(
                    role="assistant",
                    content=(
                        TextBlock(text="Let me look that up."),
                        ToolUseBlock(tool_use_id=call_id, name=tool, input=args),
                    ),
                    timestamp=when,
                )
            ]
        )
        result = await self.tools.call(tool, args)
        output = result.text or json.dumps(result.output.structured, ensure_ascii=False)
        await session.add_turns(
            [
                TurnInput(
                    role="user",
                    content=(
                        ToolResultBlock(tool_use_id=call_id, content=(TextBlock(text=output),)),
                    ),
                    timestamp=when + timedelta(seconds=2),
                )
            ]
        )
        return output

    async def day1(self, start: datetime, generated: Conversation) -> SessionReport:
        session = await self.memory.session(
            self.sid(DEMO_SESSIONS[0]), user_id=self.user, user_tier="vip", locale="en-US"
        )
        t = start
        step = timedelta(seconds=40)
        opening = [
            ("user", "Hi! I'm looking for something new to read."),
            ("assistant", "Welcome to the manga store! What kind of manga do you like?"),
            ("user", "I prefer seinen. I don't like horror."),
            ("assistant", "Noted: seinen, no horror. Berserk and Vinland Saga are favourites."),
            ("user", "Do you have Berserk vol 42 in stock?"),
        ]
        await session.add_turns([_text(r, x, t + i * step) for i, (r, x) in enumerate(opening)])
        t += len(opening) * step
        stock = await self.tool_exchange(
            session, t, "search_catalog", {"query": "Berserk"}, "call-d1-1"
        )
        line = next((row for row in stock.splitlines() if "vol 42" in row), stock.splitlines()[0])
        t += step
        follow = [
            ("assistant", f"Found it: {line}."),
            ("user", "Great, please order Berserk vol 42 for me."),
            ("assistant", "Ordered: Berserk vol 42, order ORD-20417."),
            ("user", "No, I meant volume 41, sorry. Please change the order."),
            ("assistant", "No problem: order ORD-20417 is now Berserk vol 41."),
            ("user", "The weather is lovely today, I'll read in the park."),
            ("assistant", "Sounds perfect. Enjoy the sunshine!"),
        ]
        await session.add_turns([_text(r, x, t + i * step) for i, (r, x) in enumerate(follow)])
        t += len(follow) * step
        await session.put_state(
            "cart", {"order_id": "ORD-20417", "items": [{"title": "Berserk", "volume": 41}]}
        )
        # A longer browse: generated, with planted facts, corrections and big tool outputs.
        offset = t - generated.turns[0].timestamp
        browse = [
            TurnInput(role=turn.role, content=turn.content, timestamp=turn.timestamp + offset)
            for turn in generated.turns
        ]
        for first in range(0, len(browse), 10):
            await session.add_turns(browse[first : first + 10])
        view = await session.view()
        summaries = await session.summaries(wait_through=view.next_index - 1)
        report = await self.session_report(session, "2 days ago")
        structured = summaries.structured
        current = {**structured.entities, **structured.facts}
        result = self.result
        for fact in generated.facts:
            found = current.get(fact.slot)
            result.facts_planted += 1
            if found is not None and found.value.casefold() == fact.value.casefold():
                result.facts_current += 1
                if fact.superseded:
                    result.corrections_applied += 1
            if fact.superseded:
                result.corrections_planted += 1
        # Losing the hot tier (a restarted cache) is survived: the next read reloads.
        await self.memory.tiers.hot.delete(session.id)
        reloaded = await session.view()
        report.reload_source = reloaded.source
        await session.close()
        report.handed_off = True
        return report

    async def day2(self, start: datetime) -> SessionReport:
        session = await self.memory.session(self.sid(DEMO_SESSIONS[1]), user_id=self.user)
        step = timedelta(seconds=45)
        await session.add_turns(
            [
                _text("user", "Hi again! Has my order ORD-20417 shipped?", start),
            ]
        )
        status = await self.tool_exchange(
            session, start + step, "order_status", {"order_id": "ORD-20417"}, "call-d2-1"
        )
        shipped = json.loads(status)
        t = start + 3 * step
        lines = [
            (
                "assistant",
                f"Yes: it {shipped['status']} with {shipped['carrier']}, arriving tomorrow.",
            ),
            ("user", "Thanks!"),
            ("assistant", "You're welcome. Anything else?"),
            ("user", "Please call me Aki."),
            ("assistant", "Of course, Aki."),
            ("user", "I love sci-fi manga too."),
            ("assistant", "Then Planetes is worth a look."),
            ("user", "ok thanks, bye"),
        ]
        await session.add_turns([_text(r, x, t + i * step) for i, (r, x) in enumerate(lines)])
        report = await self.session_report(session, "yesterday")
        await session.close()
        report.handed_off = True
        return report

    async def day3(self, start: datetime) -> SessionReport:
        session = await self.memory.session(self.sid(DEMO_SESSIONS[2]), user_id=self.user)
        await session.add_turns([_text("user", "Hello, it's me again.", start)])
        await session.add_turns(
            [_text("assistant", "Welcome back! How can I help?", start + timedelta(seconds=20))]
        )
        await session.add_turns([_text("user", DAY3_QUESTION, start + timedelta(seconds=60))])
        window = await session.context(query=DAY3_QUESTION, budget=CONTEXT_BUDGET)
        result = self.result
        result.context_tokens = window.stats.total_tokens
        result.context_by_kind = {k: v for k, v in window.stats.tokens_by_tier.items() if v}
        result.context_text = "\n".join(item.text for item in window.items)
        earlier = "\n".join(
            item.text for item in window.items if item.kind not in ("turn", "current")
        ).casefold()
        for word in RECALL_CHECKS:
            result.recalled[word] = word in earlier
        liked = [w for w in ("seinen", "sci-fi") if w in earlier]
        answer = (
            f"Of course{', Aki' if result.recalled['aki'] else ''}! You like "
            f"{' and '.join(liked) or 'many genres'}"
            + (", and no horror" if result.recalled["horror"] else "")
            + ": try Vagabond or Planetes. "
            + ("Your order is Berserk vol 41, as you corrected." if result.recalled["41"] else "")
        )
        await session.add_turns([_text("assistant", answer.strip(), start + timedelta(seconds=75))])
        await session.put_state("recommendations", {"titles": ["Vagabond", "Planetes"]})
        return await self.session_report(session, "now (open)")

    async def session_report(self, session: Session, day: str) -> SessionReport:
        view = await session.view()
        turns = await session.get_turns(0, view.next_index)
        found = await session.summaries()
        window = await session.context(budget=CONTEXT_BUDGET)
        return SessionReport(
            session_id=self.scope.unscope(session.id),
            day=day,
            turns=view.next_index,
            full_tokens=sum(t.token_count for t in turns),
            hot_turns=len(view.turns),
            archived_turns=view.next_index - len(view.turns),
            summary_tiers={t.tier.value: t.tokens for t in found.tiers if t.text},
            summarized_through=found.watermarks.summarized_through,
            structured_facts=len(found.structured.facts) + len(found.structured.entities),
            context_tokens=window.stats.total_tokens,
            context_items={k: v for k, v in window.stats.tokens_by_tier.items() if v},
        )

    async def run(self, now: datetime) -> StoryResult:
        await self.memory.purge_user(self.user)  # a rerun starts from a clean slate
        generated = generate_conversation(
            _GENERATED_SEED, turns=56, facts=6, corrections=2, tool_calls=2, distractors=1
        )
        result = self.result
        result.sessions.append(await self.day1(now - timedelta(days=2, hours=3), generated))
        result.sessions.append(await self.day2(now - timedelta(days=1, hours=1)))
        await self.memory.drain()  # handoff and detection run off the response path
        result.sessions.append(await self.day3(now - timedelta(minutes=2)))
        result.history_tokens = sum(s.full_tokens for s in result.sessions)
        await self.memory.drain()
        for record in await self.memory.longterm.list(self.user, limit=50):
            prov = record.provenance
            where = ""
            if prov.session_id and self.scope.owns(prov.session_id):
                where = self.scope.unscope(prov.session_id)
                if prov.turn_indexes:
                    where += " #" + ",".join(str(i) for i in prov.turn_indexes)
            result.memories.append((record.memory_type, record.content, where))
        for status in await self.tools.statuses():
            result.tools.append((status.name, status.breaker.value, status.stats.calls))
        return result


async def run_story(
    memory: MemoryService,
    *,
    scope: TenantScope | None = None,
    tools: ToolDispatcher | None = None,
) -> StoryResult:
    """Write the story into ``memory`` as ``scope``'s tenant (default ``local``), calling the
    store's tools through ``tools`` (default: a dispatcher over :func:`demo_tools`).
    Replaces any earlier run's data of the demo user."""
    scope = scope or TenantScope(LOCAL_TENANT)
    dispatcher = tools or memory.tools(demo_tools())
    return await _Story(memory, scope, dispatcher).run(memory.clock.now())


# ---------------------------------------------------------------- printing


def _print_story(result: StoryResult, settings: TierMemSettings) -> None:
    console.print(
        Panel.fit(
            f"[bold]tiermem demo[/bold]: customer [cyan]{result.user_id}[/cyan] of a manga "
            f"store, three sessions over three days, tenant [cyan]{LOCAL_TENANT.id}[/cyan], "
            f"on {settings.hot_backend} (hot) + {settings.durable_backend} (durable)"
        )
    )
    table = Table(title="sessions (tenant local)", title_justify="left")
    for column in ("session", "when", "turns", "hot", "archived", "summaries (tokens)",
                   "facts", "history tokens"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("session", "when") else "right")
    for s in result.sessions:
        tiers = ", ".join(f"{k} {v}" for k, v in s.summary_tiers.items()) or "-"
        table.add_row(
            s.session_id,
            s.day,
            str(s.turns),
            str(s.hot_turns),
            str(s.archived_turns),
            tiers,
            str(s.structured_facts),
            f"{s.full_tokens:,}",
        )
    console.print(table)
    day1 = result.sessions[0]
    saved = 1 - day1.context_tokens / day1.full_tokens if day1.full_tokens else 0.0
    console.print(
        f"day 1: summarized through turn {day1.summarized_through}; structured memory holds "
        f"the latest value of {result.facts_current}/{result.facts_planted} stated facts "
        f"({result.corrections_applied}/{result.corrections_planted} corrections applied); "
        f"after losing the hot tier the next read was served by [bold]{day1.reload_source}"
        f"[/bold]. Its context at the end: [bold]{day1.context_tokens:,}[/bold] tokens "
        f"instead of {day1.full_tokens:,} ({saved:.0%} saved). Closed: handed off to "
        "long-term memory."
    )
    memories = Table(title="long-term memory (after the handoffs)", title_justify="left")
    for column in ("type", "content", "from"):
        memories.add_column(column)
    for kind, content, where in result.memories[:12]:
        memories.add_row(kind, " ".join(content.split())[:70], where)
    if len(result.memories) > 12:
        memories.add_row("…", f"{len(result.memories) - 12} more", "")
    console.print(memories)
    recalled = "  ".join(
        f"{'[green]✓[/green]' if ok else '[red]✗[/red]'} {RECALL_CHECKS[word]}"
        for word, ok in result.recalled.items()
    )
    console.print(f"day 3 asks: [italic]{DAY3_QUESTION}[/italic]\nrecalled: {recalled}")
    kinds = ", ".join(f"{k} {v}" for k, v in result.context_by_kind.items())
    console.print(
        f"day 3's context (budget {CONTEXT_BUDGET:,}): [bold]{result.context_tokens:,}[/bold] "
        f"tokens ({kinds}) instead of [bold]{result.history_tokens:,}[/bold] for the full "
        f"history of the three sessions: [bold green]{result.savings:.0%} saved[/bold green]"
    )
    tools = ", ".join(f"{name} ({breaker}, {calls} calls)" for name, breaker, calls in result.tools)
    console.print(f"tools: {tools}")


async def _demo(settings: TierMemSettings) -> None:
    from tiermem.service import MemoryService

    async with MemoryService.from_settings(settings) as memory:
        result = await run_story(memory)
    _print_story(result, settings)
    console.print(
        f"\nexplore it: [bold]tiermem inspect {DEMO_SESSIONS[0]}[/bold], "
        f"[bold]tiermem recall {DEMO_USER} horror[/bold], or "
        "[bold]tiermem demo --serve[/bold] for the web inspector"
    )


async def _serve(settings: TierMemSettings, host: str, port: int) -> None:
    from tiermem.interfaces.api.app import create_app
    from tiermem.interfaces.api.server import build_server
    from tiermem.interfaces.tenancy import KeyStore
    from tiermem.service import MemoryService

    # The server's own service holds the story (an in-process hot tier included) and its
    # dispatcher runs the story's tool calls, so the inspector shows their counts.
    async with MemoryService.from_settings(settings) as memory:
        app = create_app(
            settings,
            service=memory,
            keystore=KeyStore.from_settings(settings),
            tools=demo_tools(),
            allow_anonymous=True,
        )
        result = await run_story(memory, tools=app.state.tiermem.dispatcher)
        _print_story(result, settings)
        url = f"http://{host}:{port}/inspector/?user={DEMO_USER}&session={DEMO_SESSIONS[2]}"
        console.print(
            f"\n[bold]inspector:[/bold] {url}\n"
            f"[bold]API:[/bold] http://{host}:{port}/v1  (keyless on localhost; Ctrl-C stops)"
        )
        server = build_server(app, host, port, log_level="warning")
        await server.serve()


def demo(settings: TierMemSettings, *, serve: bool = False, port: int = 8080) -> None:
    """Run the story (see the module doc); with ``serve``, keep the API and the inspector
    running on 127.0.0.1:``port`` afterwards."""
    if not serve:
        run_on_loop(_demo(settings), event_loop=settings.event_loop)
        return
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        fail(
            f"--serve needs the 'api' extra (FastAPI, uvicorn): pip install 'tiermem[api]' ({exc})"
        )
    from tiermem.interfaces.tenancy import KeyStore, check_bind_allowed

    check_bind_allowed("127.0.0.1", KeyStore.from_settings(settings))
    run_on_loop(_serve(settings, "127.0.0.1", port), event_loop=settings.event_loop)
