"""TurnText: one turn's text, normalised once and read by every rule engine.

Token counting, entity extraction, importance scoring, memory detection and search
indexing all read a turn's text. :class:`TurnText` computes what they share once per turn —
the text, its NFKC form for the search tokenizer, and the normalised and folded *rule
windows* (:class:`~tiermem.policies.phrases.TextView`) for the rule engines — so none of
them normalises it again. It is a plain immutable value, safe to build in a worker thread.

**The rule window.** The rule engines (entity rules, importance cues and density, memory
detection) read at most ``RULE_HEAD_CHARS + RULE_TAIL_CHARS`` (12,000) characters of a turn:
all of a turn up to that size; of a longer one, the first ``RULE_HEAD_CHARS`` (8,000) and
the last ``RULE_TAIL_CHARS`` (4,000) characters, joined by :data:`RULE_ELISION`. Why:

* what a person types is almost always shorter than 8,000 characters (about 1,300 English
  words), so typed turns are read whole and nothing changes for them;
* a longer turn is mostly pasted material (a log, a chapter, a document), and what the
  person says about it comes before it ("I prefer seinen; here is my list: …") or after it
  ("… so which of these is vol 42?"). The middle of a paste holds the entities and "I like"
  of whoever wrote it, not of the user;
* the rules' cost grows with what they read: on a 200 KB turn they took about 400 ms of CPU
  before the cap (``bench/large_turn.py``).

Cuts fall at whitespace when there is some within 64 characters, so no word is split (a
Japanese text without spaces is cut where it is); the elision is a line of its own, so no
sentence, phrase or pattern spans the cut. Token counting and search indexing read the whole
text: the token count is the context budget and must be exact, and a pasted text should be
found by recall.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tiermem.models.content import TextBlock, text_of
from tiermem.policies.phrases import TextView, nfkc, straight_apostrophes

__all__ = [
    "RULE_ELISION",
    "RULE_HEAD_CHARS",
    "RULE_TAIL_CHARS",
    "TurnText",
    "as_turn_text",
    "rule_window",
]

RULE_HEAD_CHARS = 8_000
"""Characters the rule engines read from the start of a long turn."""
RULE_TAIL_CHARS = 4_000
"""Characters the rule engines read from the end of a long turn."""
RULE_ELISION = "\n...\n"
"""What stands for the unread middle of a long turn in its rule window."""
_WORD_SLACK = 64
_WHOLE_CHARS = RULE_HEAD_CHARS + RULE_TAIL_CHARS
_SPACES = (" ", "\n", "\t")


def rule_window(text: str) -> str:
    """The part of ``text`` that the rule engines read: all of it up to
    ``RULE_HEAD_CHARS + RULE_TAIL_CHARS`` characters, else its head and tail joined by
    :data:`RULE_ELISION` (see the module docstring)."""
    if len(text) <= RULE_HEAD_CHARS + RULE_TAIL_CHARS:
        return text
    head_end = _cut_back(text, RULE_HEAD_CHARS)
    tail_start = _cut_forward(text, len(text) - RULE_TAIL_CHARS)
    return text[:head_end].rstrip() + RULE_ELISION + text[tail_start:].lstrip()


def _cut_back(text: str, at: int) -> int:
    """``at``, or the nearest whitespace before it, so that ``text[:cut]`` ends a word."""
    if text[at - 1].isspace() or text[at].isspace():
        return at
    space = max(text.rfind(s, at - _WORD_SLACK, at) for s in _SPACES)
    return space if space > 0 else at


def _cut_forward(text: str, at: int) -> int:
    """``at``, or the nearest whitespace after it, so that ``text[cut:]`` starts a word."""
    if text[at - 1].isspace() or text[at].isspace():
        return at
    found = [i for s in _SPACES if (i := text.find(s, at, at + _WORD_SLACK)) >= 0]
    return min(found) if found else at


def _window_view(normal: str) -> tuple[TextView, bool]:
    window = rule_window(normal)
    return TextView.of_normal(straight_apostrophes(window)), window is not normal


@dataclass(frozen=True)
class TurnText:
    """One turn's text in the forms its readers need, computed once.

    Build it with :meth:`of` (text someone wrote) or :meth:`of_blocks` (a turn's content
    blocks). Who reads what:

    * ``text`` — the whole text (:func:`~tiermem.models.text_of`): token counting;
    * ``nfkc`` — ``text`` in NFKC, whole: the search tokenizer
      (:func:`tiermem.longterm.text.tokenize`) casefolds it;
    * ``view`` — the rule window of ``text``: entity rules, importance density;
    * ``said_text`` and ``said`` — the text of the turn's text blocks only (what the speaker
      wrote, not tool results or reasoning), whole and as its rule window: importance cues,
      memory detection (``!remember`` keeps the whole ``said_text``).

    For a turn of text blocks only, ``said`` is ``view``. Equality compares the text.
    """

    text: str
    said_text: str
    nfkc: str = field(repr=False)
    view: TextView = field(repr=False, compare=False)
    said: TextView = field(repr=False, compare=False)
    truncated: bool = False
    """Whether a rule window left out the middle of the text."""

    @classmethod
    def of(cls, text: str) -> TurnText:
        """The text someone wrote, all of it said (as for one text block)."""
        if text.isascii() and len(text) <= _WHOLE_CHARS:
            # Most turns: what ``_build`` and ``TextView.of_normal`` do for them, without
            # their two frames (ASCII is in NFKC, has no curly apostrophe, and lower-cases
            # to the same length).
            view = _new(TextView)
            view.normal = text
            view.folded = text.lower()
            view._keys = view._words = None
            built = _new(cls)
            _set(
                built,
                "__dict__",
                {
                    "text": text,
                    "said_text": text,
                    "nfkc": text,
                    "view": view,
                    "said": view,
                    "truncated": False,
                },
            )
            return built
        return cls._build(text, text)

    @classmethod
    def of_blocks(cls, blocks: tuple[Any, ...] | list[Any]) -> TurnText:
        """The text of a turn's content blocks (see the class docstring)."""
        if len(blocks) == 1 and type(blocks[0]) is TextBlock:
            text = blocks[0].text  # most turns: one text block, all of it said
            return cls._build(text, text)
        said_text = "\n".join(b.text for b in blocks if isinstance(b, TextBlock))
        return cls._build(text_of(blocks), said_text)

    @classmethod
    def _build(cls, text: str, said_text: str) -> TurnText:
        if text.isascii():  # most turns: in NFKC, no curly apostrophe
            normal = text
            if len(text) <= _WHOLE_CHARS:
                view, truncated = TextView.of_normal(text), False
            else:
                view, truncated = _window_view(text)
        else:
            normal = nfkc(text)
            view, truncated = _window_view(normal)
        if said_text is text or said_text == text:
            said, said_truncated = view, truncated
        else:
            said, said_truncated = _window_view(nfkc(said_text))
        # ``cls(...)`` in one step: a frozen dataclass's ``__init__`` sets each field with
        # ``object.__setattr__``, and this runs for every turn.
        built = _new(cls)
        _set(
            built,
            "__dict__",
            {
                "text": text,
                "said_text": said_text,
                "nfkc": normal,
                "view": view,
                "said": said,
                "truncated": truncated or said_truncated,
            },
        )
        return built


_new = object.__new__
_set = object.__setattr__


def as_turn_text(text: str | TurnText) -> TurnText:
    """``text`` as a :class:`TurnText`: a string is read as :meth:`TurnText.of` reads it."""
    return TurnText.of(text) if isinstance(text, str) else text
