"""Every engine and sampling setting is declared once (a row of native/include/bmoe/config.h), and
everything else is derived from that row: the checks here fail if a setting is declared again."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bmoe_edge.engine import settings
from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic import tinymoe

from conftest import REPO, assert_clean_error, run_cli

CONFIG_H = REPO / "native" / "include" / "bmoe" / "config.h"
ROW = re.compile(r"^\s*X\(\s*([\w:]+)\s*,\s*(\w+)\s*,", re.M)
# A settings row elsewhere: a row with a rule (other tables' rows, e.g. bmoe/metrics.h's run info, share names).
SETTING_ROW = re.compile(r"^\s*X\(\s*([\w:]+)\s*,\s*(\w+)\s*,[^\n]*\bRule::", re.M)


def _rows(text: str) -> list[str]:
    return [name for _type, name in ROW.findall(text)]


def test_the_python_table_is_the_native_declaration_row_for_row() -> None:
    rows = _rows(CONFIG_H.read_text())
    assert rows == [s.name for s in settings.SETTINGS]
    assert len(rows) == len(set(rows)) >= 30
    assert {s.name for s in settings.SAMPLING_SETTINGS} == {
        "temp", "top_k", "top_p", "min_p", "seed", "grammar", "grammar_triggers", "grammar_prefill", "logit_bias",
        "repeat_penalty", "presence_penalty", "frequency_penalty", "penalty_last_n", "logprobs"}


def _typer_flags(call: ast.Call) -> set[str]:
    return {a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}


def test_no_setting_is_declared_anywhere_else() -> None:
    names = {s.name for s in settings.SETTINGS}
    flags = {f for s in settings.SETTINGS for flag in s.flags for f in flag.split("/")}
    found = []
    for path in sorted((REPO / "native").rglob("*.[ch]*")):
        if path != CONFIG_H:
            text = path.read_text()
            found += [f"{path}: row {n}" for _type, n in SETTING_ROW.findall(text) if n in names]
            found += [f"{path}: struct {m}" for m in re.findall(r"^\s*struct (StreamConfig|SamplingParams)\s*\{",
                                                              text, re.M)]
    for path in sorted((REPO / "bmoe_edge").rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "engine":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Setting":
                found.append(f"{path}:{node.lineno}: a Setting row")
            if isinstance(node, ast.ClassDef):  # a record that copies several settings with their defaults
                copied = [t.target.id for t in node.body if isinstance(t, ast.AnnAssign) and t.value is not None
                          and isinstance(t.target, ast.Name) and t.target.id in names]
                if len(copied) >= 3:
                    found.append(f"{path}:{node.lineno}: class {node.name} copies {copied}")
            # a command that takes the settings' options declares none of them by hand
            if isinstance(node, ast.FunctionDef) and any(
                    getattr(getattr(d, "func", None), "id", "") in ("engine_options", "sampling_options")
                    for d in node.decorator_list):
                for call in ast.walk(node.args):
                    if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "Option":
                        found += [f"{path}:{call.lineno}: option {f}" for f in sorted(_typer_flags(call) & flags)]
    assert not found, "\n".join(found)


def test_a_default_stands_in_one_place() -> None:
    """min_p's 0.05 and the sampling seed's auto are the row's; the old copies (0.0 in generate, 0.05
    in serve and chat, seed 0) are gone."""
    assert settings.BY_NAME["min_p"].default == 0.05 and settings.BY_NAME["seed"].default == "auto"
    hits = [p for p in (REPO / "bmoe_edge").rglob("*.py") if re.search(r"min_p\s*[=:]\s*[\w\[\]]*\s*=?\s*0\.05",
                                                                        p.read_text())]
    assert hits == []


def test_bounds_and_rules_are_the_engines() -> None:
    io = settings.BY_NAME["io_threads"]
    assert (io.minimum, io.maximum, io.default, io.profile) == (1, 64, 4, "required")
    with pytest.raises(BmoeError, match=r"io_threads \(--io-threads\) must be between 1 and 64, got 65"):
        settings.StreamConfig(io_threads=65)
    with pytest.raises(BmoeError, match=r"must be in \[0, 1\)"):
        settings.StreamConfig(drop_cold=1.0)
    with pytest.raises(BmoeError, match="power of two"):
        settings.StreamConfig(page_kb=12)
    with pytest.raises(BmoeError, match="corrupt:N"):
        settings.StreamConfig(fault="melt:1")
    with pytest.raises(BmoeError, match="is not HOST:PORT"):
        settings.StreamConfig(rpc="nohost")
    with pytest.raises(BmoeError, match=r"temp \(--temp\) must be between 0 and 2"):
        settings.Sampling(temp=2.5)
    assert settings.StreamConfig(cache_mb="12.5").cache_mb == 12.5
    with pytest.raises(BmoeError, match=r"cache_mb \(--cache-mb\) must be >= 0 or auto, got -1"):
        settings.StreamConfig(cache_mb=-1)  # the engine's encoding of auto is not a budget a user can give
    assert settings.Sampling(seed="7").seed == 7


def test_records_are_keyword_only() -> None:
    """A row added before another cannot shift a positional argument (how --seed once set min_p)."""
    with pytest.raises(TypeError):
        settings.Sampling(1.0, 40)  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.StreamConfig(True)  # type: ignore[misc]


def test_a_conversation_samples_where_nothing_is_given() -> None:
    assert settings.sampling({"temp": None, "seed": 3}).temp == 0.0
    chat = settings.sampling({"seed": 3}, conversation=True)
    assert (chat.temp, chat.seed, chat.min_p) == (settings.CONVERSATION_TEMP, 3, 0.05)
    assert settings.sampling({"temp": 0.0}, conversation=True).temp == 0.0


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


def _text(model: Path, *flags: str) -> str:
    result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "24", "-t", "1", *flags)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_seed_picks_the_sample_and_the_same_seed_repeats_it(model: Path) -> None:
    # The fixture's next token has a wide margin by design (the gates need clear top-1 choices), so it is
    # sampled hot and unfiltered here; a real model's choices differ at --temp 1.0 already.
    hot = ("--temp", "2.0", "--top-p", "1", "--min-p", "0")
    greedy = _text(model)
    one, two, three = (_text(model, *hot, "--seed", s) for s in ("1", "2", "3"))
    assert _text(model, *hot, "--seed", "1") == one
    assert len({one, two, three}) == 3, "different seeds gave the same text"
    assert greedy not in (one, two, three)
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "x", "--seed", "-4"), "seed (--seed)")
