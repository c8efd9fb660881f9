"""The streaming engine through its Python API: cache, residency, read paths, load cost, telemetry."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from bmoe_edge.bench.machine import drop_page_cache
from bmoe_edge.engine import Engine, StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import tinymoe

BASE = replace(gates.BASE, stream=True)
PROMPT = gates.PROMPTS[0]


@pytest.fixture(scope="module")
def qwen3() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


def rss_anon_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_cache_off_reads_for_every_token(qwen3: Path) -> None:
    with Engine(qwen3, replace(BASE, cache_mb=0)) as engine:
        gen = engine.run(PROMPT, 12)
        assert engine.run_info["cache_mode"] == "off"
    assert all(m.bytes_read > 0 for m in gen.metrics)
    assert all(m.cache_hits == 0 for m in gen.metrics)


def test_a_cache_that_holds_every_expert_hits_after_warm_up(qwen3: Path) -> None:
    with Engine(qwen3, replace(BASE, cache_mb=64)) as engine:
        engine.run(PROMPT, 16)  # warm-up
        again = engine.run(PROMPT, 16)
    lookups = sum(m.cache_lookups for m in again.metrics)
    hits = sum(m.cache_hits for m in again.metrics)
    assert lookups > 0 and hits / lookups > 0.9


def test_once_every_expert_is_in_a_decode_runs_as_one_graph_and_gives_the_resident_answer(qwen3: Path) -> None:
    """Streamer::holds_every_expert: the graph runs whole (no split per layer), its experts counted as hits
    after it; the ids and every logit are the resident run's. A cache that cannot hold them all never does."""
    with Engine(qwen3, replace(BASE, stream=False)) as engine:
        resident = engine.run(PROMPT, 40, logits=True)
    with Engine(qwen3, replace(BASE, cache_mb=64, overlap=True)) as engine:   # the hook notes the experts used
        streamed = engine.run(PROMPT, 40, logits=True)
        per_token = engine.run_info["n_layer"] * engine.run_info["n_expert_used"]
    assert streamed.tokens == resident.tokens
    assert streamed.logits == resident.logits and len(streamed.logits) == 40   # every step's float32 bytes
    whole = [m for m in streamed.metrics if m.whole_graphs]
    assert whole and streamed.metrics[-1].whole_graphs == 1, [m.whole_graphs for m in streamed.metrics]
    assert all(m.bytes_read == 0 and m.stall_ms == 0 for m in whole)
    # counted as the routers would have: each layer's distinct experts, all hits (top-k distinct for one token)
    assert all(m.cache_lookups == m.cache_hits == per_token for m in whole)
    assert all(m.routed_bytes > 0 for m in whole)
    with Engine(qwen3, replace(BASE, cache_mb=0.25, overlap=True)) as engine:
        small = engine.run(PROMPT, 40)
    assert not any(m.whole_graphs for m in small.metrics)
    assert small.tokens == resident.tokens


def test_small_budget_bounds_resident_expert_bytes(qwen3: Path) -> None:
    budget_mb = 0.25
    with Engine(qwen3, replace(BASE, cache_mb=budget_mb)) as engine:
        info = engine.run_info
        n_layers = info["n_layer"]
        per_expert = info["routed_bytes_per_token"] // (n_layers * info["n_expert_used"])
        page = info["page_size"]
        anon_before = rss_anon_bytes()
        peak_anon = 0
        gen_steps = []
        for token in engine.generate(PROMPT, 24):
            gen_steps.append(token.metrics)
            peak_anon = max(peak_anon, rss_anon_bytes())
    budget = int(budget_mb * 2**20)
    # The layer being computed may exceed the budget by its own routed experts (all 8 in a prompt),
    # each slice possibly touching one extra page at either end.
    working_set = info["n_expert"] * (per_expert + 2 * 3 * page)
    assert sum(m.evictions for m in gen_steps) > 0, "the budget must force evictions"
    for m in gen_steps:
        assert m.resident_expert_bytes <= budget + working_set, m
    assert peak_anon - anon_before <= budget + working_set + 2 * 2**20


