"""OpenAI's request and response shapes: a request body checked into a worker `Request` (or an
`ApiError` with OpenAI's error object), and the engine's answer written back as OpenAI writes it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from bmoe_edge.engine import chat, settings, tools
from bmoe_edge.engine.generation import Logprob, PositionLogprobs
from bmoe_edge.errors import BmoeError
from bmoe_edge.serve import limits, params, schemas
from bmoe_edge.serve.api_errors import ApiError
from bmoe_edge.serve.worker import Request

DEFAULT_MAX_TOKENS = 512
# Refused parameters (params.py's rows), each with the values it still takes (what the server does anyway:
# store nothing, one tier, text only, one choice): any other value (null aside) is a 400 that names it.
REFUSED: dict[str, dict[str, tuple[Any, ...]]] = {route: params.refused(route) for route in params.ROUTES}


def _number(body: Mapping[str, Any], key: str, default: float | None, lo: float, hi: float) -> float | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ApiError(400, f"'{key}' must be a number from {lo:g} to {hi:g}, got {value!r}", param=key)
    return float(value)


def _integer(body: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ApiError(400, f"'{key}' must be an integer from {lo} to {hi}, got {value!r}", param=key)
    return value


def _stops(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    kind = params.param("chat", "stop").kind
    assert isinstance(kind, params.Stops)
    if not isinstance(stops, list) or len(stops) > kind.count or not all(isinstance(s, str) for s in stops) \
            or any(len(s) > kind.chars for s in stops):
        raise ApiError(400, f"'stop' must be a string or a list of up to {kind.count} strings of up to "
                       f"{kind.chars} characters", param="stop")
    return tuple(stops)


def _stream(body: Mapping[str, Any]) -> bool:
    """`stream` and `stream_options`, checked before the job is queued."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, Mapping) or not isinstance(options.get("include_usage", False), bool):
            raise ApiError(400, "'stream_options' must be an object like {'include_usage': true}",
                           param="stream_options")
        if not stream:
            raise ApiError(400, "'stream_options' is only allowed with 'stream': true", param="stream_options")
    return bool(stream)


def include_usage(body: Mapping[str, Any]) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def streamer_stats(body: Mapping[str, Any]) -> bool:
    """bmoe-edge's `streamer_stats`: the streamer's telemetry in the answer (stats.step, stats.answer)."""
    return _bool(body, params.STREAMER_STATS)


def _think(body: Mapping[str, Any]) -> bool | None:
    """llama-server's `chat_template_kwargs.enable_thinking`, or a plain `think`."""
    kwargs = body.get("chat_template_kwargs") or {}
    value = body.get("think", kwargs.get("enable_thinking") if isinstance(kwargs, Mapping) else None)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, "'think' (chat_template_kwargs.enable_thinking) must be true or false", param="think")
    return value


EFFORTS = ("low", "medium", "high")


def _effort(body: Mapping[str, Any]) -> str | None:
    """OpenAI's `reasoning_effort` (or `chat_template_kwargs.reasoning_effort`): gpt-oss's template takes it."""
    kwargs = body.get("chat_template_kwargs") or {}
    value = body.get("reasoning_effort", kwargs.get("reasoning_effort") if isinstance(kwargs, Mapping) else None)
    if value is not None and value not in EFFORTS:
        raise ApiError(400, f"'reasoning_effort' must be one of {', '.join(EFFORTS)}", param="reasoning_effort")
    return value


def check_model(body: Mapping[str, Any], model_id: str) -> None:
    model = body.get("model")
    if model is not None and model != model_id:
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{model_id}'",
                       param="model", code="model_not_found")


def refuse_unsupported(body: Mapping[str, Any], route: params.Route) -> None:
    """A refused parameter (params.py's rows of `route`) set to a value the server would not honour: a 400 naming it."""
    for name, honoured in REFUSED[route].items():
        value = body.get(name)
        if value is None or any(value == h and type(value) is type(h) for h in honoured):
            continue
        only = f" (only {' or '.join(repr(h) for h in honoured)})" if honoured else ""
        raise ApiError(400, f"'{name}' is not supported by this server{only}: see docs/serve.md", param=name)


