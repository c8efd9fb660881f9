"""Tool calling: `tools` rendered into the prompt by the model's own Jinja chat template, and the model's
tool calls parsed out of its answer into OpenAI's `tool_calls`.

llama.cpp's built-in template matcher (`llama_chat_apply_template`) cannot render tools: it recognises a
family and writes plain role/content turns. The model's template itself can, so a conversation with
tools (or with earlier tool calls and results) is rendered from the template's Jinja source by jinja2 in
a sandbox, the way Hugging Face's tokenizers render it (`trim_blocks`, `lstrip_blocks`, `tojson`,
`raise_exception`). How a family writes a call is data: TOOL_STYLES."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bmoe_edge.engine import grammar
from bmoe_edge.errors import BmoeError


@dataclass(frozen=True)
class ToolStyle:
    """How a template family marks a tool call: `start` JSON `end`, the JSON {"name", "arguments"}."""

    name: str
    marker: str  # found in a template's source: this family
    start: str
    end: str


# The first row whose marker the template contains wins.
TOOL_STYLES = (
    # Qwen2.5/Qwen3, Hermes 2/3, and templates derived from them: <tool_call>{"name":…,"arguments":…}</tool_call>
    ToolStyle("hermes", marker="<tool_call>", start="<tool_call>", end="</tool_call>"),
)


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


def tool_style(source: str) -> ToolStyle | None:
    """The family's tool style, when the template renders `tools` (a Jinja source that uses them)."""
    if "tools" not in source:
        return None
    return next((s for s in TOOL_STYLES if s.marker in source), None)


def _raise(message: str) -> None:
    raise BmoeError(f"the chat template refused the conversation: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def render(source: str, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None,
           think: bool | None = None, bos_token: str = "", eos_token: str = "",
           variables: Mapping[str, Any] | None = None) -> str:
    """The prompt for the assistant's next turn, rendered by the template's own Jinja source
    (`variables`: more of the template's own switches, e.g. gpt-oss's `reasoning_effort`)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    extra: dict[str, Any] = {} if think is None else {"enable_thinking": think}
    extra.update(variables or {})
    try:
        return env.from_string(source).render(messages=list(messages), tools=list(tools) if tools else None,
                                              add_generation_prompt=True, bos_token=bos_token,
                                              eos_token=eos_token, **extra)
    except TemplateError as exc:
        raise BmoeError(f"the model's chat template failed on this conversation: {exc}") from None


def text_parts(parts: list[Any], role: str) -> str:
    """OpenAI's content parts: the text of the text ones (each must be a string)."""
    texts = [p.get("text", "") for p in parts if isinstance(p, Mapping) and p.get("type") == "text"]
    if not all(isinstance(t, str) for t in texts):
        raise BmoeError(f"a {role} message's text part must have a string 'text'")
    return "".join(texts)


def message_dict(m: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI message as a template sees it: text content (parts joined), tool calls with their
    arguments parsed (templates write them with `tojson`, or as given when they are text)."""
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
            args = json.loads(args or "{}")
        except ValueError:
            raise BmoeError(f"the arguments of the tool call {fn['name']!r} are not JSON") from None
    return {"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}}


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
    control-token check looks at."""
    out: list[tuple[str, str]] = []
    todo: list[tuple[str, Any]] = [(f"message {i}", m) for i, m in enumerate(messages)]
    todo += [(f"tool {i}", t) for i, t in enumerate(tools)]
    while todo:
        where, value = todo.pop()
        if isinstance(value, str):
            out.append((where, value))
        elif isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(k, str):
                    out.append((f"{where}: a key", k))
                todo.append((f"{where}: {k}" if isinstance(k, str) else where, v))
        elif isinstance(value, list | tuple):
            todo.extend((where, v) for v in value)
    return out


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def parse_call(text: str) -> ToolCall | None:
    """The JSON between a style's markers as a call; None when it is not one (then it stays text)."""
    try:
        data = json.loads(text)
        if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
            return None
        args = data.get("arguments", data.get("parameters", {}))
        return ToolCall(call_id(), data["name"],
                        args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
    except (ValueError, RecursionError):   # not JSON, or nested past the recursion limit: text
        return None


class ToolCallSplit:
    """Splits an answer as it streams into text and tool calls: text outside the markers passes on,
    a marked call is held until it closes, then parsed (one that does not parse stays text)."""

    def __init__(self, style: ToolStyle) -> None:
        self.style = style
        self.held = ""
        self.inside = False
        self.after_call = False  # the line breaks right after a call are not content

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.held += text
        out, calls = "", []
        while True:
            if not self.inside:
                if self.after_call:
                    self.held = self.held.lstrip("\n")
                    self.after_call = not self.held
                at = self.held.find(self.style.start)
                if at < 0:
                    keep = _partial_suffix(self.held, self.style.start)
                    out += self.held[: len(self.held) - keep]
                    self.held = self.held[len(self.held) - keep:]
                    return out, calls
                out += self.held[:at]
                self.held = self.held[at:]
                self.inside = True
            end = self.held.find(self.style.end)
            if end < 0:
                return out, calls
            block = self.held[: end + len(self.style.end)]
            self.held = self.held[end + len(self.style.end):]
            self.inside = False
            call = parse_call(block[len(self.style.start): -len(self.style.end)].strip())
            if call is None:
                out += block
            else:
                calls.append(call)
                self.after_call = True

    def flush(self) -> tuple[str, list[ToolCall]]:
        """The end of the answer: a call left open (cut by max_tokens) is parsed if it is whole JSON."""
        held, self.held = self.held, ""
        if self.inside:
            self.inside = False
            call = parse_call(held[len(self.style.start):].strip())
            if call is not None:
                return "", [call]
        return held, []


def _partial_suffix(text: str, marker: str) -> int:
    return max((k for k in range(1, len(marker)) if text.endswith(marker[:k])), default=0)


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


def call_grammar(style: ToolStyle, tools: Sequence[Mapping[str, Any]], only: str | None = None) -> str:
    """GBNF for an answer that is one tool call in the style's markers, the arguments following each
    tool's `parameters` schema (tool_choice "required" or a named function)."""
    conv = grammar._Converter({})
    options = []
    for t in tools:
        fn = t["function"]
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") or {"type": "object"}
        conv.root, conv.refs = params, {}   # each tool's $refs are its own
        with grammar.converting():
            args = conv.visit(params, f"args-{fn['name']}")
        options.append(f'"{{" ws "\\"name\\"" ws ":" ws {grammar.literal(json.dumps(fn["name"]))} ws "," ws '
                       f'"\\"arguments\\"" ws ":" ws {args} "}}"')
    call = " | ".join(f"( {o} )" for o in options)
    root = f'{grammar.literal(style.start + chr(10))} ( {call} ) {grammar.literal(chr(10) + style.end)}'
    return grammar._grammar(root, {**conv.rules, **grammar.JSON_RULES})
