"""Model protocols and adapters: embeddings and chat models (LLMs). Optional extras.

The chat side: :class:`ChatModel` is the protocol; :class:`ScriptedChatModel` answers from
a script (tests, demos); the adapters for Bedrock Converse, OpenAI-compatible servers and
Anthropic live in ``tiermem.llm.chat_bedrock``, ``chat_openai`` and ``chat_anthropic`` and
import their client libraries only when built; :func:`open_chat_model` picks one from the
settings (None: use the offline engine).
"""

from tiermem.llm.chat import ChatMessage, ChatModel, ChatReply, ModelFailedError
from tiermem.llm.chat_factory import open_chat_model
from tiermem.llm.chat_json import ReplyParseError, parse_json_object
from tiermem.llm.chat_scripted import ScriptedCall, ScriptedChatModel, ScriptExhaustedError

__all__ = [
    "ChatMessage",
    "ChatModel",
    "ChatReply",
    "ModelFailedError",
    "ReplyParseError",
    "ScriptExhaustedError",
    "ScriptedCall",
    "ScriptedChatModel",
    "open_chat_model",
    "parse_json_object",
]
