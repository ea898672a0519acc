"""Tolerant parsing of a model's JSON reply and the top-level shape check.

Pure functions: tables of the replies real models give (fences, prose, trailing commas,
cut-off output, echoed schemas) and hypothesis for "any object survives being wrapped".
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from tiermem.llm.chat_json import ReplyParseError, check_reply_shape, parse_json_object

OBJECT = {"facts": [{"key": "budget", "value": "3000 yen"}], "note": "a {brace} inside"}
TEXT = json.dumps(OBJECT)


@pytest.mark.parametrize(
    "reply",
    [
        TEXT,
        f"  \n{TEXT}\n",
        f"```json\n{TEXT}\n```",
        f"```JSON\n{TEXT}```",
        f"```\n{TEXT}\n```",
        f"Here is the summary you asked for:\n```json\n{TEXT}\n```\nLet me know!",
        f"Sure! {TEXT} Hope this helps.",
        f"I'll use {{name}} placeholders. Result: {TEXT}",
        f"{TEXT}\n\nThe object above is {TEXT}",  # the same object twice counts once
        json.dumps(OBJECT, indent=2).replace("]\n", "],\n").replace('"}', '",}'),
        '{"facts": [{"key": "budget", "value": "3000 yen",},], "note": "a {brace} inside",}',
        f"Prose with a fence that is not JSON ```python\nx = 1\n``` and then {TEXT}",
    ],
)
def test_finds_the_one_object(reply: str) -> None:
    assert parse_json_object(reply) == OBJECT


def test_commas_inside_strings_are_kept() -> None:
    assert parse_json_object('{"a": "x, }", "b": [1, 2,],}') == {"a": "x, }", "b": [1, 2]}


def test_an_empty_result_is_a_result_not_an_error() -> None:
    assert parse_json_object('```json\n{"facts": []}\n```') == {"facts": []}
    assert parse_json_object("{}") == {}


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("I could not find anything.", "no JSON object"),
        ("[1, 2, 3]", "list, not an object"),
        ('"just a string"', "str, not an object"),
        ('```json\n[{"a": 1}]\n```', "list, not an object"),
        ('{"facts": [{"key": "budget", "value": "30', "cut off"),
        ('Here: {"a": 1} or maybe {"a": 2}', "2 different JSON objects"),
        ("{not json at all}", "cut off, or not valid JSON"),
    ],
)
def test_rejects_replies_without_one_usable_object(reply: str, reason: str) -> None:
    with pytest.raises(ReplyParseError, match=reason):
        parse_json_object(reply)


def test_backticks_inside_a_json_string_do_not_end_the_fence() -> None:
    obj = {"nested": {"b": 1}, "code": "```python\nprint(1)\n```"}
    assert parse_json_object(f"Result:\n```json\n{json.dumps(obj)}\n```") == obj


def test_a_fenced_object_wins_over_prose_objects_outside_the_fence() -> None:
    reply = 'The schema was {"type": "object"}.\n```json\n{"facts": []}\n```'
    assert parse_json_object(reply) == {"facts": []}


# ------------------------------------------------------------------------ hypothesis

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=5)
# Prose that a model puts around its answer; no braces or backticks, which would be JSON-ish.
prose = st.text(st.characters(exclude_characters="{}`[]"), max_size=40)


def dumps_with_trailing_commas(value: Any) -> str:
    """JSON with a comma after the last member of every non-empty object and array."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        members = [f"{json.dumps(k)}: {dumps_with_trailing_commas(v)}" for k, v in value.items()]
        return "{" + ", ".join(members) + ",}"
    if isinstance(value, list):
        if not value:
            return "[]"
        return "[" + ", ".join(dumps_with_trailing_commas(v) for v in value) + ",]"
    return json.dumps(value)


@given(json_objects, prose, prose, st.booleans(), st.booleans(), st.booleans())
@example({}, '"', '"', False, False, False)  # found by hypothesis
@example({}, "(", ")", False, False, False)
def test_any_object_survives_fences_prose_indentation_and_trailing_commas(
    obj: dict[str, Any], before: str, after: str, fenced: bool, indented: bool, commas: bool
) -> None:
    body = (
        dumps_with_trailing_commas(obj)
        if commas
        else json.dumps(obj, indent=2 if indented else None, ensure_ascii=indented)
    )
    if fenced:
        body = f"```json\n{body}\n```"
    reply = f"{before}{body}{after}"
    # A '"' of prose on each side of "{}" makes the whole reply one JSON string ('"{}"'):
    # a scalar, which the parser refuses by design (see the "just a string" case above).
    assume(not isinstance(_json_or_none(reply.strip()), str))
    assert parse_json_object(reply) == obj


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


@given(st.lists(json_values, max_size=4))
def test_a_top_level_array_is_never_taken_for_an_object(items: list[Any]) -> None:
    with pytest.raises(ReplyParseError):
        parse_json_object(json.dumps(items))


# ----------------------------------------------------------------------- shape check

SCHEMA = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "facts": {"type": "array"},
        "count": {"type": "integer"},
        "score": {"type": ["number", "null"]},
        "extra": {"type": "customtype"},
    },
    "required": ["summary", "facts"],
}


@pytest.mark.parametrize(
    "data",
    [
        {"summary": "", "facts": []},
        {"summary": "s", "facts": [1], "count": 3, "score": None},
        {"summary": "s", "facts": [], "count": 3.0, "score": 0.5, "extra": {"x": 1}},
        {"summary": "s", "facts": [], "unknown": True},
    ],
)
def test_shape_check_accepts_conforming_objects(data: dict[str, Any]) -> None:
    check_reply_shape(data, SCHEMA)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"facts": []}, r"lacks required properties \['summary'\]"),
        ({"summary": "s", "facts": "none"}, "'facts' is a str"),
        ({"summary": "s", "facts": [], "count": True}, "'count' is a bool"),
        ({"summary": "s", "facts": [], "count": 1.5}, "'count' is a float"),
        ({"summary": "s", "facts": [], "score": "high"}, "'score' is a str"),
        (SCHEMA, "lacks required properties"),  # an echoed schema is not an answer
    ],
)
def test_shape_check_rejects_wrong_objects(data: dict[str, Any], reason: str) -> None:
    with pytest.raises(ReplyParseError, match=reason):
        check_reply_shape(data, SCHEMA)


@given(st.text(st.sampled_from('{}[]",:`ab1 \n\\')) | st.text())
def test_any_text_gives_an_object_or_a_parse_error(text: str) -> None:
    try:
        result = parse_json_object(text)
    except ReplyParseError:
        return
    assert isinstance(result, dict)
