"""Converters between Messages and the Converse, Anthropic and OpenAI wire formats."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.models import (
    CachePointBlock,
    DocumentBlock,
    ImageBlock,
    JsonBlock,
    Message,
    ReasoningBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
)
from tiermem.models.convert import (
    from_anthropic,
    from_anthropic_system,
    from_converse,
    from_converse_system,
    from_openai,
    split_openai_system,
    to_anthropic,
    to_anthropic_system,
    to_converse,
    to_converse_system,
    to_openai,
)

# ---------------------------------------------------------------- strategies

texts = st.text(max_size=30)
ids = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
image_formats = st.sampled_from(["png", "jpeg", "gif", "webp"])
text_blocks = st.builds(TextBlock, text=texts)
inline_images = st.builds(ImageBlock, format=image_formats, data=st.binary(max_size=24))
tool_uses = st.builds(
    ToolUseBlock, tool_use_id=ids, name=ids, input=st.dictionaries(texts, json_values, max_size=3)
)
pdfs = st.builds(DocumentBlock, format=st.just("pdf"), name=ids, data=st.binary(max_size=24))
thinking = st.builds(ReasoningBlock, text=texts, signature=st.none() | ids)
redacted = st.builds(ReasoningBlock, redacted=st.binary(min_size=1, max_size=24))


def results(content: st.SearchStrategy[Any], statuses: list[str]) -> st.SearchStrategy[Any]:
    return st.builds(
        ToolResultBlock,
        tool_use_id=ids,
        content=st.lists(content, max_size=3).map(tuple),
        status=st.sampled_from(statuses),
    )


def with_cache_points(blocks: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    """Blocks, some followed by a cache point (never two in a row, never first)."""
    pairs = st.lists(st.tuples(blocks, st.booleans()), min_size=1, max_size=4)
    return pairs.map(
        lambda ps: tuple(
            x for b, cached in ps for x in ((b, CachePointBlock()) if cached else (b,))
        )
    )


def conversations(
    user: st.SearchStrategy[tuple[Any, ...]], assistant: st.SearchStrategy[tuple[Any, ...]]
) -> st.SearchStrategy[list[Message]]:
    """Alternating user/assistant messages, as every provider requires."""
    turn = st.tuples(user, assistant).map(
        lambda ua: [Message(role="user", content=ua[0]), Message(role="assistant", content=ua[1])]
    )
    return st.lists(turn, min_size=1, max_size=3).map(lambda ts: [m for t in ts for m in t])


s3_images = st.builds(lambda f, k: ImageBlock(format=f, uri=f"s3://bucket/{k}"), image_formats, ids)
converse_documents = st.builds(
    DocumentBlock,
    format=st.sampled_from(["pdf", "csv", "doc", "docx", "xls", "xlsx", "html", "txt", "md"]),
    name=ids,
    data=st.binary(max_size=24),
) | st.builds(lambda k: DocumentBlock(format="pdf", name=k, uri=f"s3://bucket/{k}.pdf"), ids)
converse_media = inline_images | s3_images | converse_documents
converse_unknown = st.builds(
    lambda t: UnknownBlock(kind="converse", data={"guardContent": {"text": {"text": t}}}), texts
)
converse_user = st.lists(
    text_blocks
    | converse_media
    | results(
        text_blocks | st.builds(JsonBlock, json=json_values) | converse_media, ["success", "error"]
    )
    | st.just(CachePointBlock())
    | converse_unknown,
    min_size=1,
    max_size=5,
).map(tuple)
converse_assistant = st.lists(
    text_blocks | tool_uses | thinking | redacted | st.just(CachePointBlock()) | converse_unknown,
    min_size=1,
    max_size=5,
).map(tuple)

anthropic_text_documents = st.builds(
    lambda n, t: DocumentBlock(format="txt", name=n, data=t.encode()), ids, texts
)
anthropic_url_pdfs = st.builds(
    lambda k: DocumentBlock(format="pdf", name=k, uri=f"https://example.com/{k}.pdf"), ids
)
anthropic_media = inline_images | pdfs | anthropic_text_documents | anthropic_url_pdfs
anthropic_user = with_cache_points(
    text_blocks
    | anthropic_media
    | results(text_blocks | inline_images | pdfs | anthropic_text_documents, ["success", "error"])
    | st.builds(
        lambda t: UnknownBlock(kind="anthropic", data={"type": "search_result", "title": t}), texts
    )
)
anthropic_assistant = with_cache_points(
    text_blocks
    | tool_uses
    | thinking
    | redacted
    | st.builds(
        lambda i: UnknownBlock(
            kind="anthropic",
            data={"type": "server_tool_use", "id": i, "name": "web_search", "input": {}},
        ),
        ids,
    )
)

openai_user = (
    st.tuples(
        st.lists(
            results(st.builds(TextBlock, text=st.text(min_size=1, max_size=20)), ["success"]),
            max_size=3,
        ),
        st.lists(
            text_blocks
            | inline_images
            | pdfs
            | st.builds(
                lambda d: UnknownBlock(
                    kind="openai",
                    data={"type": "input_audio", "input_audio": {"data": d, "format": "wav"}},
                ),
                ids,
            ),
            max_size=3,
        ),
    )
    .filter(lambda rp: bool(rp[0] or rp[1]))
    .map(lambda rp: (*rp[0], *rp[1]))
)
openai_assistant = (
    st.tuples(
        st.lists(
            text_blocks
            | st.builds(
                lambda t: UnknownBlock(kind="openai", data={"type": "refusal", "refusal": t}), texts
            ),
            max_size=3,
        ),
        st.lists(
            tool_uses
            | st.builds(
                lambda i: UnknownBlock(
                    kind="openai",
                    data={"id": i, "type": "custom", "custom": {"name": "grep", "input": "x"}},
                ),
                ids,
            ),
            max_size=3,
        ),
    )
    .filter(lambda pc: bool(pc[0] or pc[1]))
    .map(lambda pc: (*pc[0], *pc[1]))
)


def over_json(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a JSON wire format delivers: proves the output is plain JSON (bytes as base64)."""
    loaded: list[dict[str, Any]] = json.loads(json.dumps(raw))
    return loaded


