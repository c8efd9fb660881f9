"""`bench kernels`' arithmetic without llama-bench or a model: the per-token comparison (a low quantile of each
side's 1-token decode times, so a host's stalls on a few tokens stay out of it) and its summary."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bmoe_edge.bench import kernels, llama_bench
from bmoe_edge.errors import BmoeError

ROW = kernels.KernelRow(
    model="m.gguf", threads=2, repack="auto", repeat=0, decode_tok_s=55.0, prompt_tok_s=0.0, prompt_reused=0,
    llama_bench_decode_tok_s=60.0, llama_bench_prompt_tok_s=0.0, hit_pct=0.0, flash_attn_setting="off",
    flash_attn=False, repack_layouts="q4_K: q4_K_8x8", first="engine", decode_ctx=256, prompt_ctx=0,
    decode_runs="55.00 50.00", llama_bench_decode_runs="60.00 58.00", decode_token_ms=16.0,
    llama_bench_token_ms=15.2)


def test_quantile_is_the_nearest_rank_below_and_stalls_do_not_move_it() -> None:
    clean = [16.0, 17.0, 16.5, 16.2, 16.8, 17.1, 16.1, 16.4, 16.3, 16.6, 16.7]
    stalled = [52.0 if x == 17.0 else 51.0 if x == 17.1 else x for x in clean]  # two tokens the host held up
    assert kernels.quantile(clean, 0.1) == kernels.quantile(stalled, 0.1) == 16.1
    assert sum(stalled) / len(stalled) > 1.3 * sum(clean) / len(clean)  # where a run's mean moves by a third
    assert kernels.quantile(clean, 0.0) == 16.0 and kernels.quantile(stalled, 1.0) == 52.0
    assert kernels.quantile([], 0.1) == 0.0


def test_token_ratio_is_a_speed_and_zero_without_a_measurement() -> None:
    assert round(ROW.token_ratio, 3) == 0.95  # 15.2 ms against 16.0 ms: the engine at 0.95x llama-bench's speed
    assert replace(ROW, llama_bench_token_ms=0.0).token_ratio == 0.0
    assert replace(ROW, decode_token_ms=0.0).token_ratio == 0.0


def test_summary_reports_the_per_token_medians_and_a_dash_without_them() -> None:
    rows = [ROW, replace(ROW, repeat=1, decode_token_ms=17.0, llama_bench_token_ms=16.15),
            replace(ROW, repeat=2, decode_token_ms=15.0, llama_bench_token_ms=15.3)]
    text = kernels.summary(rows)
    assert "per token p10 ms: engine / llama-bench" in text
    assert "| 16.00 / 15.30: 0.950 |" in text  # medians of each side, and of the per-repeat ratios
    single = kernels.summary([replace(ROW, llama_bench_token_ms=0.0)])
    line = next(x for x in single.splitlines() if x.startswith("| m.gguf"))
    assert "| - |" in line
    assert line.count("|") == text.splitlines()[-1].count("|")  # the same columns either way


def test_summary_dashes_the_prompt_cells_when_no_prompt_was_measured() -> None:
    """`--prompt-tokens 0` measures decode alone: its prompt cells say so, not a speed and a ratio of 0."""
    decode_only = next(x for x in kernels.summary([ROW]).splitlines() if x.startswith("| m.gguf"))
    assert decode_only.endswith("| - | - | - | 1 |") and "0.000" not in decode_only
    with_prompt = replace(ROW, prompt_tok_s=90.0, llama_bench_prompt_tok_s=100.0)
    line = next(x for x in kernels.summary([with_prompt]).splitlines() if x.startswith("| m.gguf"))
    assert line.endswith("| 90.0 | 100.0 | 0.900 | 1 |")
    assert line.count("|") == decode_only.count("|")


def test_write_keeps_the_per_token_columns(tmp_path) -> None:
    kernels.write([ROW], tmp_path)
    header = (tmp_path / "kernels.csv").read_text().splitlines()[0].split(",")
    assert {"decode_token_ms", "llama_bench_token_ms", "token_ratio"} <= set(header)


def test_llama_bench_tokens_sit_at_the_engine_s_positions() -> None:
    """Flash attention's CPU kernel skips masked cells, so a token's cost grows with the cells before it: llama-bench's
    1-token decodes are spread over the positions of the engine's measured steps (a run's steps but its first two)."""
    assert kernels.token_depths(10, 64) == [11, 20, 29, 38, 46, 55, 64, 73]
    assert kernels.token_depths(10, 64)[-1] == 10 + 64 - 1 and kernels.token_depths(0, 2) == [1]
    assert kernels.token_depths(5, 64, n=1) == [6]
    # the per-token anchor runs in the engine's context only while the deepest one fits it
    assert llama_bench.context_cells(0, 1, max(kernels.token_depths(16, 64))) == llama_bench.context_cells(0, 64 + 16)


def test_llama_bench_s_tests_of_several_depths_are_one_sample_set() -> None:
    tests = [{"n_prompt": 0, "n_gen": 1, "n_depth": d, "avg_ts": 60.0 + d, "samples_ts": [59.0 + d, 61.0 + d]}
             for d in (10, 20)]
    tests.append({"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 90.0, "samples_ts": [90.0]})
    out = llama_bench.parse_tests(tests)
    assert out["decode_samples"] == [69.0, 71.0, 79.0, 81.0] and out["decode_tok_s"] == 75.0
    assert out["prompt_samples"] == [90.0] and out["prompt_tok_s"] == 90.0


def test_an_installed_release_runs_the_anchor_beside_its_module_or_says_in_one_line_that_it_has_none(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A board's release is an installed wheel: the engine built from the pin, not the pin's source, so its anchor
    is the llama-bench its build put beside the native module. Without one, `bench kernels` says so in one line
    before it loads a model, and `bench stream`'s anchor cell records the line as its error (no traceback; the
    campaign's other cells go on)."""
    from bmoe_edge import llama_source
    from bmoe_edge.bench import cells
    from bmoe_edge.engine import native

    site = tmp_path / "site" / "bmoe_edge"
    site.mkdir(parents=True)
    monkeypatch.setattr(llama_source, "LLAMA_DIR", tmp_path / "site" / "third_party" / "llama.cpp")  # no PIN
    monkeypatch.setattr(native, "module_dir", lambda: site)
    absent = tmp_path / "not-loaded.gguf"   # never opened: the refusal comes first
    said: list[str] = []
    with pytest.raises(BmoeError, match="this installation has no llama-bench") as refused:
        kernels.run([absent], None, [2], ["auto"], repeats=1, decode_tokens=2, prompt_tokens=0, say=said.append)
    assert said == [] and "\n" not in str(refused.value) and llama_bench.NOT_INSTALLED in str(refused.value)

    spec = {"label": "llama-bench", "kind": "llama-bench", "model": str(absent), "config": {"threads": 1},
            "tokens": 2}
    assert cells.cell_main(json.dumps(spec)) == 1
    record = json.loads(capsys.readouterr().out.strip().removeprefix(cells.RECORD_PREFIX))
    assert record["status"] == "error" and record["error"] == str(refused.value)

    installed = site / "llama-bench"   # as a wheel unpacked without its file modes leaves it
    installed.write_text("#!/bin/sh\n")
    installed.chmod(0o644)
    assert llama_bench.binary() == installed and installed.stat().st_mode & 0o111


