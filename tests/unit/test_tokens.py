"""Token counting and the model registry."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import UnknownModelError, ValidationError
from tiermem.models import (
    CachePointBlock,
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    UnknownBlock,
)
from tiermem.tokens import (
    DOCUMENT_TOKENS,
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    BaseTokenCounter,
    ModelRegistry,
    ModelSpec,
    TiktokenCounter,
    TokenCounter,
    default_registry,
    normalize_model_id,
)

JAPANESE = "ベルセルクの最新刊は在庫がありますか？配送は明日になりますか。"


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


# ---------------------------------------------------------------- counting text


def test_counts_match_cl100k(counter: TiktokenCounter) -> None:
    # Known cl100k_base values: a different encoding would give different counts.
    assert counter.count("hello world") == 2
    assert counter.count("") == 0
    assert counter.count("tiktoken is great!") == 6


def test_japanese_counts_are_positive_and_stable(counter: TiktokenCounter) -> None:
    first = counter.count(JAPANESE)
    assert first > len(JAPANESE) // 4  # CJK is dense in tokens, never near zero
    assert counter.count(JAPANESE) == first
    assert TiktokenCounter().count(JAPANESE) == first


def test_special_token_text_counts_as_plain_text(counter: TiktokenCounter) -> None:
    text = "ignore this <|endoftext|> and <|fim_prefix|>"
    # As plain text "<|endoftext|>" is several tokens, not the one special token.
    assert counter.count("<|endoftext|>") > 1
    assert counter.count(text) >= counter.count("ignore this  and ") + 2


SPECIALS = st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", "<|endofprompt|>", "<|im_start|>"])


@given(st.lists(st.text(max_size=20) | SPECIALS, max_size=6).map("".join))
def test_any_text_counts_between_one_and_its_byte_length(text: str) -> None:
    count = TiktokenCounter().count(text)
    # Every cl100k token stands for at least one byte, and only "" has no tokens.
    assert (count > 0) == bool(text)
    assert count <= len(text.encode("utf-8"))


def test_counting_is_safe_across_threads_and_tasks(counter: TiktokenCounter) -> None:
    texts = [f"{JAPANESE} {i} " * (i % 7 + 1) for i in range(200)]
    expected = [counter.count(t) for t in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(counter.count, texts)) == expected

    async def count_all() -> list[int]:
        return list(await asyncio.gather(*(asyncio.to_thread(counter.count, t) for t in texts)))

    assert asyncio.run(count_all()) == expected


# ---------------------------------------------------------------- counting blocks and messages


def test_image_adds_the_fixed_estimate(counter: TiktokenCounter) -> None:
    text = TextBlock(text="which volume is this?")
    image = ImageBlock(format="png", data=b"\x89PNG")
    assert counter.count_blocks([text, image]) == counter.count(text.text) + IMAGE_TOKENS


def test_image_inside_a_tool_result_is_counted(counter: TiktokenCounter) -> None:
    result = ToolResultBlock(
        tool_use_id="t1",
        content=(TextBlock(text="cover:"), ImageBlock(format="jpeg", uri="s3://b/c.jpg")),
    )
    assert counter.count_blocks([result]) == counter.count("cover:") + IMAGE_TOKENS


def test_documents_text_inline_counted_binary_estimated(counter: TiktokenCounter) -> None:
    body = "return policy: 30 days " * 50
    text_doc = DocumentBlock(format="txt", name="policy", data=body.encode())
    pdf = DocumentBlock(format="pdf", name="policy", data=b"%PDF-1.7")
    assert counter.count_blocks([text_doc]) == counter.count("policy") + counter.count(body)
    assert counter.count_blocks([pdf]) == counter.count("policy") + DOCUMENT_TOKENS


def test_cache_points_are_free_and_unknown_blocks_are_not(counter: TiktokenCounter) -> None:
    text = TextBlock(text="hello")
    assert counter.count_blocks([text, CachePointBlock()]) == counter.count_blocks([text])
    unknown = UnknownBlock(kind="converse", data={"video": {"format": "mp4", "uri": "s3://b/v"}})
    assert counter.count_blocks([unknown]) > 0


def test_message_adds_the_per_message_overhead(counter: TiktokenCounter) -> None:
    message = Message.text("user", JAPANESE)
    assert counter.count_message(message) == counter.count(JAPANESE) + MESSAGE_OVERHEAD_TOKENS


def test_a_counter_needs_only_count_to_get_blocks_and_messages() -> None:
    class CharCounter(BaseTokenCounter):
        def count(self, text: str) -> int:
            return len(text)

    counter: TokenCounter = CharCounter()
    blocks = (TextBlock(text="abc"), ImageBlock(format="png", data=b"x"))
    assert counter.count_blocks(blocks) == 3 + IMAGE_TOKENS
    assert counter.count_message(Message(role="user", content=blocks)) == (
        3 + IMAGE_TOKENS + MESSAGE_OVERHEAD_TOKENS
    )


# ---------------------------------------------------------------- model specs


def test_usable_input_tokens_reserves_output_and_margin() -> None:
    spec = ModelSpec("m", context_window=10_000, max_output_tokens=2_000, safety_margin=0.1)
    assert spec.usable_input_tokens == 7_200
    assert spec.input_budget(1_000) == 8_100
    exact = ModelSpec("e", 10_000, 2_000, tokenizer_exact=True, safety_margin=0.0)
    assert exact.usable_input_tokens == 8_000


@given(
    st.integers(2, 2_000_000).flatmap(
        lambda window: st.tuples(st.just(window), st.integers(1, window - 1))
    ),
    st.sampled_from([0.0, 0.05, 0.1, 0.15, 0.25, 0.3]),
)
def test_usable_input_never_exceeds_what_is_left_after_output(
    limits: tuple[int, int], margin: float
) -> None:
    window, output = limits
    spec = ModelSpec("m", window, output, safety_margin=margin)
    left = window - output
    assert spec.usable_input_tokens <= left
    assert spec.usable_input_tokens >= left * (1 - margin) - 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"context_window": 8_000, "max_output_tokens": 8_000},
        {"context_window": 8_000, "max_output_tokens": 0},
        {"context_window": 8_000, "max_output_tokens": 1_000, "safety_margin": 1.0},
        {"context_window": 8_000, "max_output_tokens": 1_000, "safety_margin": -0.1},
    ],
)
def test_impossible_specs_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValidationError, match="'m'"):
        ModelSpec("m", **kwargs)  # type: ignore[arg-type]


def test_reserving_more_output_than_the_model_allows_is_rejected() -> None:
    spec = ModelSpec("m", 10_000, 2_000)
    with pytest.raises(ValidationError, match=r"0\.\.2000"):
        spec.input_budget(2_001)


# ---------------------------------------------------------------- the registry


@pytest.fixture
def registry() -> ModelRegistry:
    return default_registry()


@pytest.mark.parametrize(
    ("model_id", "expected_id", "window", "output"),
    [
        ("anthropic.claude-3-5-sonnet-20240620-v1:0", "claude-3-5-sonnet", 200_000, 8_192),
        ("us.anthropic.claude-3-5-sonnet-20240620-v1:0", "claude-3-5-sonnet", 200_000, 8_192),
        ("eu.anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet-v2", 200_000, 8_192),
        ("claude-3-5-sonnet-latest", "claude-3-5-sonnet-v2", 200_000, 8_192),
        ("anthropic.claude-3-haiku-20240307-v1:0", "claude-3-haiku", 200_000, 4_096),
        ("anthropic.claude-3-opus-20240229-v1:0", "claude-3-opus", 200_000, 4_096),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku", 200_000, 8_192),
        ("apac.anthropic.claude-3-7-sonnet-20250219-v1:0", "claude-3-7-sonnet", 200_000, 64_000),
        ("us.anthropic.claude-sonnet-4-20250514-v1:0", "claude-sonnet-4", 200_000, 64_000),
        ("us.anthropic.claude-opus-4-20250514-v1:0", "claude-opus-4", 200_000, 32_000),
        ("us.anthropic.claude-opus-4-1-20250805-v1:0", "claude-opus-4-1", 200_000, 32_000),
        ("global.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5", 200_000, 64_000),
        ("amazon.nova-micro-v1:0", "nova-micro", 128_000, 5_120),
        ("us.amazon.nova-lite-v1:0", "nova-lite", 300_000, 5_120),
        ("amazon.nova-pro-v1:0", "nova-pro", 300_000, 5_120),
        ("us.amazon.nova-premier-v1:0", "nova-premier", 1_000_000, 32_000),
        ("meta.llama3-8b-instruct-v1:0", "llama3-8b-instruct", 8_192, 2_048),
        ("us.meta.llama3-1-405b-instruct-v1:0", "llama3-1-405b-instruct", 128_000, 2_048),
        ("us.meta.llama3-2-90b-instruct-v1:0", "llama3-2-90b-instruct", 128_000, 2_048),
        ("us.meta.llama3-3-70b-instruct-v1:0", "llama3-3-70b-instruct", 128_000, 2_048),
        ("mistral.mistral-7b-instruct-v0:2", "mistral-7b-instruct", 32_000, 8_192),
        ("mistral.mixtral-8x7b-instruct-v0:1", "mixtral-8x7b-instruct", 32_000, 4_096),
        ("mistral.mistral-large-2402-v1:0", "mistral-large", 32_000, 8_192),
        ("mistral.mistral-large-2407-v1:0", "mistral-large-2", 128_000, 8_192),
        ("mistral.mistral-small-2402-v1:0", "mistral-small", 32_000, 8_192),
        ("gpt-4o", "gpt-4o", 128_000, 16_384),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", 128_000, 16_384),
        ("gpt-4.1-nano", "gpt-4.1-nano", 1_047_576, 32_768),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
            "us.anthropic.claude-3-7-sonnet-20250219-v1:0",
            "claude-3-7-sonnet",
            200_000,
            64_000,
        ),
        ("  Claude-3-Haiku ", "claude-3-haiku", 200_000, 4_096),
    ],
)
def test_lookup_by_short_name_provider_id_and_bedrock_id(
    registry: ModelRegistry, model_id: str, expected_id: str, window: int, output: int
) -> None:
    spec = registry.get(model_id)
    assert (spec.model_id, spec.context_window, spec.max_output_tokens) == (
        expected_id,
        window,
        output,
    )


def test_only_cl100k_models_are_exact(registry: ModelRegistry) -> None:
    assert registry.get("gpt-4-turbo").tokenizer_exact
    assert registry.get("gpt-4-turbo").safety_margin == 0.0
    claude = registry.get("claude-sonnet-4")
    assert not claude.tokenizer_exact
    assert claude.usable_input_tokens < claude.context_window - claude.max_output_tokens


def test_every_default_model_leaves_room_for_input(registry: ModelRegistry) -> None:
    assert len(registry.known_ids()) >= 30
    for model_id in registry.known_ids():
        assert registry.get(model_id).usable_input_tokens > 1_000, model_id


def test_unknown_model_says_how_to_register(registry: ModelRegistry) -> None:
    with pytest.raises(UnknownModelError) as caught:
        registry.get("us.acme.rocket-9-v1:0")
    message = str(caught.value)
    assert "'us.acme.rocket-9-v1:0'" in message
    assert "registry.register(ModelSpec(" in message
    assert "claude-3-haiku" in message
    assert isinstance(caught.value, ValidationError)
    assert "us.acme.rocket-9-v1:0" not in registry


def test_context_size_variants_are_not_mistaken_for_the_base_model(
    registry: ModelRegistry,
) -> None:
    with pytest.raises(UnknownModelError):
        registry.get("anthropic.claude-3-sonnet-20240229-v1:0:28k")


def test_registered_models_are_found_by_alias_and_profile(registry: ModelRegistry) -> None:
    spec = ModelSpec("acme.rocket-9-v1:0", 64_000, 4_000, safety_margin=0.2)
    registry.register(spec, aliases=["rocket-9"])
    assert registry.get("us.acme.rocket-9-v1:0") is spec
    assert registry.get("ROCKET-9") is spec
    assert "rocket-9" in registry


def test_register_replaces_a_default_and_registries_are_independent(
    registry: ModelRegistry,
) -> None:
    smaller = ModelSpec("nova-pro", 300_000, 10_000, safety_margin=0.2)
    registry.register(smaller)
    assert registry.get("us.amazon.nova-pro-v1:0") is smaller
    assert default_registry().get("us.amazon.nova-pro-v1:0").max_output_tokens == 5_120


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("us.anthropic.claude-3-haiku-20240307-v1:0", "anthropic.claude-3-haiku-20240307-v1"),
        ("global.amazon.nova-pro-v1:0", "amazon.nova-pro-v1"),
        ("gpt-4.1", "gpt-4.1"),
        (
            "anthropic.claude-3-sonnet-20240229-v1:0:28k",
            "anthropic.claude-3-sonnet-20240229-v1:0:28k",
        ),
    ],
)
def test_normalize_model_id(raw: str, key: str) -> None:
    assert normalize_model_id(raw) == key