# ---------------------------------------------------------------- round trips


@given(conversations(converse_user, converse_assistant))
def test_converse_round_trip(messages: list[Message]) -> None:
    assert from_converse(to_converse(messages)) == messages


@given(conversations(anthropic_user, anthropic_assistant))
def test_anthropic_round_trip_through_json(messages: list[Message]) -> None:
    assert from_anthropic(over_json(to_anthropic(messages))) == messages


@given(conversations(openai_user, openai_assistant))
def test_openai_round_trip_through_json(messages: list[Message]) -> None:
    assert from_openai(over_json(to_openai(messages))) == messages


# ---------------------------------------------------------------- Converse


def test_converse_keeps_raw_bytes_and_s3_references() -> None:
    message = Message(
        role="user",
        content=(
            ImageBlock(format="png", data=b"\x89PNG"),
            DocumentBlock(format="pdf", name="terms", uri="s3://bucket/terms.pdf"),
        ),
    )
    assert to_converse([message])[0]["content"] == [
        {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}},
        {
            "document": {
                "format": "pdf",
                "name": "terms",
                "source": {"s3Location": {"uri": "s3://bucket/terms.pdf"}},
            }
        },
    ]


def test_converse_rejects_base64_text_where_bytes_belong() -> None:
    raw = [
        {"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": "iVBORw=="}}}]}
    ]
    with pytest.raises(ValidationError, match=r"converse message 0 block 0.*raw bytes"):
        from_converse(raw)


def test_converse_rejects_http_image_uri() -> None:
    message = Message(role="user", content=(ImageBlock(format="png", uri="https://x.test/a.png"),))
    with pytest.raises(ValidationError, match=r"message 0 block 0.*s3://"):
        to_converse([message])


def test_converse_tool_result_it_cannot_hold_is_kept_whole() -> None:
    block = {"toolResult": {"toolUseId": "t1", "content": [{"video": {"format": "mp4"}}]}}
    [message] = from_converse([{"role": "user", "content": [block]}])
    assert message.content == (UnknownBlock(kind="converse", data=block),)
    assert to_converse([message])[0]["content"] == [block]


def test_converse_system_round_trip_keeps_guard_content() -> None:
    raw = [
        {"text": "You are a shop assistant."},
        {"cachePoint": {"type": "default"}},
        {"guardContent": {"text": {"text": "x"}}},
    ]
    system = from_converse_system(raw)
    assert system[:2] == (TextBlock(text="You are a shop assistant."), CachePointBlock())
    assert isinstance(system[2], UnknownBlock)
    assert to_converse_system(system) == raw


def test_redacted_reasoning_moves_from_converse_bytes_to_anthropic_base64() -> None:
    messages = from_converse(
        [{"role": "assistant", "content": [{"reasoningContent": {"redactedContent": b"abc"}}]}]
    )
    assert to_anthropic(messages)[0]["content"] == [{"type": "redacted_thinking", "data": "YWJj"}]


# ---------------------------------------------------------------- Anthropic


def test_anthropic_cache_point_marks_the_block_before_it() -> None:
    message = Message(
        role="user", content=(TextBlock(text="a"), CachePointBlock(), TextBlock(text="b"))
    )
    assert to_anthropic([message])[0]["content"] == [
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "b"},
    ]


