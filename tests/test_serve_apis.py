"""Anthropic's Messages API and OpenAI's Responses API as their users meet them: the real `anthropic` and `openai`
clients against a real `serve` on the tiny fixture. A plain answer whole and streamed; a forced tool call's round
trip (tool_use -> tool_result -> answer) on the Qwen3, GLM and gpt-oss templates, its streamed arguments adding up to
the whole call; count_tokens against the answer's usage; a conversation continued by previous_response_id (per API
key, bounded); greedy answers equal to Chat Completions' for the same conversation, token by token; the key (bearer
or x-api-key), a web Origin, an oversized body, the queue and a hang-up on the new routes as on the old; and every
parameter of both APIs, as the installed clients declare them, against docs/serve.md's tables and params.py."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http import client as http_client
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import message_count_tokens_params, message_create_params
from openai.types.responses import response_create_params

from bmoe_edge.proof import http_fuzz
from bmoe_edge.serve import params, responses_api
from bmoe_edge.synthetic import tinymoe

from test_serve import Server, http, start, stop
from test_templates import CLOCK, MAX_CALL_TOKENS, QUESTION, RESULT, TEMPLATES_DIR, WEATHER, follows

ROOT = Path(__file__).resolve().parents[1]
KEY, OTHER_KEY = "apis-key-5e1a", "apis-key-other-77c2"
# The same tools in each API's shape
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in (WEATHER, CLOCK)]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in (WEATHER, CLOCK)]
SYSTEM, ASK = QUESTION[0]["content"], QUESTION[1]["content"]


def _start(tmp: Path, template: str, *args: str) -> Server:
    keys = tmp / "keys"
    keys.write_text(f"{KEY}\n{OTHER_KEY}\n")
    return start(tinymoe.fixture("qwen3moe", "Q8_0"), "--ctx", "2048", "--api-key-file", str(keys),
                 "--chat-template", str(TEMPLATES_DIR / template), *args)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = _start(tmp_path_factory.mktemp("apis"), "Qwen-Qwen3-0.6B.jinja", "--queue", "2")
    yield s
    stop(s)


def claude(server: Server, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120)


def gpt(server: Server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)


def post(server: Server, path: str, body: Any, **headers: str) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http(server.url, "POST", path, data, {"Content-Type": "application/json", "x-api-key": KEY} | headers)


GREEDY = {"temperature": 0}


# ---------------------------------------------------------------------------------------------------
# A plain answer, whole and streamed


def test_both_clients_list_the_model(server: Server) -> None:
    [listed] = list(claude(server).models.list())
    assert listed.id == listed.display_name == server.model_id and listed.type == "model"
    assert [m.id for m in gpt(server).models.list()] == [server.model_id]


def test_a_messages_answer_whole_and_streamed(server: Server) -> None:
    kw = {"model": server.model_id, "max_tokens": 12, "system": SYSTEM, "messages": [{"role": "user", "content": ASK}],
          "thinking": {"type": "disabled"}, "extra_body": GREEDY}
    whole = claude(server).messages.create(**kw)
    [block] = whole.content
    assert block.type == "text" and block.text and whole.stop_reason == "max_tokens"
    assert whole.usage.output_tokens == 12 and whole.role == "assistant" and whole.model == server.model_id
    events = []
    with claude(server).messages.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events.count("content_block_start") == events.count("content_block_stop") == 1
    # A stop sequence: stop_reason names it, and the answer is cut before it.
    stop = block.text[3:6]
    cut = claude(server).messages.create(**kw | {"stop_sequences": [stop]})
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == block.text[: block.text.index(stop)]


def test_a_responses_answer_whole_and_streamed(server: Server) -> None:
    kw = {"model": server.model_id, "instructions": SYSTEM, "input": ASK, "max_output_tokens": 12, "temperature": 0}
    whole = gpt(server).responses.create(**kw)
    assert whole.output_text and whole.status == "incomplete" and whole.usage.output_tokens == 12
    assert whole.incomplete_details.reason == "max_output_tokens"
    events = list(gpt(server).responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    done = events[-1].response
    assert done.output_text == whole.output_text and done.usage.output_tokens == 12
    assert {e.type for e in events} >= {"response.output_item.added", "response.content_part.added",
                                         "response.output_text.done", "response.content_part.done",
                                         "response.output_item.done"}


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Qwen3.5's template: with reasoning on, its prompt opens the reasoning, so all the fixture writes is."""
    s = _start(tmp_path_factory.mktemp("thinker"), "Qwen3.5-4B.jinja")
    yield s
    stop(s)


