"""Build the chat model the settings name (``TIERMEM_LLM*``), at the composition root."""

from __future__ import annotations

from tiermem.errors import ValidationError
from tiermem.llm.chat import ChatModel
from tiermem.settings import TierMemSettings

__all__ = ["open_chat_model"]


def open_chat_model(settings: TierMemSettings) -> ChatModel | None:
    """The chat model of ``settings.llm``, or None for ``none`` (use the offline engine).

    Raises:
        ValidationError: a setting the chosen provider needs is missing (the message names
            the environment variable to set).
        UnsupportedCapabilityError: the provider's client library is not installed.
    """
    if settings.llm == "none":
        return None
    if not settings.llm_model:
        raise ValidationError(
            f"TIERMEM_LLM={settings.llm} needs TIERMEM_LLM_MODEL (the model id the provider "
            "knows), or set TIERMEM_LLM=none to use the offline engine"
        )
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    timeout = settings.llm_timeout_seconds
    attempts = settings.llm_max_attempts
    if settings.llm == "bedrock":
        from tiermem.llm.chat_bedrock import BedrockConverseModel

        return BedrockConverseModel(
            settings.llm_model,
            region_name=settings.aws_region,
            timeout=timeout,
            max_attempts=attempts,
        )
    if settings.llm == "openai":
        from tiermem.llm.chat_openai import OpenAICompatibleChatModel

        if not settings.llm_base_url:
            raise ValidationError(
                "TIERMEM_LLM=openai needs TIERMEM_LLM_BASE_URL, e.g. http://localhost:11434/v1 "
                "for Ollama or https://api.openai.com/v1"
            )
        return OpenAICompatibleChatModel(
            settings.llm_base_url,
            settings.llm_model,
            api_key=key,
            timeout=timeout,
            json_mode=settings.llm_json_mode,
            max_attempts=attempts,
        )
    from tiermem.llm.chat_anthropic import ANTHROPIC_API_URL, AnthropicChatModel

    if not key:
        raise ValidationError("TIERMEM_LLM=anthropic needs TIERMEM_LLM_API_KEY")
    return AnthropicChatModel(
        settings.llm_model,
        api_key=key,
        base_url=settings.llm_base_url or ANTHROPIC_API_URL,
        timeout=timeout,
        max_attempts=attempts,
    )
