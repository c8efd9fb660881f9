"""Every request parameter of every route, declared once: the route that takes it, whether it is supported,
refused or ignored there, and the values it takes. The routes are OpenAI's Chat Completions and Completions,
Anthropic's Messages (and its count_tokens) and OpenAI's Responses API, each at its path (`PATHS`: the app's
routes and the fuzzer's). `openai_api`, `anthropic_api` and `responses_api` check a body against these rows
(bounds, refusals), docs/serve.md's parameter tables are checked against them (tests/test_serve_params.py,
tests/test_serve_apis.py), and `fuzz --http` draws its requests from them (proof/request_space.py: a generator
per kind of value), so a parameter or a route added here is checked, documented and fuzzed the day it lands.

The limits a request must stay within (sizes, counts, a schema's shape) are `limits.py`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bmoe_edge.engine import settings
from bmoe_edge.serve import limits

Route = Literal["chat", "completions", "messages", "count_tokens", "responses"]
Status = Literal["supported", "refused", "ignored"]
ROUTES: tuple[Route, ...] = ("chat", "completions", "messages", "count_tokens", "responses")
PATHS: dict[Route, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
                           "messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens",
                           "responses": "/v1/responses"}


# The kinds of value a parameter takes. Each is data: what the server accepts, which openai_api checks and
# the fuzzer draws from (in range, at the edges, past them, of the wrong type).
@dataclass(frozen=True)
class Number:
    lo: float
    hi: float


@dataclass(frozen=True)
class Integer:
    lo: int
    hi: int


@dataclass(frozen=True)
class Flag:
    """true or false."""


@dataclass(frozen=True)
class OneOf:
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Text:
    """Any string (an identifier, a hint)."""


@dataclass(frozen=True)
class Anything:
    """A refused parameter's value, or an object the server does not look into."""


@dataclass(frozen=True)
class ModelName:
    """The served model's id."""


@dataclass(frozen=True)
class Stops:
    count: int
    chars: int


@dataclass(frozen=True)
class LogitBias:
    """{"token id": bias}: up to `entries`, each bias within [lo, hi]."""

    entries: int
    lo: float
    hi: float


@dataclass(frozen=True)
class ResponseFormat:
    """text, json_object or json_schema with a JSON schema (limits.SchemaLimits)."""


@dataclass(frozen=True)
class Tools:
    """OpenAI's function tools, each with a JSON schema of its parameters."""


@dataclass(frozen=True)
class ToolChoice:
    pass


@dataclass(frozen=True)
class Messages:
    """A conversation: roles, text or text parts, earlier tool calls (JSON arguments) and their results."""


@dataclass(frozen=True)
class Prompt:
    """A string or token ids, or a list of one of those."""


@dataclass(frozen=True)
class StreamOptions:
    """{"include_usage": bool}, only with stream."""


@dataclass(frozen=True)
class TemplateKwargs:
    """llama-server's chat_template_kwargs: enable_thinking, reasoning_effort."""


# Anthropic's Messages API: its content blocks, tools, tool_choice, system prompt and thinking switch
@dataclass(frozen=True)
class AnthropicMessages:
    """user and assistant turns: text, or blocks of text, tool_use (assistant) and tool_result (user)."""


@dataclass(frozen=True)
class System:
    """A system prompt: a string or a list of text blocks."""


@dataclass(frozen=True)
class AnthropicTools:
    """[{"name", "description"?, "input_schema"}]: custom tools (server tools are refused)."""


@dataclass(frozen=True)
class AnthropicToolChoice:
    """{"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}, with disable_parallel_tool_use."""


@dataclass(frozen=True)
class Thinking:
    """{"type": "enabled", "budget_tokens": N}, {"type": "adaptive"} or {"type": "disabled"}."""


@dataclass(frozen=True)
class OutputConfig:
    """{"format": {"type": "json_schema", "schema": ...}, "effort": ...}."""


# OpenAI's Responses API: its input items, function tools, tool_choice, text format and reasoning
@dataclass(frozen=True)
class ResponseInput:
    """A string, or items: messages (input_text, output_text), function_call and function_call_output."""


@dataclass(frozen=True)
class ResponseTools:
    """[{"type": "function", "name", "description"?, "parameters"?}] (built-in tools are refused)."""


@dataclass(frozen=True)
class ResponseToolChoice:
    """"auto", "none", "required" or {"type": "function", "name": ...}."""


@dataclass(frozen=True)
class TextConfig:
    """{"format": {"type": "text" | "json_object"} or {"type": "json_schema", "name", "schema"}}."""


@dataclass(frozen=True)
class Reasoning:
    """{"effort": "low" | "medium" | "high", "summary": ...}."""


@dataclass(frozen=True)
class Include:
    """A list of what to add to the answer, each one of `values`."""

    values: tuple[str, ...]


Kind = (Number | Integer | Flag | OneOf | Text | Anything | ModelName | Stops | LogitBias | ResponseFormat | Tools
        | ToolChoice | Messages | Prompt | StreamOptions | TemplateKwargs | AnthropicMessages | System | AnthropicTools
        | AnthropicToolChoice | Thinking | OutputConfig | ResponseInput | ResponseTools | ResponseToolChoice
        | TextConfig | Reasoning | Include)