def test_reasoning_comes_back_as_thinking_and_reasoning_whole_and_streamed(thinker: Server) -> None:
    kw = {"model": thinker.model_id, "max_tokens": 8, "messages": [{"role": "user", "content": ASK}],
          "extra_body": GREEDY}
    on = claude(thinker).messages.create(thinking={"type": "enabled", "budget_tokens": 1024}, **kw)
    [block] = on.content
    assert block.type == "thinking" and block.thinking and on.usage.output_tokens == 8
    with claude(thinker).messages.stream(thinking={"type": "enabled", "budget_tokens": 1024}, **kw) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert set(deltas) == {"thinking_delta"} and [b.model_dump() for b in final.content] == [block.model_dump()]
    off = claude(thinker).messages.create(thinking={"type": "disabled"}, **kw)
    assert [b.type for b in off.content] == ["text"]
    # the Responses API: the template's default (on), a reasoning item, whole and streamed
    rkw = {"model": thinker.model_id, "input": ASK, "max_output_tokens": 8, "temperature": 0}
    whole = gpt(thinker).responses.create(**rkw)
    [item] = whole.output
    assert item.type == "reasoning" and item.content[0].text == block.thinking
    events = list(gpt(thinker).responses.create(stream=True, **rkw))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == item.content[0].text
    assert [i.type for i in events[-1].response.output] == ["reasoning"]


# ---------------------------------------------------------------------------------------------------
# count_tokens, previous_response_id


def test_count_tokens_is_the_prompt_the_answer_reports(server: Server) -> None:
    conversation = {"model": server.model_id, "system": SYSTEM, "tools": ANTHROPIC_TOOLS,
                    "messages": [{"role": "user", "content": "Count me in, please"}]}
    counted = claude(server).messages.count_tokens(**conversation)
    answer = claude(server).messages.create(max_tokens=2, extra_body=GREEDY, **conversation)
    used = answer.usage
    assert counted.input_tokens == used.input_tokens + used.cache_read_input_tokens + used.cache_creation_input_tokens
    assert counted.input_tokens > 100   # the tools are in it
    # the same conversation again: most of it read from the context, the sum the same
    again = claude(server).messages.create(max_tokens=2, extra_body=GREEDY, **conversation).usage
    assert again.cache_read_input_tokens == counted.input_tokens - 1 and again.input_tokens == 1


def test_a_responses_conversation_continued_by_previous_response_id(server: Server) -> None:
    client = gpt(server)
    first = client.responses.create(model=server.model_id, input="Hi there", instructions=SYSTEM,
                                    max_output_tokens=6, temperature=0)
    second = client.responses.create(model=server.model_id, input="And then?", previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0)
    assert second.previous_response_id == first.id
    # The same as sending the whole conversation (instructions are not carried over: OpenAI's rule)
    spelled = client.responses.create(model=server.model_id, max_output_tokens=6, temperature=0, store=False,
                                      input=[{"role": "user", "content": "Hi there"},
                                             {"role": "assistant", "content": first.output_text},
                                             {"role": "user", "content": "And then?"}])
    assert spelled.output_text == second.output_text
    assert spelled.usage.input_tokens == second.usage.input_tokens > first.usage.input_tokens
    # Another key cannot continue it; an unknown id and a response not stored are 404s, not 500s.
    for key, previous in ((OTHER_KEY, first.id), (KEY, "resp-nope"), (KEY, spelled.id)):
        with pytest.raises(openai.NotFoundError) as caught:
            gpt(server, key).responses.create(model=server.model_id, input="x", previous_response_id=previous,
                                              max_output_tokens=2)
        assert caught.value.body["param"] == "previous_response_id"


