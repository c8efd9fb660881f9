"""The engine's and sampling's settings, as the native engine declares them (one X-macro row each in
`native/include/bmoe/config.h`: type, default, bounds, rule, profile key, flag, help).

Nothing here lists a setting: `SETTINGS` is built from the rows the engine exports (`_native.settings()`),
their defaults are a default-constructed native config's, and their bounds are checked by the engine's
own check (`_native.check_setting`), so C++ and Python callers get the same answer. Derived from
`SETTINGS`: the `StreamConfig` and `Sampling` records and their conversion to the native structs, the
command-line options (bmoe_edge.cli.common), the `engine:` section of a board profile
(bmoe_edge.boards.profile_schema), and the flags `generate --host` forwards to a board
(bmoe_edge.fleet.onboard).

Python values: a choice is its name; a switch the engine may decide (`overlap`) is true, false or "auto";
a number whose rule is auto (`cache_mb`, `n_expert_used`, `seed`) is a number or "auto".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Any, Literal

from bmoe_edge.engine import native
from bmoe_edge.errors import BmoeError

_KINDS: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str, "choice": str, "toggle": bool}
_TOGGLE_TO_NATIVE = {True: "on", False: "off", "auto": "auto"}
_AUTO = -1  # the native encoding of "auto" (bmoe::kAuto)


@dataclass(frozen=True)
class Setting:
    """One row of the native declaration, seen from Python."""

    group: Literal["engine", "sampling"]
    name: str
    kind: type                          # bool, int, float or str
    default: Any
    help: str
    flags: tuple[str, ...] = ()         # command-line options; () = Python/config only. A bool's is "--x/--no-x".
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    below_max: bool = False             # the maximum itself is out of range
    profile: Literal["required", "optional", None] = None   # key under a board profile's `engine:`
    auto: bool = False                  # "auto" is a value too (the engine decides where it runs)
    toggle: bool = False                # natively a switch: off, on or auto
    native_choices: tuple[str, ...] = ()  # the native declaration's spellings (a toggle's too)
    lossy: bool = False                 # a value other than the default makes the output differ from the model's

    @property
    def flag(self) -> str:
        """The long flag, as shown in errors (and forwarded to a board)."""
        return self.flags[-1].split("/")[0] if self.flags else ""

    @property
    def switch(self) -> tuple[str, str] | None:
        """(on, off) flags of a boolean setting."""
        if self.kind is bool and self.flags:
            on, _, off = self.flags[-1].partition("/")
            return on, off
        return None

    def _where(self) -> str:
        return f"{self.name} ({self.flag})" if self.flag else self.name

    def _typed(self, value: Any) -> Any:
        """`value` as this setting's Python type (text from a flag or a profile is parsed), or BmoeError."""
        auto = " or auto" if self.auto else ""
        if self.auto and value == "auto":
            return value
        if self.kind is bool:
            if not isinstance(value, bool):
                raise BmoeError(f"{self._where()} must be true or false{auto}, got {value!r}")
            return value
        if self.kind in (int, float) and not isinstance(value, bool):
            try:
                number = self.kind(value) if isinstance(value, str) else value
            except ValueError:
                number = None
            if self.kind is int and isinstance(number, int):
                return number
            if self.kind is float and isinstance(number, int | float) and number == number:  # not NaN
                return float(number)
        if self.kind in (int, float):
            what = "an integer" if self.kind is int else "a number"
            raise BmoeError(f"{self._where()} must be {what}{auto}, got {value!r}")
        if not isinstance(value, str) or (self.choices and value not in self.choices):
            raise BmoeError(f"{self._where()} must be {' or '.join(self.choices) or 'a string'}, got {value!r}")
        return value

    def check(self, value: Any) -> Any:
        """The value, typed and checked against the row's bounds and rule by the engine itself; BmoeError
        says which setting and why."""
        value = self._typed(value)
        if self.auto and not self.toggle and value != "auto" and value == _AUTO:  # natively auto: say "auto"
            raise BmoeError(f"{self._where()} must be >= {self.minimum:g} or auto, got {value!r}")
        n = native.load()
        record = n.StreamConfig() if self.group == "engine" else n.SamplingParams()
        try:
            setattr(record, self.name, self.to_native(value))
            n.check_setting(record, self.name)
        except (n.EngineError, TypeError, OverflowError) as exc:
            message = str(exc) if isinstance(exc, n.EngineError) else f"{self.name} is out of range, got {value!r}"
            raise BmoeError(message.replace(self.name, self._where(), 1)) from None
        return value

    def to_native(self, value: Any) -> Any:
        """The native struct's value of this setting."""
        if self.toggle:
            return _TOGGLE_TO_NATIVE[value]
        if self.auto and value == "auto":
            return _AUTO
        return value

    def from_native(self, value: Any) -> Any:
        if self.toggle:
            return {v: k for k, v in _TOGGLE_TO_NATIVE.items()}[value]
        if self.auto and value == _AUTO:
            return "auto"
        return self.kind(value)

    def as_flag(self, value: Any) -> list[str]:
        """The command-line arguments that give this setting `value` (what --host forwards)."""
        switch = self.switch
        if switch is not None and value == "auto":
            return []  # a switch's flag cannot say auto: the board decides (its profile's value, else auto)
        if switch is not None:
            return [switch[0] if value else switch[1]]
        return [self.flag, repr(value) if isinstance(value, float) else str(value)]


