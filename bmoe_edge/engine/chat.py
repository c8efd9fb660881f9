"""Conversations on the engine: the model's chat template rendered by llama.cpp's own template engine,
thinking control, the reasoning kept apart from the answer, stop strings, and the context kept from
one turn to the next so that only what is new gets decoded (docs/chat.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bmoe_edge.engine import native
from bmoe_edge.engine.generation import Generation, PositionLogprobs, Sampling, Token, TokenMetrics
from bmoe_edge.engine.tools import ToolCall, ToolCallSplit, ToolStyle, text_parts
from bmoe_edge.errors import BmoeError

ROLES = ("system", "user", "assistant", "tool")
FALLBACK_TEMPLATE = "chatml"  # a llama.cpp built-in: what a model without a template gets


class ChatEngine(Protocol):
    """What a conversation needs of the engine: `session.Engine` is one (it imports this module for
    `Engine.chat`, so this module names the engine by what it uses, not by importing it)."""

    @property
    def chat_template(self) -> str: ...

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
    reasoning: str = ""  # an answer's reasoning, kept for the user; templates do not send it back


@dataclass(frozen=True)
class ThinkingStyle:
    """How a template family marks reasoning, and how (if at all) it is switched off."""

    name: str
    marker: str  # found in a template's source: this family
    start: str
    end: str
    off_suffix: str = ""  # appended to the assistant's opening to answer without reasoning; "" = no switch


# The first row whose marker the template contains wins.
THINKING_STYLES = (
    # Qwen3's template: `enable_thinking=false` writes an empty reasoning block into the assistant's turn.
    ThinkingStyle("qwen3", marker="enable_thinking", start="<think>", end="</think>",
                  off_suffix="<think>\n\n</think>\n\n"),
    # DeepSeek-R1, GLM-4.5, MiniMax-M2 and others reason in <think> tags without a switch.
    ThinkingStyle("think-tags", marker="<think>", start="<think>", end="</think>"),
)


@dataclass(frozen=True)
class Template:
    source: str  # a Jinja source as a gguf stores it, or a llama.cpp built-in name
    origin: str  # "model", "given" or "fallback"
    thinking: ThinkingStyle | None
    note: str = ""  # what the user should hear once (why the fallback)


@dataclass(frozen=True)
class Delta:
    """A piece of an answer as it arrives: text of the answer, text of the reasoning, or neither (a
    token still held back, e.g. the start of a possible stop string)."""

    content: str = ""
    reasoning: str = ""
    token: Token | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # calls that closed with this piece (engine/tools.py)
    # The log-probabilities of the tokens behind a piece that is not one generated token (serve's echo of
    # a prompt); a generated token's are its own (token.logprobs).
    logprobs: tuple[PositionLogprobs, ...] = ()


@dataclass
class Reply:
    """One answer, complete once its iterator is exhausted (or interrupted: then what arrived)."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str = ""  # "stop" or "length" (OpenAI's words)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose keys and values the context already held
    metrics: list[TokenMetrics] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)


def thinking_style(source: str) -> ThinkingStyle | None:
    return next((s for s in THINKING_STYLES if s.marker in source), None)


def builtin_templates() -> list[str]:
    return list(native.load().builtin_chat_templates())


def _recognised(source: str) -> bool:
    n = native.load()
    try:
        n.apply_chat_template(source, [n.ChatMessage("user", "x")], True)
    except n.EngineError:
        return False
    return True


