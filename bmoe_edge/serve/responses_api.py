"""OpenAI's Responses API (POST /v1/responses) on the Chat Completions pipeline: `input` (text, or message,
function_call and function_call_output items), `instructions`, function tools and the conversation a
`previous_response_id` names are translated into a Chat Completions body and parsed as one
(`openai_api.parse_translated`: the same checks, bounds and limits, the same worker `Request`, rendered and read
back by llama.cpp common); the answer is written back as output items (reasoning, message, function_call), whole
or as the API's typed events. What it does not do (built-in tools, background mode, ...) is refused with a 400
(params.py's rows)."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bmoe_edge.engine import chat
from bmoe_edge.engine.generation import PositionLogprobs
from bmoe_edge.serve import limits, openai_api, params
from bmoe_edge.serve.api_errors import ApiError, bad_request, tools_of_type
from bmoe_edge.serve.worker import Request, request_id

# chat's parameter names -> this API's, for the errors parse_chat raises on the translated body
NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text",
         "reasoning_effort": "reasoning", "logprobs": "top_logprobs"}
Conversation = list[dict[str, Any]]   # Chat Completions messages


class ResponseStore:
    """What previous_response_id continues: each stored response's conversation (its input and its answer; not its
    instructions, which OpenAI does not carry over), in memory for the server's life. Each API key has an equal
    share of limits.MAX_STORED_RESPONSES and limits.MAX_STORED_RESPONSE_BYTES; a key's new response evicts that
    key's least recently used ones, never another key's, and a key finds only its own."""

    def __init__(self, tenants: int, max_count: int = limits.MAX_STORED_RESPONSES,
                 max_bytes: int = limits.MAX_STORED_RESPONSE_BYTES) -> None:
        self.count = max(1, max_count // max(1, tenants))
        self.bytes = max_bytes // max(1, tenants)
        self._kept: dict[int, OrderedDict[str, tuple[Conversation, int]]] = {}
        self._held: dict[int, int] = {}   # bytes each tenant's entries hold

    def put(self, tenant: int, rid: str, conversation: Conversation) -> bool:
        """Keep a conversation (False: larger than a share, not kept)."""
        size = len(json.dumps(conversation, ensure_ascii=False).encode())
        if size > self.bytes:
            return False
        own = self._kept.setdefault(tenant, OrderedDict())
        own[rid] = (conversation, size)
        self._held[tenant] = self._held.get(tenant, 0) + size
        while len(own) > self.count or self._held[tenant] > self.bytes:
            _, (_, dropped) = own.popitem(last=False)
            self._held[tenant] -= dropped
        return True

    def get(self, tenant: int, rid: str) -> Conversation | None:
        own = self._kept.get(tenant, OrderedDict())
        if rid not in own:
            return None
        own.move_to_end(rid)
        return json.loads(json.dumps(own[rid][0]))   # a copy: the caller adds to it



TEXT_PARTS = ("input_text", "output_text", "text")


def _text(content: Any, where: str) -> str:
    """A message's or a function_call_output's content: a string or text parts (only text is supported)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(p, Mapping) and p.get("type") in TEXT_PARTS
                                                and isinstance(p.get("text"), str) for p in content):
        raise bad_request(f"{where} must be a string or a list of input_text/output_text parts (only text is "
                          "supported)", "input")
    return "".join(p["text"] for p in content)


def _item(item: Any, out: Conversation) -> None:
    """One input item added to the conversation: a message; a function_call (joining the assistant message before
    it, as Chat Completions holds an answer's text and calls in one message); a function_call_output (a tool
    message). Earlier reasoning items are dropped, as the templates drop earlier reasoning."""
    kind = item.get("type", "message" if "role" in item else None) if isinstance(item, Mapping) else None
    if kind == "message":
        role = {"developer": "system"}.get(item.get("role"), item.get("role"))
        if role not in ("user", "system", "assistant"):
            raise bad_request(f"a message's role must be user, system, developer or assistant, got {role!r:.40}",
                              "input")
        out.append({"role": role, "content": _text(item.get("content"), "a message's content")})
    elif kind == "function_call":
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            raise bad_request("a function_call item needs 'call_id', 'name' and 'arguments' (JSON text)", "input")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        if out and out[-1]["role"] == "assistant":
            out[-1].setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise bad_request("a function_call_output item needs 'call_id'", "input")
        out.append({"role": "tool", "tool_call_id": item["call_id"],
                    "content": _text(item.get("output"), "a function_call_output's output")})
    elif kind != "reasoning":
        raise bad_request(f"input items of type {kind!r:.40} are not supported: message, function_call and "
                          "function_call_output are", "input")


