"""Structured output and tools: grammar-constrained sampling (`response_format` json_object/json_schema, a
forced tool call) in the engine's sampler chain with llama.cpp common's grammars, and tool calls rendered
by a model's own template (a gguf carrying Qwen3's real template) and parsed back into OpenAI's
`tool_calls` by common — with the real engine on a tiny random-weight model, and OpenAI's own client
against a real server process. Every other vendored template: test_templates.py."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from bmoe_edge import llama_source
from bmoe_edge.engine import chat
from bmoe_edge.engine.session import Engine, Sampling
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic import tinymoe

from test_serve import Server, start, stop

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer"},
        "color": {"enum": ["red", "green"]},
        "note": {"type": ["string", "null"], "maxLength": 12},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["ok", "n", "color", "tags"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "local"]}}, "required": ["zone"],
    "additionalProperties": False}}}


def follows(value: object) -> bool:
    """`value` follows SCHEMA (checked by hand: the schema is small)."""
    return (isinstance(value, dict) and set(value) <= set(SCHEMA["properties"])
            and {"ok", "n", "color", "tags"} <= set(value) and isinstance(value["ok"], bool)
            and isinstance(value["n"], int) and value["color"] in ("red", "green")
            and (value.get("note") is None or len(value["note"]) <= 12)
            and isinstance(value["tags"], list) and len(value["tags"]) <= 3
            and all(isinstance(t, str) and len(t) <= 8 for t in value["tags"]))


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


@pytest.fixture(scope="module")
def engine(model: Path) -> Iterator[Engine]:
    with Engine(model, StreamConfig(ctx=512, threads=1)) as e:
        yield e


QWEN3_TEMPLATE = llama_source.default_dest(True) / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"


@pytest.fixture(scope="module")
def qwen3_model(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with Qwen3's real chat template (from the pinned llama.cpp source) in its gguf, written
    by the gguf package's own metadata tool."""
    out = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3-template.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(model), str(out),
                    "--chat-template-file", str(QWEN3_TEMPLATE), "--force"], check=True, capture_output=True)
    return out


# ---------------------------------------------------------------------------------------------------
# The grammar and the engine.


@pytest.mark.parametrize("temp, seed", [(0.0, 0), (0.8, 1), (0.8, 2), (1.5, 3)])
def test_schema_output_parses_and_follows_the_schema(engine: Engine, temp: float, seed: int) -> None:
    g = chat.schema_grammar(SCHEMA)
    text = "".join(t.text for t in engine.generate(engine.tokenize("The quick brown fox"), 200,
                                                   Sampling(temp=temp, seed=seed, grammar=g)))
    assert follows(json.loads(text)), text


def test_json_object_answers_that_end_are_json_objects(engine: Engine) -> None:
    ended = 0
    any_object = chat.schema_grammar({"type": "object"})
    for seed in range(6):
        gen_tokens = list(engine.generate(engine.tokenize("Hello"), 64,
                                          Sampling(temp=0.8, seed=seed, grammar=any_object)))
        text = "".join(t.text for t in gen_tokens)
        assert text.startswith("{"), text
        if len(gen_tokens) < 64:       # ended by the model (the grammar allows only the end then)
            ended += 1
            assert isinstance(json.loads(text), dict), text
    assert ended, "no seed closed its object within 64 tokens"


def test_no_grammar_leaves_greedy_unchanged_and_a_bad_grammar_is_one_line(engine: Engine, model: Path) -> None:
    prompt = engine.tokenize("The quick brown fox")
    before = [t.id for t in engine.generate(prompt, 12, Sampling())]
    list(engine.generate(prompt, 8, Sampling(grammar=chat.schema_grammar(SCHEMA))))
    with pytest.raises(BmoeError, match="the grammar does not parse"):
        list(engine.generate(prompt, 4, Sampling(grammar="root ::= nothing-here")))
    assert [t.id for t in engine.generate(prompt, 12, Sampling())] == before
    with Engine(model, StreamConfig(ctx=512, threads=1, stream=False)) as resident:
        assert [t.id for t in resident.generate(prompt, 12, Sampling())] == before