def test_anthropic_cache_point_with_nothing_before_it_is_rejected() -> None:
    message = Message(role="user", content=(CachePointBlock(), TextBlock(text="a")))
    with pytest.raises(ValidationError, match="message 0 block 0"):
        to_anthropic([message])


def test_anthropic_image_is_base64_with_media_type() -> None:
    message = Message(role="user", content=(ImageBlock(format="jpeg", data=b"\xff\xd8"),))
    assert to_anthropic([message])[0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9g="}}
    ]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://cdn.test/a.PNG", "png"),
        ("https://cdn.test/a.webp?x=1", "webp"),
        ("https://cdn.test/img", "jpeg"),
    ],
)
def test_anthropic_url_image_format_comes_from_the_extension(url: str, expected: str) -> None:
    raw = [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}]}]
    assert from_anthropic(raw)[0].content == (ImageBlock(format=expected, uri=url),)  # type: ignore[arg-type]


def test_anthropic_reads_string_content_and_error_results() -> None:
    raw = [
        {"role": "user", "content": "hi"},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True}
            ],
        },
    ]
    assert from_anthropic(raw) == [
        Message.text("user", "hi"),
        Message(
            role="user",
            content=(
                ToolResultBlock(
                    tool_use_id="t1", content=(TextBlock(text="boom"),), status="error"
                ),
            ),
        ),
    ]


def test_anthropic_json_tool_result_becomes_json_text() -> None:
    message = Message(
        role="user",
        content=(ToolResultBlock(tool_use_id="t1", content=(JsonBlock(json={"n": 1}),)),),
    )
    [result] = to_anthropic([message])[0]["content"]
    assert result["content"] == [{"type": "text", "text": '{"n": 1}'}]


def test_anthropic_rejects_office_documents() -> None:
    message = Message(role="user", content=(DocumentBlock(format="docx", name="a", data=b"PK"),))
    with pytest.raises(ValidationError, match="docx"):
        to_anthropic([message])


def test_anthropic_system_from_string_and_back_with_cache_mark() -> None:
    assert from_anthropic_system("Be brief.") == (TextBlock(text="Be brief."),)
    system = (TextBlock(text="policy"), CachePointBlock())
    raw = to_anthropic_system(system)
    assert raw == [{"type": "text", "text": "policy", "cache_control": {"type": "ephemeral"}}]
    assert from_anthropic_system(raw) == system


# ---------------------------------------------------------------- OpenAI


def test_openai_splits_tool_results_into_tool_messages_then_user_text() -> None:
    message = Message(
        role="user",
        content=(
            ToolResultBlock(tool_use_id="c1", content=(TextBlock(text="3 in stock"),)),
            ToolResultBlock(tool_use_id="c2", content=(JsonBlock(json={"price": 480}),)),
            TextBlock(text="and the next volume?"),
        ),
    )
    raw = to_openai([message])
    assert raw == [
        {"role": "tool", "tool_call_id": "c1", "content": "3 in stock"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"price": 480}'},
        {"role": "user", "content": "and the next volume?"},
    ]
    [back] = from_openai(raw)
    assert [b.type for b in back.content] == ["tool_result", "tool_result", "text"]


def test_openai_groups_consecutive_tool_messages_before_an_assistant_message() -> None:
    raw = [
        {"role": "user", "content": "stock?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "stock", "arguments": '{"sku": "A"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "stock", "arguments": '{"sku": "B"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "0"}]},
        {"role": "assistant", "content": "A has 3, B none."},
    ]
    messages = from_openai(raw)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1].content[0] == ToolUseBlock(
        tool_use_id="c1", name="stock", input={"sku": "A"}
    )
    assert messages[2].content == (
        ToolResultBlock(tool_use_id="c1", content=(TextBlock(text="3"),)),
        ToolResultBlock(tool_use_id="c2", content=(TextBlock(text="0"),)),
    )


def test_openai_drops_reasoning_and_cache_points_without_error() -> None:
    messages = [
        Message(role="user", content=(TextBlock(text="q"), CachePointBlock())),
        Message(
            role="assistant",
            content=(ReasoningBlock(text="hmm", signature="s"), TextBlock(text="a")),
        ),
    ]
    raw = to_openai(messages)
    assert raw == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert from_openai(raw) == [Message.text("user", "q"), Message.text("assistant", "a")]


def test_openai_image_is_a_data_url() -> None:
    message = Message(
        role="user", content=(TextBlock(text="this one"), ImageBlock(format="png", data=b"\x89P"))
    )
    assert to_openai([message])[0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,iVA="},
    }


