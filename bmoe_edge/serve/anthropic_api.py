"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) on the Chat Completions pipeline:
a request is translated into a Chat Completions body (system prompt, turns with their tool_use and tool_result
blocks, tools, tool_choice, thinking, sampling) and parsed as one (`openai_api.parse_translated`: the same
checks, bounds and limits, the same worker `Request`, rendered and read back by llama.cpp common); the answer
(`chat.Reply`, or its pieces as they stream) is written back as Anthropic writes it. Its errors are Anthropic's
error object (api_errors.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bmoe_edge.engine import chat
from bmoe_edge.serve import openai_api, params
from bmoe_edge.serve.api_errors import ApiError, bad_request, tools_of_type
from bmoe_edge.serve.worker import Request

# chat's parameter names -> this API's, for the errors parse_chat raises on the translated body
NAMES = {"stop": "stop_sequences", "response_format": "output_config", "think": "thinking",
         "parallel_tool_calls": "tool_choice", "continue_final_message": "messages"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}   # else end_turn (or stop_sequence)



def _text(blocks: Any, where: str, param: str) -> str:
    """A string, or text blocks joined (what a system prompt and a tool_result's content may be)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list) or not all(isinstance(b, Mapping) and b.get("type") == "text"
                                               and isinstance(b.get("text"), str) for b in blocks):
        raise bad_request(f"{where} must be a string or a list of text blocks (only text is supported)", param)
    return "".join(b["text"] for b in blocks)


def _tool_use(block: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant's tool_use block as a Chat Completions tool call (its input as JSON text)."""
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
            or not isinstance(block.get("input"), Mapping):
        raise bad_request("a tool_use block needs 'id', 'name' and 'input' (an object)", "messages")
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}


def _turn(message: Any) -> list[dict[str, Any]]:
    """One Anthropic message as Chat Completions messages: a user turn's tool_result blocks become tool messages
    (first, as Anthropic requires them first), its text a user message; an assistant turn's text and tool_use
    blocks one assistant message. Earlier thinking is dropped, as the templates drop earlier reasoning."""
    role = message.get("role") if isinstance(message, Mapping) else None
    if role not in ("user", "assistant"):
        raise bad_request(f"a message's role must be 'user' or 'assistant', got {role!r:.40}", "messages")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request("a message's content must be a string or a list of content blocks", "messages")
    texts, calls, results = [], [], []
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block))
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad_request("a tool_result block needs 'tool_use_id'", "messages")
            result = _text(block.get("content", ""), "a tool_result's content", "messages")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise bad_request(f"a {role} message's {kind!r:.40} block is not supported: text, tool_use (assistant) and "
                              "tool_result (user) are", "messages")
    if role == "assistant":
        return [{"role": "assistant", "content": "".join(texts)} | ({"tool_calls": calls} if calls else {})]
    return [*results, *([{"role": "user", "content": "".join(texts)}] if texts or not results else [])]


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Custom tools as Chat Completions function tools; a server tool (web search, bash, text editor, computer
    use, ...) is refused: nothing here runs one."""
    tools = tools_of_type(value, "custom", "only custom tools (name, input_schema); server tools are not run here",
                          default="custom")
    if tools is None:
        return None
    out = []
    for tool in tools:
        if not isinstance(tool.get("input_schema"), Mapping):
            raise bad_request(f"the tool {str(tool.get('name'))[:60]!r} needs an 'input_schema' (a JSON schema)",
                              "tools")
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> tuple[Any, bool | None]:
    """Anthropic's tool_choice as Chat Completions' (and parallel_tool_calls: on only when
    disable_parallel_tool_use is false; this server's default, as for Chat Completions, is one call)."""
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, Mapping) else None
    choices = {"auto": "auto", "any": "required", "none": "none"}
    if kind in choices:
        choice: Any = choices[kind]
    elif kind == "tool" and isinstance(value.get("name"), str):
        choice = {"type": "function", "function": {"name": value["name"]}}
    else:
        raise bad_request("'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
                          "tool_choice")
    disabled = value.get("disable_parallel_tool_use")
    if disabled is not None and not isinstance(disabled, bool):
        raise bad_request("'disable_parallel_tool_use' must be true or false", "tool_choice")
    return choice, None if disabled is None else not disabled


def _thinking(value: Any) -> bool | None:
    """enabled (and between_tools) -> reasoning on, disabled -> off, adaptive -> the model's own default (its
    template's); budget_tokens is not enforced (the reasoning counts against max_tokens, as Anthropic's does)."""
    kind = value.get("type") if isinstance(value, Mapping) else value
    switch = {None: None, "adaptive": None, "enabled": True, "between_tools": True, "disabled": False}
    if not isinstance(kind, str | None) or kind not in switch:
        raise bad_request("'thinking' must be {'type': 'enabled', 'budget_tokens': N}, {'type': 'adaptive'} or "
                          "{'type': 'disabled'}", "thinking")
    return switch[kind]


