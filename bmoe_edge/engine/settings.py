"""Every engine setting, declared once: name, type, default, CLI flag, help, profile key, validation.

The rest is derived from `SETTINGS`: the `StreamConfig` record and its conversion to the native
config, the `generate` options (bmoe_edge.cli.engine_options), the `engine:` section of a board
profile (bmoe_edge.boards.profiles), and the flags `generate --host` forwards to a board
(bmoe_edge.fleet.onboard). Adding a setting is adding a row here (and its field in the C++
config); nothing else lists them.

The cache budget is one typed value, `CacheBudget` (off, a fixed number of MiB, or auto), parsed
in one place (`CacheBudget.parse`) whether it comes from a flag, a profile or Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Any, Literal

from bmoe_edge.engine import rpc
from bmoe_edge.errors import BmoeError


@dataclass(frozen=True)
class CacheBudget:
    """The expert cache: `off` (keep nothing beyond the layer in flight), `fixed` MiB, or `auto`
    (available memory - cache_floor_mb, at most cache_ceil_mb; the engine works it out)."""

    mode: Literal["off", "fixed", "auto"]
    mb: float = 0.0

    @classmethod
    def parse(cls, value: object) -> CacheBudget:
        """`auto`, a number of MiB (0 = off; fractions allowed), or a CacheBudget."""
        if isinstance(value, CacheBudget):
            return value
        if value == "auto":
            return cls("auto")
        mb: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            mb = float(value)
        elif isinstance(value, str):
            try:
                mb = float(value)
            except ValueError:
                mb = None
        if mb is None or mb != mb or mb < 0:  # mb != mb: NaN
            raise BmoeError(f"cache_mb (--cache-mb) must be a number of MiB >= 0 (0 = no cache) or 'auto', "
                            f"got {value!r}")
        return cls("off") if mb == 0 else cls("fixed", mb)

    def native(self) -> float:
        """The C++ config's encoding: MiB, with -1 for auto."""
        return -1.0 if self.mode == "auto" else self.mb

    def __str__(self) -> str:
        return "auto" if self.mode == "auto" else f"{self.mb:g}"


FAULT_KINDS = ("corrupt", "fail", "short", "hang")


def _fault(value: str) -> tuple[str, int]:
    """"" (none) or KIND:N, KIND one of FAULT_KINDS (the Nth slice read)."""
    if not value:
        return "none", 0
    kind, _, nth = value.partition(":")
    if kind not in FAULT_KINDS or not nth.isdigit() or int(nth) < 1:
        raise BmoeError(f"fault must be {', '.join(k + ':N' for k in FAULT_KINDS)} with N >= 1, got {value!r}")
    return kind, int(nth)


def _overlap(value: bool | str, n: Any) -> Mapping[str, Any]:
    """auto: on where this build has the expert-ready hook and no other engine of this process uses it
    (the hook is process-wide); asked for explicitly, the engine refuses where it cannot."""
    if value == "auto":
        return {"overlap": bool(n.build_info().expert_ready_hook) and not n.overlap_in_use()}
    return {"overlap": value}


@dataclass(frozen=True)
class Setting:
    """One row of the table."""

    name: str
    kind: type                          # bool, int, float, str or CacheBudget
    default: Any
    help: str
    flags: tuple[str, ...] = ()         # `generate` options; () = Python/config only. A bool's flag is
                                        # "--x/--no-x".
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    profile: Literal["required", "optional", None] = None   # key under a board profile's `engine:`
    profile_minimum: int | None = None  # a board profile is stricter than the engine
    auto: bool = False                  # "auto" is a value too (the engine decides where it runs)
    native: Callable[[Any, Any], Mapping[str, Any]] | None = None   # (value, _native) -> native fields

    @property
    def flag(self) -> str:
        """The long flag, as shown in errors (and forwarded to a board)."""
        return self.flags[-1].split("/")[0] if self.flags else ""

    @property
    def toggle(self) -> tuple[str, str] | None:
        """(on, off) flags of a boolean setting."""
        if self.kind is bool and self.flags:
            on, _, off = self.flags[-1].partition("/")
            return on, off
        return None

    def _where(self) -> str:
        return f"{self.name} ({self.flag})" if self.flag else self.name

    def check(self, value: Any) -> Any:
        """The value, validated and normalized; BmoeError says which setting and why."""
        if self.kind is CacheBudget:
            return CacheBudget.parse(value)
        if self.auto and value == "auto":
            return value
        if self.kind is bool:
            if not isinstance(value, bool):
                raise BmoeError(f"{self._where()} must be true or false{' or auto' if self.auto else ''}, "
                                f"got {value!r}")
            return value
        if self.kind is float:
            try:
                value = float(value) if not isinstance(value, bool) else None
            except (TypeError, ValueError):
                value = None
            if value is None or value != value:  # NaN
                raise BmoeError(f"{self._where()} must be a number")
            return self._in_bounds(value)
        if self.kind is int:
            if isinstance(value, str) and value.lstrip("-").isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise BmoeError(f"{self._where()} must be an integer, got {value!r}")
            return self._in_bounds(value)
        if not isinstance(value, str) or (self.choices and value not in self.choices):
            raise BmoeError(f"{self._where()} must be {' or '.join(self.choices) or 'a string'}, got {value!r}")
        if self.name == "fault":
            _fault(value)
        if self.name == "rpc" and value:
            rpc.parse_endpoints(value)
        return value

    def _in_bounds(self, value: float) -> Any:
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
            raise BmoeError(f"{self._where()} must be {bounds}, got {value:g}")
        return value

    def to_native(self, value: Any, n: Any) -> Mapping[str, Any]:
        """The native config fields this setting sets."""
        if self.native is not None:
            return self.native(value, n)
        return {self.name: value}

    def as_flag(self, value: Any) -> list[str]:
        """The `generate` arguments that give this setting `value` (what --host forwards)."""
        if self.auto and value == "auto":
            return []  # the board decides: its profile's value, else its own auto
        toggle = self.toggle
        if toggle is not None:
            return [toggle[0] if value else toggle[1]]
        return [self.flag, str(value)]