def test_openai_rejects_an_image_in_a_tool_result() -> None:
    block = ToolResultBlock(tool_use_id="c1", content=(ImageBlock(format="png", data=b"x"),))
    with pytest.raises(ValidationError, match=r"message 0 block 0 content 0.*text only"):
        to_openai([Message(role="user", content=(block,))])


def test_openai_system_prompt_goes_first_and_splits_back_out() -> None:
    raw = to_openai(
        [Message.text("user", "hi")], system=(TextBlock(text="Be kind."), CachePointBlock())
    )
    assert raw[0] == {"role": "system", "content": "Be kind."}
    with pytest.raises(ValidationError, match=r"message 0.*split_openai_system"):
        from_openai(raw)
    system, rest = split_openai_system(raw)
    assert system == (TextBlock(text="Be kind."),)
    assert from_openai(rest) == [Message.text("user", "hi")]


def test_openai_invalid_tool_arguments_are_reported_with_location() -> None:
    raw = [
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
            ],
        }
    ]
    with pytest.raises(ValidationError, match=r"openai message 0 tool_call 0.*not valid JSON"):
        from_openai(raw)


# ---------------------------------------------------------------- shared rules


CONVERTERS = [
    pytest.param(to_converse, from_converse, "converse", id="converse"),
    pytest.param(to_anthropic, from_anthropic, "anthropic", id="anthropic"),
    pytest.param(to_openai, from_openai, "openai", id="openai"),
]


@pytest.mark.parametrize(("to_fmt", "from_fmt", "fmt"), CONVERTERS)
def test_unknown_block_of_another_format_is_rejected(to_fmt: Any, from_fmt: Any, fmt: str) -> None:
    other = "anthropic" if fmt != "anthropic" else "openai"
    message = Message(role="user", content=(UnknownBlock(kind=other, data={"type": "x"}),))
    with pytest.raises(ValidationError, match=rf"message 0 block 0.*kind '{other}'.*{fmt}"):
        to_fmt([message])


@pytest.mark.parametrize(("to_fmt", "from_fmt", "fmt"), CONVERTERS)
def test_unknown_block_of_the_same_format_passes_through(
    to_fmt: Any, from_fmt: Any, fmt: str
) -> None:
    data = {"type": "future_block", "payload": {"n": [1, 2]}}
    raw = to_fmt(
        [Message(role="user", content=(TextBlock(text="a"), UnknownBlock(kind=fmt, data=data)))]
    )
    assert data in raw[-1]["content"]
    assert from_fmt(raw)[0].content[1] == UnknownBlock(kind=fmt, data=data)


@pytest.mark.parametrize(("to_fmt", "from_fmt", "fmt"), CONVERTERS)
def test_tool_use_in_a_user_message_is_rejected(to_fmt: Any, from_fmt: Any, fmt: str) -> None:
    message = Message(role="user", content=(ToolUseBlock(tool_use_id="t", name="f"),))
    with pytest.raises(ValidationError, match="assistant message"):
        to_fmt([message])


@pytest.mark.parametrize(
    ("from_fmt", "raw", "where"),
    [
        (from_converse, [{"content": []}], r"converse message 0: missing key 'role'"),
        (
            from_converse,
            [{"role": "user", "content": []}, {"role": "system", "content": []}],
            r"converse message 1: role 'system'",
        ),
        (
            from_converse,
            [{"role": "user", "content": [{"text": "a"}, {"toolResult": {"content": []}}]}],
            r"converse message 0 block 1: missing key 'toolUseId'",
        ),
        (
            from_converse,
            [{"role": "user", "content": "hi"}],
            r"converse message 0 blocks: expected a list",
        ),
        (
            from_anthropic,
            [{"role": "user", "content": [{"text": "no type"}]}],
            r"anthropic message 0 block 0: missing key 'type'",
        ),
        (
            from_anthropic,
            [
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/bmp", "data": ""},
                        }
                    ],
                }
            ],
            r"anthropic message 0 block 0: unsupported image media type",
        ),
        (
            from_anthropic,
            [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            r"anthropic message 0 block 0: invalid TextBlock",
        ),
        (
            from_openai,
            [{"role": "tool", "content": "x"}],
            r"openai message 0: missing key 'tool_call_id'",
        ),
        (from_openai, [{"role": "function", "content": "x"}], r"openai message 0: role 'function'"),
        (
            from_openai,
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "data:image/png,raw"}}],
                }
            ],
            r"openai message 0 part 0: expected a base64 data URL",
        ),
        (from_openai, {"role": "user"}, r"openai messages: expected a list"),
    ],
)
def test_invalid_input_names_what_and_where(from_fmt: Any, raw: Any, where: str) -> None:
    with pytest.raises(ValidationError, match=where):
        from_fmt(raw)