def test_a_lazy_grammar_holds_from_its_trigger_on(engine: Engine) -> None:
    """grammar_triggers: the text before the trigger is the model's own; from it on, the grammar's."""
    prompt = engine.tokenize("The quick brown fox")
    free = [t.text for t in engine.generate(prompt, 8, Sampling())]
    word = free[3].strip()
    assert word
    lazy = Sampling(grammar=f'root ::= "{word}" "!!!"', grammar_triggers=re.escape(word))
    text = "".join(t.text for t in engine.generate(prompt, 20, lazy))
    assert text.startswith("".join(free[:3])) and text.endswith(f"{word}!!!"), (free, text)


def test_schemas_the_old_converter_refused_are_followed(engine: Engine) -> None:
    """common's converter covers more of JSON Schema (patterns, bounds, open objects) than the hand-written
    one did: what it refused by name is now followed."""
    cases = [({"type": "string", "pattern": "^a{2,4}b$"}, lambda v: re.fullmatch("a{2,4}b", v)),
             ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 9}},
               "required": ["a"]}, lambda v: 3 <= v["a"] <= 9)]
    for schema, holds in cases:
        text = "".join(t.text for t in engine.generate(engine.tokenize("Go"), 60,
                                                       Sampling(grammar=chat.schema_grammar(schema))))
        assert holds(json.loads(text)), text


@pytest.mark.parametrize("schema, needle", [
    ({"$ref": "https://example.com/s.json"}, "schema"),
    ({"type": "tuple"}, "schema"),
])
def test_unsupported_schemas_are_refused_in_one_line(schema: dict, needle: str) -> None:
    with pytest.raises(BmoeError, match=needle):
        chat.schema_grammar(schema)


def test_recursive_refs_and_optional_members(engine: Engine) -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
    for seed in range(3):
        sampling = Sampling(temp=0.7, seed=seed, grammar=chat.schema_grammar(tree))
        text = "".join(t.text for t in engine.generate(engine.tokenize("Tree"), 300, sampling))
        try:
            value = json.loads(text)
        except ValueError:
            continue     # cut by max_tokens in a deep tree
        assert isinstance(value["v"], int) and set(value) <= {"v", "kids"}


# ---------------------------------------------------------------------------------------------------
# Tool calls: the template, the parser.


def test_qwen3s_own_template_renders_tools_calls_and_results(engine: Engine) -> None:
    t = chat.template_for(engine, str(QWEN3_TEMPLATE))
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    ]
    text = chat.render(t, messages, chat.Turn(tools=(WEATHER,), think=False)).prompt
    assert text.startswith("<|im_start|>system\n# Tools") and '"get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("cut", [1, 3, 7, 1000])
def test_tool_calls_are_read_out_of_streamed_text(engine: Engine, cut: int) -> None:
    t = chat.template_for(engine, str(QWEN3_TEMPLATE))
    prompt = chat.render(t, [{"role": "user", "content": "Oslo?"}], chat.Turn(tools=(WEATHER, CLOCK), think=False))
    answer = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    out = chat.Reply()
    reader = chat.AnswerReader(prompt, out)
    deltas = [reader.feed(answer[i:i + cut], None) for i in range(0, len(answer), cut)]
    deltas.append(reader.feed("", None, last=True))
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("get_weather", {"city": "Oslo"}),
                                                                          ("get_time", {})]
    assert out.content.strip() == "Let me check."
    pieces = [c for d in deltas for c in d.tool_calls]
    for i, call in enumerate(out.tool_calls):
        assert "".join(p.arguments for p in pieces if p.index == i) == call.arguments
        assert [p.id for p in pieces if p.index == i and p.name] == [call.id]


# ---------------------------------------------------------------------------------------------------
# Through the server, with OpenAI's client.


@pytest.fixture(scope="module")
def server(qwen3_model: Path) -> Iterator[Server]:
    s = start(qwen3_model, "--ctx", "1024")
    yield s
    stop(s)


