"""Board profiles: load the YAML record of a board, merge what it `extends`, validate it, resolve it.

Where the files live: the shipped profiles are package data, `bmoe_edge/board_profiles/*.yaml`, so
they ship inside the wheel and a board can read its own profile after `pip install`. A user adds or
overrides profiles in directories given with `--profiles-dir`, in the user profile directory
`${XDG_CONFIG_HOME:-~/.config}/bmoe-edge/profiles` (where `bmoe-edge tune` writes the profile it
measured), or in `$BMOE_EDGE_PROFILES` (os.pathsep-separated), searched in that order before the
shipped ones, so theirs win by name. The user directory comes before `$BMOE_EDGE_PROFILES` because a
deployed board's launcher puts its release's resolved profile there: a tuned `rpi5.yaml` that
`extends: rpi5` then layers on top of it. Files whose name starts with `_` are fragments (shared
CPU/OS facts), pulled in with `extends`, never boards themselves.

Merge order: each `extends` entry in order (each resolved the same way, recursively), then the file's
own fields; later wins. `storage` and `ssh` merge key by key; every other value is replaced whole.
A profile's `name` is its file name and is never inherited. A file may extend its own name: that
means the next profile of that name in search order (a user's `rpi5.yaml` can extend the shipped one).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bmoe_edge.errors import BmoeError

PROFILES_ENV = "BMOE_EDGE_PROFILES"
SUFFIX = ".yaml"
FRAGMENT_PREFIX = "_"


def shipped_dir() -> Path:
    """The profiles that ship with the package (also inside an installed wheel)."""
    return Path(__file__).resolve().parent / "board_profiles"


# ---------------------------------------------------------------------------------------------------
# The schema, as data: one row per field.


@dataclass(frozen=True)
class Field:
    kind: str                       # a key of KINDS
    required: bool = True
    choices: tuple[object, ...] = ()
    pattern: str | None = None      # a string (each item, for lists) must match it whole
    expect: str = ""                # what `pattern` means, for the error message
    minimum: int | None = None      # smallest number; for lists, fewest items
    maximum: int | None = None
    subfields: Mapping[str, Field] | None = None   # for kind "map"
    help: str = ""


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# kind -> (accepts the value?, how to say it)
KINDS: dict[str, tuple[object, str]] = {
    "str": (lambda x: isinstance(x, str), "a string"),
    "int": (_is_int, "an integer"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "list": (lambda x: isinstance(x, list), "a list of strings"),
    "map": (lambda x: isinstance(x, dict), "a mapping"),
    "int|auto": (lambda x: _is_int(x) or x == "auto", "an integer or 'auto'"),
    "str|list": (lambda x: isinstance(x, (str, list)), "a name or a list of names"),
}

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"

STORAGE_FIELDS: dict[str, Field] = {
    "kind": Field("str", choices=("nvme", "sd", "emmc", "ssd"), help="what the models are read from"),
    "read_mb_s": Field("int", minimum=1, help="expected sequential read speed, MB/s"),
}

SSH_FIELDS: dict[str, Field] = {
    "user": Field("str", pattern=r"[a-z_][a-z0-9_.-]*", expect="a user name", help="login user"),
    "install_dir": Field("str", pattern=r"/\S*", expect="an absolute path without spaces",
                         help="where releases are installed on the board"),
    "host": Field("str", required=False, pattern=r"[A-Za-z0-9.:_-]+", expect="a host name or address",
                  help="default address (real boards are usually named on the command line)"),
    "port": Field("int", required=False, minimum=1, maximum=65535, help="ssh port (default 22)"),
}

SCHEMA: dict[str, Field] = {
    "extends": Field("str|list", required=False, pattern=f"_?{_NAME}", expect="a profile or fragment name",
                     help="fragments (or profiles) merged first, in order"),
    "name": Field("str", required=False, pattern=_NAME, expect="the file's name",
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
    "threads": Field("int", minimum=1, help="compute threads"),
    "io_threads": Field("int", minimum=1, help="expert reader lanes"),
    "read_path": Field("str", choices=("pread", "odirect"), help="how expert slices are read"),
    "cache_mb": Field("int|auto", minimum=0, help="expert cache budget, MiB, or auto"),
    "cache_floor_mb": Field("int", required=False, minimum=0,
                            help="auto: MiB of MemAvailable left to everything else"),
    "cache_ceil_mb": Field("int", required=False, minimum=0, help="auto: largest budget, MiB"),
    "cache_margin_mb": Field("int", required=False, minimum=0,
                             help="auto: MiB kept free beyond the measured working set (engine default 64)"),
    "page_kb": Field("int", required=False, choices=(0, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                     help="the engine's page unit, KiB (0 = the kernel's page size)"),
    "dense": Field("str", choices=("mmap", "anon"), help="where dense weights live"),
    "overlap": Field("bool", help="read experts while the layer computes (needs the hook)"),
    "ssh": Field("map", subfields=SSH_FIELDS, help="deploy defaults"),
    "exec_wrapper": Field("list", required=False, minimum=1, pattern=r"([^{}]|\{sysroot\})*",
                          expect="an argument; the only placeholder is {sysroot}",
                          help="command prefix that runs the board's programs (emulated boards)"),
    "hook": Field("bool", required=False, help="the build must carry the expert-ready hook (default true)"),
}

DEFAULTS: dict[str, object] = {"hook": True}


# ---------------------------------------------------------------------------------------------------
# The resolved record.


@dataclass(frozen=True)
class Storage:
    kind: str
    read_mb_s: int


@dataclass(frozen=True)
class Ssh:
    user: str
    install_dir: str
    host: str | None
    port: int | None


@dataclass(frozen=True)
class BoardProfile:
    name: str
    vendor: str
    arch: str
    cpu: str
    march: str | None
    toolchain: str
    page_size: int
    ram_mb: int
    storage: Storage
    python: str
    glibc: str
    qemu_cpu: str | None
    libs: tuple[str, ...]
    threads: int
    io_threads: int
    read_path: str
    cache_mb: int | str
    cache_floor_mb: int | None
    cache_ceil_mb: int | None
    cache_margin_mb: int | None
    page_kb: int | None
    dense: str
    overlap: bool
    ssh: Ssh
    exec_wrapper: tuple[str, ...] | None
    hook: bool
    # every file merged, first to last (the profile's own file is last); not part of equality
    files: tuple[Path, ...] = field(compare=False)

    @property
    def source(self) -> Path:
        return self.files[-1]

    @property
    def emulated(self) -> bool:
        return self.exec_wrapper is not None

    def exec_prefix(self, sysroot: Path) -> list[str]:
        """The command prefix that runs a board program here ([] for a real board)."""
        return [arg.replace("{sysroot}", str(sysroot)) for arg in self.exec_wrapper or ()]

    def to_dict(self) -> dict[str, object]:
        """The profile's fields as plain JSON/YAML data (no `files`); loading it back gives this profile."""
        out: dict[str, object] = {}
        for key in SCHEMA:
            if key == "extends":
                continue
            value = getattr(self, key)
            if isinstance(value, Storage | Ssh):
                value = dict(vars(value))
            elif isinstance(value, tuple):
                value = list(value)
            out[key] = value
        return out


