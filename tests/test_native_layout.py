"""The C++ side's house rules, checked on the source (tests/test_layout.py holds the Python side's): each
native/src folder includes only the folders before it in the engine's flow (docs/engine.md), the pure ones
nothing of llama.cpp, the policies' own tests only the pure folders, and no unit (a .cpp with its own
header) grows past 600 lines."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

NATIVE = REPO / "native"
SRC = NATIVE / "src"
PUBLIC = NATIVE / "include" / "bmoe"
# folder -> the folders its files may include (besides its own and the public bmoe/ headers). The flow:
# core below all; the pure policies and the file reads; the model; the streamer; the seam llama.cpp calls;
# RPC and the MTP drafter beside it; the engine over everything.
ALLOWED = {
    "core": set(),
    "policy": {"core"},
    "read": {"core"},
    "model": {"core", "read"},
    "stream": {"core", "policy", "read"},
    "seam": {"core", "read", "model", "stream"},
    "rpc": {"core", "policy", "model"},
    "draft": {"core", "policy", "model"},
    "engine": {"core", "policy", "read", "model", "stream", "seam", "rpc", "draft"},
}
# Nothing of llama.cpp here: core/ and policy/ are built and tested without it (native/tests' target has no
# include path to it); read/ and stream/ are mechanism that knows files and experts, not graphs.
PURE = {"core", "policy", "read", "stream"}
LLAMA = re.compile(r"^(llama|ggml|gguf|common|chat|json-schema|peg-)")
MAX_LINES = 600
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def _includes(path: Path) -> list[str]:
    return INCLUDE.findall(path.read_text())


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".cpp", ".h"))


def _own(include: str) -> str | None:
    """The native/src folder an include names ("seam/seam.h" -> "seam"), None for anything else."""
    folder, _, rest = include.partition("/")
    return folder if rest and folder in ALLOWED else None


def wrong_arrows(src: Path) -> list[str]:
    wrong = []
    for path in _sources(src):
        here = path.relative_to(src).parts[0]
        for inc in _includes(path):
            there = _own(inc)
            if there is not None and there != here and there not in ALLOWED[here]:
                wrong.append(f"{path.relative_to(src)} includes {inc} ({here}/ -> {there}/ is not an arrow)")
            if here in PURE and LLAMA.match(inc):
                wrong.append(f"{path.relative_to(src)} includes {inc}: {here}/ is built without llama.cpp")
    return wrong


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def oversized(roots: list[Path], public: Path) -> list[str]:
    """Units over MAX_LINES: a .cpp counted with its own header (beside it, or the public one of its name)."""
    lines = {p: len(p.read_text().splitlines()) for root in roots for p in _sources(root)}
    lines |= {p: len(p.read_text().splitlines()) for p in public.glob("*.h")}
    counted: set[Path] = set()
    big = []
    for path, n in sorted(lines.items()):
        if path.suffix != ".cpp":
            continue
        header = next((h for h in (path.with_suffix(".h"), public / f"{path.stem}.h") if h in lines), None)
        total = n + (lines[header] if header else 0)
        counted |= {path, header} if header else {path}
        if total > MAX_LINES:
            big.append(f"{_shown(path)} ({n}) + {header.name if header else 'no header'}: {total} lines")
    big += [f"{_shown(p)}: {n} lines" for p, n in lines.items() if p not in counted and n > MAX_LINES]
    return big


def test_every_source_lives_in_a_folder_of_the_flow() -> None:
    stray = [str(p.relative_to(SRC)) for p in _sources(SRC) if len(p.relative_to(SRC).parts) != 2 or
             p.relative_to(SRC).parts[0] not in ALLOWED]
    assert not stray, f"native/src files outside the flow's folders (ALLOWED): {stray}"


def test_folders_include_only_along_the_flow() -> None:
    wrong = wrong_arrows(SRC)
    assert not wrong, "\n".join(wrong)


def test_policy_tests_need_only_the_pure_folders() -> None:
    """native/tests builds from core/ and policy/ alone, without llama.cpp."""
    wrong = [f"{p.name} includes {inc}" for p in _sources(NATIVE / "tests") for inc in _includes(p)
             if (_own(inc) is not None and _own(inc) not in {"core", "policy"}) or LLAMA.match(inc)]
    assert not wrong, wrong


def test_no_unit_past_600_lines() -> None:
    big = oversized([SRC, NATIVE / "python", NATIVE / "tests"], PUBLIC)
    assert not big, f"C++ units over {MAX_LINES} lines (split them along what they do): {big}"


def test_the_checks_have_teeth(tmp_path: Path) -> None:
    """A planted include against the flow, a pure folder reaching for llama.cpp, and a unit one line too long."""
    src = tmp_path / "src"
    for folder in ALLOWED:
        (src / folder).mkdir(parents=True)
    (src / "policy" / "p.cpp").write_text('#include "policy/p.h"\n#include <vector>\n')
    (src / "engine" / "e.cpp").write_text('#include "seam/seam.h"\n#include "llama.h"\n')
    assert wrong_arrows(src) == []
    (src / "policy" / "bad.cpp").write_text('#include "engine/engine_parts.h"\n')
    (src / "read" / "bad.cpp").write_text('#include "ggml.h"\n')
    assert len(wrong_arrows(src)) == 2
    public = tmp_path / "include"
    public.mkdir()
    (src / "stream" / "s.h").write_text("\n" * 300)
    (src / "stream" / "s.cpp").write_text("\n" * 300)
    assert oversized([src], public) == []
    (src / "stream" / "s.cpp").write_text("\n" * 301)
    assert len(oversized([src], public)) == 1
