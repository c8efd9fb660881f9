"""The docs, checked against the code: the tables that restate a fact the code declares (the patch series,
the profile schema) list what the code has, every relative link resolves (its #anchor too), and the
campaign records live in bench-data/, not in docs/. The markdown is parsed with markdown-it-py (typer's
rich brings it), so a link or a table inside a code block is not taken for one."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from bmoe_edge.boards import checks
from bmoe_edge.boards.profile_schema import SCHEMA, Field

from conftest import REPO

DOCS = REPO / "docs"
PATCHES = REPO / "third_party" / "llama.cpp" / "patches"
_MD = MarkdownIt("commonmark").enable("table")


def _tokens(path: Path) -> list[Token]:
    return _MD.parse(path.read_text())


def _section_tables(path: Path, heading: str) -> list[list[list[str]]]:
    """The tables under the `## heading` section of a page (to the next heading of the same level or
    above), each a list of body rows, each a list of cell texts as written."""
    tables: list[list[list[str]]] = []
    level = None
    rows: list[list[str]] = []
    toks = _tokens(path)
    for i, tok in enumerate(toks):
        if tok.type == "heading_open":
            depth = int(tok.tag[1])
            if level is not None and depth <= level:
                break
            if toks[i + 1].content == heading:
                level = depth
        elif level is None:
            continue
        elif tok.type == "tbody_open":
            rows = []
        elif tok.type == "tr_open":
            rows.append([])
        elif tok.type == "inline" and rows and toks[i - 1].type == "td_open":
            rows[-1].append(tok.content.strip())
        elif tok.type == "tbody_close":
            tables.append(rows)
    assert tables, f"{path.name}: no table under '{heading}'"
    return tables


def _code_name(cell: str) -> str:
    """A first column written as `name`: the name."""
    m = re.fullmatch(r"`([^`]+)`", cell)
    assert m, f"a table's first cell is a `name` in backticks, not {cell!r}"
    return m.group(1)


# ---------------------------------------------------------------------------------------------------
# Tables restating what the code declares


def test_the_patch_table_lists_the_patch_series_in_order() -> None:
    [rows] = _section_tables(DOCS / "llama-source.md", "Patches")
    listed = [_code_name(row[0]) for row in rows]
    assert listed == sorted(p.name for p in PATCHES.glob("*.patch")), \
        "docs/llama-source.md's patch table is the files of third_party/llama.cpp/patches/, one row each, in order"
    assert all(row[1] for row in rows)


def _schema_rows(schema: dict[str, Field] = SCHEMA, prefix: str = "") -> Iterator[tuple[str, Field]]:
    """Every field a profile can set, a section's fields as `section.field` (the section itself is no row)."""
    for name, field in schema.items():
        if field.subfields is None:
            yield prefix + name, field
        else:
            yield from _schema_rows(dict(field.subfields), f"{prefix}{name}.")


def test_the_boards_field_table_is_the_profile_schema() -> None:
    [rows] = [t for t in _section_tables(DOCS / "boards.md", "Fields") if t[0][0] == "`extends`"]
    table = {_code_name(row[0]): row for row in rows}
    schema = dict(_schema_rows())
    assert len(table) == len(rows), "a field listed twice"
    assert sorted(table) == sorted(schema), "docs/boards.md's field table lists SCHEMA's fields, each once"
    for name, (_, kind, required, meaning) in table.items():
        field = schema[name]
        assert (required == "yes") == field.required, f"{name}: 'required' says {required!r}"
        missing = [c for c in field.choices if str(c) not in kind]
        assert not missing, f"{name}: its type cell leaves out {missing}"
        assert meaning, name


# ---------------------------------------------------------------------------------------------------
# Links


def _pages() -> list[Path]:
    return [REPO / "README.md", REPO / "third_party" / "llama.cpp" / "README.md", *sorted(DOCS.glob("*.md")),
            *sorted((REPO / "bench-data").rglob("*.md"))]


def _slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (hyphens and underscores kept), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    toks = _tokens(path)
    seen: dict[str, int] = {}
    for i, tok in enumerate(toks):
        if tok.type == "heading_open":
            text = "".join(c.content for c in toks[i + 1].children or [] if c.type in ("text", "code_inline"))
            slug = _slug(text)
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def _links(path: Path) -> Iterator[str]:
    for tok in _tokens(path):
        for child in tok.children or []:
            if child.type in ("link_open", "image"):
                target = str(child.attrs.get("href") or child.attrs.get("src") or "")
                if not re.match(r"[a-z][a-z0-9+.-]*:", target):   # http:, mailto: ... are not ours to check
                    yield target


