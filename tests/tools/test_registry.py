"""Tool specs and the registry: validation at the edge, fallbacks that always resolve, and
the function invoker."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.tools.support import ScriptedInvoker
from tiermem.errors import NotFoundError, ValidationError
from tiermem.tools import BreakerPolicy, FunctionInvoker, ToolOutput, ToolRegistry, ToolSpec

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def test_spec_defaults() -> None:
    spec = ToolSpec("search", "Search the catalog", SCHEMA)
    assert spec.timeout == timedelta(seconds=2)
    assert spec.policy.failure_threshold == 5
    assert spec.policy.probe_lease == timedelta(seconds=30)
    assert spec.manifest() == {
        "name": "search",
        "description": "Search the catalog",
        "input_schema": SCHEMA,
    }


def test_default_probe_lease_outlasts_a_long_timeout() -> None:
    spec = ToolSpec("report", timeout=timedelta(seconds=40))
    assert spec.policy.probe_lease == timedelta(seconds=80)


def test_spec_keeps_its_own_copy_of_the_schema() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    spec = ToolSpec("search", input_schema=schema)
    schema["properties"]["q"]["type"] = "integer"
    assert spec.input_schema["properties"]["q"]["type"] == "string"  # type: ignore[index]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": ""}, "tool name must not be empty"),
        ({"name": "a\nb"}, "control character"),
        ({"input_schema": {"type": "string"}}, "must describe an object"),
        ({"input_schema": ["q"]}, "must be a JSON Schema object"),
        ({"input_schema": {"type": "object", "default": object()}}, "is not JSON"),
        ({"fallbacks": ("search",)}, "lists itself"),
        ({"fallbacks": ("a", "a")}, "lists a fallback twice"),
        ({"timeout": timedelta(0)}, "positive timedelta"),
        (
            {
                "timeout": timedelta(seconds=5),
                "breaker": BreakerPolicy(probe_lease=timedelta(seconds=5)),
            },
            "must outlast its timeout",
        ),
    ],
)
def test_bad_specs_are_rejected(options: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"name": "search", **options}
    with pytest.raises(ValidationError, match=message):
        ToolSpec(**fields)  # type: ignore[arg-type]


def test_registry_resolves_fallbacks_registered_first() -> None:
    invoker = ScriptedInvoker()
    registry = ToolRegistry()
    with pytest.raises(ValidationError, match="register fallbacks before"):
        registry.register(ToolSpec("search", fallbacks=("cache",)), invoker)
    registry.register(ToolSpec("cache"), invoker)
    registry.register(ToolSpec("search", fallbacks=("cache",)), invoker)
    with pytest.raises(ValidationError, match="already registered"):
        registry.register(ToolSpec("cache"), invoker)
    assert [spec.name for spec in registry] == ["cache", "search"]
    assert "search" in registry
    assert len(registry) == 2
    assert [tool["name"] for tool in registry.manifest()] == ["cache", "search"]
    with pytest.raises(NotFoundError, match="registered tools: \\['cache', 'search'\\]"):
        registry.get("orders")


async def test_function_invoker_turns_results_into_output() -> None:
    async def text(arguments: object, emit: object) -> str:
        return "plain"

    async def data(arguments: object, emit: object) -> dict[str, object]:
        return {"hits": 2}

    async def listing(arguments: object, emit: object) -> list[int]:
        return [1, 2]

    async def output(arguments: object, emit: object) -> ToolOutput:
        return ToolOutput.of_text("no", is_error=True)

    invoker = FunctionInvoker({"text": text, "data": data, "listing": listing, "output": output})

    async def run(tool: str) -> ToolOutput:
        return await invoker.invoke(tool, {}, request_id="r", emit=lambda _: None)

    assert (await run("text")).text == "plain"
    assert (await run("data")).structured == {"hits": 2}
    assert (await run("data")).text == '{"hits": 2}'
    assert (await run("listing")).structured == {"result": [1, 2]}
    assert (await run("output")).is_error
    with pytest.raises(NotFoundError, match="no function for tool 'other'"):
        await run("other")


def test_register_all_puts_fallbacks_first() -> None:
    invoker = ScriptedInvoker()
    registry = ToolRegistry()
    registry.register(ToolSpec("local_cache"), invoker)
    registry.register_all(
        [
            ToolSpec("search", fallbacks=("mirror", "local_cache")),
            ToolSpec("mirror", fallbacks=("local_cache",)),
        ],
        invoker,
    )
    assert [spec.name for spec in registry] == ["local_cache", "mirror", "search"]


@pytest.mark.parametrize(
    "specs",
    [
        [ToolSpec("search", fallbacks=("nowhere",))],
        [ToolSpec("a", fallbacks=("b",)), ToolSpec("b", fallbacks=("a",))],
        [ToolSpec("taken")],
    ],
    ids=["unknown", "cycle", "duplicate"],
)
def test_register_all_registers_nothing_on_error(specs: list[ToolSpec]) -> None:
    registry = ToolRegistry()
    registry.register(ToolSpec("taken"), ScriptedInvoker())
    with pytest.raises(ValidationError):
        registry.register_all([ToolSpec("fine"), *specs], ScriptedInvoker())
    assert [spec.name for spec in registry] == ["taken"]
