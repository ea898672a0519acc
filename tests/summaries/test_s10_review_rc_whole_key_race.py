"""Review of ``whole_key`` (s10, reviewer RC): its list of recent keys is shared by every
thread without a lock, so a lookup must survive another thread moving an entry between
the moment it finds its text and the moment it moves that entry to the front.

A real thread cannot be paused between two list operations, so the other thread's step is
played by a ``str`` subclass whose ``__eq__`` (run while the lookup compares it with a held
text) does what a concurrent lookup of another text does: takes an entry out and puts it
back in front. The subclass is a fake standing for that interleaving only."""

from __future__ import annotations

from tiermem.summaries import structured
from tiermem.summaries._lru import INLINE_KEY, text_key
from tiermem.summaries.structured import RECENT_KEYS, whole_key


class _Racing(str):
    """A text whose comparison lets "another thread" move the last entry to the front."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        same = str.__eq__(self, other)
        recent = structured._RECENT_KEYS
        if same is True and len(recent) == RECENT_KEYS:
            recent.insert(0, recent.pop())  # a concurrent lookup's move, done in full
            recent.pop(1)  # ... and one caught between its pop and its insert
        return same

    __hash__ = str.__hash__


def test_a_lookup_survives_an_entry_moved_under_it() -> None:
    structured._RECENT_KEYS.clear()
    texts = [f"{i:03d}" + "w" * INLINE_KEY for i in range(RECENT_KEYS)]
    for text in texts:
        whole_key(text)
    oldest = texts[0]  # now last in the list
    racing = _Racing("".join(list(oldest)))  # equal, another object: compared with ==
    assert whole_key(racing) == text_key(oldest)
    assert len(structured._RECENT_KEYS) <= RECENT_KEYS
    for held, key in structured._RECENT_KEYS:
        assert key == text_key(held)