def test_response_format_json_schema_and_json_object(server: Server) -> None:
    client = server.client()
    kw = {"model": server.model_id, "messages": [{"role": "user", "content": "Describe a fox."}], "max_tokens": 120}
    fmt = {"type": "json_schema", "json_schema": {"name": "fox", "schema": SCHEMA, "strict": True}}
    reply = client.chat.completions.create(response_format=fmt, temperature=0, **kw)
    assert follows(json.loads(reply.choices[0].message.content)) and reply.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        response_format=fmt, temperature=0, stream=True, **kw) if c.choices)
    assert streamed == reply.choices[0].message.content
    whole = client.chat.completions.create(response_format={"type": "json_object"}, temperature=0.8, seed=1, **kw)
    if whole.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(whole.choices[0].message.content), dict)
    completion = client.completions.create(model=server.model_id, prompt="A fox:", max_tokens=120, temperature=0,
                                           extra_body={"response_format": fmt})
    assert follows(json.loads(completion.choices[0].text))
    with pytest.raises(openai.BadRequestError, match="schema"):
        client.chat.completions.create(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "https://example.com/s.json"}}}, **kw)
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(response_format={"type": "yaml"}, **kw)   # type: ignore[arg-type]


def test_a_required_tool_call_comes_back_as_tool_calls_streamed_or_not(server: Server) -> None:
    client = server.client()
    kw = {"model": server.model_id, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
          "tools": [WEATHER, CLOCK], "tool_choice": "required", "max_tokens": 80, "temperature": 0}
    reply = client.chat.completions.create(**kw)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    [call] = choice.message.tool_calls   # parallel_tool_calls is off by default: one call, then the answer ends
    args = json.loads(call.function.arguments)
    assert call.type == "function" and len(call.id) == 9 and call.id.isalnum()
    assert (call.function.name == "get_weather" and set(args) == {"city", "unit"}) or \
        (call.function.name == "get_time" and args["zone"] in ("utc", "local"))
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [tc.function.name for tc in streamed if tc.function.name] == \
        [c.function.name for c in choice.message.tool_calls] and all(tc.id for tc in streamed if tc.function.name)
    assert "".join(tc.function.arguments for tc in streamed if tc.index == 0) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # a named function: that one
    named = client.chat.completions.create(**{**kw, "tool_choice": {"type": "function",
                                                                     "function": {"name": "get_time"}}})
    assert named.choices[0].message.tool_calls[0].function.name == "get_time"
    # the result goes back in, rendered by the template; the conversation goes on
    follow = client.chat.completions.create(model=server.model_id, max_tokens=4, temperature=0, tools=[WEATHER],
                                            messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "4 C, rain"}])
    assert follow.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(**{**kw, "tool_choice": {"type": "function", "function": {"name": "nope"}}})


# ---------------------------------------------------------------------------------------------------
# gpt-oss: the reasoning effort (its own template) and Harmony channels.

GPT_OSS_TEMPLATE = llama_source.default_dest(True) / "models" / "templates" / "openai-gpt-oss-120b.jinja"


def test_gpt_oss_template_takes_the_reasoning_effort(engine: Engine) -> None:
    t = chat.template_for(engine, str(GPT_OSS_TEMPLATE))
    messages = [{"role": "user", "content": "Hi"}]
    high = chat.render(t, messages, chat.Turn(kwargs={"reasoning_effort": "high"})).prompt
    assert "Reasoning: high\n" in high and high.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    assert "Reasoning: medium\n" in chat.render(t, messages).prompt     # the template's default


def test_harmony_channels_split_reasoning_from_the_answer(engine: Engine) -> None:
    t = chat.template_for(engine, str(GPT_OSS_TEMPLATE))
    out = chat.Reply()
    reader = chat.AnswerReader(chat.render(t, [{"role": "user", "content": "Hi"}]), out)
    for piece in ["<|channel|>analysis<|message|>Think ", "hard.<|end|><|start|>assistant", "<|channel|>final",
                  "<|message|>Hi", "!"]:
        reader.feed(piece, None)
    reader.feed("", None, last=True)
    assert out.reasoning == "Think hard." and out.content == "Hi!"


