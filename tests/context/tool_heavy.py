"""A deterministic, seeded generator of tool-heavy conversations (seed 002's problem case).

A manga-shop agent serves one user. Each user request starts an agent loop: tool calls, each
in an assistant turn whose results come back in the next user turn, then an answer that
quotes facts from the final results. The agent behaves as agent logs show agents do, with
rates set by a :class:`Profile`:

* it reads the customer's record at the start of most loops, as support agents that do not
  trust their own memory do (identical results);
* it repeats lookups: the same search when the user refines, the item page of a volume
  discussed earlier, the shipping policy, the cart before answering (identical results);
* it polls an order's status, which changes now and then (newer readings, same input);
* a call times out (a long error with a trace) and is retried with the same input;
* it first sends an invalid id, gets a validation error, and corrects the input;
* it says "Let me check that." before most steps.

:data:`DISTINCT_CALLS` turns every repetition off: the control that shows how much of the
reduction comes from repetition. The same seed and profile always give the same turns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tiermem.models import (
    ContentBlock,
    JsonBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Turn,
)

__all__ = [
    "DISTINCT_CALLS",
    "SIDE_EFFECT_TOOLS",
    "TOOL_HEAVY",
    "Profile",
    "tool_heavy_conversation",
]

SERIES = (
    "Berserk", "Vagabond", "Monster", "Pluto", "Vinland Saga", "Blame!", "Mushishi",
    "Dorohedoro", "Yotsuba&!", "Frieren", "Dungeon Meshi", "Chainsaw Man", "Kingdom",
    "Akira", "Nausicaä", "Golden Kamuy", "Houseki no Kuni", "20th Century Boys",
    "ベルセルク", "鋼の錬金術師", "よつばと!", "蟲師", "葬送のフリーレン", "ダンジョン飯",
)  # fmt: skip
WORDS = (
    "a", "wandering", "swordsman", "haunted", "kingdom", "quiet", "village", "war",
    "memory", "robot", "detective", "alchemist", "brothers", "journey", "north", "sea",
    "hunger", "dungeon", "party", "cook", "monster", "mercenary", "band", "eclipse",
    "revenge", "spirits", "forest", "river", "winter", "empire", "betrayal", "friendship",
)  # fmt: skip
FILLERS = (
    "Let me check that.",
    "Let me look that up.",
    "One moment, I'll check the catalog.",
)
POLICY_SECTIONS = ("shipping", "returns", "preorders")
STATUSES = ("received", "processing", "packed", "shipped", "in transit", "delivered")
SIDE_EFFECT_TOOLS = frozenset({"add_to_cart"})
"""Tools whose every successful call is an action (for ``OptimizePolicy.side_effect_tools``)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """How the agent behaves: chances per step of repeating and of failing.

    ``refetch_rate``: a loop starts by reading the customer's record again.
    ``repeat_rate``: a lookup repeats one made earlier. ``verify_rate``: the cart is read
    again before answering. ``timeout_rate``: a call times out and is retried as it was.
    ``invalid_rate``: the agent first sends an invalid item id. ``polls``: status reads per
    tracking request (inclusive bounds).
    """

    requests: int = 14
    refetch_rate: float = 0.7
    repeat_rate: float = 0.6
    verify_rate: float = 0.5
    timeout_rate: float = 0.15
    invalid_rate: float = 0.1
    polls: tuple[int, int] = (3, 6)
    filler_rate: float = 0.8


TOOL_HEAVY = Profile()
DISTINCT_CALLS = Profile(
    refetch_rate=0.0,
    repeat_rate=0.0,
    verify_rate=0.0,
    timeout_rate=0.0,
    invalid_rate=0.0,
    polls=(1, 1),
)