# ---------------------------------------------------------------------------------------------------
# Reading one file, keeping the line of every value.


@dataclass(frozen=True)
class _Value:
    value: object               # for a mapping: dict[str, _Value]
    path: Path
    line: int                   # 1-based line of the field's key
    item_lines: tuple[int, ...] = ()
    raw: str | None = None      # the scalar as written, for hints


def _show(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _error(path: Path, line: int, name: str, message: str) -> BmoeError:
    return BmoeError(f"{_show(path)}:{line}: field '{name}': {message}")


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, path: Path, prefix: str) -> dict[str, _Value]:
    out: dict[str, _Value] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise _error(path, line, f"{prefix}{key}", "a field name must be a word")
        if key in out:
            raise _error(path, line, f"{prefix}{key}", f"set twice (first on line {out[key].line})")
        if isinstance(value_node, yaml.MappingNode):
            out[key] = _Value(_mapping(loader, value_node, path, f"{prefix}{key}."), path, line)
        else:
            value = loader.construct_object(value_node, deep=True)
            items = value_node.value if isinstance(value_node, yaml.SequenceNode) else ()
            raw = value_node.value if isinstance(value_node, yaml.ScalarNode) else None
            out[key] = _Value(value, path, line, tuple(n.start_mark.line + 1 for n in items), raw)
    return out


