"""I/O-compute overlap through the expert-ready hook: lossless, fails cleanly, one engine per process."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from bmoe_edge.engine import Engine
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import tinymoe

from conftest import assert_clean_error, run_cli

BASE = replace(gates.BASE, stream=True, overlap=True)


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


def test_overlap_is_reported_and_reads_happen(model: Path) -> None:
    with Engine(model, replace(BASE, cache_mb=0)) as engine:
        gen = engine.run(gates.PROMPTS[0], 8)
        assert engine.run_info["overlap"] is True and engine.run_info["hook_compiled_in"] is True
    assert all(m.bytes_read > 0 for m in gen.metrics)


def test_a_second_overlapping_engine_is_refused_until_the_first_closes(model: Path) -> None:
    first = Engine(model, BASE)
    with pytest.raises(BmoeError, match="already uses overlap"):
        Engine(model, BASE)
    with Engine(model, replace(BASE, overlap=False)) as serial:  # serial engines do not need the hook
        serial.run("Hi", 2)
    first.close()
    import gc

    gc.collect()
    with Engine(model, BASE) as again:
        again.run("Hi", 2)


def test_a_failed_read_under_overlap_fails_generate_cleanly(model: Path) -> None:
    env = dict(os.environ, BMOE_FAULT="fail:45")
    result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "40", "--cache-mb", "0",
                     "--overlap", "-t", "2", "--json", env=env, timeout=60)
    assert_clean_error(result, "injected fault")
    tokens = [json.loads(line) for line in result.stdout.splitlines() if '"token"' in line]
    assert len(tokens) < 40


def test_a_corrupted_read_under_overlap_fails_the_gate() -> None:
    spec = gates.FixtureSpec("gpt-oss", "Q8_0")
    case = replace(gates.CASES["overlap-cache-off"], name="overlap-corrupt", overrides={"overlap": True,
                                                                                       "fault": "corrupt:9"})
    (result,) = gates.run_gates([gates.GateCell(spec, case)], gates.fixture_resolver(None), steps=12)
    assert not result.passed and not result.equal_logits


@pytest.mark.slow
@pytest.mark.parametrize("threads", [2, pytest.param(4, marks=pytest.mark.full_campaign)])
def test_stress_200_steps_with_evictions_every_layer(threads: int) -> None:
    """Evictions in every layer, 4 lanes, overlap on: bit-identical to resident, no deadlock.

    More compute threads than cores makes ggml's spinning barriers crawl (measured here: 4 threads on
    2 cores, 200 tokens of a tiny model take ~130 s resident, ~0.1 s with 2 threads), so on such a
    machine the oversubscribed case runs 40 steps: still evictions in every layer of every step. That
    case alone took 295 s here on a shared machine: it is a full-campaign case (docs/testing.md).
    """
    steps = 200 if threads <= (os.cpu_count() or 1) else 40
    model = tinymoe.fixture("olmoe", "Q4_0")
    prompt = "Once upon a time, in a land far away, there lived"
    common = replace(gates.BASE, threads=threads, ctx=512)
    with Engine(model, replace(common, stream=False)) as resident:
        expected = resident.run(prompt, steps, logits=True)
    with Engine(model, replace(common, stream=True, overlap=True, io_threads=4, cache_mb=0)) as streamed:
        got = streamed.run(prompt, steps, logits=True)
    assert len(got.tokens) == len(expected.tokens) == steps
    assert got.tokens == expected.tokens
    assert got.logits == expected.logits
    assert all(m.evictions > 0 for m in got.metrics[1:])
