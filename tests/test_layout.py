"""The Python side's house rules, checked on the source: the stages import only downwards, no file
grows past ~600 lines, and what runs on a board imports nothing the board does not have."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "bmoe_edge"
# Modules below every stage (the error type, the llama.cpp pin and cache paths, the tool checks, byte sizes).
FOUNDATION = {"errors", "llama_source", "doctor", "units", "__init__", "__main__", "_native"}
# stage -> the stages it may import (besides itself and the foundation). The flow is
# profile (data) -> build -> bundle -> deploy -> run -> report; the engine is what every stage runs on.
ALLOWED = {
    "engine": set(),
    "synthetic": {"engine"},
    "boards": {"engine", "synthetic", "bench"},
    "fleet": {"engine", "boards"},
    "proof": {"engine", "synthetic"},
    "bench": {"engine"},
    "serve": {"engine"},
    "cli": {"engine", "synthetic", "boards", "fleet", "proof", "bench", "serve"},
}
# What a board's Python has: the standard library and the runtime dependencies (pyproject.toml).
BOARD_SIDE = ["engine/*.py", "boards/bundle.py", "boards/profiles.py", "boards/profile_schema.py",
              "proof/gates.py", "synthetic/specs.py", "bench/machine.py", "bench/layout.py", "bench/io.py",
              "bench/ramcap.py", "bench/cells.py", "bench/routing.py", "bench/tune.py", "boards/tune.py",
              "serve/*.py", "cli/*.py"]
HOST_ONLY = {"numpy", "gguf", "matplotlib", "fabric", "paramiko"}


def _imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _stage(module: str) -> str | None:
    """bmoe_edge.<stage>... -> stage; None for the foundation and anything outside the package."""
    parts = module.split(".")
    if parts[0] != "bmoe_edge" or len(parts) < 2 or parts[1] in FOUNDATION:
        return None
    return parts[1]


def test_stages_import_only_downwards() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        own = rel.parts[0] if len(rel.parts) > 1 else ("cli" if rel.name == "__main__.py" else None)
        for module in _imports(path):
            stage = _stage(module)
            if stage is None or stage == own or stage not in ALLOWED:
                continue
            if own is None or stage not in ALLOWED[own]:
                wrong.append(f"{rel} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_every_stage_is_a_package_with_its_arrows_declared() -> None:
    stages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert stages == set(ALLOWED)


def test_no_python_file_is_over_600_lines() -> None:
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_what_runs_on_a_board_imports_no_host_only_package_at_the_top() -> None:
    for pattern in BOARD_SIDE:
        for path in PACKAGE.glob(pattern):
            found = {m.split(".")[0] for m in _imports(path, top_level_only=True)} & HOST_ONLY
            assert not found, f"{path.relative_to(REPO)} imports {found} at the top"