def _read_fields(path: Path) -> dict[str, _Value]:
    """Parse one profile file into its own fields (not merged), each checked against SCHEMA."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BmoeError(f"{_show(path)}: cannot read: {exc}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise BmoeError(f"{_show(path)}:1: the file is empty; a profile is a mapping of field: value")
        if not isinstance(node, yaml.MappingNode):
            raise BmoeError(f"{_show(path)}:{node.start_mark.line + 1}: "
                            "a profile must be a mapping of field: value")
        fields = _mapping(loader, node, path, "")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise BmoeError(f"{_show(path)}:{mark.line + 1 if mark else 1}: YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise BmoeError(f"{_show(path)}: YAML error: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    return {key: _check(key, SCHEMA, value) for key, value in fields.items()}


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


def _check(name: str, table: Mapping[str, Field], v: _Value, prefix: str = "") -> _Value:
    """Check one field's own value; "" and null mean "unset" (a required field is checked after merging)."""
    where = f"{prefix}{name}"
    spec = table.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known fields: {', '.join(table)}"
        raise _error(v.path, v.line, where, f"unknown field; {hint}")
    x = v.value
    if x is None or x == "":
        return _Value(None, v.path, v.line)
    accepts, wanted = KINDS[spec.kind]
    if not accepts(x):  # type: ignore[operator]
        hint = f' (write it quoted: "{v.raw}")' if spec.kind == "str" and v.raw is not None else ""
        raise _error(v.path, v.line, where, f"expected {wanted}, got {_describe(x)}{hint}")
    if isinstance(x, dict):
        for sub, sv in x.items():
            x[sub] = _check(sub, spec.subfields or {}, sv, f"{where}.")
        return v
    if isinstance(x, list):
        if spec.minimum is not None and len(x) < spec.minimum:
            raise _error(v.path, v.line, where, f"needs at least {spec.minimum} item(s)")
        for i, item in enumerate(x):
            line = v.item_lines[i] if i < len(v.item_lines) else v.line
            if not isinstance(item, str):
                raise _error(v.path, line, f"{where}[{i}]", f"expected a string, got {_describe(item)}")
            _check_scalar(spec, item, v.path, line, f"{where}[{i}]")
        return v
    if not (spec.kind == "int|auto" and x == "auto"):
        _check_scalar(spec, x, v.path, v.line, where)
    return v


def _check_scalar(spec: Field, x: object, path: Path, line: int, where: str) -> None:
    if spec.choices and x not in spec.choices:
        raise _error(path, line, where, f"{x!r} is not one of {', '.join(map(str, spec.choices))}")
    if isinstance(x, str) and spec.pattern and not re.fullmatch(spec.pattern, x):
        raise _error(path, line, where, f"{x!r} is not {spec.expect}")
    if _is_int(x):
        if spec.minimum is not None and x < spec.minimum:  # type: ignore[operator]
            raise _error(path, line, where, f"{x} is less than {spec.minimum}")
        if spec.maximum is not None and x > spec.maximum:  # type: ignore[operator]
            raise _error(path, line, where, f"{x} is more than {spec.maximum}")


# ---------------------------------------------------------------------------------------------------
# Finding files, merging `extends`.


def user_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The user profile directory, ${XDG_CONFIG_HOME:-$HOME/.config}/bmoe-edge/profiles (None without
    either variable); it need not exist."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or (f"{env['HOME']}/.config" if env.get("HOME") else "")
    return Path(base) / "bmoe-edge" / "profiles" if base else None


def profile_dirs(extra: Sequence[Path | str] = (), environ: Mapping[str, str] | None = None) -> list[Path]:
    """Search order: `extra` (--profiles-dir), the user profile directory (when it exists), then
    $BMOE_EDGE_PROFILES, then the shipped profiles."""
    env = os.environ if environ is None else environ
    given = [(Path(d), "--profiles-dir") for d in extra]
    user = user_dir(env)
    if user is not None and user.is_dir():
        given.append((user, "the user profile directory"))
    given += [(Path(d), f"${PROFILES_ENV}") for d in env.get(PROFILES_ENV, "").split(os.pathsep) if d]
    dirs: list[Path] = []
    for d, origin in given:
        if not d.is_dir():
            raise BmoeError(f"profiles directory {d} (from {origin}) does not exist or is not a directory")
        if d.resolve() not in dirs:
            dirs.append(d.resolve())
    shipped = shipped_dir()
    return [*dirs, shipped] if shipped not in dirs else dirs


def _index(dirs: Sequence[Path]) -> dict[str, list[Path]]:
    """name -> its files, in search order (the first one wins)."""
    index: dict[str, list[Path]] = {}
    for d in dirs:
        for path in sorted(Path(d).resolve().glob(f"*{SUFFIX}")):
            index.setdefault(path.stem, []).append(path)
    return index