def _row(info: Any, defaults: Mapping[str, Any]) -> Setting:
    flags = (*([info.short_flag] if info.short_flag else []), info.flag) if info.flag else ()
    partial = Setting(
        group=info.group, name=info.name, kind=_KINDS[info.kind], default=None, help=info.help, flags=flags,
        choices=() if info.kind == "toggle" else tuple(info.choices),
        minimum=None if info.minimum == float("-inf") else info.minimum,
        maximum=None if info.maximum == float("inf") else info.maximum, below_max=info.below_max,
        profile=info.profile or None, auto=info.auto_value, toggle=info.kind == "toggle", lossy=info.lossy,
        native_choices=tuple(info.choices))
    if partial.toggle and set(partial.native_choices) != set(_TOGGLE_TO_NATIVE.values()):
        raise BmoeError(f"internal error: the native toggle {info.name} is spelled {partial.native_choices}")
    return replace(partial, default=partial.from_native(defaults[info.name]))


def _table() -> tuple[Setting, ...]:
    n = native.load()
    defaults = {"engine": n.StreamConfig(), "sampling": n.SamplingParams()}
    return tuple(_row(i, {i.name: getattr(defaults[i.group], i.name)}) for i in n.settings())


SETTINGS: tuple[Setting, ...] = _table()
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
ENGINE_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.group == "engine")
SAMPLING_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.group == "sampling")
PROFILE_SETTINGS: tuple[Setting, ...] = tuple(s for s in ENGINE_SETTINGS if s.profile)
FLAG_SETTINGS: tuple[Setting, ...] = tuple(s for s in ENGINE_SETTINGS if s.flags)
SAMPLING_FLAGS: tuple[Setting, ...] = tuple(s for s in SAMPLING_SETTINGS if s.flags)
# The rows whose value, away from its default, changes the output (`bench quality` measures them, gates refuse them).
LOSSY_SETTINGS: tuple[Setting, ...] = tuple(s for s in ENGINE_SETTINGS if s.lossy)
# Conversations (`chat`, `serve`) sample where nothing says otherwise; everything else is greedy by default.
CONVERSATION_TEMP: float = float(native.load().conversation_temp)


def _record(name: str, rows: tuple[Setting, ...], native_type: str, doc: str) -> Any:
    def post_init(self: Any) -> None:
        for s in rows:
            object.__setattr__(self, s.name, s.check(getattr(self, s.name)))

    def to_native(self: Any) -> Any:
        out = getattr(native.load(), native_type)()
        for s in rows:
            setattr(out, s.name, s.to_native(getattr(self, s.name)))
        return out

    cls = make_dataclass(name, [(s.name, s.kind, field(default=s.default)) for s in rows], frozen=True,
                         kw_only=True, namespace={"__post_init__": post_init, "to_native": to_native, "__doc__": doc})
    cls.__module__ = __name__
    return cls


# Every setting of a run, one field per engine row; the defaults are a sensible host run, a board profile
# supplies its own. Frozen and keyword-only; `dataclasses.replace` makes variants (validated again).
StreamConfig = _record("StreamConfig", ENGINE_SETTINGS, "StreamConfig",
                       "Every setting of a run (one field per engine row of bmoe/config.h).")
# How tokens are chosen, one field per sampling row (keyword-only: a new row cannot shift the others).
Sampling = _record("Sampling", SAMPLING_SETTINGS, "SamplingParams",
                   "How tokens are chosen (one field per sampling row of bmoe/config.h).")


def resolve(defaults: Mapping[str, object] | None, overrides: Mapping[str, object | None]) -> Any:
    """A StreamConfig: the declared defaults, then `defaults` (a board profile's `engine:`), then the
    `overrides` that were given (None = not given)."""
    values: dict[str, object] = {k: v for k, v in (defaults or {}).items() if v is not None}
    engine = {s.name for s in ENGINE_SETTINGS}
    unknown = sorted(set(values) - engine)
    if unknown:
        raise BmoeError(f"unknown engine setting {unknown[0]!r} (known: {', '.join(sorted(engine))})")
    values.update({k: v for k, v in overrides.items() if v is not None and k in engine})
    return replace(StreamConfig(), **values)


def sampling(given: Mapping[str, object | None], *, conversation: bool = False) -> Any:
    """A Sampling from the options that were given (None = not given): the declared defaults, with a
    conversation's temperature for `chat` and `serve`."""
    values = {k: v for k, v in given.items() if v is not None}
    if conversation:
        values.setdefault("temp", CONVERSATION_TEMP)
    return Sampling(**values)


def config_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(StreamConfig))
