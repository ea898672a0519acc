"""``whole_key`` remembers the digest key of the last long texts: it must always equal
``text_key`` (random texts, equal texts that are other objects, texts that differ in one
character), and hold no more texts, nor longer ones, than its bounds say."""

from __future__ import annotations

import random

from tiermem.summaries import structured
from tiermem.summaries._lru import INLINE_KEY, text_key
from tiermem.summaries.structured import RECENT_KEY_CHARS, RECENT_KEYS, whole_key


def test_whole_key_is_text_key() -> None:
    rng = random.Random(7)
    alphabet = "ab c\n日本¥-"
    pool = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 900))) for _ in range(30)]
    for _ in range(3_000):
        text = rng.choice(pool)
        pick = rng.randrange(4)
        if pick == 1:  # an equal text, another object
            text = "".join(list(text))
        elif pick == 2 and text:  # one character changed, same length
            at = rng.randrange(len(text))
            text = text[:at] + ("x" if text[at] != "x" else "y") + text[at + 1 :]
        assert whole_key(text) == text_key(text)


def test_bounds() -> None:
    for i in range(RECENT_KEYS * 3):
        whole_key(f"{i:04d}" + "z" * INLINE_KEY)
    assert len(structured._RECENT_KEYS) == RECENT_KEYS
    huge = "h" * (RECENT_KEY_CHARS + 1)
    assert whole_key(huge) == text_key(huge)
    assert all(held is not huge for held, _ in structured._RECENT_KEYS)
    short = "s" * INLINE_KEY
    assert whole_key(short) == short