def _input(value: Any) -> Conversation:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty list of items", "input")
    out: Conversation = []
    for item in value:
        _item(item, out)
    return out


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Function tools as Chat Completions' tools; a built-in tool (web search, file search, code interpreter,
    computer use, MCP, image generation, shell, custom grammar tools) is refused: nothing here runs one."""
    tools = tools_of_type(value, "function", "only function tools; built-in tools are not run here")
    if tools is None:
        return None
    out = []
    for tool in tools:
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise bad_request("'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...} (built-in "
                      "tools and allowed_tools are not supported)", "tool_choice")


def _format(value: Any) -> dict[str, Any] | None:
    """text.format as a response_format; text.verbosity is refused, as Chat Completions' verbosity is."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("verbosity") is not None:
        raise bad_request("'text' must be {'format': {...}} ('verbosity' is not supported)", "text")
    fmt = value.get("format")
    if fmt is None or (isinstance(fmt, Mapping) and fmt.get("type") in ("text", "json_object")):
        return None if fmt is None else {"type": fmt["type"]}
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    raise bad_request("'text.format' must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', "
                      "'name': ..., 'schema': {...}}", "text")


def _effort(value: Any) -> Any:
    """reasoning.effort as reasoning_effort (its summary is not made: the reasoning itself is the output)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request("'reasoning' must be {'effort': ...}", "reasoning")
    return value.get("effort")


def _logprobs(body: Mapping[str, Any]) -> bool:
    include = body.get("include")
    if include is None:
        return body.get("top_logprobs") is not None
    kind = params.param("responses", "include").kind
    assert isinstance(kind, params.Include)
    if not isinstance(include, list) or not all(isinstance(i, str) and i in kind.values for i in include):
        raise bad_request(f"'include' may list only {', '.join(kind.values)}", "include")
    return params.INCLUDE_LOGPROBS in include or body.get("top_logprobs") is not None


def to_chat(body: Mapping[str, Any], history: Conversation) -> tuple[dict[str, Any], Conversation]:
    """The request as a Chat Completions body, and the conversation to store for a later previous_response_id
    (without the instructions, which are not carried over)."""
    conversation = [*history, *_input(body.get("input"))]
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", "instructions")
    system = [{"role": "system", "content": instructions}] if instructions is not None else []
    logprobs = _logprobs(body)
    chat_body = {"model": body.get("model"), "messages": [*system, *conversation],
                 "max_tokens": body.get("max_output_tokens"), "stream": body.get("stream"),
                 "tools": _tools(body.get("tools")), "tool_choice": _tool_choice(body.get("tool_choice")),
                 "parallel_tool_calls": body.get("parallel_tool_calls"),
                 "response_format": _format(body.get("text")), "reasoning_effort": _effort(body.get("reasoning")),
                 "logprobs": logprobs or None, "top_logprobs": body.get("top_logprobs")}
    chat_body |= {name: body.get(name) for name in params.sampling("responses")}
    return chat_body, conversation


def parse(body: Any, model_id: str, stored: Callable[[str], Conversation | None]
          ) -> tuple[Request, Conversation]:
    """A Responses request, checked and translated: the worker's Request and the conversation it continues.
    `stored`: the conversation a previous_response_id names (this API key's), None when there is none."""
    openai_api.checked(body, "responses", model_id)
    history: Conversation = []
    previous = body.get("previous_response_id")
    if previous is not None:
        found = stored(previous) if isinstance(previous, str) else None
        if found is None:
            raise ApiError(404, f"there is no stored response {str(previous)[:80]!r} (responses are kept in memory "
                           "for the server's life, per API key, within a bound: see docs/serve.md)",
                           param="previous_response_id", code="previous_response_not_found")
        history = found
    if not isinstance(body.get("store", True), bool):
        raise bad_request("'store' must be true or false", "store")
    chat_body, conversation = to_chat(body, history)
    return openai_api.parse_translated(chat_body, model_id, NAMES), conversation


def answer_turn(reply: chat.Reply) -> dict[str, Any]:
    """The answer as the assistant message a later turn sends back (its reasoning dropped, as templates do)."""
    turn: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        turn["tool_calls"] = [c.openai() for c in reply.tool_calls]
    return turn


def echo(body: Mapping[str, Any], previous: str | None = None) -> dict[str, Any]:
    """What a Response repeats of its request."""
    effort = body.get("reasoning", {}).get("effort") if isinstance(body.get("reasoning"), Mapping) else None
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", False)),
            "previous_response_id": body.get("previous_response_id"), "reasoning": {"effort": effort, "summary": None},
            "store": body.get("store", True), "temperature": body.get("temperature"),
            "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
            "top_p": body.get("top_p"), "top_logprobs": body.get("top_logprobs"), "truncation": "disabled",
            "metadata": body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {},
            "background": False}