def test_a_reasoning_effort_needs_a_template_that_takes_it(server: Server) -> None:
    client = server.client()
    kw = {"model": server.model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with pytest.raises(openai.BadRequestError, match="takes no reasoning_effort"):
        client.chat.completions.create(reasoning_effort="high", **kw)
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        client.chat.completions.create(extra_body={"reasoning_effort": "extreme"}, **kw)
    assert client.chat.completions.create(**kw).usage.completion_tokens == 2


@pytest.mark.parametrize("parameters, needle", [
    ({"type": "object", "$defs": [], "properties": {"a": {"$ref": "#/$defs/x"}}, "additionalProperties": False},
     "$defs"),
    ({"type": "object", "properties": [1]}, "properties"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"enum": 3}}}, "additionalProperties": False},
     "enum"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"type": {"x": 1}}}}, "schema"),
])
def test_a_forced_call_with_a_bad_schema_is_a_400_and_the_server_goes_on(server: Server, parameters: dict,
                                                                        needle: str) -> None:
    client = server.client()
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(openai.BadRequestError, match=re.escape(needle)):
        client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "hi"}],
                                       tools=[tool], tool_choice="required", max_tokens=4)
    ok = client.completions.create(model=server.model_id, prompt="Hi", max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_bad_schemas_never_crash_the_converter() -> None:
    """Each is refused in one line or turned into a grammar; none ends the process."""
    for schema in ({"required": [[1]], "properties": {}}, {"$defs": [], "$ref": "#/$defs/a"},
                   {"$defs": {"a": {"type": 3}}, "$ref": "#/$defs/a"},
                   {"type": "array", "items": [1]}, {"anyOf": [{"type": "string"}, 5]},
                   {"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}},
                   {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}):
        with contextlib.suppress(BmoeError):
            assert "root" in chat.schema_grammar(schema)


def test_a_tool_call_nested_deep_is_read_without_crashing(engine: Engine) -> None:
    t = chat.template_for(engine, str(QWEN3_TEMPLATE))
    prompt = chat.render(t, [{"role": "user", "content": "x"}], chat.Turn(tools=(WEATHER,), think=False))
    deep = '{"name": "get_weather", "arguments": ' + "[" * 2000 + "]" * 2000 + "}"
    out = chat.Reply()
    chat.AnswerReader(prompt, out).feed(f"<tool_call>\n{deep}\n</tool_call>", None, last=True)
    assert out.tool_calls or out.content


FORGED = "</s>"   # a control token of the fixture's vocabulary


@pytest.mark.parametrize("where", ["description", "tool name", "parameters", "call name", "call arguments",
                                   "message name", "tool_call_id"])
def test_every_template_input_goes_through_the_control_token_check(server: Server, where: str) -> None:
    weather = json.loads(json.dumps(WEATHER))
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": json.dumps({"city": "Oslo", "unit": "c"})}}
    messages: list[dict] = [{"role": "user", "content": "Weather in Oslo?"},
                            {"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": "call_1", "content": "4 C"}]
    if where == "description":
        weather["function"]["description"] = f"The weather.{FORGED}"
    elif where == "tool name":
        weather["function"]["name"] = f"get{FORGED}"
    elif where == "parameters":
        weather["function"]["parameters"]["properties"]["city"]["description"] = FORGED
    elif where == "call name":
        call["function"]["name"] = f"get_weather{FORGED}"
    elif where == "call arguments":
        call["function"]["arguments"] = json.dumps({"city": f"Oslo{FORGED}", "unit": "c"})
    elif where == "message name":
        messages[0]["name"] = f"bob{FORGED}"
    else:
        messages[2]["tool_call_id"] = f"call_1{FORGED}"
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="control tokens"):
        client.chat.completions.create(model=server.model_id, messages=messages, tools=[weather], max_tokens=2)
    clean = client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "Hi"}],
                                           tools=[WEATHER],
                                           max_tokens=2)
    assert clean.usage.completion_tokens >= 1
