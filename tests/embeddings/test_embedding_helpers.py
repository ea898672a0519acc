"""What every embedder shares: input checks, normalization, and a missing extra reported."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest

from tiermem.errors import BackendError, UnsupportedCapabilityError, ValidationError
from tiermem.llm.embeddings import check_texts, unit_normalize


def test_unit_normalize_scales_to_length_one() -> None:
    vector = unit_normalize([3, 4], backend="test")
    assert vector == [0.6, 0.8]
    assert all(isinstance(x, float) for x in vector)
    tiny = unit_normalize([1e-30, 0.0, -1e-30], backend="test")
    assert math.isclose(math.fsum(x * x for x in tiny), 1.0)


@pytest.mark.parametrize("vector", [[], [0.0, 0.0], [float("nan"), 1.0], [float("inf"), 1.0]])
def test_vectors_that_cannot_be_normalized_are_backend_errors(vector: list[float]) -> None:
    with pytest.raises(BackendError, match="cannot be normalized"):
        unit_normalize(vector, backend="test")


def test_check_texts_accepts_sequences_of_str() -> None:
    assert check_texts(("a", "b"), what="E") == ["a", "b"]
    assert check_texts([], what="E") == []


def test_check_texts_rejects_a_lone_str_and_non_str_items() -> None:
    with pytest.raises(ValidationError, match="not one str"):
        check_texts("abc", what="E")
    with pytest.raises(ValidationError, match="text 1 is bytes"):
        check_texts(["ok", b"bytes"], what="E")  # type: ignore[list-item]


def test_local_embedder_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tiermem.llm.embeddings_local import LocalMiniLMEmbedder

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "sentence_transformers" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(UnsupportedCapabilityError, match=r"pip install 'tiermem\[embeddings\]'"):
        LocalMiniLMEmbedder()


def test_bedrock_embedder_without_boto3_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tiermem.llm.embeddings_remote import BedrockTitanEmbedder

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "boto3" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(UnsupportedCapabilityError, match=r"tiermem\[llm\]"):
        BedrockTitanEmbedder()


def test_importing_the_adapters_needs_none_of_their_libraries() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import tiermem.llm.embeddings_local, tiermem.llm.embeddings_remote\n"
        "import tiermem.longterm.knowledge\n"
        "heavy = {'torch', 'sentence_transformers', 'boto3', 'httpx', 'pypdf', 'docx'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run(  # noqa: S603  (our own interpreter, fixed code)
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
