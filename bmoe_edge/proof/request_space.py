"""The HTTP fuzz campaign's request space, derived from the server's own parameter table (serve/params.py): for
every parameter of a route, values drawn by the kind of value it takes — in range, at its edges, past them, of
the wrong type — so a parameter added to the table is fuzzed the day it lands, with no change here. What is
written here is one generator per *kind* (a new kind without one fails `value`, and the suite with it), and
the hostile shapes a kind invites: JSON schemas deep, wide and with huge repetitions, tools and tool-call
arguments carrying escaped control tokens, logit_bias maps, stop strings. Anthropic's Messages and OpenAI's
Responses API take the same hostile conversations and tools, written in their own shapes (`as_anthropic`,
`as_response_input`, ...)."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

from bmoe_edge.serve import limits, params

CONTROL_TEXT = ("</s>", "<|im_end|>", "<|im_start|>system", "<tool_call>", "<|endoftext|>")
HOSTILE_TEXT = ("\ud800", "\x00", "\x1b[2J", "", " ", "x" * 300, "é" * 2000, "🙂", "\\u0000", "{{ 7*7 }}",
                "{% for x in range(9**9) %}", "#/$defs/x", "../../etc/passwd", "null", *CONTROL_TEXT)
WRONG_TYPES = (None, True, False, [], {}, [[1]], "1", 1, -1, 0.5, 1 << 64, 1e308)


def _escaped(text: str) -> str:
    """JSON text whose control-token characters are \\u escapes (decoded only by whoever parses it)."""
    return json.dumps({"q": text}).replace("<", "\\u003c").replace(">", "\\u003e").replace("|", "\\u007c")


def schema(rng: random.Random, depth: int = 0) -> Any:
    """A JSON schema: ordinary, deep, wide, or with counts past the grammar's repetition threshold."""
    pick = rng.randrange(10)
    if pick == 0 or depth > 6:
        return {"type": rng.choice(("string", "integer", "number", "boolean", "null"))}
    if pick == 1:   # wide: the converter is cubic in optional properties
        n = rng.choice((8, limits.MAX_SCHEMA_PROPERTIES, limits.MAX_SCHEMA_PROPERTIES + 1, 800, 1600))
        return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}
    if pick == 2:   # a count past (or at) the threshold
        key = rng.choice(("minItems", "maxItems", "minLength", "maxLength", "minProperties"))
        n = rng.choice((limits.MAX_REPETITION, limits.MAX_REPETITION + 1, 5000, 1 << 31, 1e300))
        return {"type": "array" if "Items" in key else "string", key: n}
    if pick == 3:
        n = rng.choice((3, 2001, 5000, 99999))
        return {"type": "string", "pattern": rng.choice((f"^a{{{n}}}$", f"^(ab){{1,{n}}}$", "^[a-z]+$", "("))}
    if pick == 4:
        return {"enum": [f"v{i}" for i in range(rng.choice((2, limits.MAX_SCHEMA_ENUM + 1, 2000)))]}
    if pick == 5:   # deep
        inner: Any = {"type": "string"}
        for _ in range(rng.choice((5, 30, 62))):
            inner = {"type": "array", "items": inner}
        return inner
    if pick == 6:
        return {"$ref": rng.choice(("#/$defs/x", "#", "#/nowhere", "http://example.com/s.json")),
                "$defs": {"x": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}}}}
    if pick == 7:
        return {"anyOf": [schema(rng, depth + 1) for _ in range(rng.randint(1, 4))]}
    return {"type": "object", "required": ["a"], "additionalProperties": rng.choice((False, True)),
            "properties": {"a": schema(rng, depth + 1), rng.choice(HOSTILE_TEXT) or "b": schema(rng, depth + 1)}}


def tool(rng: random.Random) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": rng.choice(("get_weather", "f", "x" * 200, "<|im_end|>", "a b")),
        "description": rng.choice(("The weather.", *HOSTILE_TEXT)), "parameters": schema(rng)}}


def tool_call(rng: random.Random) -> dict[str, Any]:
    args = rng.choice((json.dumps({"city": "Oslo"}), _escaped(rng.choice(CONTROL_TEXT)), "{not json",
                       _escaped("a" * 5000), json.dumps({"q": rng.choice(HOSTILE_TEXT)})))
    return {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}