def usage(reply: chat.Reply) -> dict[str, Any]:
    return {"input_tokens": reply.prompt_tokens, "input_tokens_details": {"cached_tokens": reply.reused_tokens},
            "output_tokens": reply.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def response(rid: str, model_id: str, echoed: Mapping[str, Any], output: list[dict[str, Any]],
             reply: chat.Reply | None, status: str | None = None, error: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """The Response object: in progress (no reply yet), completed, incomplete (cut by max_output_tokens) or
    failed."""
    if status is None:
        status = "in_progress" if reply is None else "incomplete" if reply.finish_reason == "length" else "completed"
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status, "error": error,
            "incomplete_details": incomplete, "model": model_id, "output": output,
            "usage": usage(reply) if reply is not None else None, **echoed}


def _logprob_entries(found: Sequence[PositionLogprobs] | None) -> list[dict[str, Any]]:
    logprobs = openai_api.chat_logprobs(found)
    return logprobs["content"] if logprobs else []


def output_text(text: str, found: Sequence[PositionLogprobs] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": _logprob_entries(found)}


def reasoning_item(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": request_id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(text: str, found: Sequence[PositionLogprobs] | None, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": request_id("msg"), "status": status, "role": "assistant",
            "content": [output_text(text, found)] if status == "completed" else []}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": request_id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output(reply: chat.Reply, found: Sequence[PositionLogprobs] | None) -> list[dict[str, Any]]:
    """The whole answer's output items, as the stream adds them up: its reasoning, its text (when it has some, or
    there is nothing else), its calls."""
    items = [reasoning_item(reply.reasoning)] if reply.reasoning else []
    if reply.content or not (items or reply.tool_calls):
        items.append(message_item(reply.content, found))
    return items + [call_item(c.id, c.name, c.arguments) for c in reply.tool_calls]


class ResponseStream:
    """The answer as the Responses API streams it: response.created and response.in_progress; each output item's
    output_item.added, its deltas (reasoning_text, output_text with its content part, function_call_arguments)
    and their done events, output_item.done; then response.completed (or response.incomplete), whose output is
    the items streamed; a failure mid-answer is response.failed. Every event carries its sequence_number."""

    def __init__(self, rid: str, model_id: str, echoed: Mapping[str, Any], logprobs: bool,
                 on_done: Callable[[chat.Reply], None]) -> None:
        self.rid, self.model_id, self.echoed, self.logprobs, self.on_done = rid, model_id, echoed, logprobs, on_done
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.open: Any = None   # the item being streamed: "reasoning", "message" or ("call", the call's index)
        self.held: list[PositionLogprobs] = []   # logprobs of text still held back: they go with the next delta

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def _snapshot(self, reply: chat.Reply | None, status: str | None = None,
                  error: dict[str, Any] | None = None) -> dict[str, Any]:
        return response(self.rid, self.model_id, self.echoed, list(self.items), reply, status, error)

    def head(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=self._snapshot(None)),
                self._event("response.in_progress", response=self._snapshot(None))]

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        item, where, out = self.items[-1], self._where(), []
        if self.open == "reasoning":
            out.append(self._event("response.reasoning_text.done", **where, content_index=0,
                                   text=item["content"][0]["text"]))
        elif self.open == "message":
            part = item["content"][0]
            out += [self._event("response.output_text.done", **where, content_index=0, text=part["text"],
                                logprobs=part["logprobs"]),
                    self._event("response.content_part.done", **where, content_index=0, part=part)]
        else:
            out.append(self._event("response.function_call_arguments.done", **where, name=item["name"],
                                   arguments=item["arguments"]))
        item["status"] = "completed"
        self.open = None
        return [*out, self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _into(self, what: Any, item: dict[str, Any]) -> list[dict[str, Any]]:
        """Events that make `what` the item being streamed (closing the one before), if it is not already."""
        if self.open == what:
            return []
        out = self._close()
        self.items.append(item)
        self.open = what
        out.append(self._event("response.output_item.added", output_index=len(self.items) - 1,
                               item=json.loads(json.dumps(item))))
        if what == "message":
            item["content"] = [output_text("", None)]
            out.append(self._event("response.content_part.added", **self._where(), content_index=0,
                                   part=output_text("", None)))
        return out

    def chunk(self, d: chat.Delta) -> list[dict[str, Any]]:
        self.held.extend(openai_api.positions(d) if self.logprobs else ())
        out = []
        if d.reasoning:
            reasoning = {"type": "reasoning", "id": request_id("rs"), "summary": [], "status": "in_progress",
                         "content": [{"type": "reasoning_text", "text": ""}]}
            out += self._into("reasoning", reasoning)
            self.items[-1]["content"][0]["text"] += d.reasoning
            out.append(self._event("response.reasoning_text.delta", **self._where(), content_index=0,
                                   delta=d.reasoning))
        if d.content:
            out += self._into("message", message_item("", None, "in_progress"))
            part = self.items[-1]["content"][0]
            entries = _logprob_entries(self.held) if self.held else []
            self.held = []
            part["text"] += d.content
            part["logprobs"] += entries
            out.append(self._event("response.output_text.delta", **self._where(), content_index=0, delta=d.content,
                                   logprobs=entries))
        for call in d.tool_calls:
            if call.name:
                out += self._into(("call", call.index), call_item(call.id, call.name, "", "in_progress"))
            if call.arguments and self.open == ("call", call.index):
                self.items[-1]["arguments"] += call.arguments
                out.append(self._event("response.function_call_arguments.delta", **self._where(),
                                       delta=call.arguments))
        return out

    def last(self, reply: chat.Reply) -> list[dict[str, Any]]:
        out = self._close()
        self.on_done(reply)
        done = self._snapshot(reply)
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=done)]

    def failed(self, status: int, message: str) -> list[dict[str, Any]]:
        error = {"code": "server_error" if status >= 500 else "invalid_request", "message": message}
        return [self._event("response.failed", response=self._snapshot(None, "failed", error))]
