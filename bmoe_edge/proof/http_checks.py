"""What the HTTP fuzz campaign expects of an answer (http_fuzz.py): a refusal is its API's error object, a success
is a well-formed body or event stream that ends as its API ends one."""

from __future__ import annotations

import json
from urllib.parse import unquote

from bmoe_edge.serve import ui
from bmoe_edge.serve.api_errors import speaks_anthropic

PAGE_TYPES = tuple(media_type.split(";")[0] for media_type in ui.MEDIA_TYPES.values())   # the chat page's files


def is_error_object(data: bytes, path: str) -> bool:
    """The body is the error object of the API whose route `path` is: Anthropic's ({"type": "error", "error":
    {"type", "message"}}) on its routes, OpenAI's elsewhere. The path as the server routes it: percent-decoded, as
    uvicorn hands it to the app ("/v1/messages%2F" is "/v1/messages/", under Anthropic's routes)."""
    try:
        body = json.loads(data)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    if not (isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)):
        return False
    if speaks_anthropic(unquote(path.split("?", 1)[0])):
        return body.get("type") == "error" and set(error) == {"type", "message"}
    return set(error) == {"message", "type", "param", "code"}


# The events a stream ends with: Anthropic's and the Responses API's (named by their type), or an error event
LAST_EVENTS = ("message_stop", "error", "response.completed", "response.incomplete", "response.failed")


def event_problem(event: str) -> str:
    """"" when one server-sent event is well formed (an optional `event: TYPE` line naming its data's type, then
    one `data:` line of JSON or [DONE]); else what is wrong."""
    lines = event.split("\n")
    name = lines.pop(0)[7:] if lines[0].startswith("event: ") else None
    if len(lines) != 1 or not lines[0].startswith("data: "):
        return f"an event that is not data: {event[:80]!r}"
    if lines[0] == "data: [DONE]" and name is None:
        return ""
    try:
        body = json.loads(lines[0][6:])
    except ValueError:
        return f"an event that is not JSON: {event[:80]!r}"
    if name is not None and (not isinstance(body, dict) or body.get("type") != name):
        return f"an event named {name!r} whose data is not of that type: {event[:80]!r}"
    return ""


def good_success(headers: dict[str, str], data: bytes) -> str:
    """"" when a 2xx body is what its route answers; else what is wrong."""
    if headers.get("content-type", "").startswith("text/event-stream"):
        text = data.decode("utf-8", "replace")
        events = [e for e in text.split("\n\n") if e]
        if not events:
            return "an empty event stream"
        for e in events:
            problem = event_problem(e)
            if problem:
                return problem
        last = events[-1]
        if last != "data: [DONE]" and '"error"' not in last and not last.startswith(
                tuple(f"event: {name}\n" for name in LAST_EVENTS)):
            return "a stream that ends without [DONE], its API's last event or an error"
        return ""
    if headers.get("content-type", "").startswith("text/plain"):   # /metrics
        return ""
    if headers.get("content-type", "").startswith(PAGE_TYPES):   # GET / and its files (serve/ui.py)
        return "" if "content-security-policy" in headers else "a page's file without its Content-Security-Policy"
    try:
        json.loads(data or b"null")
    except ValueError:
        return f"a body that is not JSON: {data[:80]!r}"
    return ""


def outcome_of(method: str, path: str, status: int, headers: dict[str, str], data: bytes) -> tuple[str, str]:
    """What the answer to a `method` request of `path` is (http_fuzz.OUTCOMES) and why, from its status, headers and
    body (status -1: the connection closed)."""
    if status >= 500:
        return "server-error", data[:300].decode("utf-8", "replace")
    if headers.get("x-hung-up"):   # the client left mid-answer: only the server's health counts
        return ("ok" if status < 300 else "refused"), "hung up"
    if 200 <= status < 300:
        problem = good_success(headers, data)
        return ("bad-body", problem) if problem else ("ok", "")
    if status == 400 and data.startswith(b"Invalid HTTP request"):   # uvicorn's parser, before any route
        return "protocol", data[:80].decode("utf-8", "replace")
    if 400 <= status < 500 and method == "HEAD":   # an answer to HEAD has no body (RFC 9110): its headers
        if not data and headers.get("content-type", "").startswith("application/json"):
            return "refused", "HEAD"
        return "bad-body", f"HEAD: {headers.get('content-type')!r}, {len(data)} bytes of body"
    if 400 <= status < 500:
        if is_error_object(data, path):
            return "refused", json.loads(data)["error"]["message"][:160]
        return "bad-body", data[:300].decode("utf-8", "replace")
    if status == -1:
        return "protocol", f"connection closed: {data[:120].decode()}"
    return "bad-body", f"status {status}"
