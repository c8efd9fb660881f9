"""Tool calling, what llama.cpp's chat layer (engine/chat.py) does not do: OpenAI's `tools`, `tool_choice`
and messages checked into the shapes it takes, every string a template is given (for the control-token
check), and the call ids of OpenAI's `tool_calls`. Rendering, the grammar of a forced call and parsing the
calls out of the answer are common's, for each format it knows."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bmoe_edge.errors import BmoeError


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


def text_parts(parts: list[Any], role: str) -> str:
    """OpenAI's content parts: the text of the text ones (each must be a string)."""
    texts = [p.get("text", "") for p in parts if isinstance(p, Mapping) and p.get("type") == "text"]
    if not all(isinstance(t, str) for t in texts):
        raise BmoeError(f"a {role} message's text part must have a string 'text'")
    return "".join(texts)


def message_dict(m: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI message as common takes it: text content (parts joined), tool calls with JSON text as
    their arguments."""
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise BmoeError(f"a message's role must be one of system, user, assistant, tool, got {role!r}")
    content = m.get("content")
    if isinstance(content, list):
        content = text_parts(content, str(role))
    if content is None and role == "assistant" and m.get("tool_calls"):
        content = ""
    if not isinstance(content, str):
        raise BmoeError(f"a {role} message needs text content")
    out: dict[str, Any] = {"role": role, "content": content}
    calls = m.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise BmoeError("an assistant message's 'tool_calls' must be a list")
        out["tool_calls"] = [_call_for_template(c) for c in calls]
    for key in ("tool_call_id", "name"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def _call_for_template(call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise BmoeError("each tool call needs 'function': {'name': ..., 'arguments': ...}")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            # the decoded text too must be Unicode: JSON's "\ud800" escape decodes to a lone surrogate, which
            # common (and every encoder after it) cannot take
            json.dumps(json.loads(args or "{}"), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:   # (a ValueError too: first)
            raise BmoeError(f"the arguments of the tool call {fn['name']!r} decode to text that is not valid "
                            "Unicode (a lone surrogate escape such as \\ud800)") from None
        except (ValueError, RecursionError):
            raise BmoeError(f"the arguments of the tool call {fn['name']!r} are not JSON") from None
    else:
        args = json.dumps(args, ensure_ascii=False)
    out: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": args or "{}"}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI's `tools`: a list of {"type": "function", "function": {"name", "description"?, "parameters"?}}."""
    if not isinstance(tools, list) or not tools:
        raise BmoeError("'tools' must be a non-empty list")
    for t in tools:
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(fn, Mapping) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BmoeError("each of 'tools' must be {'type': 'function', 'function': {'name': ..., "
                           "'parameters': ...}}")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise BmoeError(f"the description of the tool {fn['name']!r} must be a string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], Mapping):
            raise BmoeError(f"the parameters of the tool {fn['name']!r} must be a JSON schema (an object)")
    return [dict(t) for t in tools]


def template_inputs(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
                    ) -> list[tuple[str, str]]:
    """Every string a template is given, keys included, each with where it came from: what the
    control-token check looks at. A tool call's `arguments` are JSON text that common decodes and the template
    writes back (`tojson`), so "\\u003c|im_end|\\u003e" in them reaches the prompt as the control token itself:
    the strings of the decoded arguments are given too."""
    out: list[tuple[str, str]] = []
    todo: list[tuple[str, Any]] = [(f"message {i}", m) for i, m in enumerate(messages)]
    todo += [(f"tool {i}", t) for i, t in enumerate(tools)]
    while todo:
        where, value = todo.pop()
        if isinstance(value, str):
            out.append((where, value))
            if where.endswith(": arguments"):
                todo.append((f"{where} (decoded)", _decoded(value)))
        elif isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(k, str):
                    out.append((f"{where}: a key", k))
                todo.append((f"{where}: {k}" if isinstance(k, str) else where, v))
        elif isinstance(value, list | tuple):
            todo.extend((where, v) for v in value)
    return out


def _decoded(arguments: str) -> Any:
    """A tool call's JSON arguments as common reads them (None when they are not JSON: refused elsewhere)."""
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return None


ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def call_id() -> str:
    """A tool call's id: 9 letters and digits, the one shape every vendored template takes (Mistral's
    refuse any other); opaque to OpenAI's clients, which only send it back."""
    return "".join(secrets.choice(ID_CHARS) for _ in range(9))


TOOL_CHOICES = ("auto", "none", "required")


def tool_choice(value: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
    """OpenAI's `tool_choice`: "auto" (default), "none", "required", or one named function (its name)."""
    if value is None or value == "auto":
        return "auto"
    if value in ("none", "required"):
        return value
    fn = value.get("function") if isinstance(value, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
        raise BmoeError("'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                        "{'name': <one of the tools>}}")
    return name
