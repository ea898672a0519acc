"""Conversations written as short shapes, for tables of cases, and random ones for
hypothesis.

A shape is words separated by spaces, one per message::

    "u a:t1 u:r1 a"      user text, assistant calling t1, user with t1's result, assistant text
    "a:t1,t2 u:r1,r2"    two parallel calls answered in one message
    "a:t1,t2 u:r1 u:r2"  ... answered in two messages
    "u*"                 a pinned user message (``*`` on any word)
    "u:r1!"              a result of 2,000 characters (long enough to shorten)

Each message's text says its position (``m3``) so a result can be read back.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from tiermem.context.tool_pairs import tool_pair_groups
from tiermem.managers import Reduction
from tiermem.models import ImageBlock, Message, TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.tokens import TiktokenCounter

COUNTER = TiktokenCounter()

SENTENCES = (
    "I prefer seinen.",
    "Is Berserk vol 42 in stock?",
    "My order ORD-12345 has not arrived.",
    "Thanks!",
    "Let me check that for you.",
    "It costs ¥1,200.",
    "Sure, here you go.",
    "I love horror.",
    "okay",
)


def shape(text: str) -> tuple[list[Message], list[int]]:
    """The messages of a shape, and the positions pinned with ``*``."""
    messages: list[Message] = []
    pinned: list[int] = []
    for position, word in enumerate(text.split()):
        if word.endswith("*"):
            pinned.append(position)
            word = word[:-1]
        long = word.endswith("!")
        word = word.rstrip("!")
        role, _, ids = word.partition(":")
        label = TextBlock(text=f"m{position}: {SENTENCES[position % len(SENTENCES)]}")
        if role == "a" and ids:
            uses = tuple(
                ToolUseBlock(tool_use_id=i, name="lookup", input={"q": i}) for i in ids.split(",")
            )
            messages.append(Message(role="assistant", content=(label, *uses)))
        elif role == "u" and ids:
            body = ("x" * 2000) if long else f"result m{position}"
            results = tuple(
                ToolResultBlock(tool_use_id=i.replace("r", "t"), content=(TextBlock(text=body),))
                for i in ids.split(",")
            )
            messages.append(Message(role="user", content=results))
        else:
            messages.append(Message(role="user" if role == "u" else "assistant", content=(label,)))
    return messages, pinned


def words(messages: Sequence[Message]) -> str:
    """A conversation written back as a shape (without pins or lengths), for assertions."""
    out = []
    for m in messages:
        uses = [b.tool_use_id for b in m.content if isinstance(b, ToolUseBlock)]
        results = [
            b.tool_use_id.replace("t", "r") for b in m.content if isinstance(b, ToolResultBlock)
        ]
        ids = uses or results
        out.append(("u" if m.role == "user" else "a") + (":" + ",".join(ids) if ids else ""))
    return " ".join(out)


def pairs_intact(before: Sequence[Message], after: Reduction) -> bool:
    """No tool-pair group of ``before`` is partly kept."""
    kept = {o for o in after.origins if o is not None}
    return all(
        set(g) <= kept or not set(g) & kept for g in tool_pair_groups([m.content for m in before])
    )


def no_orphans(messages: Sequence[Message]) -> bool:
    """Every result answers a call made earlier, and every call but the last message's is
    answered later."""
    called: set[str] = set()
    answered: set[str] = set()
    for m in messages:
        for b in m.content:
            if isinstance(b, ToolResultBlock):
                if b.tool_use_id not in called:
                    return False
                answered.add(b.tool_use_id)
            elif isinstance(b, ToolUseBlock):
                called.add(b.tool_use_id)
    last = (
        {b.tool_use_id for b in messages[-1].content if isinstance(b, ToolUseBlock)}
        if messages
        else set()
    )
    return called - answered <= last


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[Message], list[int]]:
    """Random well-formed conversations: exchanges of a user message, then assistant text or
    tool calls (1-3, in parallel) answered in one or several user messages, then maybe more
    text; texts and tool outputs of random length, images in some results; random pins."""
    messages: list[Message] = []
    counter = 0
    text = st.builds(
        lambda parts, pad: " ".join(parts) + (" filler words" * pad),
        st.lists(st.sampled_from(SENTENCES), min_size=1, max_size=3),
        st.integers(0, 60),
    )
    for _ in range(draw(st.integers(1, 8))):
        messages.append(Message.text("user", draw(text)))
        if draw(st.booleans()):
            ids = [f"t{counter + k}" for k in range(draw(st.integers(1, 3)))]
            counter += len(ids)
            uses = tuple(ToolUseBlock(tool_use_id=i, name="lookup", input={"q": i}) for i in ids)
            messages.append(Message(role="assistant", content=(TextBlock(text=draw(text)), *uses)))
            results = [
                ToolResultBlock(
                    tool_use_id=i,
                    content=(
                        (ImageBlock(format="png", data=b"\x89PNG"),)
                        if draw(st.integers(0, 9)) == 0
                        else (TextBlock(text="r" * draw(st.integers(1, 1500))),)
                    ),
                    status=draw(st.sampled_from(["success", "error"])),
                )
                for i in ids
            ]
            if draw(st.booleans()):
                messages.append(Message(role="user", content=tuple(results)))
            else:
                messages += [Message(role="user", content=(r,)) for r in results]
        messages.append(Message.text("assistant", draw(text)))
    if draw(st.booleans()):
        messages.append(Message.text("user", draw(text)))
    pinned = draw(st.lists(st.integers(0, len(messages) - 1), max_size=3, unique=True))
    return messages, pinned
