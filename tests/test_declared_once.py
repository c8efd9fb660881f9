"""Facts beyond the settings, each declared once and derived everywhere else: the telemetry records
(TokenMetrics, RunInfo: rows of native/include/bmoe/metrics.h), the settings rows' `lossy` column, the
threads auto rule (bmoe::compute_threads) and the bench commands' settings options. The checks fail where
one of them is declared a second time, or a copy drifts from its row."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import typer

from bmoe_edge.bench import defaults, quality, serve_bench
from bmoe_edge.cli import app
from bmoe_edge.engine import Engine, generation, session, settings
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import tinymoe
from bmoe_edge.tune import rules

from conftest import REPO

METRICS_H = REPO / "native" / "include" / "bmoe" / "metrics.h"
CONFIG_CPP = REPO / "native" / "src" / "core" / "config.cpp"
ROW = re.compile(r"^\s*X\(\s*([\w:]+)\s*,\s*(\w+)\s*,", re.M)
RECORDS = (("TokenMetrics", "BMOE_TOKEN_METRICS"), ("RunInfo", "BMOE_RUN_INFO"))


def _macro_rows(text: str, macro: str) -> list[str]:
    """The names of the rows of `#define MACRO(X)` (up to the first line that does not continue it)."""
    lines = text[text.index(f"#define {macro}(X)"):].splitlines()
    end = next(i for i, line in enumerate(lines) if not line.rstrip().endswith("\\"))
    return [name for _type, name in ROW.findall("\n".join(lines[1:end + 1]))]


def _native_files() -> list[Path]:
    return sorted(p for p in (REPO / "native").rglob("*") if p.suffix in (".h", ".cpp", ".cc", ".hpp"))


def _python_files() -> list[Path]:
    return sorted((REPO / "bmoe_edge").rglob("*.py"))


# --- TokenMetrics and RunInfo ---------------------------------------------------------------------------------------

def test_token_metrics_is_its_rows_in_the_binding_and_in_python(native) -> None:
    rows = _macro_rows(METRICS_H.read_text(), "BMOE_TOKEN_METRICS")
    assert len(rows) == len(set(rows)) >= 31
    assert [f.name for f in native.token_metrics_fields()] == rows
    bound = native.TokenMetrics()
    assert {n for n in dir(bound) if not n.startswith("_") and not callable(getattr(bound, n))} == set(rows)
    record = fields(generation.TokenMetrics)
    assert [f.name for f in record] == rows  # the metrics CSV's columns, in the rows' order
    kinds = {"bool": bool, "int": int, "float": float, "str": str}
    for f, row in zip(record, native.token_metrics_fields(), strict=True):
        assert f.type is kinds[row.kind], f.name
        assert f.default is not MISSING and f.default == getattr(bound, f.name), f.name
    assert all(f"- {f.name}: " in generation.TokenMetrics.__doc__ for f in record)


def test_run_info_is_its_rows_in_the_binding_and_in_python(native) -> None:
    rows = _macro_rows(METRICS_H.read_text(), "BMOE_RUN_INFO")
    assert len(rows) == len(set(rows)) >= 51
    assert [f.name for f in native.run_info_fields()] == rows
    assert {n for n in dir(native.RunInfo) if isinstance(getattr(native.RunInfo, n, None), property)} == set(rows)
    assert sorted(session.RUN_INFO_KEYS) == sorted(rows)


def test_the_structs_and_bindings_are_only_the_rows() -> None:
    """A field written into a struct by hand, or bound by hand, would bypass the rows (the binding and Python
    would miss it, or show what no row declares)."""
    header = METRICS_H.read_text()
    for struct, macro in RECORDS:
        body = re.search(rf"^struct {struct} \{{\n(.*?)^\}};", header, re.S | re.M)
        assert body is not None, struct
        assert body.group(1).strip() == f"{macro}(BMOE_RECORD_FIELD)", f"struct {struct} holds more than its rows"
    found = []
    for path in _native_files():
        text = path.read_text()
        if path != METRICS_H:
            found += [f"{path}: struct {s}" for s in re.findall(r"^\s*struct (TokenMetrics|RunInfo)\s*\{", text, re.M)]
        by_hand = re.findall(r"def_r[ow]\(\s*\"\w+\",\s*&bmoe::(?:TokenMetrics|RunInfo)::\w+", text)
        found += [f"{path}: binds {m} by hand" for m in by_hand]
    assert not found, "\n".join(found)


def test_no_python_class_restates_a_record() -> None:
    """Python's records are built from the rows (generation.TokenMetrics, session.RUN_INFO_KEYS): a class written
    by hand under a record's name would be a second declaration."""
    found = [f"{path}:{node.lineno}: class {node.name}" for path in _python_files()
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ClassDef) and node.name in {struct for struct, _macro in RECORDS}]
    assert not found, "\n".join(found)


# --- lossy: a column of the settings rows ---------------------------------------------------------------------------