@dataclass
class _Shop:
    """The world the tools read: a catalog, a cart and an order, all from the seed."""

    rng: random.Random
    catalog: dict[str, dict[str, Any]] = field(default_factory=dict)
    cart: dict[str, int] = field(default_factory=dict)
    order_status: int = 0

    def __post_init__(self) -> None:
        for series in SERIES:
            for volume in range(1, 9):
                item_id = f"M{self.rng.randrange(10_000, 99_999)}"
                self.catalog[item_id] = {
                    "id": item_id,
                    "title": f"{series} vol. {volume}",
                    "series": series,
                    "volume": volume,
                    "price_jpy": self.rng.choice((528, 594, 660, 726, 792, 1320)),
                    "stock": self.rng.randrange(0, 40),
                    "format": self.rng.choice(("paperback", "digital", "deluxe")),
                    "publisher": self.rng.choice(("Hakusensha", "Kodansha", "Shogakukan")),
                    "released": f"20{self.rng.randrange(10, 26)}-0{self.rng.randrange(1, 10)}",
                    "cover_url": f"https://img.example-shop.jp/covers/{item_id}-{volume}.jpg",
                    "tags": sorted({self.rng.choice(WORDS) for _ in range(4)}),
                    "synopsis": self.sentence(45),
                }

    def sentence(self, words: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(words)).capitalize() + "."

    def search(self, query: str, page: int) -> list[dict[str, Any]]:
        hits = [item for item in self.catalog.values() if item["series"] == query]
        hits += [item for item in self.catalog.values() if item["series"] != query]
        return hits[(page - 1) * 16 : page * 16]

    def item_page(self, item_id: str) -> dict[str, Any]:
        item = self.catalog[item_id]
        # Seeded by the id so that a repeated lookup sees the same page.
        page_rng = random.Random(item_id)
        reviews = [
            {
                "stars": page_rng.randrange(2, 6),
                "text": " ".join(page_rng.choice(WORDS) for _ in range(50)),
            }
            for _ in range(6)
        ]
        return {**item, "isbn": f"978-4-{page_rng.randrange(10**6):06d}", "reviews": reviews}

    def cart_view(self) -> dict[str, Any]:
        lines = [
            {"item_id": i, "title": self.catalog[i]["title"], "qty": q,
             "subtotal_jpy": q * self.catalog[i]["price_jpy"]}
            for i, q in self.cart.items()
        ]  # fmt: skip
        return {"lines": lines, "total_jpy": sum(line["subtotal_jpy"] for line in lines)}

    def tracking(self, order_id: str) -> dict[str, Any]:
        events = [
            {"status": STATUSES[step], "at": f"2026-03-0{1 + step}T0{step}:15:00Z",
             "depot": f"Depot {step + 1}, Saitama", "carrier": "Yamato Transport",
             "note": "Scanned at the sorting facility and handed to the next leg."}
            for step in range(self.order_status + 1)
        ]  # fmt: skip
        return {"order_id": order_id, "status": STATUSES[self.order_status], "events": events}


def _policy_text(section: str) -> str:
    rng = random.Random(section)
    paragraphs = [
        f"{section.title()} policy, clause {n}: "
        + " ".join(rng.choice(WORDS) for _ in range(70))
        + "."
        for n in range(1, 7)
    ]
    return "\n\n".join(paragraphs)


def _timeout_trace(tool: str) -> str:
    frames = "\n".join(
        f'  File "/srv/shop/{tool}/handlers.py", line {100 + 7 * n}, in handle_{n}'
        for n in range(9)
    )
    return (
        f"upstream timeout after 30s calling {tool}; the request was not applied\n"
        f"Traceback (most recent call last):\n{frames}\nTimeoutError: read timed out"
    )


def _json(result: ToolResultBlock) -> Any:
    block = result.content[0]
    return block.json_ if isinstance(block, JsonBlock) else {}


class _Writer:
    """Appends turns with consecutive indexes and timestamps a few seconds apart."""

    def __init__(self, seed: int, start: datetime) -> None:
        self.turns: list[Turn] = []
        self.seed = seed
        self.start = start
        self.calls = 0

    def add(self, role: str, *content: ContentBlock) -> None:
        index = len(self.turns)
        self.turns.append(
            Turn.model_validate(
                {
                    "index": index,
                    "role": role,
                    "content": content,
                    "timestamp": self.start + timedelta(seconds=7 * index),
                }
            )
        )

    def use(self, name: str, tool_input: dict[str, Any]) -> ToolUseBlock:
        self.calls += 1
        return ToolUseBlock(tool_use_id=f"tu_{self.seed}_{self.calls}", name=name, input=tool_input)