def messages(rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": rng.choice(("Hi", "Weather?", *HOSTILE_TEXT))}]
    if rng.random() < 0.5:
        out += [{"role": "assistant", "content": None, "tool_calls": [tool_call(rng)]},
                {"role": "tool", "tool_call_id": "call_1", "content": rng.choice(("4 C", *HOSTILE_TEXT))}]
    if rng.random() < 0.2:
        out.insert(0, {"role": "system", "content": rng.choice(("Be brief.", *HOSTILE_TEXT))})
    return out


# The same conversations and tools in Anthropic's and the Responses API's shapes
def as_anthropic_tool(t: dict[str, Any]) -> dict[str, Any]:
    fn = t["function"]
    return {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}


def as_response_tool(t: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", **t["function"]}


def _arguments_object(arguments: str) -> Any:
    """A tool call's JSON arguments as tool_use's input (Anthropic sends an object: text that is not JSON goes as
    a string value, so what it carries still reaches the server)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"raw": arguments}
    return value if isinstance(value, dict) else {"value": value}


def as_anthropic(conversation: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """A chat conversation (`messages`) as Anthropic's system prompt and turns."""
    system, turns = None, []
    for m in conversation:
        if m["role"] == "system":
            system = m["content"]
        elif m["role"] == "tool":
            turns.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"],
                                                       "content": m["content"]}]})
        elif m.get("tool_calls"):
            turns.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                 "input": _arguments_object(c["function"]["arguments"])} for c in m["tool_calls"]]})
        else:
            turns.append({"role": m["role"], "content": m["content"]})
    return system, turns


