"""TiktokenCounter's direct call into tiktoken's core counts exactly what the public
``Encoding.encode_ordinary`` counts (the reference), and it falls back to the public
method when the private core is missing."""

from __future__ import annotations

import random

import pytest
import tiktoken

from tiermem.tokens import ENCODING_NAME, TiktokenCounter

_POOL = (
    list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,!?-_'\"\n\t<|>")
    + list("漫画好きなジャンルはセイネンですベルセルク巻ありますか？ー・。")
    + ["<|endoftext|>", "<|fim_prefix|>", "😀", "é", "\u200b", "\ud800", "\udfff"]
)
CORPUS = [
    "",
    "hello world",
    "好きなジャンルはセイネンです。ベルセルク42巻はありますか？",
    "<|endoftext|> is text here",
    "lone surrogate \ud83d in text",
    "Your order ORD-12345 ships tomorrow.",
]


def _texts() -> list[str]:
    rng = random.Random(8)
    texts = list(CORPUS)
    for _ in range(2_000):
        texts.append("".join(rng.choice(_POOL) for _ in range(rng.randint(0, 60))))
    return texts


def test_counts_match_the_public_encoder() -> None:
    reference = tiktoken.get_encoding(ENCODING_NAME)
    counter = TiktokenCounter()
    for text in _texts():
        assert counter.count(text) == len(reference.encode_ordinary(text)), repr(text)


def test_falls_back_to_the_public_method_without_the_private_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fake encoding without ``_core_bpe``: a tiktoken release may rename it, which the
    # installed one cannot show.
    real = tiktoken.get_encoding(ENCODING_NAME)

    class PublicOnly:
        def encode_ordinary(self, text: str) -> list[int]:
            return real.encode_ordinary(text)

    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: PublicOnly())
    counter = TiktokenCounter()
    for text in CORPUS:
        assert counter.count(text) == len(real.encode_ordinary(text))
