"""The Python side's house rules, checked on the source: the stages import only downwards, no module
imports itself back through others, no file grows past ~600 lines, and what runs on a board imports
nothing the board does not have."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "bmoe_edge"
# Modules below every stage (the error type, the llama.cpp pin and cache paths, the tool checks, byte sizes, addresses).
FOUNDATION = {"errors", "llama_source", "doctor", "units", "net", "__init__", "__main__", "_native"}
# stage -> the stages it may import (besides itself and the foundation). The flow is
# profile (data) -> build -> bundle -> deploy -> run -> report; the engine is what every stage runs on.
ALLOWED = {
    "engine": set(),
    "synthetic": {"engine"},
    "boards": {"engine", "synthetic"},
    "fleet": {"engine", "boards"},
    # the proofs check what earlier stages declare: the server's parameter table and limits (the HTTP fuzz's
    # request space), the unit the deploy writes (booted under a real systemd)
    "proof": {"engine", "synthetic", "serve", "fleet"},
    "bench": {"engine"},
    "serve": {"engine"},
    "tune": {"engine", "synthetic", "boards", "bench", "fleet"},
    "cli": {"engine", "synthetic", "boards", "fleet", "proof", "bench", "serve", "tune"},
}
# What a board's Python has: the standard library and the runtime dependencies (pyproject.toml).
BOARD_SIDE = ["engine/*.py", "boards/bundle.py", "boards/profiles.py", "boards/profile_schema.py",
              "proof/gates.py", "synthetic/specs.py", "bench/machine.py", "bench/layout.py", "bench/io.py",
              "bench/ramcap.py", "bench/cells.py", "bench/routing.py", "tune/measure.py", "tune/rules.py",
              "tune/user_profile.py", "tune/local.py", "serve/*.py", "cli/*.py"]
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


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports: every import statement, at the top, inside a function
    or under TYPE_CHECKING alike (an import moved into a function still ties the two modules together).
    `from a import b` is an arrow to a.b when that is a module, else to a (its __init__)."""
    paths = {_module_name(p, package.parent): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = parent.split(".")[:len(parent.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names}
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_module_graph_has_no_cycle() -> None:
    graph = _module_graph()
    assert graph["bmoe_edge.fleet.deploy"] >= {"bmoe_edge.fleet.upload", "bmoe_edge.fleet.install"}  # it sees arrows
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "sub" / "__init__.py"):
        init.write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def late():\n    from .. import a\n")
    assert _cycle(_module_graph(pkg)) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (pkg / "sub" / "b.py").write_text("def late():\n    from pkg import sub\n")
    assert _cycle(_module_graph(pkg)) is None


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
