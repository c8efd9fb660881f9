"""Board profiles: load the YAML record of a board, merge what it `extends`, validate it, resolve it.

Where the files live: the shipped profiles are the checkout's top-level `board_profiles/*.yaml`, carried
unchanged into the wheel as `bmoe_edge/board_profiles/` (pyproject.toml, `wheel.packages`), so a board
can read them after `pip install`. A bundle carries its board's resolved profile as a file,
`profile/<board>.yaml` (`profile_file_text`), which the board reads as it is. A user adds or
overrides profiles in directories given with `--profiles-dir`, in the user profile directory
`${XDG_CONFIG_HOME:-~/.config}/bmoe-edge/profiles` (where `bmoe-edge tune` writes the profile it
measured), or in `$BMOE_EDGE_PROFILES` (os.pathsep-separated), searched in that order before the
shipped ones, so theirs win by name. The user directory comes before `$BMOE_EDGE_PROFILES` because a
deployed release's launcher puts the release's resolved profile there (`<release>/profile`): a tuned
`rpi5.yaml` that `extends: rpi5` then layers on top of it. Files whose name starts with `_` are
fragments (shared CPU/OS facts), pulled in with `extends`, never boards themselves.

Merge order: each `extends` entry in order (each resolved the same way, recursively), then the file's
own fields; later wins. Mappings (`storage`, `ssh`, `engine`) merge key by key; every other value is
replaced whole.
A profile's `name` is its file name and is never inherited. A file may extend its own name: that
means the next profile of that name in search order (a user's `rpi5.yaml` can extend the shipped one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bmoe_edge import llama_source
from bmoe_edge.boards.profile_schema import (
    DEFAULTS,
    NAME_PATTERN,
    SCHEMA,
    SSH_FIELDS,
    Field,
    Value,
    field_error,
    is_int,
    read_fields,
)
from bmoe_edge.errors import BmoeError, show_path

PROFILES_ENV = "BMOE_EDGE_PROFILES"
SUFFIX = ".yaml"
FRAGMENT_PREFIX = "_"
STORAGE_PREFIX = "_storage-"  # a storage class: a fragment that sets only `storage:`


def shipped_dir() -> Path:
    """The shipped profiles: inside an installed wheel, `bmoe_edge/board_profiles/`; in a checkout
    (and an editable install), the top-level `board_profiles/` they are copied from."""
    packaged = Path(__file__).resolve().parent.parent / "board_profiles"
    return packaged if packaged.is_dir() else llama_source.PROJECT_ROOT / "board_profiles"


# ---------------------------------------------------------------------------------------------------
# The resolved record.


@dataclass(frozen=True)
class Storage:
    kind: str
    read_mb_s: int
    read_iops: int | None = None
    latency_us: float | None = None


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
    engine: dict[str, object]         # the engine settings this profile sets (engine.settings names)
    ssh: Ssh
    exec_wrapper: tuple[str, ...] | None
    hook: bool
    # every file merged, first to last (the profile's own file is last); not part of equality
    files: tuple[Path, ...] = field(compare=False)

    @property
    def source(self) -> Path:
        return self.files[-1]

    @property
    def storage_class(self) -> str | None:
        """The storage class the board extends (the last `_storage-CLASS` fragment merged), if any."""
        names = [p.stem[len(STORAGE_PREFIX):] for p in self.files if p.stem.startswith(STORAGE_PREFIX)]
        return names[-1] if names else None

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
            if isinstance(value, Storage):
                value = {k: v for k, v in vars(value).items() if v is not None}
            elif isinstance(value, Ssh):
                value = dict(vars(value))
            elif isinstance(value, dict):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[key] = value
        return out


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


def _extends(v: Value | None) -> list[tuple[str, int]]:
    if v is None or v.value is None:
        return []
    if isinstance(v.value, str):
        return [(v.value, v.line)]
    return [(name, v.item_lines[i] if i < len(v.item_lines) else v.line) for i, name in enumerate(v.value)]


def _overlay(into: dict[str, Value], fields: Mapping[str, Value]) -> None:
    for key, v in fields.items():
        old = into.get(key)
        if isinstance(v.value, dict) and old is not None and isinstance(old.value, dict):
            v = Value({**old.value, **v.value}, v.path, v.line)
        into[key] = v


def _merged(
    path: Path, index: Mapping[str, list[Path]], seen: dict[Path, dict[str, Value]],
    chain: tuple[Path, ...], files: list[Path],
) -> dict[str, Value]:
    if path not in seen:
        seen[path] = read_fields(path)
    fields = seen[path]
    merged: dict[str, Value] = {}
    for name, line in _extends(fields.get("extends")):
        candidates = index.get(name, [])
        if path in candidates:  # extending one's own name: the next file of that name in search order
            candidates = candidates[candidates.index(path) + 1:]
        if not candidates:
            fragments = sorted(n for n in index if n.startswith(FRAGMENT_PREFIX))
            raise field_error(path, line, "extends", f"no profile or fragment named '{name}' "
                         f"(fragments: {', '.join(fragments) or 'none'})")
        parent = candidates[0]
        if parent in (*chain, path):
            stack = [*chain, path]
            loop = [*(p.stem for p in stack[stack.index(parent):]), parent.stem]
            raise field_error(path, line, "extends", f"loop: {' -> '.join(loop)}")
        inherited = _merged(parent, index, seen, (*chain, path), files)
        inherited.pop("name", None)
        _overlay(merged, inherited)
    _overlay(merged, {k: v for k, v in fields.items() if k != "extends"})
    files.append(path)
    return merged


def _plain(v: Value | None) -> object:
    if v is None:
        return None
    if isinstance(v.value, dict):
        return {k: _plain(sv) for k, sv in v.value.items()}
    return v.value


def _require(
    fields: Mapping[str, Value], table: Mapping[str, Field], at: tuple[Path, int], prefix: str = "",
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
            raise field_error(v.path, v.line, f"{prefix}{key}", "required, but set to nothing here")
        raise field_error(*at, f"{prefix}{key}", "required, but neither this file nor what it extends sets it")


def _cross_checks(path: Path, f: Mapping[str, Value]) -> None:
    """Rules that involve two fields."""
    def is_set(key: str) -> bool:
        return key in f and f[key].value is not None

    if f["arch"].value == "aarch64":
        for key in ("march", "qemu_cpu"):
            if not is_set(key):
                raise field_error(path, 1, key, "required for an aarch64 board (arch is set at "
                             f"{show_path(f['arch'].path)}:{f['arch'].line})")
    elif is_set("march"):
        raise field_error(f["march"].path, f["march"].line, "march",
                     "an x86_64 board takes no march (it becomes GGML_CPU_ARM_ARCH, ARM only)")
    engine = f["engine"].value
    assert isinstance(engine, dict)
    cache = engine.get("cache_mb")
    if cache is not None and cache.value == "auto":
        for key in ("cache_floor_mb", "cache_ceil_mb"):
            if key not in engine or engine[key].value is None:
                raise field_error(f["engine"].path, f["engine"].line, f"engine.{key}", "required when cache_mb is "
                                  f"auto (set at {show_path(cache.path)}:{cache.line})")
    # A fixed budget or the floor kept free cannot exceed the RAM; the ceiling is only an upper bound
    # (a user profile that lowers ram_mb need not lower it too).
    ram = f["ram_mb"]
    for key in ("cache_mb", "cache_floor_mb"):
        v = engine.get(key)
        if v is not None and is_int(v.value) and v.value >= ram.value:  # type: ignore[operator]
            raise field_error(v.path, v.line, f"engine.{key}", f"{v.value} MiB is not less than ram_mb "
                              f"{ram.value} ({show_path(ram.path)}:{ram.line})")


def _resolve(path: Path, dirs: Sequence[Path]) -> BoardProfile:
    files: list[Path] = []
    f = _merged(path, _index(dirs), {}, (), files)
    own_name = f.get("name")
    if own_name is not None and own_name.value is not None and own_name.value != path.stem:
        raise field_error(own_name.path, own_name.line, "name", f"{own_name.value!r} differs from the file name "
                     f"{path.stem!r} (a profile's name is its file name)")
    if not re.fullmatch(NAME_PATTERN, path.stem):
        raise field_error(path, 1, "name", f"{path.stem!r} (the file name) is not a valid profile name")
    _require(f, SCHEMA, (path, 1))
    _cross_checks(path, f)
    data = {key: _plain(f.get(key)) for key in SCHEMA if key not in ("extends", "name")}
    for key, default in DEFAULTS.items():
        data[key] = default if data[key] is None else data[key]
    ssh = {k: data["ssh"].get(k) for k in SSH_FIELDS}  # type: ignore[union-attr]
    return BoardProfile(
        **{**data, "name": path.stem, "storage": Storage(**data["storage"]), "ssh": Ssh(**ssh),  # type: ignore[arg-type]
           "libs": tuple(data["libs"]),  # type: ignore[arg-type]
           "engine": {k: v for k, v in data["engine"].items() if v is not None},  # type: ignore[union-attr]
           "exec_wrapper": tuple(data["exec_wrapper"]) if data["exec_wrapper"] else None,  # type: ignore[arg-type]
           "files": tuple(dict.fromkeys(files))},
    )


# ---------------------------------------------------------------------------------------------------
# What the rest of the tool calls.


BOARD_ENV = "BMOE_EDGE_BOARD"


def machine_board(environ: Mapping[str, str] | None = None) -> str:
    """The profile of the machine this runs on: a deployed release's launcher names its board in
    $BMOE_EDGE_BOARD; anywhere else it is `host`."""
    return (os.environ if environ is None else environ).get(BOARD_ENV) or "host"


def load_profile(name: str, dirs: Sequence[Path] | None = None) -> BoardProfile:
    """Resolve the board `name` (first match in search order); BmoeError names file, line and field."""
    dirs = profile_dirs() if dirs is None else dirs
    index = _index(dirs)
    boards = sorted(n for n in index if not n.startswith(FRAGMENT_PREFIX))
    where = ", ".join(show_path(Path(d)) for d in dirs)
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


def storage_classes(dirs: Sequence[Path] | None = None) -> dict[str, Storage]:
    """Every storage class by name: the `_storage-CLASS.yaml` fragments (first in search order wins),
    each a `storage:` section with its kind and read bandwidth (docs/boards.md, "Storage classes")."""
    dirs = profile_dirs() if dirs is None else dirs
    out: dict[str, Storage] = {}
    for name, paths in sorted(_index(dirs).items()):
        if not name.startswith(STORAGE_PREFIX):
            continue
        fields = read_fields(paths[0])
        if set(fields) - {"storage"} or "storage" not in fields:
            raise field_error(paths[0], 1, "storage", "a storage class fragment sets `storage:` and nothing else")
        _require(fields, {"storage": SCHEMA["storage"]}, (paths[0], 1))
        out[name[len(STORAGE_PREFIX):]] = Storage(**_plain(fields["storage"]))  # type: ignore[arg-type]
    return out


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
    header = f"# {profile.name}, resolved from: {', '.join(show_path(p) for p in profile.files)}\n"
    return header + yaml.safe_dump(profile.to_dict(), sort_keys=False, default_flow_style=False).rstrip()


def profile_file_text(profile: BoardProfile) -> str:
    """The resolved profile as the file a bundle carries (`profile/<board>.yaml`): a valid profile with
    nothing to extend, the same bytes on every build machine (file names, not paths, in the comment)."""
    header = (f"# {profile.name}: the resolved board profile this bundle was built with, from "
              f"{', '.join(p.name for p in profile.files)}\n")
    return header + yaml.safe_dump(profile.to_dict(), sort_keys=False, default_flow_style=False)


def exec_prefix_here(board: str | None = None) -> list[str]:
    """How this machine runs its board's own programs (rpc-worker's server): [] on a real board; an
    emulated board's exec wrapper, with the userland the release launcher exports as $BMOE_EDGE_SYSROOT."""
    profile = load_profile(board or machine_board())
    if not profile.exec_wrapper:
        return []
    sysroot = os.environ.get("BMOE_EDGE_SYSROOT", "")
    if not sysroot:
        raise BmoeError(f"board {profile.name} runs its programs through an exec wrapper that needs the board's "
                        "userland: run this through the release's bin/bmoe-edge (it sets BMOE_EDGE_SYSROOT)")
    return profile.exec_prefix(Path(sysroot))
