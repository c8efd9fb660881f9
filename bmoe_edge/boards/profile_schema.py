"""The board profile schema, as data (one row per field), and reading one profile file with the line
of every value, each checked against its row. The `engine:` section is derived from the engine's
settings table (bmoe_edge.engine.settings).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from bmoe_edge.engine.settings import PROFILE_SETTINGS, Setting
from bmoe_edge.errors import BmoeError, show_path

# ---------------------------------------------------------------------------------------------------
# The schema, as data: one row per field.


@dataclass(frozen=True)
class Field:
    kind: str                       # a key of KINDS
    required: bool = True
    choices: tuple[object, ...] = ()
    pattern: str | None = None      # a string (each item, for lists) must match it whole
    expect: str = ""                # what `pattern` means, for the error message
    minimum: float | None = None    # smallest number; for lists, fewest items
    maximum: float | None = None
    subfields: Mapping[str, Field] | None = None   # for kind "map"
    help: str = ""
    check: Callable[[object], object] | None = None  # the rest of the value's rules (an engine setting's own)


def is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


# kind -> (accepts the value?, how to say it)
KINDS: dict[str, tuple[object, str]] = {
    "str": (lambda x: isinstance(x, str), "a string"),
    "int": (is_int, "an integer"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "list": (lambda x: isinstance(x, list), "a list of strings"),
    "map": (lambda x: isinstance(x, dict), "a mapping"),
    "int|auto": (lambda x: is_int(x) or x == "auto", "an integer or 'auto'"),
    "number": (is_number, "a number"),
    "number|auto": (lambda x: is_number(x) or x == "auto", "a number or 'auto'"),
    "bool|auto": (lambda x: isinstance(x, bool) or x == "auto", "true, false or 'auto'"),
    "str|list": (lambda x: isinstance(x, (str, list)), "a name or a list of names"),
}

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"

# A storage class is a fragment `_storage-CLASS.yaml` that sets only this section (bench.storage).
STORAGE_FIELDS: dict[str, Field] = {
    "kind": Field("str", choices=("nvme", "sd", "emmc", "ssd", "ufs"), help="what the models are read from"),
    "read_mb_s": Field("int", minimum=1, help="read bandwidth, MB/s (large reads; `bench stream --storage` "
                       "throttles to it)"),
    "read_iops": Field("int", required=False, minimum=1, help="4 KiB random reads per second with a queue "
                       "(the throttle's IOPS limit)"),
    "latency_us": Field("number", required=False, minimum=0, help="one 4 KiB random read at queue depth 1, "
                        "microseconds (recorded; the throttle does not add latency)"),
}

def _engine_field(s: Setting) -> Field:
    """A profile field from a row of the engine's settings table."""
    kind = {bool: "bool", int: "int", float: "number", str: "str"}[s.kind] + ("|auto" if s.auto else "")
    return Field(kind, required=s.profile == "required", choices=s.choices, minimum=s.minimum, maximum=s.maximum,
                 help=s.help, check=s.check)


# Derived from bmoe_edge.engine.settings: a setting with a `profile` key is a field under `engine:`.
ENGINE_FIELDS: dict[str, Field] = {s.name: _engine_field(s) for s in PROFILE_SETTINGS}

SSH_FIELDS: dict[str, Field] = {
    "user": Field("str", pattern=r"[a-z_][a-z0-9_.-]*", expect="a user name", help="login user"),
    "install_dir": Field("str", pattern=r"/\S*", expect="an absolute path without spaces",
                         help="where releases are installed on the board"),
    "host": Field("str", required=False, pattern=r"[A-Za-z0-9.:_-]+", expect="a host name or address",
                  help="default address (real boards are usually named on the command line)"),
    "port": Field("int", required=False, minimum=1, maximum=65535, help="ssh port (default 22)"),
}