@dataclass(frozen=True)
class Param:
    name: str
    kind: Kind
    chat: Status | None = None          # None: not a parameter of that route
    completions: Status | None = None
    messages: Status | None = None      # Anthropic's POST /v1/messages
    count_tokens: Status | None = None  # ... and its POST /v1/messages/count_tokens
    responses: Status | None = None     # OpenAI's POST /v1/responses
    honoured: tuple[Any, ...] = ()      # refused: the values that still pass (what the server does anyway)
    openai: bool = True                 # the route's API defines it (docs/serve.md's tables); else an extension
    setting: str = ""                   # a sampling setting it sets (its bounds are the setting's)
    required: bool = False              # the route's API requires it (a body without it is a 400)

    def status(self, route: Route) -> Status | None:
        return getattr(self, route)


def _setting(name: str) -> Number | Integer:
    """A sampling setting's own bounds (native/include/bmoe/config.h)."""
    row = settings.BY_NAME[name]
    if row.kind is int:
        return Integer(int(row.minimum or 0), int(row.maximum or 0))
    return Number(float(row.minimum or 0.0), float(row.maximum or 0.0))


def _both(name: str, kind: Kind, status: Status = "supported", **kw: Any) -> Param:
    return Param(name, kind, chat=status, completions=status, **kw)


def _sampling(name: str, setting: str, openai: bool = True) -> Param:
    return _both(name, _setting(setting), setting=setting, openai=openai)


def _refused_chat(name: str, *honoured: Any) -> Param:
    return Param(name, Anything(), chat="refused", honoured=honoured)


def _anthropic(name: str, kind: Kind, status: Status = "supported", counted: bool = True, **kw: Any) -> Param:
    """A parameter of Anthropic's Messages API; `counted`: count_tokens takes it too."""
    return Param(name, kind, messages=status, count_tokens=status if counted else None, **kw)


def _responses(name: str, kind: Kind, status: Status = "supported", **kw: Any) -> Param:
    return Param(name, kind, responses=status, **kw)


# llama-server's sampling extensions, taken by every route that generates (their names, their bounds)
EXTENSIONS = (("min_p", "min_p"), ("repeat_penalty", "repeat_penalty"), ("repeat_last_n", "penalty_last_n"))
# What `include` may ask of the Responses API: the answer's logprobs (honoured); encrypted reasoning (there is
# none to give: an empty list's worth, ignored). Anything else (built-in tools' outputs, images) is refused.
INCLUDE_LOGPROBS = "message.output_text.logprobs"
INCLUDES = (INCLUDE_LOGPROBS, "reasoning.encrypted_content")


STREAMER_STATS = "streamer_stats"
EFFORTS = ("low", "medium", "high")
SEED = Integer(-(1 << 63), (1 << 64) - 1)   # OpenAI's: any 64-bit integer (the engine takes it modulo 2^32 - 1)

