"""Slice checksums: a model's sidecar of CRC-32C sums, written and checked by `bmoe-edge verify-model`,
read by the engine for `--verify-slices`.

The sidecar sits next to the model (first shard) as `<model>.sums`: JSON, one CRC-32C per expert
slice of every routed-expert tensor, one per dense tensor, and one per file header (everything
before the file's first tensor), each file named with its size. It carries its own BLAKE2b over
the canonical JSON of the rest, so a damaged sidecar is refused, never believed. The sums are
computed by the engine's own CRC-32C (`native/src/core/crc32c.cpp`), the one `--verify-slices` checks
every read with.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe_edge.engine import native
from bmoe_edge.errors import BmoeError, show_path

FORMAT = "bmoe-edge-sums/1"
SUFFIX = ".sums"


@dataclass(frozen=True)
class Slice:
    """A checksummed range: a file header, a dense tensor (expert -1) or one expert's slice."""

    tensor: str
    expert: int
    file: int
    offset: int
    length: int


@dataclass(frozen=True)
class Mismatch:
    slice: Slice
    expected: int
    found: int

    def describe(self, files: list[str]) -> str:
        s = self.slice
        what = s.tensor if s.expert < 0 else f"{s.tensor} expert {s.expert}"
        return (f"{what}: {s.length} bytes at offset {s.offset} of {show_path(files[s.file])}: CRC-32C "
                f"{self.found:08x}, expected {self.expected:08x}")


@dataclass(frozen=True)
class Report:
    sidecar: Path
    files: list[str]
    slices: int
    mismatches: list[Mismatch]
    written: bool  # the sidecar was (re)written now rather than checked


def sidecar_path(model: Path) -> Path:
    return model.with_name(model.name + SUFFIX)


def _layout(model: Path) -> Any:
    with native.engine_errors():
        return native.load().model_layout(str(model))


def model_slices(layout: Any) -> list[Slice]:
    """Every checksummed range of a model, in file order."""
    out = [Slice("(header)", -1, i, 0, start) for i, start in enumerate(layout.data_starts)]
    for t in layout.tensors:
        if t.n_slices:
            step = t.bytes // t.n_slices
            out += [Slice(t.name, e, t.file, t.offset + e * step, step) for e in range(t.n_slices)]
        else:
            out.append(Slice(t.name, -1, t.file, t.offset, t.bytes))
    return sorted(out, key=lambda s: (s.file, s.offset))


def compute(layout: Any, slices: list[Slice]) -> list[int]:
    """The CRC-32C of every slice, file by file, read in order."""
    n = native.load()
    sums: list[int] = []
    for index, path in enumerate(layout.files):
        ranges = [(s.offset, s.length) for s in slices if s.file == index]
        with native.engine_errors():
            sums += n.file_checksums(path, ranges)
    return sums


def _seal(record: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in record.items() if k != "checksum"}, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(body.encode(), digest_size=32).hexdigest()


def _files(layout: Any) -> list[dict[str, Any]]:
    return [{"name": Path(f).name, "size": size} for f, size in zip(layout.files, layout.file_sizes, strict=True)]


def _record(layout: Any, slices: list[Slice], sums: list[int]) -> dict[str, Any]:
    record: dict[str, Any] = {
        "format": FORMAT,
        "algorithm": "crc32c",
        "files": _files(layout),
        "slices": [[s.tensor, s.expert, s.file, s.offset, s.length, f"{crc:08x}"]
                   for s, crc in zip(slices, sums, strict=True)],
    }
    record["checksum"] = _seal(record)
    return record


def write(model: Path) -> Report:
    """Compute every sum of the model and write its sidecar (atomically)."""
    layout = _layout(model)
    slices = model_slices(layout)
    sums = compute(layout, slices)
    path = sidecar_path(model)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(_record(layout, slices, sums), separators=(",", ":")) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise BmoeError(f"cannot write {show_path(path)}: {exc.strerror or exc}") from None
    return Report(path, list(layout.files), len(slices), [], True)


def load(model: Path, layout: Any | None = None) -> dict[tuple[int, int], tuple[Slice, int]]:
    """The sidecar's sums by (file, offset), checked: its own checksum, its format, and that it was made
    for these files (names and sizes). BmoeError says what is wrong and what to do."""
    path = sidecar_path(model)
    layout = layout or _layout(model)
    redo = f"run `bmoe-edge verify-model {show_path(model)} --rewrite` once the model is known good"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise BmoeError(f"{show_path(model)} has no checksums ({show_path(path)} is missing): run "
                        f"`bmoe-edge verify-model {show_path(model)}` once to write them") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BmoeError(f"{show_path(path)}: unreadable checksum sidecar ({exc}); {redo}") from None
    if not isinstance(record, dict) or record.get("checksum") != _seal(record):
        raise BmoeError(f"{show_path(path)}: the checksum sidecar is damaged (its own checksum does not match); {redo}")
    if record.get("format") != FORMAT or record.get("algorithm") != "crc32c":
        raise BmoeError(f"{show_path(path)}: not a {FORMAT} sidecar; {redo}")
    want = _files(layout)
    if record.get("files") != want:
        raise BmoeError(f"{show_path(path)} was written for other files ({record.get('files')}, now {want}); {redo}")
    out: dict[tuple[int, int], tuple[Slice, int]] = {}
    for tensor, expert, file, offset, length, crc in record["slices"]:
        out[(file, offset)] = (Slice(tensor, expert, file, offset, length), int(crc, 16))
    return out


def verify(model: Path) -> Report:
    """Recompute every sum and compare it with the sidecar."""
    layout = _layout(model)
    expected = load(model, layout)
    slices = model_slices(layout)
    missing = [s for s in slices if (s.file, s.offset) not in expected or expected[(s.file, s.offset)][0] != s]
    if missing:
        raise BmoeError(f"{show_path(sidecar_path(model))} does not list {missing[0].tensor} at offset "
                        f"{missing[0].offset}: it was written for another layout; run `bmoe-edge verify-model "
                        f"{show_path(model)} --rewrite` once the model is known good")
    found = compute(layout, slices)
    mismatches = [Mismatch(s, expected[(s.file, s.offset)][1], crc) for s, crc in zip(slices, found, strict=True)
                  if crc != expected[(s.file, s.offset)][1]]
    return Report(sidecar_path(model), list(layout.files), len(slices), mismatches, False)


def slice_sums(model: Path) -> list[Any]:
    """The expert slices' sums as the engine takes them (native SliceSum rows) for verify_slices."""
    n = native.load()
    return [n.SliceSum(s.file, s.offset, s.length, crc) for (s, crc) in load(model).values() if s.expert >= 0]


def verify_model(model: Path, rewrite: bool = False) -> Report:
    """`bmoe-edge verify-model`: write the sidecar when there is none (or `rewrite`), else check every sum."""
    if not model.is_file():
        raise BmoeError(f"{show_path(model)}: no such model file")
    if rewrite or not sidecar_path(model).exists():
        return write(model)
    return verify(model)