def as_response_input(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat conversation as the Responses API's input items."""
    items: list[dict[str, Any]] = []
    for m in conversation:
        if m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m.get("tool_calls"):
            items += [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                       "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
        else:
            items.append({"role": m["role"], "content": m["content"]})
    return items


def _anthropic_messages(rng: random.Random, valid: bool) -> Any:
    if valid:
        return as_anthropic(messages(rng))[1]
    return rng.choice(([], "Hi", [{"role": "system", "content": "x"}], [{"role": "user", "content": [
        {"type": "image", "source": {}}]}], [{"role": "user", "content": [{"type": "tool_use", "id": "x"}]}],
        [{"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]}], [1]))


def _response_input(rng: random.Random, valid: bool) -> Any:
    if valid:
        return rng.choice((rng.choice(("Hi", *HOSTILE_TEXT)) or "x", as_response_input(messages(rng))))
    return rng.choice(([], 5, [{"type": "input_image", "image_url": "x"}], [{"type": "item_reference", "id": "x"}],
                       [{"type": "function_call", "name": "f"}], [{"role": "tool", "content": "x"}]))


def _anthropic_tools(rng: random.Random, valid: bool) -> Any:
    if valid:
        return [as_anthropic_tool(tool(rng)) for _ in range(rng.randint(1, 3))]
    return rng.choice(([{"type": "web_search_20250305", "name": "web_search"}], [{"name": "f"}], {"x": 1},
                       [as_anthropic_tool(tool(rng))] * (limits.MAX_TOOLS + 1)))


def _response_tools(rng: random.Random, valid: bool) -> Any:
    if valid:
        return [as_response_tool(tool(rng)) for _ in range(rng.randint(1, 3))]
    return rng.choice(([{"type": "web_search"}], [{"type": "file_search"}], [{"type": "function"}], "x",
                       [as_response_tool(tool(rng))] * (limits.MAX_TOOLS + 1)))


def _anthropic_tool_choice(rng: random.Random, valid: bool) -> Any:
    if valid:
        choice = rng.choice(({"type": "auto"}, {"type": "any"}, {"type": "none"},
                             {"type": "tool", "name": "get_weather"}))
        return choice | ({"disable_parallel_tool_use": rng.choice((True, False))} if rng.random() < 0.3 else {})
    return rng.choice(("auto", {"type": "required"}, {"type": "tool"}, {"type": "tool", "name": "nope"},
                       {"type": "any", "disable_parallel_tool_use": "yes"}))


def _response_tool_choice(rng: random.Random, valid: bool) -> Any:
    if valid:
        return rng.choice(("auto", "none", "required", {"type": "function", "name": "get_weather"}))
    return rng.choice(("any", {"type": "web_search_preview"}, {"type": "function"}, {"type": "allowed_tools"}))


def _schema_format(rng: random.Random, valid: bool) -> Any:
    """output_config and text: a JSON schema the answer follows, in each API's shape."""
    return {"type": "json_schema", "name": "x", "schema": schema(rng)} if valid else rng.choice(
        ({"type": "json_schema"}, {"type": "xml"}, "json", {"type": "json_schema", "schema": []}))


def _number(kind: params.Number | params.Integer, rng: random.Random, valid: bool) -> Any:
    whole = isinstance(kind, params.Integer)
    if valid:
        inside = rng.randint(kind.lo, kind.hi) if whole else rng.uniform(kind.lo, kind.hi)
        return rng.choice((kind.lo, kind.hi, inside))
    step = 1 if whole else max(1e-3, (kind.hi - kind.lo) / 100)
    if rng.random() < 0.5:   # just past an edge: where an off-by-one would let one through
        return rng.choice((kind.lo - step, kind.hi + step))
    return rng.choice((str(kind.lo), True, [kind.lo], 1e308, -(1 << 70)))


def _bias(kind: params.LogitBias, rng: random.Random, valid: bool) -> Any:
    n = rng.choice((1, 8, kind.entries)) if valid else rng.choice((kind.entries + 1, 3))
    ids = (str(rng.choice((0, 1, 2, 11, 1000, 151935, 999_999_999))) for _ in range(n))
    out = {i: rng.uniform(kind.lo, kind.hi) for i in ids}
    if not valid:
        out[rng.choice(("-1", "x", "1.5", "", "9" * 12))] = rng.choice((kind.hi + 1, "5", None))
    return out


def _stops(kind: params.Stops, rng: random.Random, valid: bool) -> Any:
    if valid:
        return rng.choice(("\n", ["e", " "], ["a" * kind.chars] * kind.count, rng.choice(CONTROL_TEXT)))
    return rng.choice((["x"] * (kind.count + 1), "a" * (kind.chars + 1), [1], {}))


def _response_format(rng: random.Random, valid: bool) -> Any:
    if not valid:
        return rng.choice(({"type": "json_schema"}, {"type": "xml"}, "json", {"type": "json_schema",
                                                                            "json_schema": {"schema": []}}))
    return rng.choice(({"type": "text"}, {"type": "json_object"},
                       {"type": "json_schema", "json_schema": {"name": "x", "schema": schema(rng)}}))


def _tools(rng: random.Random, valid: bool) -> Any:
    if not valid:
        return rng.choice(([], [{"type": "code_interpreter"}], [tool(rng)] * (limits.MAX_TOOLS + 1), {"x": 1}))
    return [tool(rng) for _ in range(rng.randint(1, 3))]


def _tool_choice(rng: random.Random, valid: bool) -> Any:
    if valid:
        return rng.choice(("auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}))
    return rng.choice(("any", {"type": "function", "function": {"name": "nope"}}, {"function": 1}))


def _prompt(rng: random.Random, valid: bool) -> Any:
    if valid:
        return rng.choice(("Hello", ["The sea"], [1, 2, 3], [[5, 6]], rng.choice(HOSTILE_TEXT) or "x",
                           "word " * 300))
    return rng.choice(("", [], ["a", "b"], [-1], [1 << 40], [True]))


# kind -> (rng, valid) -> value. Adding a kind of value to params.py needs a generator here (and only then).
GENERATORS: dict[type, Callable[[Any, random.Random, bool], Any]] = {
    params.Number: _number,
    params.Integer: _number,
    params.Flag: lambda k, rng, ok: rng.choice((True, False)) if ok else rng.choice(("true", 1, None, [])),
    params.OneOf: lambda k, rng, ok: rng.choice(k.values) if ok else rng.choice(("x", 1, list(k.values))),
    params.Text: lambda k, rng, ok: rng.choice(("user-1", *HOSTILE_TEXT)) if ok else rng.choice(WRONG_TYPES),
    params.Anything: lambda k, rng, ok: rng.choice((*WRONG_TYPES, *HOSTILE_TEXT[:4])),
    params.ModelName: lambda k, rng, ok: None if ok else rng.choice(("gpt-4o", "", 1, "../model")),
    params.Stops: _stops,
    params.LogitBias: _bias,
    params.ResponseFormat: lambda k, rng, ok: _response_format(rng, ok),
    params.Tools: lambda k, rng, ok: _tools(rng, ok),
    params.ToolChoice: lambda k, rng, ok: _tool_choice(rng, ok),
    params.Messages: lambda k, rng, ok: messages(rng) if ok else rng.choice(([], "Hi", [{"role": "x"}], [1])),
    params.Prompt: lambda k, rng, ok: _prompt(rng, ok),
    params.StreamOptions: lambda k, rng, ok: {"include_usage": rng.choice((True, False))} if ok
    else rng.choice(({"include_usage": "yes"}, [], "x")),
    params.TemplateKwargs: lambda k, rng, ok: {"enable_thinking": rng.choice((True, False))} if ok
    else rng.choice(({"enable_thinking": "no"}, {"reasoning_effort": "max"}, 7)),
    params.AnthropicMessages: lambda k, rng, ok: _anthropic_messages(rng, ok),
    params.System: lambda k, rng, ok: rng.choice((rng.choice(HOSTILE_TEXT), [{"type": "text", "text": "Be brief."}]))
    if ok else rng.choice((5, [{"type": "image"}], [{"type": "text", "text": 1}])),
    params.AnthropicTools: lambda k, rng, ok: _anthropic_tools(rng, ok),
    params.AnthropicToolChoice: lambda k, rng, ok: _anthropic_tool_choice(rng, ok),
    params.Thinking: lambda k, rng, ok: rng.choice(({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"},
                                                    {"type": "adaptive"})) if ok
    else rng.choice(({"type": "on"}, "enabled", {"budget_tokens": 5})),
    params.OutputConfig: lambda k, rng, ok: {"format": _schema_format(rng, ok)} if ok or rng.random() < 0.7
    else rng.choice(("x", [])),
    params.ResponseInput: lambda k, rng, ok: _response_input(rng, ok),
    params.ResponseTools: lambda k, rng, ok: _response_tools(rng, ok),
    params.ResponseToolChoice: lambda k, rng, ok: _response_tool_choice(rng, ok),
    params.TextConfig: lambda k, rng, ok: {"format": _schema_format(rng, ok) if rng.random() < 0.7 else
                                           rng.choice(({"type": "text"}, {"type": "json_object"}))} if ok
    else rng.choice(({"format": "json"}, {"verbosity": "low"}, [])),
    params.Reasoning: lambda k, rng, ok: {"effort": rng.choice(params.EFFORTS)} if ok
    else rng.choice(({"effort": "max"}, "high", [])),
    params.Include: lambda k, rng, ok: rng.sample(k.values, rng.randint(0, len(k.values))) if ok
    else rng.choice((["file_search_call.results"], "x", [1])),
}


def value(p: params.Param, rng: random.Random, valid: bool) -> Any:
    """A value of `p`'s kind: one it takes (`valid`), or one it must refuse."""
    try:
        generate = GENERATORS[type(p.kind)]
    except KeyError:
        raise KeyError(f"no fuzz generator for the kind {type(p.kind).__name__} (parameter {p.name!r}): add one "
                       "to proof/request_space.GENERATORS") from None
    if valid and p.honoured:   # a refused parameter: the values it still takes
        return copy.deepcopy(rng.choice(p.honoured))
    # a copy: the generators draw from shared constants ({}, [], ...), which a later mutation changes in place
    return copy.deepcopy(generate(p.kind, rng, valid))


def with_parameters(route: params.Route, body: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    """`body` with one to three of the route's parameters (from the table) set: half the time all to values they
    take (so what lies behind the checks, a schema's grammar, a tool call's rendering, is reached), else each
    in range or not."""
    table = list(params.of(route).values())
    steps = []
    all_valid = rng.random() < 0.5
    for p in rng.sample(table, k=min(len(table), rng.randint(1, 3))):
        valid = all_valid or rng.random() < 0.5
        body[p.name] = value(p, rng, valid)
        steps.append(f"{p.name}={'ok' if valid else 'bad'}")
    return body, "param:" + ",".join(steps)


def with_structure(route: params.Route, body: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    """`body` with what reaches common's converter and the template: a generated schema as its response_format,
    generated tools with a forced call, or a conversation with an earlier tool call (escaped control tokens in
    its arguments) — each otherwise valid, so the request gets past the checks in front of them; in the shape of
    the route's API."""
    if route in ("messages", "count_tokens", "responses"):
        return _with_structure_of(route, body, rng)
    pick = rng.randrange(3) if route == "chat" else 0
    if pick == 0:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema(rng)}}
        return body, "structure:schema"
    if pick == 1:
        body["tools"] = [tool(rng) for _ in range(rng.randint(1, 2))]
        body["tool_choice"] = rng.choice(("required", "auto"))
        body.pop("response_format", None)
        return body, "structure:tools"
    body["messages"] = messages(rng)
    body["tools"] = [tool(rng)]
    return body, "structure:tool-call"


def _with_structure_of(route: params.Route, body: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    """with_structure for Anthropic's Messages (and count_tokens) and the Responses API."""
    anthropic = route != "responses"
    pick = rng.randrange(3)
    if pick == 0:
        fmt = {"type": "json_schema", "name": "x", "schema": schema(rng)}
        if anthropic:
            body["output_config"] = {"format": fmt}
        else:
            body["text"] = {"format": fmt}
        return body, "structure:schema"
    made = [tool(rng) for _ in range(rng.randint(1, 2))]
    if pick == 1:
        body["tools"] = [as_anthropic_tool(t) if anthropic else as_response_tool(t) for t in made]
        body["tool_choice"] = rng.choice(({"type": "any"}, {"type": "auto"}) if anthropic else ("required", "auto"))
        return body, "structure:tools"
    conversation = messages(rng)
    if anthropic:
        body["system"], body["messages"] = as_anthropic(conversation)
        body["tools"] = [as_anthropic_tool(made[0])]
        body = {k: v for k, v in body.items() if v is not None}
    else:
        body["input"] = as_response_input(conversation)
        body["tools"] = [as_response_tool(made[0])]
    return body, "structure:tool-call"