def template_for(engine: ChatEngine, given: str | None = None) -> Template:
    """The template a conversation uses: `given` (a built-in name or a Jinja file), else the model's,
    else ChatML with a note saying why."""
    if given:
        source = Path(given).read_text(encoding="utf-8") if Path(given).is_file() else given
        if not _recognised(source):
            raise BmoeError(f"llama.cpp does not recognise the chat template {given!r}: give one of "
                            f"{', '.join(builtin_templates())} or a file with a model's template")
        return Template(source, "given", thinking_style(source))
    own = engine.chat_template
    if not own:
        return Template(FALLBACK_TEMPLATE, "fallback", None,
                        note="the model has no chat template (tokenizer.chat_template): using ChatML")
    if not _recognised(own):
        return Template(FALLBACK_TEMPLATE, "fallback", None,
                        note="llama.cpp does not recognise the model's chat template: using ChatML "
                             "(--chat-template picks another)")
    return Template(own, "model", thinking_style(own))


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


def render(template: Template, messages: Sequence[Message], *, think: bool | None = None) -> str:
    """The prompt text for the assistant's next turn."""
    if not messages:
        raise BmoeError("a conversation needs at least one message")
    n = native.load()
    with native.engine_errors():
        text = n.apply_chat_template(template.source, [n.ChatMessage(m.role, m.content) for m in messages], True)
    if think is False:
        style = template.thinking
        if style is None or not style.off_suffix:
            raise BmoeError("this model's chat template has no switch for reasoning (thinking): drop --no-think")
        text += style.off_suffix
    return text


def prompt_tokens(engine: ChatEngine, template: Template, messages: Sequence[Message], *, think: bool | None = None,
                  parse_special: bool = False) -> list[int]:
    """Render and tokenize. The template's own markers are control tokens; text a user wrote that spells
    one (e.g. "<|im_end|>") is refused unless `parse_special`, so nobody can forge a turn."""
    check_text(engine, messages, parse_special)
    return engine.tokenize(render(template, messages, think=think), True, True)


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


HARMONY = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")  # gpt-oss's message framing (control tokens)
HARMONY_REASONING = ("analysis",)  # channels whose text is reasoning; final/commentary are the answer


def harmony_ids(engine: ChatEngine) -> dict[str, int] | None:
    """The ids of gpt-oss's Harmony control tokens, when the model's vocabulary has them all (its
    answer then arrives as channels: the engine prints no control token, so they are told apart by id)."""
    ids = {}
    for marker in HARMONY:
        found = engine.tokenize(marker, False, True)
        if len(found) != 1 or found == engine.tokenize(marker, False, False):
            return None
        ids[marker] = found[0]
    return ids


class HarmonySplit:
    """gpt-oss's answer as it streams: `<|channel|>NAME<|message|>TEXT<|end|>`, repeated (each new message
    opened by `<|start|>assistant`); the analysis channel is reasoning, the rest the answer."""

    def __init__(self, ids: Mapping[str, int]) -> None:
        self.by_id = {v: k for k, v in ids.items()}
        self.part = "header"   # header (role, channel name) | body
        self.channel = ""

    def feed(self, token_id: int | None, text: str) -> tuple[str, str]:
        """(reasoning, answer) text of this token."""
        marker = self.by_id.get(token_id) if token_id is not None else None
        if marker == "<|channel|>":
            self.part, self.channel = "channel", ""
        elif marker == "<|message|>":
            self.part = "body"
        elif marker in ("<|end|>", "<|start|>"):
            self.part = "header"
        elif self.part == "channel":
            self.channel += text
        elif self.part == "body":
            reasoning = self.channel.split(" ")[0].strip() in HARMONY_REASONING
            return (text, "") if reasoning else ("", text)
        return "", ""


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
                    ended = max(ended, k)
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