PARAMETERS: tuple[Param, ...] = (
    _both("model", ModelName()),
    Param("messages", Messages(), chat="supported"),
    Param("prompt", Prompt(), completions="supported"),
    _both("max_tokens", Integer(0, limits.MAX_TOKENS)),
    Param("max_completion_tokens", Integer(1, limits.MAX_TOKENS), chat="supported"),
    _sampling("temperature", "temp"),
    _sampling("top_p", "top_p"),
    _both("seed", SEED),
    _both("stop", Stops(limits.MAX_STOPS, limits.MAX_STOP_CHARS)),
    _both("stream", Flag()),
    _both("stream_options", StreamOptions()),
    _sampling("presence_penalty", "presence_penalty"),
    _sampling("frequency_penalty", "frequency_penalty"),
    _both("logit_bias", LogitBias(limits.MAX_BIASES, -100.0, 100.0)),
    Param("logprobs", Flag(), chat="supported"),
    Param("logprobs", Integer(0, limits.MAX_TOP_LOGPROBS), completions="supported"),
    Param("top_logprobs", Integer(0, limits.MAX_TOP_LOGPROBS), chat="supported"),
    Param("echo", Flag(), completions="supported"),
    Param("response_format", ResponseFormat(), chat="supported"),
    Param("tools", Tools(), chat="supported"),
    Param("tool_choice", ToolChoice(), chat="supported"),
    Param("reasoning_effort", OneOf(EFFORTS), chat="supported"),
    Param("parallel_tool_calls", Flag(), chat="supported"),
    _both("n", Integer(1, 1), "refused", honoured=(1,)),
    _refused_chat("store", False),
    _refused_chat("service_tier", "auto", "default"),
    _refused_chat("modalities", ["text"]),
    _refused_chat("prompt_cache_retention", "in_memory"),
    *(_refused_chat(name) for name in ("audio", "prediction", "metadata", "functions", "function_call",
                                        "web_search_options", "verbosity", "moderation", "prompt_cache_options")),
    Param("best_of", Anything(), completions="refused", honoured=(1,)),
    Param("suffix", Anything(), completions="refused", honoured=("",)),
    _both("user", Text(), "ignored"),
    Param("safety_identifier", Text(), chat="ignored"),
    Param("prompt_cache_key", Text(), chat="ignored"),
    # llama-server's extensions
    _sampling("top_k", "top_k", openai=False),
    _sampling("min_p", "min_p", openai=False),
    _sampling("repeat_penalty", "repeat_penalty", openai=False),
    _sampling("repeat_last_n", "penalty_last_n", openai=False),
    Param("think", Flag(), chat="supported", openai=False),
    Param("chat_template_kwargs", TemplateKwargs(), chat="supported", openai=False),
    Param("continue_final_message", Flag(), chat="supported", openai=False),
    # bmoe-edge's own: the streamer's telemetry per step and per answer in the answer (stats.py; the chat page's)
    Param(STREAMER_STATS, Flag(), chat="supported", openai=False),
    Param("response_format", ResponseFormat(), completions="supported", openai=False),
    # Anthropic's Messages API (POST /v1/messages; count_tokens takes the ones that shape the prompt)
    _anthropic("model", ModelName()),
    _anthropic("messages", AnthropicMessages(), required=True),
    _anthropic("max_tokens", Integer(1, limits.MAX_TOKENS), counted=False, required=True),
    _anthropic("system", System()),
    _anthropic("stop_sequences", Stops(limits.MAX_STOPS, limits.MAX_STOP_CHARS), counted=False),
    _anthropic("stream", Flag(), counted=False),
    _anthropic("tools", AnthropicTools()),
    _anthropic("tool_choice", AnthropicToolChoice()),
    _anthropic("thinking", Thinking()),
    _anthropic("output_config", OutputConfig()),
    # Anthropic's reference has documented these for years; the 2.x Python client no longer declares them
    *(_anthropic(name, _setting(setting), counted=False, setting=setting)
      for name, setting in (("temperature", "temp"), ("top_p", "top_p"), ("top_k", "top_k"))),
    _anthropic("service_tier", Anything(), "refused", counted=False, honoured=("auto", "standard_only")),
    _anthropic("container", Anything(), "refused", counted=False),
    _anthropic("metadata", Anything(), "ignored", counted=False),
    _anthropic("cache_control", Anything(), "ignored"),
    *(_anthropic(name, Anything(), "ignored", counted=name not in ("inference_geo", "diagnostics"))
      for name in ("speed", "inference_geo", "diagnostics", "user_profile_id", "workspace_id")),
    *(_anthropic(name, _setting(setting), counted=False, setting=setting, openai=False)
      for name, setting in EXTENSIONS),
    # OpenAI's Responses API (POST /v1/responses)
    _responses("model", ModelName()),
    _responses("input", ResponseInput(), required=True),
    _responses("instructions", Text()),
    _responses("max_output_tokens", Integer(1, limits.MAX_TOKENS)),
    _responses("temperature", _setting("temp"), setting="temp"),
    _responses("top_p", _setting("top_p"), setting="top_p"),
    _responses("stream", Flag()),
    _responses("stream_options", Anything(), "ignored"),
    _responses("tools", ResponseTools()),
    _responses("tool_choice", ResponseToolChoice()),
    _responses("parallel_tool_calls", Flag()),
    _responses("previous_response_id", Text()),
    _responses("store", Flag()),
    _responses("text", TextConfig()),
    _responses("reasoning", Reasoning()),
    _responses("top_logprobs", Integer(0, limits.MAX_TOP_LOGPROBS)),
    _responses("include", Include(INCLUDES)),
    _responses("background", Anything(), "refused", honoured=(False,)),
    _responses("truncation", Anything(), "refused", honoured=("disabled",)),
    _responses("service_tier", Anything(), "refused", honoured=("auto", "default")),
    _responses("prompt_cache_retention", Anything(), "refused", honoured=("in_memory",)),
    *(_responses(name, Anything(), "refused")
      for name in ("conversation", "prompt", "max_tool_calls", "context_management", "prompt_cache_options",
                   "moderation", "image", "access_programs", "background_options")),
    *(_responses(name, Text(), "ignored") for name in ("user", "safety_identifier", "prompt_cache_key")),
    _responses("metadata", Anything(), "ignored"),
    _responses("top_k", _setting("top_k"), setting="top_k", openai=False),
    *(_responses(name, _setting(setting), setting=setting, openai=False) for name, setting in EXTENSIONS),
)


def of(route: Route) -> dict[str, Param]:
    """The route's parameters by name."""
    return {p.name: p for p in PARAMETERS if p.status(route) is not None}


def param(route: Route, name: str) -> Param:
    return of(route)[name]


def refused(route: Route) -> dict[str, tuple[Any, ...]]:
    """The route's refused parameters, each with the values that still pass."""
    return {p.name: p.honoured for p in of(route).values() if p.status(route) == "refused"}


def required(route: Route) -> tuple[str, ...]:
    return tuple(name for name, p in of(route).items() if p.required)


def sampling(route: Route) -> dict[str, Param]:
    """The route's parameters that set a sampling setting, by name."""
    return {name: p for name, p in of(route).items() if p.setting}