def _logit_bias(body: Mapping[str, Any]) -> str:
    """OpenAI's {"token id": bias} as the logit_bias setting's text (ID:BIAS,...)."""
    value = body.get("logit_bias")
    if value is None:
        return ""
    kind = params.param("chat", "logit_bias").kind
    assert isinstance(kind, params.LogitBias)
    if not isinstance(value, Mapping) or len(value) > kind.entries:
        raise ApiError(400, f"'logit_bias' must be an object of up to {kind.entries} token ids, each mapped to a "
                       f"bias from {kind.lo:g} to {kind.hi:g}", param="logit_bias")
    items = []
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 9):
            raise ApiError(400, f"'logit_bias' keys must be token ids (digits), got {key[:40]!r}", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not kind.lo <= bias <= kind.hi:
            raise ApiError(400, f"'logit_bias' biases must be numbers from {kind.lo:g} to {kind.hi:g}, got "
                           f"{bias!r:.40}", param="logit_bias")
        items.append(f"{int(key)}:{float(bias)!r}")
    return ",".join(items)


def _bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false", param=key)
    return bool(value)


def _logprobs(body: Mapping[str, Any], route: str) -> int:
    """How many most likely tokens to report at each position: -1 = no logprobs at all. Chat: `logprobs: true`
    and `top_logprobs: N`; completions: `logprobs: N`."""
    if route == "completions":
        n = _bounded(body, "completions", "logprobs", None)
        return -1 if n is None else int(n)
    wanted = _bool(body, "logprobs")
    top = _bounded(body, "chat", "top_logprobs", None)
    if top is not None and not wanted:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else -1


def _bounded(body: Mapping[str, Any], route: params.Route, key: str, default: Any, least: float | None = None) -> Any:
    """A number parameter within its row's bounds (params.py); `least` raises the lower one."""
    kind = params.param(route, key).kind
    if isinstance(kind, params.Integer):
        return _integer(body, key, default, int(kind.lo if least is None else least), kind.hi)
    assert isinstance(kind, params.Number)
    return _number(body, key, default, kind.lo if least is None else least, kind.hi)


def checked(body: Any, route: params.Route, model_id: str) -> Mapping[str, Any]:
    """The checks every route makes first: a JSON object, for the served model, its API's required parameters
    there, none refused."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "the request body must be a JSON object")
    check_model(body, model_id)
    for name in params.required(route):
        if body.get(name) is None:
            raise ApiError(400, f"'{name}' is required", param=name)
    refuse_unsupported(body, route)
    return body


def _common(body: Any, model_id: str, route: params.Route = "chat") -> dict[str, Any]:
    checked(body, route, model_id)
    echo = route == "completions" and _bool(body, "echo")
    least = 0 if echo else 1   # echo with max_tokens 0 scores the prompt alone (as evaluation tools ask)
    max_tokens = _bounded(body, route, "max_completion_tokens", None) if route == "chat" else None
    max_tokens = _bounded(body, route, "max_tokens", DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                          least)
    given: dict[str, Any] = {"logit_bias": _logit_bias(body), "logprobs": _logprobs(body, route)}
    for key, row in params.sampling(route).items():
        given[row.setting] = _bounded(body, route, key, None)
    seed = _bounded(body, route, "seed", None)
    # OpenAI's seed is any 64-bit integer; the engine's is 32 bits (its largest asks for a random one)
    given["seed"] = None if seed is None else seed % 4294967295
    sampling = settings.sampling(given, conversation=True)
    _stream(body)
    budget = schemas.Budget()   # what all of the request's schemas may take together
    return {"budget": budget, "max_tokens": max_tokens, "sampling": sampling, "stop": _stops(body), "echo": echo,
            "json_schema": _response_format(body.get("response_format"), budget)}


JSON_OBJECT = {"type": "object"}   # response_format json_object: any JSON object


def _response_format(fmt: Any, budget: schemas.Budget) -> Any:
    """The JSON schema a `response_format` asks the answer to follow (None for plain text), within limits.py's
    bounds; its grammar is llama.cpp common's (with the chat format's own framing around it, for a chat), made
    off the event loop when the request is prepared."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ApiError(400, "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}",
                           param="response_format")
        try:
            schemas.check_schema(schema, "response_format", budget)
        except BmoeError as exc:
            raise ApiError(400, str(exc), param="response_format") from None
        return schema
    raise ApiError(400, "'response_format' must be {'type': 'text'}, {'type': 'json_object'} or "
                   "{'type': 'json_schema', 'json_schema': {...}}", param="response_format")