def board_names(dirs: Sequence[Path] | None = None) -> list[str]:
    """Every board name (fragments excluded), sorted."""
    dirs = profile_dirs() if dirs is None else dirs
    return sorted(n for n in _index(dirs) if not n.startswith(FRAGMENT_PREFIX))


def _extends(v: _Value | None) -> list[tuple[str, int]]:
    if v is None or v.value is None:
        return []
    if isinstance(v.value, str):
        return [(v.value, v.line)]
    return [(name, v.item_lines[i] if i < len(v.item_lines) else v.line) for i, name in enumerate(v.value)]


def _overlay(into: dict[str, _Value], fields: Mapping[str, _Value]) -> None:
    for key, v in fields.items():
        old = into.get(key)
        if isinstance(v.value, dict) and old is not None and isinstance(old.value, dict):
            v = _Value({**old.value, **v.value}, v.path, v.line)
        into[key] = v


def _merged(
    path: Path, index: Mapping[str, list[Path]], seen: dict[Path, dict[str, _Value]],
    chain: tuple[Path, ...], files: list[Path],
) -> dict[str, _Value]:
    if path not in seen:
        seen[path] = _read_fields(path)
    fields = seen[path]
    merged: dict[str, _Value] = {}
    for name, line in _extends(fields.get("extends")):
        candidates = index.get(name, [])
        if path in candidates:  # extending one's own name: the next file of that name in search order
            candidates = candidates[candidates.index(path) + 1:]
        if not candidates:
            fragments = sorted(n for n in index if n.startswith(FRAGMENT_PREFIX))
            raise _error(path, line, "extends", f"no profile or fragment named '{name}' "
                         f"(fragments: {', '.join(fragments) or 'none'})")
        parent = candidates[0]
        if parent in (*chain, path):
            stack = [*chain, path]
            loop = [*(p.stem for p in stack[stack.index(parent):]), parent.stem]
            raise _error(path, line, "extends", f"loop: {' -> '.join(loop)}")
        inherited = _merged(parent, index, seen, (*chain, path), files)
        inherited.pop("name", None)
        _overlay(merged, inherited)
    _overlay(merged, {k: v for k, v in fields.items() if k != "extends"})
    files.append(path)
    return merged


def _plain(v: _Value | None) -> object:
    if v is None:
        return None
    if isinstance(v.value, dict):
        return {k: _plain(sv) for k, sv in v.value.items()}
    return v.value


def _require(
    fields: Mapping[str, _Value], table: Mapping[str, Field], at: tuple[Path, int], prefix: str = "",
) -> None:
    """Every required field is set; `at` is where a missing one is reported (the file, or its mapping)."""
    for key, spec in table.items():
        v = fields.get(key)
        if v is not None and v.value is not None:
            if isinstance(v.value, dict) and spec.subfields:
                _require(v.value, spec.subfields, (v.path, v.line), f"{prefix}{key}.")
            continue
        if not spec.required:
            continue
        if v is not None:
            raise _error(v.path, v.line, f"{prefix}{key}", "required, but set to nothing here")
        raise _error(*at, f"{prefix}{key}", "required, but neither this file nor what it extends sets it")


def _cross_checks(path: Path, f: Mapping[str, _Value]) -> None:
    """Rules that involve two fields."""
    def is_set(key: str) -> bool:
        return key in f and f[key].value is not None

    if f["arch"].value == "aarch64":
        for key in ("march", "qemu_cpu"):
            if not is_set(key):
                raise _error(path, 1, key, "required for an aarch64 board (arch is set at "
                             f"{_show(f['arch'].path)}:{f['arch'].line})")
    elif is_set("march"):
        raise _error(f["march"].path, f["march"].line, "march",
                     "an x86_64 board takes no march (it becomes GGML_CPU_ARM_ARCH, ARM only)")
    if f["cache_mb"].value == "auto":
        for key in ("cache_floor_mb", "cache_ceil_mb"):
            if not is_set(key):
                raise _error(path, 1, key, "required when cache_mb is auto (set at "
                             f"{_show(f['cache_mb'].path)}:{f['cache_mb'].line})")
    # A fixed budget or the floor kept free cannot exceed the RAM; the ceiling is only an upper bound
    # (a user profile that lowers ram_mb need not lower it too).
    ram = f["ram_mb"]
    for key in ("cache_mb", "cache_floor_mb"):
        v = f.get(key)
        if v is not None and _is_int(v.value) and v.value >= ram.value:  # type: ignore[operator]
            raise _error(v.path, v.line, key, f"{v.value} MiB is not less than ram_mb {ram.value} "
                         f"({_show(ram.path)}:{ram.line})")