class _Agent:
    def __init__(self, seed: int, profile: Profile, start: datetime) -> None:
        self.rng = random.Random(seed)
        self.profile = profile
        self.shop = _Shop(random.Random(seed * 7919 + 1))
        self.out = _Writer(seed, start)
        self.searched: list[str] = []
        self.viewed: list[str] = []
        self.read_sections: list[str] = []
        self.order_id = f"O{self.rng.randrange(100_000, 999_999)}"
        self.customer = self.customer_record()

    def customer_record(self) -> dict[str, Any]:
        history = [
            {"order_id": f"O{self.rng.randrange(100_000, 999_999)}", "title": item["title"],
             "price_jpy": item["price_jpy"], "ordered": f"2025-{month:02d}-1{month % 10}"}
            for month, item in enumerate(self.rng.sample(sorted(
                self.shop.catalog.values(), key=lambda i: i["id"]), 12), start=1)
        ]  # fmt: skip
        return {
            "customer_id": "C1042",
            "name": "Aoi Tanaka",
            "tier": "gold",
            "locale": "ja-JP",
            "addresses": [
                {"label": "home", "line": "3-14-1 Kichijoji, Musashino, Tokyo 180-0004"},
                {"label": "work", "line": "2-7-2 Marunouchi, Chiyoda, Tokyo 100-7005"},
            ],
            "preferences": {"formats": ["paperback"], "genres": ["seinen", "fantasy"]},
            "order_history": history,
        }

    def chance(self, rate: float) -> bool:
        return self.rng.random() < rate

    def run(self, use: ToolUseBlock) -> ToolResultBlock:
        """One step: a call in an assistant turn and its result in the next user turn,
        after a timeout and a same-input retry when the profile says so."""
        filler = (
            (TextBlock(text=self.rng.choice(FILLERS)),)
            if self.chance(self.profile.filler_rate)
            else ()
        )
        if self.chance(self.profile.timeout_rate):
            self.out.add("assistant", *filler, use)
            failed = ToolResultBlock(
                tool_use_id=use.tool_use_id,
                status="error",
                content=(TextBlock(text=_timeout_trace(use.name)),),
            )
            self.out.add("user", failed)
            use = self.out.use(use.name, dict(use.input))
            filler = (TextBlock(text="The call timed out; retrying."),)
        result = self.answer(use)
        self.out.add("assistant", *filler, use)
        self.out.add("user", result)
        return result

    def answer(self, use: ToolUseBlock) -> ToolResultBlock:
        args = use.input
        if use.name == "search_catalog":
            body: Any = {"query": args["query"], "page": args["page"],
                         "items": self.shop.search(args["query"], args["page"])}  # fmt: skip
        elif use.name == "get_item":
            if args["item_id"] not in self.shop.catalog:
                return ToolResultBlock(
                    tool_use_id=use.tool_use_id,
                    status="error",
                    content=(
                        TextBlock(text=f"item_id must look like M12345, got {args['item_id']!r}"),
                    ),
                )
            body = self.shop.item_page(args["item_id"])
        elif use.name == "add_to_cart":
            self.shop.cart[args["item_id"]] = self.shop.cart.get(args["item_id"], 0) + args["qty"]
            body = {"ok": True, "item_id": args["item_id"], "qty": args["qty"]}
        elif use.name == "get_cart":
            body = self.shop.cart_view()
        elif use.name == "get_customer":
            body = self.customer
        elif use.name == "order_status":
            body = self.shop.tracking(args["order_id"])
        else:
            return ToolResultBlock(
                tool_use_id=use.tool_use_id,
                content=(TextBlock(text=_policy_text(args["section"])),),
            )
        return ToolResultBlock(tool_use_id=use.tool_use_id, content=(JsonBlock(json=body),))

    def pick_series(self) -> str:
        if self.searched and self.chance(self.profile.repeat_rate):
            return self.rng.choice(self.searched)
        fresh = [s for s in SERIES if s not in self.searched] or list(SERIES)
        series = self.rng.choice(fresh)
        self.searched.append(series)
        return series

    def ask(self, text: str) -> None:
        """A user message, and the customer's record read again when the profile says so."""
        first = not self.out.calls
        self.out.add("user", TextBlock(text=text))
        if first or self.chance(self.profile.refetch_rate):
            self.run(self.out.use("get_customer", {"customer_id": "C1042"}))

    def find(self) -> str:
        series = self.pick_series()
        self.ask(f"Do you have {series}? Which volumes are in stock?")
        result = self.run(self.out.use("search_catalog", {"query": series, "page": 1}))
        top = _json(result)["items"][0]
        if self.chance(self.profile.invalid_rate):
            self.run(self.out.use("get_item", {"item_id": series.lower()}))
        page = self.run(self.out.use("get_item", {"item_id": top["id"]}))
        self.viewed.append(top["id"])
        item = _json(page)
        price, stock = item["price_jpy"], item["stock"]
        return f"Yes: {item['title']} ({item['id']}) is ¥{price}, {stock} in stock."

    def details(self) -> str:
        if self.viewed and self.chance(self.profile.repeat_rate):
            item_id = self.rng.choice(self.viewed)
        else:
            item_id = self.rng.choice(sorted(self.shop.catalog))
            self.viewed.append(item_id)
        self.ask(f"Tell me more about {self.shop.catalog[item_id]['title']}.")
        page = self.run(self.out.use("get_item", {"item_id": item_id}))
        item = _json(page)
        return f"{item['title']} (ISBN {item['isbn']}): {item['synopsis']}"

    def add(self) -> str:
        item_id = self.rng.choice(self.viewed or sorted(self.shop.catalog))
        qty = self.rng.randrange(1, 3)
        self.ask(f"Add {qty} of {self.shop.catalog[item_id]['title']} to my cart.")
        self.run(self.out.use("get_cart", {}))
        self.run(self.out.use("add_to_cart", {"item_id": item_id, "qty": qty}))
        cart = self.run(self.out.use("get_cart", {}))
        if self.chance(self.profile.verify_rate):
            cart = self.run(self.out.use("get_cart", {}))
        total = _json(cart)["total_jpy"]
        return f"Added. Your cart total is now ¥{total}."

    def track(self) -> str:
        self.ask(f"Where is my order {self.order_id}?")
        low, high = self.profile.polls
        status = ""
        for _ in range(self.rng.randint(low, high)):
            if self.chance(0.3):
                self.shop.order_status = min(self.shop.order_status + 1, len(STATUSES) - 1)
            result = self.run(self.out.use("order_status", {"order_id": self.order_id}))
            status = _json(result)["status"]
        return f"Your order {self.order_id} is {status}."

    def policy(self) -> str:
        if self.read_sections and self.chance(self.profile.repeat_rate):
            section = self.rng.choice(self.read_sections)
        else:
            section = self.rng.choice(POLICY_SECTIONS)
            self.read_sections.append(section)
        self.ask(f"What is your {section} policy?")
        result = self.run(self.out.use("read_policy", {"section": section}))
        first = result.content[0].text if isinstance(result.content[0], TextBlock) else ""
        return "In short: " + first.split("\n\n", 1)[0][:160]

    def conversation(self) -> tuple[Turn, ...]:
        loops = (self.find, self.details, self.add, self.track, self.policy)
        weights = (3, 2, 2, 2, 1)
        self.out.add("user", TextBlock(text="Hi! I'm looking for some manga."))
        self.out.add("assistant", TextBlock(text="Hello! What are you looking for?"))
        for n in range(self.profile.requests):
            loop = self.find if n == 0 else self.rng.choices(loops, weights)[0]
            self.out.add("assistant", TextBlock(text=loop()))
        return tuple(self.out.turns)


def tool_heavy_conversation(
    seed: int,
    profile: Profile = TOOL_HEAVY,
    *,
    start: datetime = datetime(2026, 3, 2, 9, 0, tzinfo=UTC),
) -> tuple[Turn, ...]:
    """A tool-heavy conversation: the same ``seed`` and ``profile`` give the same turns."""
    return _Agent(seed, profile, start).conversation()
