"""`bench kernels`' arithmetic without llama-bench or a model: the per-token comparison (a low quantile of each
side's 1-token decode times, so a host's stalls on a few tokens stay out of it) and its summary."""

from __future__ import annotations

from dataclasses import replace

from bmoe_edge.bench import kernels

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


def test_write_keeps_the_per_token_columns(tmp_path) -> None:
    kernels.write([ROW], tmp_path)
    header = (tmp_path / "kernels.csv").read_text().splitlines()[0].split(",")
    assert {"decode_token_ms", "llama_bench_token_ms", "token_ratio"} <= set(header)
