"""Read-ahead (--prefetch): guesses of the next layer's experts are read early, the output stays the
model's (the gate cells prefetch-overlap and prefetch-serial-cache-small prove it over the matrix),
a corrupted read-ahead slice is caught like any other, and `auto` measures before it commits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bmoe_edge.engine import Engine, StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import faults, gates
from bmoe_edge.synthetic import tinymoe

from conftest import run_cli

BASE = replace(gates.BASE, stream=True)
PROMPT = gates.PROMPTS[0]
STEPS = 16


def _run(model, config: StreamConfig, steps: int = STEPS):
    with Engine(model, config) as engine:
        gen = engine.run(PROMPT, steps, logits=True)
        return engine.run_info, gen


@pytest.mark.parametrize("overlap", [True, False])
def test_read_ahead_guesses_mostly_right_and_changes_nothing(overlap: bool) -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    _, resident = _run(model, replace(BASE, stream=False))
    info, ahead = _run(model, replace(BASE, cache_mb=0, overlap=overlap, prefetch="predict"))
    assert info["prefetch"] == "predict" and not info["prefetch_note"]
    assert ahead.tokens == resident.tokens and ahead.logits == resident.logits
    decodes = ahead.metrics[1:]
    assert all(m.read_ahead for m in decodes)
    predicted = sum(m.predicted for m in decodes)
    right = sum(m.predicted_correct for m in decodes)
    # Every layer but the first is guessed: top-2 of 8 experts, for 3 of the fixture's 4 layers.
    assert predicted == len(decodes) * 3 * 2
    assert right > 0.5 * predicted  # the residual stream barely moves between layers
    ahead_bytes = sum(m.ahead_bytes for m in decodes)
    assert ahead_bytes > 0
    # Waste is what a wrong guess read: at most its expert's three slices, none if the router cancelled its
    # reads while they were still queued (the lanes' timing decides which, so 0 is a right answer too).
    one_slice = faults.slice_bytes(info)
    wasted = sum(m.ahead_wasted_bytes for m in decodes)
    assert wasted % one_slice == 0
    assert wasted <= min(ahead_bytes, (predicted - right) * 3 * one_slice)


@pytest.mark.parametrize("nth", [130, 140])
def test_a_corrupted_read_ahead_slice_fails_the_comparison(nth: int) -> None:
    """All 8 experts routed (the same lossy override on both sides): every guess is right, so the
    reads of layers 1-3 are read-ahead reads that the router adopts. The prompt reads 4 x 3 x 8 = 96
    slices, the first decode's layer 0 the next 24: read 121 on is read ahead."""
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    everything = replace(BASE, cache_mb=0, overlap=True, io_threads=1, n_expert_used=8)
    _, resident = _run(model, replace(everything, stream=False))
    _, clean = _run(model, replace(everything, prefetch="predict"))
    assert clean.logits == resident.logits
    assert all(m.predicted == m.predicted_correct == 3 * 8 for m in clean.metrics[1:])
    _, corrupt = _run(model, replace(everything, prefetch="predict", fault=f"corrupt:{nth}"))
    assert corrupt.logits != resident.logits


def test_auto_counts_the_guesses_before_it_reads_any() -> None:
    """auto (prefetch_policy.h) reads nothing ahead in the first decode, but its layers still guess and the
    streamer counts what reading them would have read; it goes on counting in every decode it does not read
    ahead, and reads ahead at most 16 decodes in a row (the 17th looks at the drive again). The policy's choices
    themselves are tested without a model (native/tests/test_prefetch_policy.cpp)."""
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    info, gen = _run(model, replace(BASE, cache_mb=0, overlap=True, prefetch="auto"), steps=40)
    assert info["prefetch"] == "auto"
    decodes = gen.metrics[1:]
    assert not decodes[0].read_ahead
    for m in decodes:
        assert 0 <= m.guessed_wasted_bytes <= m.guessed_bytes
        if not m.read_ahead:
            assert m.guessed_bytes > 0 and m.ahead_bytes == 0  # counted, not read
    longest = run = 0
    for m in decodes:
        run = run + 1 if m.read_ahead else 0
        longest = max(longest, run)
    assert longest <= 16
    _, off = _run(model, replace(BASE, cache_mb=0, overlap=True, prefetch="off"), steps=4)
    assert all(m.guessed_bytes == 0 for m in off.metrics)  # off does not even guess
    _, predict = _run(model, replace(BASE, cache_mb=0, overlap=True, prefetch="predict"), steps=4)
    assert all(m.read_ahead and m.ahead_bytes > 0 and m.guessed_bytes > 0 for m in predict.metrics[1:])