class ReasoningSplit:
    """Splits the generated text into reasoning and answer as it streams (a style's start/end markers)."""

    def __init__(self, style: ThinkingStyle | None) -> None:
        self.style = style
        self.state = "start" if style else "answer"
        self.held = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) text that is certain now."""
        self.held += text
        if self.state == "start":
            assert self.style is not None
            head = self.held.lstrip()
            if head.startswith(self.style.start):
                self.state, self.held = "reasoning", head[len(self.style.start):]
            elif not self.style.start.startswith(head):
                self.state = "answer"
            else:
                return "", ""  # still possibly the opening marker
        if self.state == "reasoning":
            assert self.style is not None
            end = self.held.find(self.style.end)
            if end < 0:
                keep = max((k for k in range(1, len(self.style.end)) if self.held.endswith(self.style.end[:k])),
                           default=0)
                out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
                return out, ""
            reasoning, self.held = self.held[:end], self.held[end + len(self.style.end):].lstrip()
            self.state = "after"
            return reasoning, self._answer()
        return "", self._answer()

    def _answer(self) -> str:
        if self.state == "after":  # the blank lines between the reasoning and the answer
            self.held = self.held.lstrip()
            if not self.held:
                return ""
            self.state = "answer"
        out, self.held = self.held, ""
        return out

    def flush(self) -> tuple[str, str]:
        out, self.held = self.held, ""
        return (out, "") if self.state == "reasoning" else ("", out)


def reply(engine: ChatEngine, messages: Sequence[Message | Mapping[str, Any]], max_tokens: int,
          sampling: Sampling | None = None, *, think: bool | None = None, template: str | Template | None = None,
          stop: Sequence[str] = (), parse_special: bool = False, result: Reply | None = None,
          prompt_ids: Sequence[int] | None = None, tool_style: ToolStyle | None = None,
          reuse_kv: bool = True) -> Iterator[Delta]:
    """Answer the conversation, yielding the answer as it comes. The context keeps its longest common
    prefix with the rendered conversation, so a conversation's next turn decodes only its new tokens.
    `prompt_ids`: the conversation already rendered and tokenized (`prompt_tokens`), not done again.
    `tool_style`: the answer's tool calls are taken out of its text (Delta/Reply.tool_calls)."""
    tmpl = template if isinstance(template, Template) else template_for(engine, template)
    if prompt_ids is None:
        msgs = [as_message(m) for m in messages]
        prompt_ids = prompt_tokens(engine, tmpl, msgs, think=think, parse_special=parse_special)
    ids = list(prompt_ids)
    out = result if result is not None else Reply()
    out.prompt_tokens = len(ids)
    gen = Generation(ids)
    stops = StopStrings(stop)
    split = ReasoningSplit(tmpl.thinking)
    harmony = harmony_ids(engine) if tmpl.thinking is None else None   # a gpt-oss vocabulary
    channels = HarmonySplit(harmony) if harmony else None
    calls = None
    if tool_style is not None:
        calls = ToolCallSplit(tool_style)

    def answer(content: str, last: bool = False) -> tuple[str, tuple[ToolCall, ...]]:
        if calls is None:
            return content, ()
        text, found = calls.feed(content)
        if last:
            tail, more = calls.flush()
            text, found = text + tail, found + more
        out.tool_calls += found
        return text, tuple(found)

    def emit(text: str, token: Token | None) -> Delta:
        if channels is not None:
            reasoning, content = channels.feed(token.id if token is not None else None, text)
        else:
            reasoning, content = split.feed(text)
        content, found = answer(content)
        out.reasoning += reasoning
        out.content += content
        return Delta(content, reasoning, token, found)

    for token in engine.generate(ids, max_tokens, sampling, result=gen, reuse_kv=reuse_kv):
        out.completion_tokens += 1
        out.reused_tokens = gen.reused_tokens
        out.metrics.append(token.metrics)
        yield emit(stops.feed(token.text), token)
        if stops.stopped:
            break
    out.reused_tokens = gen.reused_tokens
    if not stops.stopped:
        yield emit(stops.flush(), None)
    reasoning, content = split.flush()
    content, found = answer(content, last=True)
    out.reasoning += reasoning
    out.content += content
    if reasoning or content or found:
        yield Delta(content, reasoning, None, found)
    out.finish_reason = "stop" if stops.stopped or gen.stop_reason == "end_of_generation" else "length"
    if out.tool_calls:
        out.finish_reason = "tool_calls"


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
