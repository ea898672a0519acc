"""open_chat_model: which adapter the TIERMEM_LLM* settings build, and the errors for
settings a provider needs but lacks. Building a model sends nothing."""

from __future__ import annotations

import pydantic
import pytest

from tiermem.errors import ValidationError
from tiermem.llm import ChatModel, open_chat_model
from tiermem.llm.chat_anthropic import AnthropicChatModel
from tiermem.llm.chat_bedrock import BedrockConverseModel
from tiermem.llm.chat_openai import OpenAICompatibleChatModel
from tiermem.settings import TierMemSettings


def test_none_means_the_offline_engine() -> None:
    assert TierMemSettings().llm == "none"
    assert open_chat_model(TierMemSettings()) is None


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_LLM", "bedrock")
    monkeypatch.setenv("TIERMEM_LLM_MODEL", "us.anthropic.claude-3-5-haiku-20241022-v1:0")
    monkeypatch.setenv("TIERMEM_LLM_TIMEOUT_SECONDS", "12.5")
    monkeypatch.setenv("TIERMEM_LLM_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("TIERMEM_AWS_REGION", "eu-west-1")
    model = open_chat_model(TierMemSettings())
    assert isinstance(model, BedrockConverseModel)
    assert isinstance(model, ChatModel)
    assert model.name == "bedrock:us.anthropic.claude-3-5-haiku-20241022-v1:0"
    built = model._build_client()
    assert built.meta.region_name == "eu-west-1"
    assert built.meta.config.read_timeout == 12.5
    assert model._max_attempts == 5


async def test_openai_and_anthropic_are_built_with_their_urls() -> None:
    openai = open_chat_model(
        TierMemSettings(llm="openai", llm_model="qwen2.5", llm_base_url="http://127.0.0.1:8000/v1")
    )
    assert isinstance(openai, OpenAICompatibleChatModel)
    assert openai.name == "openai-compatible:qwen2.5"
    assert openai._url == "http://127.0.0.1:8000/v1/chat/completions"
    await openai.aclose()

    anthropic = open_chat_model(
        TierMemSettings(llm="anthropic", llm_model="claude-3-5-haiku-latest", llm_api_key="k")
    )
    assert isinstance(anthropic, AnthropicChatModel)
    assert anthropic._url == "https://api.anthropic.com/v1/messages"
    assert anthropic._headers["x-api-key"] == "k"
    await anthropic.aclose()


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"llm": "bedrock"}, "needs TIERMEM_LLM_MODEL"),
        ({"llm": "openai", "llm_model": "m"}, "needs TIERMEM_LLM_BASE_URL"),
        ({"llm": "openai", "llm_model": "m", "llm_base_url": "localhost:11434"}, "http://"),
        ({"llm": "anthropic", "llm_model": "m"}, "needs TIERMEM_LLM_API_KEY"),
    ],
)
def test_missing_settings_are_named(settings: dict[str, str], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        open_chat_model(TierMemSettings(**settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "settings",
    [{"llm": "gpt"}, {"llm_max_attempts": 0}, {"llm_timeout_seconds": 0}],
)
def test_out_of_range_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        TierMemSettings(**settings)  # type: ignore[arg-type]