def test_stored_responses_are_bounded_per_key_and_evict_only_their_own() -> None:
    by_count = responses_api.ResponseStore(tenants=2, max_count=4)   # 2 a key
    turn = [{"role": "user", "content": "x" * 400}]
    assert by_count.put(1, "other", turn)
    for i in range(5):
        assert by_count.put(0, f"r{i}", turn)
    assert by_count.get(0, "r2") is None and by_count.get(0, "r3") == by_count.get(0, "r4") == turn
    assert by_count.get(1, "other") == turn and by_count.get(1, "r4") is None   # the other key's kept, and its own
    by_bytes = responses_api.ResponseStore(tenants=2, max_count=100, max_bytes=4000)   # 2,000 bytes a key
    big = [{"role": "user", "content": "y" * 1200}]
    assert by_bytes.put(0, "a", big) and by_bytes.put(0, "b", big)
    assert by_bytes.get(0, "a") is None and by_bytes.get(0, "b") == big
    assert not by_bytes.put(0, "huge", [{"role": "user", "content": "z" * 3000}])   # over a key's share: not kept
    assert by_bytes.get(0, "b") == big


# ---------------------------------------------------------------------------------------------------
# Greedy answers: the same conversation through the three APIs gives the same tokens


def _tokens(entries: Any) -> list[tuple[str, list[int], float, list[str]]]:
    """Each token of an answer: its text, bytes and logprob, and the most likely tokens there."""
    return [(e.token, e.bytes, e.logprob, [t.token for t in e.top_logprobs]) for e in entries]


def test_greedy_answers_equal_chat_completions_token_for_token(server: Server) -> None:
    call = {"id": "call7a9Zq", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"station": 7, "celsius": True})}}
    chat_messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
    chat = gpt(server).chat.completions.create(model=server.model_id, messages=chat_messages, tools=[WEATHER, CLOCK],
                                               max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    answer, used = chat.choices[0].message.content, chat.usage
    tokens = _tokens(chat.choices[0].logprobs.content)
    assert answer and len(tokens) == used.completion_tokens == 10

    # Anthropic's: the prompt's tokens are the ones chat rendered (all but its last read from the context the chat
    # request left: a prefix is reused only as far as the token ids agree), the answer its text and token count.
    anthropic_kw = {"model": server.model_id, "system": SYSTEM, "tools": ANTHROPIC_TOOLS, "max_tokens": 10,
                    "extra_body": GREEDY,
                    "messages": [{"role": "user", "content": ASK},
                                 {"role": "assistant", "content": [{"type": "tool_use", "id": call["id"],
                                                                    "name": "get_weather",
                                                                    "input": {"station": 7, "celsius": True}}]},
                                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                               "content": RESULT}]}]}
    messages = claude(server).messages.create(**anthropic_kw)
    assert messages.usage.cache_read_input_tokens == used.prompt_tokens - 1 and messages.usage.input_tokens == 1
    assert messages.content[0].text == answer and messages.usage.output_tokens == used.completion_tokens

    # The Responses API's: the same, and each token with its logprob and the most likely ones there.
    responses_kw = {"model": server.model_id, "instructions": SYSTEM, "tools": RESPONSES_TOOLS,
                    "max_output_tokens": 10, "temperature": 0, "top_logprobs": 2,
                    "include": ["message.output_text.logprobs"], "store": False,
                    "input": [{"role": "user", "content": ASK},
                              {"type": "function_call", "call_id": call["id"], "name": "get_weather",
                               "arguments": call["function"]["arguments"]},
                              {"type": "function_call_output", "call_id": call["id"], "output": RESULT}]}
    responses = gpt(server).responses.create(**responses_kw)
    assert responses.usage.input_tokens == used.prompt_tokens
    assert responses.usage.input_tokens_details.cached_tokens == used.prompt_tokens - 1
    assert responses.output_text == answer and responses.usage.output_tokens == used.completion_tokens
    [text] = [c for item in responses.output if item.type == "message" for c in item.content]
    assert _tokens(text.logprobs) == tokens

    # Streamed, the three cut the answer into the same pieces (a token's text each, as the engine read them), and
    # the streamed logprobs are the same tokens again.
    chat_pieces = [c.choices[0].delta.content for c in gpt(server).chat.completions.create(
        model=server.model_id, messages=chat_messages, tools=[WEATHER, CLOCK], max_tokens=10, temperature=0,
        stream=True) if c.choices and c.choices[0].delta.content]
    with claude(server).messages.stream(**anthropic_kw) as stream:
        anthropic_pieces = [e.delta.text for e in stream if e.type == "content_block_delta"]
    events = list(gpt(server).responses.create(stream=True, **responses_kw))
    responses_pieces = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert anthropic_pieces == responses_pieces == chat_pieces and "".join(chat_pieces) == answer
    assert _tokens(e for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs) == tokens