SCHEMA: dict[str, Field] = {
    "extends": Field("str|list", required=False, pattern=f"_?{NAME_PATTERN}", expect="a profile or fragment name",
                     help="fragments (or profiles) merged first, in order"),
    "name": Field("str", required=False, pattern=NAME_PATTERN, expect="the file's name",
                  help="the board's name; must equal the file name"),
    "vendor": Field("str", help="who makes the board"),
    "arch": Field("str", choices=("aarch64", "x86_64"), help="CPU architecture"),
    "cpu": Field("str", pattern=r"[a-z0-9][a-z0-9.+-]*", expect="a CPU name like cortex-a76",
                 help="core type, gcc -mcpu spelling"),
    "march": Field("str", required=False, pattern=r"armv[89](\.[0-9])?-a(\+[a-z0-9]+)*",
                   expect="an Arm -march like armv8.2-a+dotprod+fp16",
                   help="becomes GGML_CPU_ARM_ARCH; aarch64 only"),
    "toolchain": Field("str", pattern=r"native|[A-Za-z0-9._-]+\.cmake",
                       expect="'native' or a file name in toolchains/ ending in .cmake",
                       help="CMake toolchain file, or native"),
    "page_size": Field("int", choices=(4096, 16384, 65536), help="kernel page size, bytes"),
    "ram_mb": Field("int", minimum=64, help="board RAM, MiB"),
    "storage": Field("map", subfields=STORAGE_FIELDS, help="what models stream from"),
    "python": Field("str", pattern=r"3\.[0-9]+", expect='a Python version like "3.11" (quoted)',
                    help="the board's Python (wheel tag, headers)"),
    "glibc": Field("str", pattern=r"2\.[0-9]+", expect='a glibc version like "2.36" (quoted)',
                   help="oldest glibc on the board"),
    "qemu_cpu": Field("str", required=False, pattern=r"[a-z0-9][a-z0-9-]*",
                      expect="a qemu -cpu model name", help="qemu model with the board's ISA; aarch64 only"),
    "libs": Field("list", minimum=1, pattern=r"[A-Za-z0-9_.+-]+\.so(\.[0-9]+)*",
                  expect="a shared library name like libc.so.6", help="shared libraries the board provides"),
    "engine": Field("map", subfields=ENGINE_FIELDS, help="the engine's settings on this board (defaults of a run)"),
    "ssh": Field("map", subfields=SSH_FIELDS, help="deploy defaults"),
    "exec_wrapper": Field("list", required=False, minimum=1, pattern=r"([^{}]|\{sysroot\})*",
                          expect="an argument; the only placeholder is {sysroot}",
                          help="command prefix that runs the board's programs (emulated boards)"),
    "hook": Field("bool", required=False, help="the build must carry the expert-ready hook (default true)"),
}

DEFAULTS: dict[str, object] = {"hook": True}


# ---------------------------------------------------------------------------------------------------
# Reading one file, keeping the line of every value.


@dataclass(frozen=True)
class Value:
    value: object               # for a mapping: dict[str, Value]
    path: Path
    line: int                   # 1-based line of the field's key
    item_lines: tuple[int, ...] = ()
    raw: str | None = None      # the scalar as written, for hints


def field_error(path: Path, line: int, name: str, message: str) -> BmoeError:
    return BmoeError(f"{show_path(path)}:{line}: field '{name}': {message}")


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, path: Path, prefix: str) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise field_error(path, line, f"{prefix}{key}", "a field name must be a word")
        if key in out:
            raise field_error(path, line, f"{prefix}{key}", f"set twice (first on line {out[key].line})")
        if isinstance(value_node, yaml.MappingNode):
            out[key] = Value(_mapping(loader, value_node, path, f"{prefix}{key}."), path, line)
        else:
            value = loader.construct_object(value_node, deep=True)
            items = value_node.value if isinstance(value_node, yaml.SequenceNode) else ()
            raw = value_node.value if isinstance(value_node, yaml.ScalarNode) else None
            out[key] = Value(value, path, line, tuple(n.start_mark.line + 1 for n in items), raw)
    return out


