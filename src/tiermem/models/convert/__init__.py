"""Converters between tiermem :class:`Message` values and three provider wire formats.

Each format has ``to_X(messages) -> list[dict]`` and ``from_X(raw) -> list[Message]``, plus
system-prompt helpers, since no format keeps the system prompt among the turns the same way:

* Bedrock Converse: ``to_converse``/``from_converse``, ``to_converse_system``/
  ``from_converse_system``. Bytes stay raw ``bytes``, as boto3 sends and returns them.
* Anthropic Messages: ``to_anthropic``/``from_anthropic``, ``to_anthropic_system``/
  ``from_anthropic_system``. Bytes are base64 text.
* OpenAI chat completions: ``to_openai(messages, system=...)``/``from_openai``;
  ``split_openai_system`` takes system/developer messages out of a raw list first.

``from_X(to_X(m)) == m`` holds except for what a format cannot carry:

Converse
    Image/document URIs must be ``s3://`` (others are rejected); an S3 ``bucketOwner`` is
    dropped on read. A block with both ``data`` and ``uri`` is sent by ``data``; a reasoning
    block with ``redacted`` bytes is sent as redacted only.
Anthropic
    A :class:`JsonBlock` in a tool result becomes JSON text. Documents are PDF (base64 or URL)
    or text (``txt``/``md``/``csv``/``html`` are sent as text and read back as ``txt``);
    ``doc``/``docx``/``xls``/``xlsx`` are rejected; no ``title`` reads back as ``"document"``.
    A URL image's format is read from the URL's extension (``jpeg`` when there is none).
    A :class:`CachePointBlock` becomes ``cache_control`` on the block before it; on read,
    its ``ttl``, cache marks inside tool results, and text citations are dropped.
OpenAI
    :class:`ReasoningBlock` and :class:`CachePointBlock` have no equivalent and are dropped
    (never an error). A tool result's ``status`` is dropped, a :class:`JsonBlock` becomes
    JSON text, an empty result is ``""``. Images and documents cannot travel in tool results
    or assistant messages (rejected); documents travel only as inline PDF ``file`` parts.
    A user message becomes its tool messages, then one user message with the rest; on read,
    consecutive tool messages and the user message right after them become one message.
    Assistant text comes before tool calls. An image's ``detail`` is dropped on read.

A block a converter does not know is read as an :class:`UnknownBlock` with ``kind`` the
format name (``"converse"``, ``"anthropic"``, ``"openai"``) and ``data`` the raw block.
Written back to that format, ``data`` passes through unchanged; to another format it raises
:class:`~tiermem.errors.ValidationError`. So does malformed input, naming the message and
block index.

Each format lives in its own module (:mod:`~tiermem.models.convert.converse`,
:mod:`~tiermem.models.convert.anthropic`, :mod:`~tiermem.models.convert.openai`); import the
converters from this package.
"""

from tiermem.models.convert._wire import SystemBlock
from tiermem.models.convert.anthropic import (
    from_anthropic,
    from_anthropic_system,
    to_anthropic,
    to_anthropic_system,
)
from tiermem.models.convert.converse import (
    from_converse,
    from_converse_system,
    to_converse,
    to_converse_system,
)
from tiermem.models.convert.openai import from_openai, split_openai_system, to_openai

__all__ = [
    "SystemBlock",
    "from_anthropic",
    "from_anthropic_system",
    "from_converse",
    "from_converse_system",
    "from_openai",
    "split_openai_system",
    "to_anthropic",
    "to_anthropic_system",
    "to_converse",
    "to_converse_system",
    "to_openai",
]