# ---------------------------------------------------------------------------------------------------
# A forced tool call's round trip on the Qwen3, GLM and gpt-oss templates


ROUND_TRIP = ("Qwen-Qwen3-0.6B.jinja", "GLM-4.6.jinja", "openai-gpt-oss-120b.jinja")


@pytest.fixture(scope="module", params=ROUND_TRIP)
def templated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = _start(tmp_path_factory.mktemp("round-trip"), request.param)
    yield s
    stop(s)


def test_a_forced_tool_call_round_trip_through_messages(templated: Server) -> None:
    client = claude(templated)
    kw = {"model": templated.model_id, "system": SYSTEM, "tools": ANTHROPIC_TOOLS, "max_tokens": MAX_CALL_TOKENS,
          "messages": [{"role": "user", "content": ASK}], "extra_body": GREEDY}
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_time"}):
        whole = client.messages.create(tool_choice=choice, **kw)
        assert whole.stop_reason == "tool_use", whole
        [use] = [b for b in whole.content if b.type == "tool_use"]
        assert follows(use.name, use.input) and use.id
        assert choice["type"] == "any" or use.name == "get_time"
        # streamed: the input_json_delta pieces add up to the same call
        with client.messages.stream(tool_choice=choice, **kw) as stream:
            pieces = [e.delta.partial_json for e in stream
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
            final = stream.get_final_message()
        [streamed] = [b for b in final.content if b.type == "tool_use"]
        assert (streamed.name, streamed.input) == (use.name, use.input) and final.stop_reason == "tool_use"
        assert json.loads("".join(pieces)) == use.input
    # the result goes back as a tool_result block; the answer follows it
    follow = client.messages.create(**kw | {"max_tokens": 3, "messages": [
        {"role": "user", "content": ASK}, {"role": "assistant", "content": whole.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}]})
    assert follow.usage.output_tokens >= 1 and follow.stop_reason in ("max_tokens", "end_turn", "tool_use")
    counted = client.messages.count_tokens(model=templated.model_id, system=SYSTEM, tools=ANTHROPIC_TOOLS,
                                           messages=[{"role": "user", "content": ASK}])
    assert counted.input_tokens < follow.usage.input_tokens + follow.usage.cache_read_input_tokens


def test_a_forced_tool_call_round_trip_through_responses(templated: Server) -> None:
    client = gpt(templated)
    kw = {"model": templated.model_id, "instructions": SYSTEM, "tools": RESPONSES_TOOLS,
          "max_output_tokens": MAX_CALL_TOKENS, "temperature": 0}
    whole = client.responses.create(input=ASK, tool_choice="required", **kw)
    [call] = [item for item in whole.output if item.type == "function_call"]
    assert whole.status == "completed" and follows(call.name, json.loads(call.arguments))
    events = list(client.responses.create(input=ASK, tool_choice="required", stream=True, **kw))
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert pieces == done.arguments == call.arguments and done.name == call.name
    assert events[-1].type == "response.completed"
    [streamed] = [i for i in events[-1].response.output if i.type == "function_call"]
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)
    named = client.responses.create(input=ASK, tool_choice={"type": "function", "name": "get_time"}, **kw)
    assert [i.name for i in named.output if i.type == "function_call"] == ["get_time"]
    # the call's output goes back, continuing the stored response
    follow = client.responses.create(previous_response_id=whole.id, **kw | {"max_output_tokens": 3},
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": RESULT}])
    assert follow.usage.output_tokens >= 1 and follow.usage.input_tokens > whole.usage.input_tokens


# ---------------------------------------------------------------------------------------------------
# The same gate, keys, limits, queue and cancellation as Chat Completions


NEW_ROUTES = {"/v1/messages": {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
              "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "Hi"}]},
              "/v1/responses": {"input": "Hi", "max_output_tokens": 2}}
OLD_ROUTE = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})


def _error_shape(path: str, body: dict[str, Any]) -> str:
    """The error's type, checked to be in the route's API's shape."""
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["type"]


