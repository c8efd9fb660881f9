"""Conversations on the engine through llama.cpp's own chat layer (`common`, native/src/engine/chat.cpp): the
model's template rendered by its Jinja engine (tools, earlier tool calls and results, thinking on or off,
the template's own switches), the grammar a forced tool call or a response_format needs, and the answer
read back into reasoning, content and tool calls as it streams, for each of the formats common knows.
Here: stop strings, the control-token rule, and the context kept from one turn to the next so that only
what is new gets decoded (docs/serve.md)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bmoe_edge.engine import native
from bmoe_edge.engine.generation import Generation, PositionLogprobs, Sampling, Token, TokenMetrics
from bmoe_edge.engine.tools import ToolCall, call_id, text_parts
from bmoe_edge.errors import BmoeError, RequestError

ROLES = ("system", "user", "assistant", "tool")
FALLBACK_TEMPLATE = "chatml"  # common's own ChatML: what a model without a template gets


class ChatEngine(Protocol):
    """What a conversation needs of the engine: `session.Engine` is one (it imports this module for
    `Engine.chat`, so this module names the engine by what it uses, not by importing it)."""

    @property
    def chat_template(self) -> str: ...

    def chat_templates(self, source: str = "") -> Any: ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool | None = None) -> list[int]: ...

    def generate(self, prompt: str | list[int], max_tokens: int, sampling: Sampling | None = None, *,
                 logits: bool = False, result: Generation | None = None,
                 reuse_kv: bool = False) -> Iterator[Token]: ...

    def reset(self) -> None: ...

    def save_state(self, path: str | Path) -> None: ...

    def load_state(self, path: str | Path) -> None: ...


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    reasoning: str = ""  # an answer's reasoning, kept for the user; not sent back to the template

    def openai(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Template:
    native: Any  # native.ChatTemplates
    origin: str  # "model", "given" or "fallback"
    note: str = ""  # what the user should hear once (why the fallback)

    @property
    def source(self) -> str:
        return self.native.source

    @functools.cached_property
    def reasons(self) -> bool:
        """The template's answers reason (in the markers common found for it)."""
        return bool(self.native.supports_thinking)

    @functools.cached_property
    def thinking(self) -> bool:
        """The template has a switch for reasoning: enable_thinking changes what it renders."""
        n = native.load()
        rendered = []
        for on in (True, False):
            inputs = n.ChatInputs()
            inputs.messages_json = '[{"role": "user", "content": "x"}]'
            inputs.tool_choice = "none"
            inputs.enable_thinking = on
            with native.engine_errors():
                rendered.append(self.native.apply(inputs).prompt)
        return rendered[0] != rendered[1]


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of one tool call as it streams (OpenAI's `delta.tool_calls[i]`): the first carries its id
    and name, the rest more of its arguments."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.name:
            out |= {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        else:
            out["function"] = {"arguments": self.arguments}
        return out


@dataclass(frozen=True)
class Delta:
    """A piece of an answer as it arrives: text of the answer, text of the reasoning, pieces of tool calls,
    or none of them (a token still held back, e.g. the start of a possible stop string)."""

    content: str = ""
    reasoning: str = ""
    token: Token | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # The log-probabilities of the tokens behind a piece that is not one generated token (serve's echo of
    # a prompt); a generated token's are its own (token.logprobs).
    logprobs: tuple[PositionLogprobs, ...] = ()


@dataclass
class Reply:
    """One answer, complete once its iterator is exhausted (or interrupted: then what arrived)."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str = ""  # "stop", "length" or "tool_calls" (OpenAI's words)
    stop_sequence: str = ""  # the request's stop string that ended it, if one did
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose keys and values the context already held
    metrics: list[TokenMetrics] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class Turn:
    """What a conversation asks of the template beyond its messages (OpenAI's request fields)."""

    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"  # "auto", "none", "required" or one tool's name
    json_schema: Mapping[str, Any] | None = None  # response_format: the answer is JSON following it
    think: bool | None = None  # None: the template's default
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # the template's own switches (reasoning_effort)
    continue_final: bool = False  # the last (assistant) message is continued
    parallel: bool = False  # several tool calls in one answer; else the answer ends after its first call


def _source(given: str) -> str:
    path = Path(given)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if given == FALLBACK_TEMPLATE or "{{" in given or "{%" in given:
        return given
    raise BmoeError(f"the chat template {given!r} is neither a file with a model's Jinja template nor "
                    f"{FALLBACK_TEMPLATE!r}")


def _renders(templates: Any) -> str:
    """Why the template cannot render a plain conversation ("" when it can)."""
    try:
        render(Template(templates, "check"), [{"role": "user", "content": "x"}])
    except BmoeError as exc:
        return str(exc)
    return ""


def template_for(engine: ChatEngine, given: str | None = None) -> Template:
    """The template a conversation uses: `given` (a Jinja file or source, or "chatml"), else the model's,
    else ChatML with a note saying why."""
    if given:
        with native.engine_errors():
            templates = engine.chat_templates(_source(given))
        why = _renders(templates)
        if why:
            raise BmoeError(f"the chat template {given!r} does not work: {why}")
        return Template(templates, "given")
    if not engine.chat_template:
        return Template(engine.chat_templates(FALLBACK_TEMPLATE), "fallback",
                        note="the model has no chat template (tokenizer.chat_template): using ChatML")
    try:
        templates = engine.chat_templates()
        why = _renders(templates)
    except BmoeError as exc:
        why = str(exc)
    if why:
        return Template(engine.chat_templates(FALLBACK_TEMPLATE), "fallback",
                        note=f"the model's chat template does not work here ({why[:200]}): using ChatML "
                             "(--chat-template picks another)")
    return Template(templates, "model")


def as_message(m: Message | Mapping[str, Any]) -> Message:
    if isinstance(m, Message):
        return m
    role, content = m.get("role"), m.get("content")
    if role not in ROLES:
        raise BmoeError(f"a message's role must be one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(content, list):  # OpenAI's content parts: the text ones
        content = text_parts(content, role)
    if not isinstance(content, str):
        raise BmoeError(f"a {role} message needs text content")
    return Message(role, content)


def _openai(m: Message | Mapping[str, Any]) -> Mapping[str, Any]:
    return m.openai() if isinstance(m, Message) else m


def render(template: Template, messages: Sequence[Message | Mapping[str, Any]], turn: Turn = Turn()) -> Any:
    """The prompt for the assistant's next turn, and how to sample and read the answer (a native
    ChatPrompt: text, grammar, lazy triggers, the answer's parser)."""
    if not messages:
        raise BmoeError("a conversation needs at least one message")
    n = native.load()
    inputs = n.ChatInputs()
    inputs.messages_json = json.dumps([_openai(m) for m in messages], ensure_ascii=False)
    if turn.tools:
        inputs.tools_json = json.dumps(list(turn.tools), ensure_ascii=False)
        named = turn.tool_choice not in ("auto", "none", "required")
        inputs.tool_choice = "required" if named else turn.tool_choice
        inputs.tool_name = turn.tool_choice if named else ""
    else:
        inputs.tool_choice = "none"
    if turn.json_schema is not None:
        inputs.json_schema = json.dumps(turn.json_schema, ensure_ascii=False)
    think = turn.think
    forced = (turn.tools and turn.tool_choice not in ("auto", "none")) or turn.json_schema is not None
    if think is None and forced:   # the grammar from the first token: no open-ended reasoning before it
        think = False
    if think is False and not template.thinking and not forced:
        raise BmoeError("this model's chat template has no switch for reasoning (thinking): drop --no-think")
    inputs.enable_thinking = think is not False
    # a forced call without reasoning starts right away: the answer opens with the call (common's grammar
    # alone would let text come first, for as long as the model likes)
    inputs.start_with_call = bool(turn.tools) and turn.tool_choice not in ("auto", "none") and think is False
    inputs.continue_final_message = turn.continue_final
    inputs.parallel_tool_calls = turn.parallel
    if turn.kwargs:
        inputs.template_kwargs_json = json.dumps(dict(turn.kwargs), ensure_ascii=False)
    with native.engine_errors():
        return template.native.apply(inputs)


def prompt_tokens(engine: ChatEngine, prompt: Any, messages: Sequence[Message | Mapping[str, Any]],
                  parse_special: bool = False) -> list[int]:
    """Tokenize a rendered prompt. The template's own markers are control tokens; text a user wrote that
    spells one (e.g. "<|im_end|>") is refused unless `parse_special`, so nobody can forge a turn."""
    check_text(engine, [_plain(m) if isinstance(m, Mapping) else m for m in messages], parse_special)
    return engine.tokenize(prompt.prompt, True, True)


def _plain(m: Mapping[str, Any]) -> Message:
    content = m.get("content")
    if isinstance(content, list):
        content = text_parts(content, str(m.get("role")))
    return Message(str(m.get("role")), content if isinstance(content, str) else "")


def check_text(engine: ChatEngine, messages: Sequence[Message], parse_special: bool = False) -> None:
    """Refuse message text that spells a control token (unless `parse_special`)."""
    if parse_special:
        return
    for m in messages:
        if engine.tokenize(m.content, False, True) != engine.tokenize(m.content, False, False):
            raise BmoeError(f"a {m.role} message contains the text of one of the model's control tokens; "
                            "remove it (or allow it with --parse-special)")


def check_strings(engine: ChatEngine, fields: Sequence[tuple[str, str]], parse_special: bool = False) -> None:
    """Refuse any of a template's inputs (`(where, text)`: tool names, descriptions and schemas, tool-call
    names and arguments, a message's `name` or `tool_call_id`, ...) that spells a control token: the
    rendered prompt is tokenized with control tokens parsed, so each of them could forge a turn."""
    if parse_special or not fields:
        return
    joined = "\n".join(text for _, text in fields)
    if engine.tokenize(joined, False, True) == engine.tokenize(joined, False, False):
        return
    for where, text in fields:
        if engine.tokenize(text, False, True) != engine.tokenize(text, False, False):
            raise BmoeError(f"{where} contains the text of one of the model's control tokens; remove it "
                            "(or allow it with --parse-special)")
    raise BmoeError("the conversation contains the text of one of the model's control tokens; remove it "
                    "(or allow it with --parse-special)")


def schema_grammar(schema: Any) -> str:
    """GBNF for a JSON schema (common's json_schema_to_grammar), for text that is not a chat."""
    with native.engine_errors():
        return native.load().json_schema_grammar(json.dumps(schema, ensure_ascii=False))


def constrained(sampling: Sampling | None, prompt: Any) -> Sampling:
    """`sampling` with the prompt's grammar: lazy (from a tool call's opening on) or from the first token
    (fed the assistant turn's opening first, which a chat format's grammar starts with)."""
    sampling = sampling or Sampling()
    if not prompt.grammar or sampling.grammar == prompt.grammar:   # none, or constrained already (serve's prepare)
        return sampling
    if sampling.grammar:
        raise RequestError("a grammar of the request and a tool call's or response_format's grammar cannot be "
                           "combined")
    if prompt.grammar_lazy:
        if not prompt.triggers:
            return sampling
        return dataclasses.replace(sampling, grammar=prompt.grammar, grammar_triggers="\n".join(prompt.triggers))
    return dataclasses.replace(sampling, grammar=prompt.grammar, grammar_prefill=prompt.generation_prompt)


class StopStrings:
    """Holds back text that may begin a stop string; says when one has appeared.

    Linear in the text: each stop string is matched by its Knuth-Morris-Pratt automaton, one state per
    string (the longest prefix of it that the text ends with) carried from one piece to the next, so a
    token costs its own characters, not the held-back text again (which is shorter than the longest
    stop string). The earliest stop string to end wins (the longest, of those ending at one character)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.fail = [_kmp_failure(s) for s in self.stops]
        self.state = [0] * len(self.stops)
        self.held = ""
        self.stopped = False
        self.matched = ""   # the stop string that ended the text (Anthropic's answer names it)

    def feed(self, text: str) -> str:
        if not self.stops:
            return text
        if self.stopped:
            return ""
        start = len(self.held)
        self.held += text
        for at in range(start, len(self.held)):
            c = self.held[at]
            ended = 0
            for i, stop in enumerate(self.stops):
                k, fail = self.state[i], self.fail[i]
                while k and stop[k] != c:
                    k = fail[k - 1]
                if stop[k] == c:
                    k += 1
                if k == len(stop):
                    if k > ended:
                        ended, self.matched = k, stop
                    k = fail[k - 1]
                self.state[i] = k
            if ended:
                self.stopped = True
                out, self.held = self.held[: at + 1 - ended], ""
                return out
        keep = max(self.state)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def _kmp_failure(s: str) -> list[int]:
    """fail[i]: the longest proper prefix of s[: i + 1] that is also its suffix."""
    fail = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class AnswerReader:
    """The answer as it streams, read by common's parser for the prompt's format: each update's pieces
    (reasoning, content, tool-call pieces), and the reply they add up to."""

    def __init__(self, prompt: Any, out: Reply, *, parallel: bool = True) -> None:
        self.parser = native.load().ChatParser(prompt)
        self.out = out
        self.ids: list[str] = []  # each tool call's id, the same streamed or not
        self.max_calls = None if parallel else 1
        self.done = False  # the answer is complete: its call is whole, or one call too many began
        self.extra = False  # ... the latter (the text read last is not part of the answer)

    def feed(self, text: str, token: Token | None, last: bool = False) -> Delta:
        reasoning, content, calls = "", "", []
        for d in self.parser.update(text, last):
            if d.tool_index >= 0 and self.max_calls is not None and d.tool_index >= self.max_calls:
                continue
            reasoning += d.reasoning
            content += d.content
            if d.tool_index >= 0:
                if d.tool_index >= len(self.ids):
                    self.ids.append(d.id or call_id())
                calls.append(ToolCallDelta(d.tool_index, self.ids[d.tool_index] if d.name else "", d.name,
                                           d.arguments))
        # common's grammars allow more calls than were asked for: one more beginning ends the answer
        if self.max_calls is not None and not last:
            self.extra = self.done = self.parser.calls_begun > self.max_calls
        self.out.reasoning += reasoning
        self.out.content += content
        if last or self.extra:
            self.out.tool_calls = [ToolCall(self.ids[i], c.name, c.arguments)
                                   for i, c in enumerate(self.parser.tool_calls[: len(self.ids)])]
        return Delta(content, reasoning, token, tuple(calls))


def reply(engine: ChatEngine, messages: Sequence[Message | Mapping[str, Any]], max_tokens: int,
          sampling: Sampling | None = None, *, think: bool | None = None, template: str | Template | None = None,
          stop: Sequence[str] = (), parse_special: bool = False, result: Reply | None = None,
          prompt: Any = None, prompt_ids: Sequence[int] | None = None, reuse_kv: bool = True,
          parallel: bool = False) -> Iterator[Delta]:
    """Answer the conversation, yielding the answer as it comes. The context keeps its longest common
    prefix with the rendered conversation, so a conversation's next turn decodes only its new tokens.
    `prompt`, `prompt_ids`: the conversation already rendered (`render`) and tokenized (`prompt_tokens`).
    `parallel`: several tool calls may come; else the answer ends when a second one begins (without it)."""
    if prompt is None:
        messages = [as_message(m) for m in messages]
        tmpl = template if isinstance(template, Template) else template_for(engine, template)
        prompt = render(tmpl, messages, Turn(think=think))
    if prompt_ids is None:
        prompt_ids = prompt_tokens(engine, prompt, messages, parse_special)
    ids = list(prompt_ids)
    out = result if result is not None else Reply()
    out.prompt_tokens = len(ids)
    gen = Generation(ids)
    stops = StopStrings([*stop, *prompt.additional_stops])
    reader = AnswerReader(prompt, out, parallel=parallel)
    for token in engine.generate(ids, max_tokens, constrained(sampling, prompt), result=gen, reuse_kv=reuse_kv):
        out.completion_tokens += 1
        out.reused_tokens = gen.reused_tokens
        out.metrics.append(token.metrics)
        yield reader.feed(stops.feed(token.text), token)
        if stops.stopped or reader.done:
            break
    out.reused_tokens = gen.reused_tokens
    if not reader.extra:
        last = reader.feed("" if stops.stopped else stops.flush(), None, last=True)
        if last.content or last.reasoning or last.tool_calls:
            yield last
    ended = stops.stopped or reader.done or gen.stop_reason == "end_of_generation"
    out.finish_reason = "stop" if ended else "length"
    out.stop_sequence = stops.matched if stops.matched in stop else ""
    # a call cut by max_tokens (its arguments not whole JSON) is not a call to make: "length"
    if out.tool_calls and (ended or all(_whole_json(c.arguments) for c in out.tool_calls)):
        out.finish_reason = "tool_calls"


def _whole_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


class Session:
    """A conversation: its messages, and the engine's context that holds them between turns."""

    def __init__(self, engine: ChatEngine, *, system: str | None = None, template: str | None = None,
                 think: bool | None = None, sampling: Sampling | None = None, max_tokens: int = 512,
                 stop: Sequence[str] = (), parse_special: bool = False) -> None:
        self.engine = engine
        self.template = template_for(engine, template)
        self.think = think
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.stop = tuple(stop)
        self.parse_special = parse_special
        self.system = system
        self.messages: list[Message] = [Message("system", system)] if system else []
        self.last = Reply()

    def send(self, text: str) -> Iterator[Delta]:
        """Add the user's message and stream the answer; the answer (what arrived of it, when the caller
        stops early) joins the conversation."""
        self.messages.append(Message("user", text))
        result = Reply()
        try:
            yield from reply(self.engine, self.messages, self.max_tokens, self.sampling, think=self.think,
                             template=self.template, stop=self.stop, parse_special=self.parse_special,
                             result=result)
        finally:
            self.messages.append(Message("assistant", result.content, result.reasoning))
            self.last = result

    def reset(self) -> None:
        self.messages = [Message("system", self.system)] if self.system else []
        self.engine.reset()

    def save(self, path: str | Path) -> list[Path]:
        """The context to `path` (llama.cpp's state file) and the messages to `path`.json."""
        state, conversation = Path(path), Path(f"{path}.json")
        self.engine.save_state(state)
        conversation.write_text(json.dumps({"messages": [asdict(m) for m in self.messages]}, indent=1),
                                encoding="utf-8")
        return [state, conversation]

    def load(self, path: str | Path) -> None:
        conversation = Path(f"{path}.json")
        try:
            data = json.loads(conversation.read_text(encoding="utf-8"))
            messages = [Message(**m) for m in data["messages"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BmoeError(f"{conversation} is not a saved conversation: {exc}") from None
        self.engine.load_state(path)
        self.messages = messages
