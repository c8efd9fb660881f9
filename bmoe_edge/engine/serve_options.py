"""`serve`'s own options (the engine settings aside: those are engine/settings.py's rows), declared once.

Three places start a server: `serve` here, `serve --host` on a board through its release (fleet/onboard.py), and
the systemd unit `deploy --service serve` writes (fleet/services.py). Each takes its options from these rows and
says, per row, whether the option reaches that place as given (FORWARDED), is set there by the caller itself
(SET_THERE: the board's server listens on its loopback, a key travels as a private file), or is deliberately
not taken there (REFUSED, with the reason). The rows live in the engine stage, below every stage that reads
them (cli, fleet, serve). The access rule (a key beyond loopback) and the key file's format are here too, once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.engine.prompt_cache import DEFAULT_CAP_BYTES, DEFAULT_FRACTION
from bmoe_edge.errors import BmoeError
from bmoe_edge.net import is_loopback

KEY_ENV = "BMOE_EDGE_API_KEY"


class Reach(enum.Enum):
    FORWARDED = "forwarded"   # passed on as given (a value left at its default is not written)
    SET_THERE = "set there"   # the caller sets it itself
    REFUSED = "refused"       # not taken there: `why` says why


@dataclass(frozen=True)
class ServeOption:
    name: str                      # serve's parameter (and the key of the options' dict)
    flags: tuple[str, ...]
    kind: type                     # int, float, str, bool or Path; with `many`, each value's
    default: object
    help: str
    board: Reach                   # `serve --host`
    service: Reach                 # `deploy --service serve`
    why: str = ""                  # why a row is SET_THERE or REFUSED somewhere
    many: bool = False             # repeatable (a list)
    minimum: float | None = None
    maximum: float | None = None
    envvar: str | None = None      # read from the environment when not given

    @property
    def flag(self) -> str:
        return self.flags[-1]

    def as_flags(self, value: object) -> list[str]:
        """The command-line words that give `value` (none for the default: the server applies the same row)."""
        if value is None or value == self.default or (self.many and not value):
            return []
        if self.kind is bool:
            return [self.flag] if value else []
        values = value if self.many else [value]
        return [word for v in values for word in (self.flag, str(v))]  # type: ignore[union-attr]


_LOOPBACK = "the board's server listens on its loopback, reached through the SSH tunnel serve --host opens"
_DEPLOY_OWN = "deploy's own option, shared by every service kind (serve, rpc-worker)"

OPTIONS: tuple[ServeOption, ...] = (
    ServeOption("bind", ("--bind",), str, "127.0.0.1", "The address to listen on (loopback by default).",
                board=Reach.SET_THERE, service=Reach.SET_THERE, why=f"{_LOOPBACK}; {_DEPLOY_OWN}"),
    ServeOption("port", ("--port",), int, 8080, "The port to listen on.", minimum=0, maximum=65535,
                board=Reach.SET_THERE, service=Reach.SET_THERE, why=f"serve --host forwards it; {_DEPLOY_OWN}"),
    ServeOption("api_key", ("--api-key",), str, None, "Every request needs 'Authorization: Bearer KEY' "
                "(/health excepted).", envvar=KEY_ENV, board=Reach.SET_THERE, service=Reach.REFUSED,
                why="a key travels to the board as a private file (never on a command line or in `ps`); a "
                "service takes --api-key-file"),
    ServeOption("api_key_file", ("--api-key-file",), Path, None, "Read the API key from this file (a service's "
                "secret; never in `ps`); one key a line: each key is a tenant of its own.",
                board=Reach.SET_THERE, service=Reach.SET_THERE,
                why="its keys are copied to a private file on the board (0600) and the server reads that"),
    ServeOption("no_auth", ("--no-auth",), bool, False, "Listen beyond loopback without an API key (anyone who "
                "reaches the port can use the model).", board=Reach.REFUSED, service=Reach.SET_THERE,
                why=f"{_LOOPBACK} (no key is needed there); {_DEPLOY_OWN}"),
    ServeOption("allowed_host", ("--allowed-host",), str, (), "A name clients reach this server by (the Host "
                "header), beside loopback and the bound address; repeat for more ('*': any, which lets DNS "
                "rebinding in).", many=True, board=Reach.REFUSED, service=Reach.FORWARDED,
                why=f"{_LOOPBACK}: clients reach it as 127.0.0.1"),
    ServeOption("cors_origin", ("--cors-origin",), str, (), "A web origin (https://app.example) whose pages may "
                "call this server; repeat for more ('*': any). Without it, requests that carry an Origin are "
                "refused.", many=True, board=Reach.REFUSED, service=Reach.FORWARDED,
                why=f"{_LOOPBACK}: pages reach it through 127.0.0.1 here"),
    ServeOption("max_connections", ("--max-connections",), int, 64, "Open connections at most (3 or more); past "
                "it, the one waiting longest for a request is closed.", minimum=1,
                board=Reach.FORWARDED, service=Reach.FORWARDED),
    ServeOption("body_timeout", ("--body-timeout",), float, 30.0, "Seconds a request's body may take to arrive "
                "(then 408).", minimum=0.1, board=Reach.FORWARDED, service=Reach.FORWARDED),
    ServeOption("queue", ("--queue",), int, 8, "Requests that may wait; more get 429.", minimum=1,
                board=Reach.FORWARDED, service=Reach.FORWARDED),
    ServeOption("prompt_cache_mb", ("--prompt-cache-mb",), int, None, "Disk the prompt cache (long prompts' "
                "state files) may take, in MiB, shared equally by the API keys; 0 turns it off (default: "
                f"{DEFAULT_FRACTION:.0%} of its filesystem, at most {DEFAULT_CAP_BYTES >> 20} MiB).", minimum=0,
                board=Reach.FORWARDED, service=Reach.FORWARDED),
    ServeOption("model_id", ("--model-id",), str, None, "The name clients use (default: the file's name).",
                board=Reach.FORWARDED, service=Reach.FORWARDED),
    ServeOption("chat_template", ("--chat-template",), str, None, "A file with a model's Jinja template (any of "
                "llama.cpp's models/templates), or chatml (default: the model's own; ChatML when it has none).",
                board=Reach.FORWARDED, service=Reach.FORWARDED),
    ServeOption("no_ui", ("--no-ui",), bool, False, "Serve no chat page at / (GET / is then a 404); the API is "
                "unchanged.", board=Reach.FORWARDED, service=Reach.FORWARDED),
)
BY_NAME = {o.name: o for o in OPTIONS}


def reaching(where: str) -> tuple[ServeOption, ...]:
    """The rows a place takes as given: "board" (`serve --host`) or "service" (`deploy --service serve`)."""
    return tuple(o for o in OPTIONS if getattr(o, where) is Reach.FORWARDED)


def given(values: Mapping[str, object]) -> dict[str, object]:
    """The options of `values` that were given: not None, not an empty list, not a switch left off."""
    return {name: value for name, value in values.items()
            if value is not None and value != () and not (BY_NAME[name].kind is bool and value is False)}


def as_flags(values: Mapping[str, object], where: str) -> list[str]:
    """`serve`'s command-line words for the options a place takes (fleet: the board's serve, the unit)."""
    words: list[str] = []
    for name, value in values.items():
        option = BY_NAME.get(name)
        if option is None or getattr(option, where) is not Reach.FORWARDED:
            raise BmoeError(f"serve's {name.replace('_', '-')} is not passed to the {where}")
        words += option.as_flags(value)
    return words


def refused_there(values: Mapping[str, object], where: str) -> str | None:
    """A one-line error for an option given that the place refuses (None: all fine)."""
    for option in OPTIONS:
        value = values.get(option.name)
        if getattr(option, where) is Reach.REFUSED and value not in (None, False, (), []) and value != option.default:
            return f"{option.flag} is not taken by serve --host: {option.why}"
    return None


def needs_key(bind: str, has_key: bool, no_auth: bool) -> bool:
    """The access rule: beyond loopback, a server needs a key unless --no-auth says otherwise out loud."""
    return not is_loopback(bind) and not has_key and not no_auth


def read_api_keys(path: Path) -> tuple[str, ...]:
    """An API key file: one key a line (each a tenant), blank lines ignored. Fails closed: a file that cannot be
    read or holds no key is an error, never a server without a key."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BmoeError(f"cannot read the API key file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise BmoeError(f"the API key file {path} is not text") from None
    keys = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not keys:
        raise BmoeError(f"the API key file {path} holds no key: a server without a key is --no-auth")
    return keys


def check_values(values: Sequence[str], flag: str) -> None:
    """Names and origins written into a unit or a command line: one plain word each."""
    for value in values:
        if not value.strip() or any(c in value for c in "\n\r\0"):
            raise BmoeError(f"{flag} {value!r}: one plain name or origin each")