def test_the_new_routes_refuse_what_the_old_one_refuses(server: Server) -> None:
    port = server.url.rsplit(":", 1)[1]
    for path, body in (*NEW_ROUTES.items(), OLD_ROUTE):
        ok = post(server, path, body)
        assert ok.status_code == 200, (path, ok.text)
        cases = {"no key": ({}, {"x-api-key": ""}, 401),
                 "a wrong bearer": ({}, {"x-api-key": "", "Authorization": "Bearer no"}, 401),
                 "a wrong x-api-key": ({}, {"x-api-key": "no"}, 401),
                 "a web origin": ({}, {"Origin": "https://evil.example"}, 403),
                 "a rebound host": ({}, {"Host": f"evil.example:{port}"}, 403),
                 "an oversized body": ({"pad": "x" * (5 << 20)}, {}, 413),
                 "a control token": ({"messages": [{"role": "user", "content": "hi</s>"}], "input": "hi</s>"}, {},
                                     400),
                 "a lone surrogate": ({"pad": "\ud800"}, {}, 400)}
        for name, (extra, headers, status) in cases.items():
            r = post(server, path, body | extra, **headers)
            assert r.status_code == status, (path, name, r.text[:300])
            kind = _error_shape(path, r.json())
            assert status != 401 or kind == "authentication_error", (path, name)
        r = post(server, path, b"{not json")
        assert r.status_code == 400 and _error_shape(path, r.json()) == "invalid_request_error"
    # the bearer works on Anthropic's routes too, and x-api-key on OpenAI's
    bearer = {"x-api-key": "", "Authorization": f"Bearer {KEY}"}
    assert post(server, "/v1/messages", NEW_ROUTES["/v1/messages"], **bearer).status_code == 200
    with pytest.raises(anthropic.PermissionDeniedError):
        claude(server).messages.create(model=server.model_id, max_tokens=1, messages=[{"role": "user", "content": "x"}],
                                       extra_headers={"Origin": "https://evil.example"})
    assert http(server.url, "GET", "/v1/messages").status_code == 405


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     None),
    ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, None),
    ("/v1/messages", {"messages": [{"role": "user", "content": "x"}]}, None),   # max_tokens is required
    ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["a"] * 5},
     None),
    ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "temperature": 9}, None),
    ("/v1/responses", {"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ("/v1/responses", {"input": "x", "background": True}, "background"),
    ("/v1/responses", {"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ("/v1/responses", {"input": "x", "reasoning": {"effort": "high"}}, None),   # Qwen3's template takes none
    ("/v1/responses", {"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "string", "maxLength": 5000}}}}, "text"),
    ("/v1/responses", {"input": "x", "include": ["file_search_call.results"]}, "include"),
])
def test_what_the_new_apis_do_not_support_is_a_400_that_says_so(server: Server, path: str, body: dict,
                                                                param: str | None) -> None:
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert _error_shape(path, r.json()) == "invalid_request_error"
    assert param is None or r.json()["error"]["param"] == param, r.text
    assert post(server, *OLD_ROUTE).status_code == 200   # and the server goes on


def _metrics(server: Server) -> dict[str, float]:
    text = http(server.url, "GET", "/metrics", headers={"x-api-key": KEY}).text
    return {name: float(value) for name, value in re.findall(r"^(\w+) (\S+)$", text, re.M)}


LONG = 2000   # tokens: seconds of the tiny model's answer, so it is still running when its client hangs up


def _hang_up(server: Server, path: str, body: dict, sent: threading.Event, release: threading.Event,
             answers: list[tuple[int, bytes]]) -> None:
    """A streamed request whose client hangs up once every client has sent theirs (`sent`): one still waiting for
    its answer to start (0) at once, one whose answer streams (200) once the others are recorded (`release`)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http_client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", "x-api-key": KEY})
    sent.wait(30)
    assert conn.sock is not None
    conn.sock.settimeout(0.2)
    try:
        r = conn.getresponse()
    except TimeoutError:
        answers.append((0, b""))
        conn.close()
        return
    answers.append((r.status, r.read() if r.status != 200 else r.readline()))
    release.wait(30)
    conn.close()


def test_a_full_queue_is_429_and_a_client_that_hangs_up_is_cancelled_on_the_new_routes(server: Server) -> None:
    long = {"/v1/messages": {"max_tokens": LONG, "stream": True, "messages": [{"role": "user", "content": "Go"}],
                             "temperature": 0},
            "/v1/responses": {"input": "Go", "max_output_tokens": LONG, "stream": True, "temperature": 0}}
    for path, body in long.items():
        before = _metrics(server)
        answers: list[tuple[int, bytes]] = []
        sent, release = threading.Event(), threading.Event()
        threads = [threading.Thread(target=_hang_up, args=(server, path, body, sent, release, answers))
                   for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        sent.set()
        deadline = time.monotonic() + 30
        while len(answers) < len(threads) and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
        for t in threads:
            t.join()
        statuses = [status for status, _ in answers]
        # one runs, two wait (--queue 2), the rest are refused in the API's shape
        refused = statuses.count(429)
        assert len(statuses) == 6 and refused and set(statuses) <= {0, 200, 429} and 6 - refused <= 3, statuses
        for status, data in answers:
            assert status != 429 or _error_shape(path, json.loads(data)) == "rate_limit_error"
        deadline = time.monotonic() + 30
        while (health := http(server.url, "GET", "/health").json())["busy"] or health["queue_depth"]:
            assert time.monotonic() < deadline, health
            time.sleep(0.2)
        # the running answer stopped when its client left, the waiting ones never ran (this key's own counters)
        generated = _metrics(server)["bmoe_completion_tokens_total"] - before["bmoe_completion_tokens_total"]
        assert generated < LONG
        assert post(server, *OLD_ROUTE).status_code == 200


# ---------------------------------------------------------------------------------------------------
# Every parameter of both APIs: docs/serve.md's tables, params.py's rows, the server's refusals


def _sdk_parameters(cls: Any) -> set[str]:
    return set(cls.__required_keys__ | cls.__optional_keys__)


SDK = {"messages": _sdk_parameters(message_create_params.MessageCreateParamsStreaming),
       "count_tokens": _sdk_parameters(message_count_tokens_params.MessageCountTokensParams),
       "responses": _sdk_parameters(response_create_params.ResponseCreateParamsStreaming)}
# Anthropic's API reference documents these; the 2.x Python client no longer declares them (extra_body sends them)
ANTHROPIC_DOCUMENTED = {"temperature", "top_p", "top_k"}


def _tables() -> dict[str, dict[str, str]]:
    """docs/serve.md's per-API tables: route -> parameter -> supported, refused or ignored."""
    text = (ROOT / "docs" / "serve.md").read_text()
    section = text.split("### Anthropic's Messages API and OpenAI's Responses API", 1)[1].split("\n### ", 1)[0]
    out: dict[str, dict[str, str]] = {route: {} for route in ("messages", "count_tokens", "responses")}
    for heading, table in re.findall(r"^\| parameter \| ([^|]+?) \|.*?\n((?:\|.*\n)+)", section, re.M):
        routes = ("messages", "count_tokens") if "messages" in heading else ("responses",)
        for row in re.findall(r"^\| (`.+?) \| (\S+) \|(?: (\S+) \|)?", table, re.M):
            for name in re.findall(r"`(\w+)`", row[0]):
                for route, status in zip(routes, row[1:], strict=False):
                    if status and status != "—":
                        assert name not in out[route], f"{name} is in the table twice for {route}"
                        out[route][name] = status
    return out


def test_every_parameter_of_both_apis_is_in_the_tables_and_refused_ones_are_400s(server: Server) -> None:
    tables = _tables()
    for route in ("messages", "count_tokens", "responses"):
        declared = {p.name: p.status(route) for p in params.of(route).values() if p.openai}
        assert tables[route] == declared, route
        extra = ANTHROPIC_DOCUMENTED if route == "messages" else set()
        assert set(tables[route]) == SDK[route] | extra, (route, set(tables[route]) ^ (SDK[route] | extra))
    for route in ("messages", "count_tokens", "responses"):
        path = params.PATHS[route]
        base = NEW_ROUTES[path] | {"model": server.model_id}
        for name, status in tables[route].items():
            if status == "supported":
                continue
            r = post(server, path, base | {name: "something-else"})
            if status == "refused":
                assert r.status_code == 400 and name in r.json()["error"]["message"], (route, name, r.text)
            else:
                assert r.status_code == 200, (route, name, r.text)


def test_every_route_is_in_the_fuzz_campaign() -> None:
    """A route declared in params.py without seeds in the HTTP fuzz campaign fails here: its requests are the
    campaign's from the day it lands."""
    seeded = {path for path, _ in http_fuzz.SEEDS}
    assert seeded == set(params.PATHS.values())
    names = " ".join(c.name for c in http_fuzz.cases(600, seed=5))
    for route, path in params.PATHS.items():
        assert f":{path}:" in names and route in {http_fuzz.route_of(path)}