# Pages being written beside the links to them (issue 49: the engine's components). Such a page's links are
# let through while it does not exist; once it does, the test below fails until its line here goes.
PENDING: set[Path] = set()


def test_pending_pages_are_still_pending() -> None:
    arrived = [p.relative_to(REPO) for p in PENDING if p.exists()]
    assert not arrived, f"{arrived} exist now: take them out of PENDING so their links are checked"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if dest in PENDING:
            continue
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page.relative_to(REPO)}: broken links: {broken}"


# Paths the pages name in `code`: the checkout's files, which move (issue 49 moved native/src/'s), so a page
# that still names the old place fails here. Not in the checkout: what the wheel holds, and what a build or a fetch
# writes (git-ignored: `third_party/llama.cpp/src-stock` exists only after a stock fetch).
TOP = ("bmoe_edge/", "native/", "scripts/", "tests/", "board_profiles/", "deploy/", "toolchains/", "third_party/",
       "bench-data/", "docs/", ".ci/")
IN_THE_WHEEL = {*checks.PROGRAMS, "bmoe_edge/board_profiles/"}   # the programs the build installs beside the module
PLACEHOLDER = re.compile(r"[*{<]|(?<![A-Za-z])(CLASS|BOARD|NAME|DATE|RUN)(?![A-Za-z])")


def _git_ignored(paths: set[str]) -> set[str]:
    if not paths:
        return set()
    # Each also as a directory: a pattern such as `src-*/` matches only one, and a missing path is neither.
    asked = "\n".join(f"{p}\n{p.rstrip('/')}/" for p in sorted(paths))
    out = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, input=asked,
                         capture_output=True, text=True, check=False)
    return {p for p in paths if {p, p.rstrip("/") + "/"} & set(out.stdout.split())}


@pytest.mark.parametrize("page", [REPO / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_checkout_path_a_page_names_exists(page: Path) -> None:
    missing = set()
    for tok in _tokens(page):
        for child in tok.children or []:
            words = child.content.split()
            if child.type != "code_inline" or not words or not words[0].startswith(TOP):
                continue
            path = words[0].split("::")[0].rstrip(".,:;)")
            if path not in IN_THE_WHEEL and not PLACEHOLDER.search(path) and not (REPO / path).exists():
                missing.add(path)
    missing -= _git_ignored(missing)
    assert not missing, f"{page.name} names paths the checkout does not have: {sorted(missing)}"


# ---------------------------------------------------------------------------------------------------
# The campaign records


SOURCES = ["README.md", "pyproject.toml", "docs", "bmoe_edge", "tests", "native", "board_profiles", "scripts",
           "deploy", ".ci", "third_party/llama.cpp/README.md", "CMakeLists.txt"]
TEXT = {".md", ".py", ".toml", ".yaml", ".yml", ".sh", ".cpp", ".h", ".txt", ".cmake", ""}


def _source_files() -> Iterator[Path]:
    for name in SOURCES:
        path = REPO / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            if f.suffix in TEXT and "__pycache__" not in f.parts and not f.is_relative_to(REPO / "bench-data"):
                yield f


def test_docs_hold_pages_not_campaign_data() -> None:
    others = [p.relative_to(REPO) for p in DOCS.rglob("*") if p.is_file() and p.suffix != ".md"]
    assert not others, f"docs/ is the map; campaign records go to bench-data/: {others}"


def test_every_bench_data_path_named_in_the_sources_exists() -> None:
    """A comment's or a page's bench-data/... (the folder before issue 49 was docs/bench-data) names a record
    that is there."""
    bad = []
    for f in _source_files():
        for m in re.finditer(r"(docs/)?bench-data/[\w.-]+(?:/[\w.-]+)*", f.read_text(errors="replace")):
            path = m.group(0).rstrip(".")
            if m.group(1) or not (REPO / path).exists():
                bad.append(f"{f.relative_to(REPO)}: {m.group(0)}")
    assert not bad, f"no such record: {bad}"