def test_lossy_is_a_column_of_the_settings_rows() -> None:
    lossy = [s.name for s in settings.LOSSY_SETTINGS]
    assert lossy == ["n_expert_used", "drop_cold"]
    assert [s.name for s in settings.SETTINGS if s.help.startswith("LOSSY: ")] == lossy  # the help says it, derived
    assert tuple(lossy) == quality.LOSSY_SETTINGS


def test_nothing_else_names_the_lossy_rows() -> None:
    """No Python literal lists exactly the lossy rows, and no C++ besides the rows' own expansion builds the
    run info's label by a row's name."""
    lossy = {s.name for s in settings.LOSSY_SETTINGS}
    found = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                items = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if items == lossy:
                    found.append(f"{path}:{node.lineno}: lists the lossy rows")
    for path in _native_files():
        if path != CONFIG_CPP:
            found += [f"{path}: labels {n}" for n in lossy if re.search(rf"\"{n}=", path.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("row", [s.name for s in settings.LOSSY_SETTINGS])
def test_the_gates_refuse_every_lossy_row(row: str) -> None:
    value = 1 if settings.BY_NAME[row].kind is int else 0.25
    with pytest.raises(BmoeError, match="lossy settings"):
        gates.stream_config(gates.StreamCase("lossy", overrides={row: value}), 1 << 20)
    gates.stream_config(gates.StreamCase("lossless", overrides={row: settings.BY_NAME[row].default}), 1 << 20)


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


def test_the_engine_labels_the_lossy_rows_and_runs_the_threads_rule(native, model: Path) -> None:
    config = settings.StreamConfig(n_expert_used=1, drop_cold=0.5, cache_mb=4)
    with Engine(model, config) as engine:
        info = engine.run_info
    assert info["lossy"] == "n_expert_used=1, drop_cold=0.5"
    assert info["threads"] == native.compute_threads(0, True, os.sysconf("SC_NPROCESSORS_ONLN"))


# --- one threads rule -----------------------------------------------------------------------------------------------

def test_tune_asks_the_engine_for_the_threads_rule(native) -> None:
    for cores in range(1, 9):
        for threads in range(4):
            assert rules.streaming_threads(threads, cores) == native.compute_threads(threads, True, cores)
    assert native.compute_threads(0, True, 4) != native.compute_threads(0, False, 4)  # streaming leaves a core
    rule = re.compile(r"cores\s*-\s*1")
    found = [str(p) for p in _python_files() if rule.search(p.read_text())]
    found += [str(p) for p in _native_files() if p != CONFIG_CPP and rule.search(p.read_text())]
    assert not found, found


# --- the bench commands on the settings rows ------------------------------------------------------------------------

def test_bench_options_are_the_rows() -> None:
    """No bench option spells a settings row's flag by hand: it is the row's (flags, help), its default the row's or
    a named override in bmoe_edge.bench.defaults."""
    flags = {f for s in settings.SETTINGS for flag in s.flags for f in flag.split("/")}
    found = []
    for path in [REPO / "bmoe_edge" / "cli" / "bench.py", *sorted((REPO / "bmoe_edge" / "bench").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Option":
                found += [f"{path}:{node.lineno}: option {a.value}" for a in node.args
                          if isinstance(a, ast.Constant) and a.value in flags]
    assert not found, "\n".join(found)

    commands = {c.name: c for c in typer.main.get_command(app).commands["bench"].commands.values()}
    expected = {"stream": {"threads": defaults.THREADS},
                "serve": {"threads": defaults.THREADS, "ctx": defaults.SERVE_CTX, "chunk": defaults.PREFILL_CHUNK},
                "rpc": {"threads": defaults.THREADS}}
    for command, options in expected.items():
        params = {p.name: p for p in commands[command].params}
        for name, bench in options.items():
            assert tuple(params[name].opts) == tuple(bench.row.flags[::-1]) or set(params[name].opts) == set(
                bench.row.flags), (command, name)
            assert params[name].default == bench.value, (command, name)
    quality_cache = {p.name: p for p in commands["quality"].params}["cache_mb"]
    assert set(quality_cache.opts) == set(settings.BY_NAME["cache_mb"].flags) and quality_cache.default is None
    assert serve_bench.ServeCell("x", 1, 1).chunk == settings.BY_NAME["prefill_chunk"].default


def test_a_bench_override_says_why_and_a_row_default_does_not() -> None:
    assert defaults.THREADS.value != defaults.THREADS.row.default and defaults.THREADS.why
    assert defaults.SERVE_CTX.value != defaults.SERVE_CTX.row.default and defaults.SERVE_CTX.why
    assert defaults.PREFILL_CHUNK.value == defaults.PREFILL_CHUNK.row.default and not defaults.PREFILL_CHUNK.why
    with pytest.raises(BmoeError):
        defaults.override("threads", -1, "out of the row's bounds")