def parse_chat(body: Any, model_id: str) -> Request:
    """A chat request: rendered, with its tools and response_format, by llama.cpp common (in the worker)."""
    common = _common(body, model_id)
    budget = common.pop("budget")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    if not all(isinstance(m, Mapping) for m in messages):
        raise ApiError(400, "each message must be an object with 'role' and 'content'", param="messages")
    try:
        given = tools.check_tools(body["tools"]) if body.get("tools") is not None else []
        if len(given) > limits.MAX_TOOLS:
            raise BmoeError(f"'tools' has {len(given)} tools; at most {limits.MAX_TOOLS} are taken")
        for t in given:
            schemas.check_schema(t["function"].get("parameters") or {}, f"the tool {t['function']['name'][:60]!r}",
                                 budget)
    except BmoeError as exc:
        raise ApiError(400, str(exc), param="tools") from None
    try:
        rendered = tuple(tools.message_dict(m) for m in messages)
    except BmoeError as exc:
        raise ApiError(400, str(exc), param="messages") from None
    try:
        choice = tools.tool_choice(body.get("tool_choice"), given) if given else "none"
    except BmoeError as exc:
        raise ApiError(400, str(exc), param="tool_choice") from None
    if choice not in ("auto", "none") and common["json_schema"] is not None:
        raise ApiError(400, "a forced tool call (tool_choice) and a JSON response_format cannot be combined",
                       param="tool_choice")
    continue_final = body.get("continue_final_message", False)
    if not isinstance(continue_final, bool) or (continue_final and rendered[-1]["role"] != "assistant"):
        raise ApiError(400, "'continue_final_message' must be true or false, true only after an assistant message",
                       param="continue_final_message")
    parallel = body.get("parallel_tool_calls", False)
    if not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    plain = tuple(chat.Message(m["role"], m["content"]) for m in rendered)   # the text alone (template_messages render)
    return Request(messages=plain, think=_think(body), tools=tuple(given), tool_choice=choice,
                   template_messages=rendered, reasoning_effort=_effort(body), continue_final=continue_final,
                   parallel_tool_calls=parallel, **common)


def parse_translated(chat_body: dict[str, Any], model_id: str, names: Mapping[str, str]) -> Request:
    """Another API's request (Anthropic's Messages, OpenAI's Responses), translated into a Chat Completions body,
    parsed as one: the same checks, bounds and limits, the same Request. An error names the other API's parameter
    (`names`: chat's name -> the request's)."""
    try:
        return parse_chat({k: v for k, v in chat_body.items() if v is not None}, model_id)
    except ApiError as exc:
        if exc.param in names:
            exc.message = exc.message.replace(f"'{exc.param}'", f"'{names[exc.param]}'")
            exc.param = names[exc.param]
        raise


def parse_completion(body: Any, model_id: str) -> Request:
    common = _common(body, model_id, "completions")
    common.pop("budget")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]   # a list of one prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and
                                                   0 <= t < 1 << 31 for t in prompt):
        return Request(prompt="", prompt_ids=tuple(prompt), **common)   # token ids (evaluation tools send them)
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string or token ids (a list of one of them at most)",
                       param="prompt")
    return Request(prompt=prompt, **common)


def usage(reply: chat.Reply) -> dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.reused_tokens}}