def _resolve(path: Path, dirs: Sequence[Path]) -> BoardProfile:
    files: list[Path] = []
    f = _merged(path, _index(dirs), {}, (), files)
    own_name = f.get("name")
    if own_name is not None and own_name.value is not None and own_name.value != path.stem:
        raise _error(own_name.path, own_name.line, "name", f"{own_name.value!r} differs from the file name "
                     f"{path.stem!r} (a profile's name is its file name)")
    if not re.fullmatch(_NAME, path.stem):
        raise _error(path, 1, "name", f"{path.stem!r} (the file name) is not a valid profile name")
    _require(f, SCHEMA, (path, 1))
    _cross_checks(path, f)
    data = {key: _plain(f.get(key)) for key in SCHEMA if key not in ("extends", "name")}
    for key, default in DEFAULTS.items():
        data[key] = default if data[key] is None else data[key]
    ssh = {k: data["ssh"].get(k) for k in SSH_FIELDS}  # type: ignore[union-attr]
    return BoardProfile(
        **{**data, "name": path.stem, "storage": Storage(**data["storage"]), "ssh": Ssh(**ssh),  # type: ignore[arg-type]
           "libs": tuple(data["libs"]),  # type: ignore[arg-type]
           "exec_wrapper": tuple(data["exec_wrapper"]) if data["exec_wrapper"] else None,  # type: ignore[arg-type]
           "files": tuple(dict.fromkeys(files))},
    )


# ---------------------------------------------------------------------------------------------------
# What the rest of the tool calls.


def load_profile(name: str, dirs: Sequence[Path] | None = None) -> BoardProfile:
    """Resolve the board `name` (first match in search order); BmoeError names file, line and field."""
    dirs = profile_dirs() if dirs is None else dirs
    index = _index(dirs)
    boards = sorted(n for n in index if not n.startswith(FRAGMENT_PREFIX))
    where = ", ".join(_show(Path(d)) for d in dirs)
    if name.startswith(FRAGMENT_PREFIX) and name in index:
        raise BmoeError(f"'{name}' is a fragment (shared facts pulled in with `extends`), not a board; "
                        f"known boards: {', '.join(boards)}")
    if name not in index:
        raise BmoeError(f"unknown board profile '{name}'; known: {', '.join(boards) or 'none'} "
                        f"(searched {where})")
    return _resolve(index[name][0], dirs)


def load_profile_file(path: Path, dirs: Sequence[Path] | None = None) -> BoardProfile:
    """Resolve one profile file directly; its `extends` are looked up in its own directory, then `dirs`."""
    path = Path(path).resolve()
    if not path.is_file():
        raise BmoeError(f"profile file {path} does not exist")
    dirs = profile_dirs() if dirs is None else dirs
    return _resolve(path, [path.parent, *(d for d in dirs if Path(d).resolve() != path.parent)])


def load_all(dirs: Sequence[Path] | None = None) -> tuple[list[BoardProfile], list[BmoeError]]:
    """Every board that resolves, and the errors of those that do not (a broken one hides no other)."""
    dirs = profile_dirs() if dirs is None else dirs
    found: list[BoardProfile] = []
    errors: list[BmoeError] = []
    for name in board_names(dirs):
        try:
            found.append(load_profile(name, dirs))
        except BmoeError as exc:
            errors.append(exc)
    return found, errors


def _ram(mb: int) -> str:
    return f"{mb // 1024} GiB" if mb % 1024 == 0 else f"{mb / 1024:.1f} GiB"


def format_table(profiles: Sequence[BoardProfile]) -> str:
    """The `profiles list` table."""
    rows = [("NAME", "ARCH", "CPU", "MARCH", "RAM", "STORAGE")]
    rows += [(p.name, p.arch, p.cpu, p.march or "-", _ram(p.ram_mb),
              f"{p.storage.kind} {p.storage.read_mb_s} MB/s") for p in profiles]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def format_record(profile: BoardProfile) -> str:
    """The `profiles show` text: the resolved record as YAML (itself a valid profile), files as a comment."""
    header = f"# {profile.name}, resolved from: {', '.join(_show(p) for p in profile.files)}\n"
    return header + yaml.safe_dump(profile.to_dict(), sort_keys=False, default_flow_style=False).rstrip()
