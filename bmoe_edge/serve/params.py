"""Every request parameter of the two routes, declared once: the route that takes it, whether it is supported,
refused or ignored there, and the values it takes. `openai_api` checks a body against these rows (bounds,
refusals), docs/serve.md's parameter table is checked against them (tests/test_serve_params.py), and
`fuzz --http` draws its requests from them (proof/request_space.py: a generator per kind of value), so a
parameter added here is checked, documented and fuzzed the day it lands.

The limits a request must stay within (sizes, counts, a schema's shape) are `limits.py`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bmoe_edge.engine import settings
from bmoe_edge.serve import limits

Route = Literal["chat", "completions"]
Status = Literal["supported", "refused", "ignored"]
ROUTES: tuple[Route, ...] = ("chat", "completions")


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


Kind = (Number | Integer | Flag | OneOf | Text | Anything | ModelName | Stops | LogitBias | ResponseFormat | Tools
        | ToolChoice | Messages | Prompt | StreamOptions | TemplateKwargs)


@dataclass(frozen=True)
class Param:
    name: str
    kind: Kind
    chat: Status | None = None          # None: not a parameter of that route
    completions: Status | None = None
    honoured: tuple[Any, ...] = ()      # refused: the values that still pass (what the server does anyway)
    openai: bool = True                 # OpenAI defines it (docs/serve.md's table); else an extension
    setting: str = ""                   # a sampling setting it sets (its bounds are the setting's)

    def status(self, route: Route) -> Status | None:
        return self.chat if route == "chat" else self.completions


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
    Param("response_format", ResponseFormat(), completions="supported", openai=False),
)


def of(route: Route) -> dict[str, Param]:
    """The route's parameters by name."""
    return {p.name: p for p in PARAMETERS if p.status(route) is not None}


def param(route: Route, name: str) -> Param:
    return of(route)[name]


def refused(route: Route) -> dict[str, tuple[Any, ...]]:
    """The route's refused parameters, each with the values that still pass."""
    return {p.name: p.honoured for p in of(route).values() if p.status(route) == "refused"}


def sampling(route: Route) -> dict[str, Param]:
    """The route's parameters that set a sampling setting, by name."""
    return {name: p for name, p in of(route).items() if p.setting}
