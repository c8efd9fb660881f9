"""What `bmoe-edge tune` reports and writes: its result (TuneResult, also as JSON for `tune --host`),
and the user profile it writes — `<board>.yaml` (`extends: <board>`, the engine settings under
`engine:`, the read speed under `storage:`, the measurements as comments) in the user profile
directory (`profiles.user_dir()`) or `--out FILE`, atomically, only after it resolved."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bmoe_edge.boards import profiles
from bmoe_edge.engine.memlimits import MemoryLimit
from bmoe_edge.errors import BmoeError
from bmoe_edge.tune.measure import ComputeCell, IoCell, Machine
from bmoe_edge.tune.rules import Choice, lane_curve
from bmoe_edge.units import KiB, size_text

ENGINE_KEYS = ("io_threads", "threads", "read_path", "cache_margin_mb")   # what tune sets under `engine:`


@dataclass(frozen=True)
class TuneResult:
    board: str
    where: str                      # "this machine" or the board's label
    read_file: str                  # the model, or "scratch file in DIR"
    sizes: tuple[int, ...]
    io: tuple[IoCell, ...]
    odirect_note: str
    fixture: str
    compute: tuple[ComputeCell, ...]
    machine: Machine
    before: dict[str, Any]          # the profile's values of what tune sets
    choice: Choice
    measured_at: str
    profile_yaml: str = ""
    written: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # one line each: figures that would not carry over, and what was left alone

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str) -> TuneResult:
        d = json.loads(text)
        m = d["machine"]
        machine = Machine(**{**m, "limits": tuple(MemoryLimit(**x) for x in m["limits"])})
        return TuneResult(**{
            **d, "sizes": tuple(d["sizes"]), "io": tuple(IoCell(**c) for c in d["io"]),
            "compute": tuple(ComputeCell(**{**c, "samples": tuple(c.get("samples", ()))}) for c in d["compute"]),
            "machine": machine, "choice": Choice(**d["choice"]), "written": tuple(d["written"]),
            "warnings": tuple(d.get("warnings", ())),
        })


def profile_before(profile: profiles.BoardProfile) -> dict[str, Any]:
    """The profile's own values of what tune sets (None: the profile leaves it to the engine's default)."""
    return {**{key: profile.engine.get(key) for key in ENGINE_KEYS},
            "read_mb_s": profile.storage.read_mb_s, "page_size": profile.page_size}


def profile_fields(board: str, choice: Choice) -> dict[str, Any]:
    """The user profile's fields: it extends the board's, engine settings under `engine:`; what the choice
    left alone (None) is not written, so the board's value stays."""
    data: dict[str, Any] = {"extends": board}
    if choice.page_size is not None:
        data["page_size"] = choice.page_size
    if choice.read_mb_s is not None:
        data["storage"] = {"read_mb_s": choice.read_mb_s}
    data["engine"] = {key: getattr(choice, key) for key in ENGINE_KEYS if getattr(choice, key) is not None}
    return data


def render_profile(r: TuneResult) -> str:
    """The user profile: `extends` the board's, the chosen fields, what was measured as comments."""
    m = r.machine
    limits = ", ".join(f"{lim.mb} MiB ({lim.source})" for lim in m.limits) or "no memory cgroup limit"
    curves = {mode: lane_curve(r.io, mode) for mode in ("odirect", "pread")}
    lines = [
        f"# Written by `bmoe-edge tune` at {r.measured_at} on {m.hostname} ({m.arch}, {m.cores} cores, "
        f"{m.ram_mb} MiB RAM, {m.page_size // KiB} KiB pages;",
        f"# limits: {limits}).",
        f"# It layers what was measured on the `{r.board}` profile; run `bmoe-edge tune` again to refresh it,",
        "# delete this file to go back to the profile's own values.",
        f"# reads of {', '.join(size_text(s) for s in r.sizes)} from {r.read_file}, MiB/s by lanes:",
    ]
    for mode, curve in curves.items():
        if curve:
            lines.append(f"#   {mode:<7} " + ", ".join(f"{n}: {v:.0f}" for n, v in curve.items()))
    if len(r.sizes) > 1:
        for size in r.sizes:
            cells = [c for c in r.io if c.size == size]
            lines.append(f"#   {size_text(size)}: " + ", ".join(
                f"{mode} " + " ".join(f"{c.lanes}:{c.mib_s:.0f}" for c in cells if c.mode == mode)
                for mode in ("odirect", "pread") if any(c.mode == mode for c in cells)))
    if r.odirect_note:
        lines.append(f"#   {r.odirect_note}")
    for mode in ("stream", "resident"):
        cells = [c for c in r.compute if c.mode == mode]
        if cells:
            lines.append(f"# {'streaming' if mode == 'stream' else 'resident'} decode of {Path(r.fixture).name}, "
                         "tok/s by threads (median, low-high): "
                         + ", ".join(f"{c.threads}: {c.tok_s:.2f} ({c.low:.2f}-{c.high:.2f})" for c in cells))
    for key, why in r.choice.left.items():
        lines.append(f"# left alone: {key}: {why}")
    body = yaml.safe_dump(profile_fields(r.board, r.choice), sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


def check_profile(text: str, name: str, exclude: Path | None) -> profiles.BoardProfile:
    """Resolve the profile text as file `<name>.yaml` against the search path without `exclude` (the
    directory it will replace a file in: `extends: <name>` then means the profile under it)."""
    skip = exclude.resolve() if exclude is not None else None
    dirs = [d for d in profiles.profile_dirs() if d != skip]
    with tempfile.TemporaryDirectory(prefix="bmoe-tune-") as tmp:
        path = Path(tmp) / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            return profiles.load_profile_file(path, dirs)
        except BmoeError as exc:
            raise BmoeError(f"the tuned profile does not resolve: {str(exc).replace(str(path), name + '.yaml')}") \
                from None


def destination(board: str, out: Path | None) -> Path:
    if out is not None:
        if not out.name.endswith(profiles.SUFFIX):
            raise BmoeError(f"--out {out}: a profile file name ends in {profiles.SUFFIX} (its name is the profile's)")
        return out
    user = profiles.user_dir()
    if user is None:
        raise BmoeError("no user profile directory: neither $XDG_CONFIG_HOME nor $HOME is set; pass --out FILE")
    return user / f"{board}{profiles.SUFFIX}"


def check_writable(dest: Path) -> None:
    """Fail before measuring when the profile could not be written (its nearest existing directory)."""
    d = dest.parent
    while not d.exists() and d != d.parent:
        d = d.parent
    try:   # a real try (access(2) says yes to root everywhere), leaving nothing behind
        Path(tempfile.mkdtemp(prefix=".bmoe-tune-", dir=d)).rmdir()
    except OSError as exc:
        raise BmoeError(f"cannot write {dest}: {d}: {exc.strerror}") from None


@contextlib.contextmanager
def staged(dest: Path, text: str) -> Iterator[Path]:
    """Write `text` next to `dest` under a temporary name; the caller commits with `commit(tmp, dest)`.
    Nothing is left behind when the block fails."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise BmoeError(f"cannot write {dest}: {exc.strerror}") from None
    tmp = Path(name)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def commit(tmp: Path, dest: Path) -> None:
    try:
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except OSError as exc:
        raise BmoeError(f"cannot write {dest}: {exc.strerror}") from None


def write_profile(dest: Path, text: str) -> None:
    with staged(dest, text) as tmp:
        commit(tmp, dest)