SETTINGS: tuple[Setting, ...] = (
    Setting("stream", bool, True, "Stream experts (default on).", flags=("--stream/--no-stream",)),
    Setting("cache_mb", CacheBudget, CacheBudget("auto"),
            "Expert cache: MiB, 0 = off, or auto (what the memory limits leave; adapts to pressure).",
            flags=("--cache-mb",), profile="required",
            native=lambda v, n: {"cache_mb": v.native()}),
    Setting("cache_floor_mb", int, 1024, "Where the machine's memory is the limit: MiB left to other processes.",
            flags=("--cache-floor-mb",), minimum=0, profile="optional"),
    Setting("cache_ceil_mb", int, 1 << 20, "auto: at most this.", flags=("--cache-ceil-mb",), minimum=0,
            profile="optional"),
    Setting("cache_margin_mb", int, 64, "MiB kept free under the memory limit beyond what the engine foresees.",
            flags=("--cache-margin-mb",), minimum=0, profile="optional"),
    Setting("page_kb", int, 0, "The mirror's page unit, KiB: a power of two from the kernel's page (0) to 1024.",
            flags=("--page-kb",), minimum=0, maximum=1024, profile="optional"),
    Setting("io_threads", int, 4, "Read lanes.", flags=("--io-threads",), minimum=1, maximum=64,
            profile="required"),
    Setting("read_path", str, "odirect", "pread or odirect.", flags=("--read-path",), choices=("pread", "odirect"),
            profile="required", native=lambda v, n: {"read_path": getattr(n.ReadPath, v)}),
    Setting("dense", str, "mmap", "Dense weights: mmap or anon.", flags=("--dense",), choices=("mmap", "anon"),
            profile="required", native=lambda v, n: {"dense": getattr(n.DenseMode, v)}),
    Setting("overlap", bool, "auto", "I/O-compute overlap (default: on where the build has the hook).",
            flags=("--overlap/--no-overlap",), profile="required", auto=True, native=_overlap),
    Setting("prefetch", str, "auto", "Read ahead: guess each next layer's experts from its router weights and read "
            "them while this layer computes (lossless: a wrong guess costs bandwidth, never tokens). predict = every "
            "decode; auto = only while it measures faster than off.", flags=("--prefetch",),
            choices=("off", "predict", "auto"), profile="optional",
            native=lambda v, n: {"prefetch": getattr(n.Prefetch, v)}),
    Setting("threads", int, 0, "Compute threads (0 = auto: all cores, one left to the read lanes when streaming).",
            flags=("-t", "--threads"), minimum=0,
            profile="required"),
    Setting("ctx", int, 2048, "Context length (`generate` without it: the prompt and -n, in steps of 256, up to "
            "this).", flags=("-c", "--ctx"), minimum=1),
    Setting("batch", int, 512, "Logical batch size.", minimum=1),
    Setting("ubatch", int, 512, "Physical batch size.", minimum=1),
    Setting("flash_attn", bool, False, "Flash attention."),
    Setting("n_expert_used", int, "auto", "LOSSY: route every token to K experts instead of the model's count "
            "(auto = the model's). The output is not the model's; the run info says so and gates refuse it.",
            flags=("--n-expert-used",), minimum=1, auto=True,
            native=lambda v, n: {"n_expert_used": 0 if v == "auto" else v}),
    Setting("drop_cold", float, 0.0, "LOSSY: skip a routed expert that is not resident (cached or read ahead) and "
            "carries less than this share of its token's routing weight; the kept experts share the weight "
            "(0 = off). Needs a cache: a skipped slot points at a cached expert with weight zero.",
            flags=("--drop-cold",), minimum=0.0),
    Setting("speculative", str, "off", "Speculative decoding: ngram verifies prompt-lookup drafts in one batch "
            "(greedy decoding only; identical tokens). A model's own MTP heads are not used: the pinned "
            "llama.cpp has no API to run them.", flags=("--speculative",), choices=("off", "ngram"),
            profile="optional", native=lambda v, n: {"speculative_ngram": v == "ngram"}),
    Setting("draft_max", int, 8, "Speculative decoding: draft at most this many tokens.", flags=("--draft-max",),
            minimum=1, maximum=64, profile="optional"),
    Setting("route_trace", str, "", "Write every token's routed experts, per layer, to this CSV (streaming only).",
            flags=("--route-trace",)),
    Setting("io_timeout", int, 30, "I/O deadline, seconds: a read making no progress this long fails the step "
            "(0 = wait forever).", flags=("--io-timeout",), minimum=0, maximum=1_000_000, profile="optional",
            native=lambda v, n: {"io_timeout_s": float(v)}),
    Setting("verify_slices", bool, False, "Check every slice read against the model's checksums (written once by "
            "`bmoe-edge verify-model`); a mismatch is read again, then fails.",
            flags=("--verify-slices/--no-verify-slices",), profile="optional"),
    Setting("parse_special", bool, False, "Let prompt text name control tokens (e.g. </s>); off: a prompt is text.",
            flags=("--parse-special/--no-parse-special",)),
    Setting("fault", str, "", "Test only: corrupt:N, fail:N, short:N or hang:N garbles, fails, cuts short or "
            "stalls the Nth slice read.",
            native=lambda v, n: {"fault_kind": getattr(n.FaultKind, _fault(v)[0]), "fault_nth": _fault(v)[1]}),
    Setting("rpc", str, "", "llama.cpp RPC workers HOST:PORT[,HOST:PORT]: whole layers go there, resident; this "
            "machine keeps the first layers and streams their experts (docs/rpc.md).", flags=("--rpc",),
            native=lambda v, n: {"rpc_endpoints": [str(e) for e in rpc.parse_endpoints(v)] if v else []}),
    Setting("rpc_split", str, "", "Layer shares W0,W1,...: this machine first, then each --rpc worker "
            "(default: by free memory).", flags=("--rpc-split",),
            native=lambda v, n: {"rpc_split": [float(w) for w in v.split(",")] if v else []}),
    Setting("rpc_timeout", int, 300, "RPC: a decode waiting this many seconds on the workers ends the run with one "
            "line (a stopped worker or a lost network); 0 = wait forever.", flags=("--rpc-timeout",), minimum=0,
            native=lambda v, n: {"rpc_timeout_s": float(v)}),
    Setting("rpc_insecure", bool, False, "Allow --rpc workers on a non-loopback address: RPC has no "
            "authentication or encryption (docs/rpc.md).", flags=("--rpc-insecure/--no-rpc-insecure",),
            native=lambda v, n: {}),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
PROFILE_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.profile)
FLAG_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.flags)


