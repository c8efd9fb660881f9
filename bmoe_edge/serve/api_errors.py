"""A refused or failed request, and the one rule for the shape its error takes: Anthropic's error object on the
routes of Anthropic's Messages API (its clients read `error.type` from it), OpenAI's everywhere else (Chat
Completions, Completions, the Responses API, and the routes no API owns). Every error the server writes for a
request whose path it knows — the gate's 403 and 415, the key's 401, a 404 or 405, the in-flight limit's 503,
a handler's 4xx and 5xx — goes through `body_for`, so an endpoint answers in its own API's shape whoever
refused it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ANTHROPIC_PREFIX = "/v1/messages"   # /v1/messages and /v1/messages/count_tokens

# Anthropic's error types by HTTP status (its API reference's "Errors"); any other 4xx is invalid_request_error,
# any other 5xx api_error.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error", 529: "overloaded_error"}


def speaks_anthropic(path: str) -> bool:
    """Whether `path` is one of Anthropic's Messages API routes (or under them)."""
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


class ApiError(Exception):
    """A request the server answers with an error object (OpenAI's or Anthropic's) and this HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's error object: its type follows the status, as Anthropic's does."""
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def body_for(self, path: str) -> dict[str, Any]:
        return self.anthropic_body() if speaks_anthropic(path) else self.body()


def bad_request(message: str, param: str) -> ApiError:
    """A 400 of a translated API's request (Messages, Responses): what is wrong with `param`, and where the fields
    each API supports are listed."""
    return ApiError(400, f"{message} (see docs/serve.md)", param=param)


def tools_of_type(value: Any, kind: str, refusal: str, default: str | None = None) -> list[Mapping[str, Any]] | None:
    """A request's `tools` when every one is of type `kind` (a tool without a type counts as `default`); anything
    else is a 400 naming the first other type, with `refusal` saying what is supported."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request("'tools' must be a list", "tools")
    for tool in value:
        if not isinstance(tool, Mapping) or tool.get("type", default) != kind:
            other = tool.get("type") if isinstance(tool, Mapping) else tool
            raise bad_request(f"the tool type {other!r:.60} is not supported: {refusal}", "tools")
    return value