def read_fields(path: Path) -> dict[str, Value]:
    """Parse one profile file into its own fields (not merged), each checked against SCHEMA."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BmoeError(f"{show_path(path)}: cannot read: {exc}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise BmoeError(f"{show_path(path)}:1: the file is empty; a profile is a mapping of field: value")
        if not isinstance(node, yaml.MappingNode):
            raise BmoeError(f"{show_path(path)}:{node.start_mark.line + 1}: "
                            "a profile must be a mapping of field: value")
        fields = _mapping(loader, node, path, "")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise BmoeError(f"{show_path(path)}:{mark.line + 1 if mark else 1}: YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise BmoeError(f"{show_path(path)}: YAML error: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    return {key: check_field(key, SCHEMA, value) for key, value in fields.items()}


def _describe(x: object) -> str:
    if isinstance(x, bool):
        return f"a boolean ({str(x).lower()})"
    if isinstance(x, int | float):
        return f"a number ({x})"
    if isinstance(x, str):
        return f"a string ({x!r})"
    if isinstance(x, list):
        return "a list"
    if isinstance(x, dict):
        return "a mapping"
    return type(x).__name__


def check_field(name: str, table: Mapping[str, Field], v: Value, prefix: str = "") -> Value:
    """Check one field's own value; "" and null mean "unset" (a required field is checked after merging)."""
    where = f"{prefix}{name}"
    spec = table.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known fields: {', '.join(table)}"
        if table is SCHEMA and name in ENGINE_FIELDS:
            hint = f"engine settings go under `engine:` (engine.{name})"
        raise field_error(v.path, v.line, where, f"unknown field; {hint}")
    x = v.value
    if x is None or x == "":
        return Value(None, v.path, v.line)
    accepts, wanted = KINDS[spec.kind]
    if not accepts(x):  # type: ignore[operator]
        hint = f' (write it quoted: "{v.raw}")' if spec.kind == "str" and v.raw is not None else ""
        raise field_error(v.path, v.line, where, f"expected {wanted}, got {_describe(x)}{hint}")
    if isinstance(x, dict):
        for sub, sv in x.items():
            x[sub] = check_field(sub, spec.subfields or {}, sv, f"{where}.")
        return v
    if isinstance(x, list):
        if spec.minimum is not None and len(x) < spec.minimum:
            raise field_error(v.path, v.line, where, f"needs at least {spec.minimum} item(s)")
        for i, item in enumerate(x):
            line = v.item_lines[i] if i < len(v.item_lines) else v.line
            if not isinstance(item, str):
                raise field_error(v.path, line, f"{where}[{i}]", f"expected a string, got {_describe(item)}")
            _check_scalar(spec, item, v.path, line, f"{where}[{i}]")
        return v
    if not (spec.kind.endswith("|auto") and x == "auto"):
        _check_scalar(spec, x, v.path, v.line, where)
    if spec.check is not None:
        try:
            spec.check(x)
        except BmoeError as exc:
            raise field_error(v.path, v.line, where, str(exc)) from None
    return v


def _check_scalar(spec: Field, x: object, path: Path, line: int, where: str) -> None:
    if spec.choices and x not in spec.choices:
        raise field_error(path, line, where, f"{x!r} is not one of {', '.join(map(str, spec.choices))}")
    if isinstance(x, str) and spec.pattern and not re.fullmatch(spec.pattern, x):
        raise field_error(path, line, where, f"{x!r} is not {spec.expect}")
    if is_number(x):
        if spec.minimum is not None and x < spec.minimum:  # type: ignore[operator]
            raise field_error(path, line, where, f"{x} is less than {spec.minimum:g}")
        if spec.maximum is not None and x > spec.maximum:  # type: ignore[operator]
            raise field_error(path, line, where, f"{x} is more than {spec.maximum:g}")