def _post_init(self: Any) -> None:
    for s in SETTINGS:
        object.__setattr__(self, s.name, s.check(getattr(self, s.name)))


def _to_native(self: Any) -> Any:  # -> bmoe_edge._native.StreamConfig
    from bmoe_edge.engine import native

    n = native.load()
    c = n.StreamConfig()
    for s in SETTINGS:
        for key, value in s.to_native(getattr(self, s.name), n).items():
            setattr(c, key, value)
    return c


# Every setting of a run, one field per row; the defaults are a sensible host run, a board profile
# supplies its own. Frozen; `dataclasses.replace` makes variants (validated again).
StreamConfig = make_dataclass(
    "StreamConfig",
    [(s.name, s.kind, field(default=s.default)) for s in SETTINGS],
    frozen=True,
    namespace={"__post_init__": _post_init, "to_native": _to_native,
               "__doc__": "Every setting of a run (one field per row of bmoe_edge.engine.settings.SETTINGS)."},
)
StreamConfig.__module__ = __name__


def resolve(defaults: Mapping[str, object] | None, overrides: Mapping[str, object | None]) -> Any:
    """A StreamConfig: the table's defaults, then `defaults` (a board profile's `engine:`), then the
    `overrides` that were given (None = not given)."""
    values: dict[str, object] = {k: v for k, v in (defaults or {}).items() if v is not None}
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise BmoeError(f"unknown engine setting {unknown[0]!r} (known: {', '.join(BY_NAME)})")
    values.update({k: v for k, v in overrides.items() if v is not None and k in BY_NAME})
    return replace(StreamConfig(), **values)


def config_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(StreamConfig))