def test_an_installed_releases_anchor_runs_through_the_machines_wrapper(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench stream`'s anchor cell as a release runs it: the llama-bench its build installed beside the module
    (here this machine's own build), started through the wrapper the cell's spec carries (`env`, standing in for
    an emulated board's qemu-aarch64), measured on a real model."""
    from bmoe_edge import llama_source
    from bmoe_edge.bench import cells
    from bmoe_edge.engine import native
    from bmoe_edge.synthetic import tinymoe

    installed = native.module_dir() / "llama-bench"
    if not installed.is_file():
        pytest.skip(f"this build installed no llama-bench beside the module ({installed})")
    monkeypatch.setattr(llama_source, "LLAMA_DIR", installed.parent / "no-checkout-here")  # an installed release
    started: list[list[str]] = []
    real_run = llama_bench.subprocess.run
    monkeypatch.setattr(llama_bench.subprocess, "run", lambda cmd, **kw: started.append(cmd) or real_run(cmd, **kw))
    spec = {"label": "llama-bench", "kind": "llama-bench", "model": str(tinymoe.fixture("qwen3moe", "Q8_0")),
            "config": {"threads": 1}, "tokens": 2, "wrapper": ["env"]}
    assert cells.cell_main(json.dumps(spec)) == 0, capsys.readouterr()
    record = json.loads(capsys.readouterr().out.strip().removeprefix(cells.RECORD_PREFIX))
    assert record["status"] == "ok" and record["tok_s"] > 0
    assert started and started[0][:2] == ["env", str(installed)]