def chat_message(reply: chat.Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["content"] = reply.content or None
        message["tool_calls"] = [c.openai() for c in reply.tool_calls]
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    return message


def envelope(kind: str, rid: str, model_id: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model_id}


def positions(d: chat.Delta) -> tuple[PositionLogprobs, ...]:
    """The log-probabilities of the tokens behind one piece of an answer (none unless asked for)."""
    if d.logprobs:
        return d.logprobs
    return (d.token.logprobs,) if d.token is not None and d.token.logprobs is not None else ()


def _token_text(piece: bytes) -> str:
    return piece.decode("utf-8", "replace")


def _chat_entry(lp: Logprob) -> dict[str, Any]:
    return {"token": _token_text(lp.piece), "logprob": lp.logprob, "bytes": list(lp.piece)}


def chat_logprobs(found: Sequence[PositionLogprobs] | None) -> dict[str, Any] | None:
    """OpenAI's chat `logprobs`: each token with its log-probability, then the most likely tokens there."""
    if found is None:
        return None
    content = [_chat_entry(p.chosen) | {"top_logprobs": [_chat_entry(t) for t in p.top]} for p in found]
    return {"content": content, "refusal": None}


def completion_logprobs(found: Sequence[PositionLogprobs] | None, offset: int = 0) -> dict[str, Any] | None:
    """OpenAI's completions `logprobs`: tokens, their log-probabilities, at each position the chosen token
    first and then the most likely ones, and each token's character offset in the choice's text (from
    `offset`: where this piece starts). A text's first token has no log-probability (null)."""
    if found is None:
        return None
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for p in found:
        text = _token_text(p.chosen.piece)
        out["tokens"].append(text)
        out["token_logprobs"].append(p.chosen.logprob)
        top = None
        if p.chosen.logprob is not None:
            top = {text: p.chosen.logprob}
            for t in p.top:
                top.setdefault(_token_text(t.piece), t.logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def chat_completion(rid: str, model_id: str, reply: chat.Reply,
                    logprobs: Sequence[PositionLogprobs] | None = None) -> dict[str, Any]:
    return envelope("chat.completion", rid, model_id) | {
        "choices": [{"index": 0, "message": chat_message(reply), "logprobs": chat_logprobs(logprobs),
                     "finish_reason": reply.finish_reason}],
        "usage": usage(reply)}


def chat_chunk(rid: str, model_id: str, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: Sequence[PositionLogprobs] | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = chat_logprobs(logprobs)
    return envelope("chat.completion.chunk", rid, model_id) | {"choices": [choice]}


def delta_fields(d: chat.Delta) -> dict[str, Any]:
    """A chunk's delta."""
    out: dict[str, Any] = {}
    if d.reasoning:
        out["reasoning_content"] = d.reasoning
    if d.content:
        out["content"] = d.content
    if d.tool_calls:   # OpenAI's streamed shape: the call's id and name first, then pieces of its arguments
        out["tool_calls"] = [c.openai() for c in d.tool_calls]
    return out


def text_completion(rid: str, model_id: str, reply: chat.Reply,
                    logprobs: Sequence[PositionLogprobs] | None = None) -> dict[str, Any]:
    return envelope("text_completion", rid, model_id) | {
        "choices": [{"index": 0, "text": reply.content, "logprobs": completion_logprobs(logprobs),
                     "finish_reason": reply.finish_reason}],
        "usage": usage(reply)}


def text_chunk(rid: str, model_id: str, text: str, finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return envelope("text_completion", rid, model_id) | {
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]}


def models(model_id: str, created: int) -> dict[str, Any]:
    """The one model, in OpenAI's list and, in the same body, Anthropic's (`type`, `display_name`, `created_at`,
    the page's `has_more` and ids): GET /v1/models is both APIs' route."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    model = {"id": model_id, "object": "model", "created": created, "owned_by": "bmoe-edge", "type": "model",
             "display_name": model_id, "created_at": stamp}
    return {"object": "list", "data": [model], "has_more": False, "first_id": model_id, "last_id": model_id}