def _output_format(value: Any) -> dict[str, Any] | None:
    """output_config.format (a JSON schema the answer follows) as a response_format; its effort is a hint."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request("'output_config' must be an object", "output_config")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), Mapping):
        raise bad_request("'output_config' must be {'format': {'type': 'json_schema', 'schema': {...}}}",
                          "output_config")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def to_chat(body: Mapping[str, Any], route: params.Route) -> dict[str, Any]:
    """The request as a Chat Completions body. A last assistant message is continued (Anthropic's prefill:
    continue_final_message)."""
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise bad_request("'messages' must be a non-empty list", "messages")
    messages = [m for turn in turns for m in _turn(turn)]
    if body.get("system") is not None:
        messages.insert(0, {"role": "system", "content": _text(body["system"], "'system'", "system")})
    if messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
        raise bad_request("the last message is an assistant's tool_use: its tool_result must follow", "messages")
    choice, parallel = _tool_choice(body.get("tool_choice"))
    chat_body = {"model": body.get("model"), "messages": messages, "tools": _tools(body.get("tools")),
                 "tool_choice": choice, "parallel_tool_calls": parallel, "think": _thinking(body.get("thinking")),
                 "response_format": _output_format(body.get("output_config")),
                 "continue_final_message": messages[-1]["role"] == "assistant" or None,
                 "max_tokens": body.get("max_tokens") if route == "messages" else 1,
                 "stop": body.get("stop_sequences") if route == "messages" else None}
    if route == "messages":
        chat_body["stream"] = body.get("stream")
        chat_body |= {name: body.get(name) for name in params.sampling(route)}
    return chat_body


def parse(body: Any, model_id: str, route: params.Route = "messages") -> Request:
    """A Messages (or count_tokens) request, checked and translated: the worker's Request."""
    openai_api.checked(body, route, model_id)
    return openai_api.parse_translated(to_chat(body, route), model_id, NAMES)


def stop_reason(reply: chat.Reply) -> str:
    return "stop_sequence" if reply.stop_sequence else STOP_REASONS.get(reply.finish_reason, "end_turn")


def usage(reply: chat.Reply) -> dict[str, int]:
    """Anthropic's usage: input_tokens are those not read from the cache (the context's reused prefix is
    cache_read_input_tokens), so the prompt is their sum, which count_tokens gives."""
    return {"input_tokens": reply.prompt_tokens - reply.reused_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": reply.reused_tokens, "output_tokens": reply.completion_tokens}


def _input(arguments: str) -> Any:
    """A call's arguments as tool_use's input (an object; a call cut by max_tokens has none whole)."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}   # no signature: nothing here verifies one


def tool_use_block(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": _input(arguments)}


def message(rid: str, model_id: str, reply: chat.Reply | None, content: list[dict[str, Any]] | None = None
            ) -> dict[str, Any]:
    """The whole answer (or, with no reply, the message_start's empty one)."""
    if reply is not None and content is None:
        content = ([thinking_block(reply.reasoning)] if reply.reasoning else []) \
            + ([{"type": "text", "text": reply.content}] if reply.content else []) \
            + [tool_use_block(c.id, c.name, c.arguments) for c in reply.tool_calls]
    return {"id": rid, "type": "message", "role": "assistant", "model": model_id, "content": content or [],
            "stop_reason": stop_reason(reply) if reply else None,
            "stop_sequence": (reply.stop_sequence or None) if reply else None,
            "usage": usage(reply) if reply else {"input_tokens": 0, "output_tokens": 0}}


class MessageStream:
    """The answer as Anthropic streams it: message_start, then content blocks — each content_block_start, its
    deltas (thinking_delta, text_delta, input_json_delta) and content_block_stop —, message_delta (stop_reason,
    usage) and message_stop; a failure mid-answer is an error event."""

    def __init__(self, rid: str, model_id: str, prompt_tokens: int) -> None:
        self.rid, self.model_id, self.prompt_tokens = rid, model_id, prompt_tokens
        self.blocks = -1   # the index of the last block opened
        self.open: Any = None   # what it holds: "thinking", "text" or ("tool", the call's index)

    def head(self) -> list[dict[str, Any]]:
        start = message(self.rid, self.model_id, None)
        start["usage"] = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        return [{"type": "message_start", "message": start}]

    def _close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.blocks}]

    def _into(self, what: Any, block: dict[str, Any]) -> list[dict[str, Any]]:
        """Events that make `what` the open block (closing the one before), if it is not already."""
        if self.open == what:
            return []
        out = self._close()
        self.blocks += 1
        self.open = what
        return [*out, {"type": "content_block_start", "index": self.blocks, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.blocks, "delta": delta}

    def chunk(self, d: chat.Delta) -> list[dict[str, Any]]:
        out = []
        if d.reasoning:
            out += self._into("thinking", thinking_block(""))
            out.append(self._delta({"type": "thinking_delta", "thinking": d.reasoning}))
        if d.content:
            out += self._into("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": d.content}))
        for call in d.tool_calls:
            if call.name:
                out += self._into(("tool", call.index), {"type": "tool_use", "id": call.id, "name": call.name,
                                                         "input": {}})
            if call.arguments and self.open == ("tool", call.index):
                out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return out

    def last(self, reply: chat.Reply) -> list[dict[str, Any]]:
        return [*self._close(),
                {"type": "message_delta", "delta": {"stop_reason": stop_reason(reply),
                                                    "stop_sequence": reply.stop_sequence or None},
                 "usage": usage(reply)},
                {"type": "message_stop"}]

    def failed(self, status: int, message: str) -> list[dict[str, Any]]:
        return [ApiError(status, message, type="server_error").anthropic_body()]