def test_odirect_is_used_on_a_real_filesystem_with_zero_copies(qwen3: Path) -> None:
    with Engine(qwen3, replace(BASE, read_path="odirect")) as engine:
        gen = engine.run(PROMPT, 6)
        info = engine.run_info
    assert info["read_path"] == "odirect" and info["read_path_note"] == ""
    assert info["dio_align"] in (512, 1024, 2048, 4096)
    assert sum(m.copy_bytes for m in gen.metrics) == 0
    assert sum(m.bytes_read for m in gen.metrics) > 0


def test_odirect_on_tmpfs_falls_back_to_pread_and_says_so(qwen3: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm tmpfs here")
    copy = shm / f"bmoe-test-{os.getpid()}.gguf"
    shutil.copyfile(qwen3, copy)
    try:
        with Engine(copy, replace(BASE, read_path="odirect")) as engine:
            info = engine.run_info
            engine.run(PROMPT, 4)
        assert info["read_path_requested"] == "odirect"
        assert info["read_path"] == "pread"
        assert "O_DIRECT" in info["read_path_note"] and "pread" in info["read_path_note"]
    finally:
        copy.unlink()


def test_streamed_load_does_not_read_or_keep_the_experts(tmp_path: Path) -> None:
    """Resident loading reads the whole file; streamed loading reads about the dense part only."""
    model = tmp_path / "expert-heavy.gguf"
    tinymoe.write_tiny_moe(model, "qwen3moe", "Q8_0", n_layer=6, n_ff_exp=512, vocab_size=2000)
    file_bytes = model.stat().st_size
    drop_page_cache(model)
    with Engine(model, replace(BASE, stream=False)) as resident:
        resident_read = resident.run_info["load_bytes_read"]
    drop_page_cache(model)
    with Engine(model, replace(BASE, cache_mb=0)) as streamed:
        info = streamed.run_info
    expert = info["expert_bytes"]
    assert expert > 0.7 * file_bytes, "fixture must be expert-heavy for this test to mean anything"
    assert info["lazy_load"] is True
    assert resident_read > 0.9 * file_bytes
    dense = file_bytes - expert
    # Dense bytes, what the warm-up decode routes to (top-2 of 8 per layer) and readahead slack.
    assert info["load_bytes_read"] < dense + expert * 0.35 + 2 * 2**20
    assert info["load_bytes_read"] < 0.5 * resident_read


def test_split_shards_are_one_model() -> None:
    model = tinymoe.fixture("olmoe", "Q8_0", split=3)
    with Engine(model, replace(BASE, cache_mb=0)) as engine:
        info = engine.run_info
        gen = engine.run(PROMPT, 4)
    assert info["n_files"] == 3
    assert len(gen.tokens) == 4


def test_invalid_configurations_are_refused() -> None:
    with pytest.raises(BmoeError, match="cache_mb"):
        StreamConfig(cache_mb=-5)
    with pytest.raises(BmoeError, match="io_threads"):
        StreamConfig(io_threads=0)
    with pytest.raises(BmoeError, match="read_path"):
        StreamConfig(read_path="mmap")  # type: ignore[arg-type]


def test_run_info_reports_the_resolved_configuration(qwen3: Path) -> None:
    with Engine(qwen3, replace(BASE, cache_mb=1.5, io_threads=3, dense="anon")) as engine:
        info = engine.run_info
    assert info["cache_mode"] == "fixed" and info["cache_budget_mb"] == 1.5
    assert info["io_threads"] == 3 and info["dense"] == "anon" and info["threads"] == 1
    assert info["page_size"] == os.sysconf("SC_PAGESIZE")
    assert info["streaming"] is True and info["streamed_tensors"] == 3 * info["n_layer"]