def test_prefetch_bad_input_is_one_line() -> None:
    with pytest.raises(BmoeError, match="prefetch"):
        StreamConfig(prefetch="sometimes")  # type: ignore[arg-type]
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    with pytest.raises(BmoeError, match="needs streaming"):
        Engine(model, replace(BASE, stream=False, prefetch="predict"))
    result = run_cli("generate", "-m", str(model), "-p", "x", "-n", "1", "--prefetch", "always")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "prefetch" in (result.stdout + result.stderr)


# --- the lossy knob --drop-cold and bench quality -------------------------------------------------


def test_drop_cold_drops_only_where_a_cached_expert_can_stand_in() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    _, lossless = _run(model, replace(BASE, cache_mb=0))
    # Cache off: no cached expert to point a slot at, so nothing is dropped and nothing changes.
    info, off = _run(model, replace(BASE, cache_mb=0, drop_cold=0.5))
    assert info["lossy"] == "drop_cold=0.5"
    assert sum(m.dropped for m in off.metrics) == 0
    assert off.logits == lossless.logits
    # A small cache: light, cold slots are dropped; the run reads less and is another model.
    _, cached = _run(model, replace(BASE, cache_mb=0.3))
    _, dropping = _run(model, replace(BASE, cache_mb=0.3, drop_cold=0.5))
    assert sum(m.dropped for m in dropping.metrics[1:]) > 0
    assert sum(m.bytes_read for m in dropping.metrics[1:]) < sum(m.bytes_read for m in cached.metrics[1:])
    assert dropping.logits != cached.logits


def test_drop_cold_bad_input_and_the_gates_refuse_it() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    for bad in (1.0, 1.5):
        with pytest.raises(BmoeError, match=r"drop_cold \(--drop-cold\) must be in \[0, 1\)"):
            Engine(model, replace(BASE, drop_cold=bad))
    with pytest.raises(BmoeError, match="drop_cold"):
        StreamConfig(drop_cold=-0.1)
    with pytest.raises(BmoeError, match="needs streaming"):
        Engine(model, replace(BASE, stream=False, drop_cold=0.1))
    case = replace(gates.CASES["cache-small"], name="dropping", overrides={"drop_cold": 0.1})
    with pytest.raises(BmoeError, match="lossy"):
        gates.stream_config(case, 2**20)


def test_bench_quality_reports_agreement_and_perplexity(tmp_path) -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    result = run_cli("bench", "quality", "-m", str(model), "--lossy", "n_expert_used=1", "--lossy", "drop_cold=0.5",
                     "--tokens", "12", "--cache-mb", "0.3", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    import json

    rows = json.loads((tmp_path / "quality.json").read_text())
    assert [r["setting"] for r in rows] == ["lossless", "n_expert_used=1", "drop_cold=0.5"]
    assert rows[0]["perplexity_delta_pct"] == 0 and rows[0]["lossy"] == ""
    assert rows[1]["lossy"] == "n_expert_used=1" and rows[1]["perplexity_delta_pct"] != 0
    assert rows[2]["dropped_per_token"] > 0
    assert all(r["perplexity"] > 1 for r in rows)
    bad = run_cli("bench", "quality", "-m", str(model), "--lossy", "cache_mb=3")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "NAME=VALUE" in bad.stderr
