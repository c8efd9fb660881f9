"""The gate matrix passes on this machine, and it has teeth: corrupted reads make cells fail."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bmoe_edge.proof import gates

from conftest import run_cli


@pytest.mark.slow
@pytest.mark.full_campaign
def test_full_gate_matrix_passes_through_the_cli() -> None:
    """All of `bmoe-edge gates` (every cell of full_matrix(): most of an hour here); the suite runs
    the sample below and the breadth (test_archs.py) instead."""
    result = run_cli("gates", "--json", timeout=7200)
    report = json.loads(result.stdout)
    failures = [c for c in report["cells"] if not c["passed"]]
    assert not failures, failures[:3]
    assert result.returncode == 0
    cells = report["cells"]
    assert len(cells) == len(gates.full_matrix()) > 700
    assert {c["arch"] for c in cells} >= {"qwen3moe", "qwen2moe", "olmoe", "llama", "gpt-oss", "gemma4"}
    assert {c["quant"] for c in cells} >= {"F32", "F16", "Q8_0", "Q4_0", "Q4_K_M"}
    assert {c["config"] for c in cells} >= {"cache-off", "cache-small", "cache-large", "pread", "odirect-1-lane",
                                            "dense-anon", "two-generations"}
    assert any(c["split"] > 1 for c in cells)
    assert all(c["bytes_read"] > 0 for c in cells)


def test_the_sample_covers_every_architecture_type_and_configuration_of_the_full_matrix() -> None:
    """What the suite gives up by not running the full matrix: combinations, never a dimension. The
    sample has every depth architecture, weight type and case once (and a split cell); with the
    breadth (which the suite runs whole, test_archs.py) and the MTP sample (test_mtp.py), every
    architecture, type and configuration of full_matrix() is in a cell the suite runs."""
    sample, breadth, full = gates.sample_matrix(), gates.breadth_matrix(), gates.full_matrix()
    key = lambda c: (c.fixture, c.case.name)  # noqa: E731
    assert len(sample) == len(gates.CASES) + 1 and len({key(c) for c in sample}) == len(sample)
    assert {key(c) for c in sample} <= {key(c) for c in full}
    assert sorted({c.fixture.arch for c in sample}) == sorted(gates.CONFIG_ARCHS)
    assert {c.fixture.quant for c in sample} == set(gates.QUANTS)
    assert [c.case.name for c in sample if c.fixture.split == 1] == list(gates.CASES)
    assert [c.fixture.split for c in sample if c.fixture.split > 1] == [3]
    assert len({c.fixture.arch for c in sample if c.fixture.split == 1}) == len(gates.CONFIG_ARCHS)
    run = sample + breadth + gates.mtp_sample() + gates.release_sample()
    for dimension in (lambda c: c.fixture.arch, lambda c: c.fixture.quant, lambda c: c.case.name,
                      lambda c: c.fixture.split):
        assert {dimension(c) for c in run} == {dimension(c) for c in full}
    assert gates.sample_matrix() == sample   # deterministic


def test_the_gate_matrix_sample_passes() -> None:
    """The sample of the full matrix (gates.sample_matrix()), at the full matrix's step count."""
    cells = gates.sample_matrix()
    results = list(gates.run_gates(cells, gates.fixture_resolver(None), gates.STEPS))
    assert len(results) == len(cells) == len(gates.CASES) + 1
    failed = [gates.format_result(r) for r in results if not r.passed]
    assert not failed, failed[:3]
    assert all(r.bytes_read > 0 and r.steps >= gates.STEPS for r in results)


def test_quick_gates_pass() -> None:
    """`bmoe-edge gates --quick` runs the whole quick matrix, every cell passing: an empty or shrunken
    matrix fails here (its size follows from the quick fixtures and cases)."""
    want = (len(gates.QUICK_FIXTURES) - 1) * len(gates.QUICK_CASES) + 1   # the split fixture: one cell
    assert len(gates.quick_matrix()) == want >= 20
    result = run_cli("gates", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == f"gates: {want} passed, 0 failed"
    cells = [ln for ln in lines[:-1] if ln.startswith("PASS ")]
    assert len(cells) == want and not any(ln.startswith("FAIL ") for ln in lines), result.stdout
    assert {ln.split()[1] for ln in cells} == {s.arch for s in gates.QUICK_FIXTURES}


# The layout ggml's repack picks for the experts on an AVX2 host (docs/streaming.md, "Repacked kernels").
REPACKED_ON_AVX2 = {"Q4_0": "q4_0_8x8", "Q4_K_M": "q4_K_8x8", "MXFP4": "mxfp4_8x8"}


@pytest.mark.parametrize("arch,quant", [("qwen3moe", "Q8_0"), ("gpt-oss", "Q4_0"), ("gemma4", "F16"),
                                        ("qwen2moe", "Q4_K_M"), ("deepseek4", "MXFP4")])
def test_a_corrupted_read_fails_the_gate(arch: str, quant: str) -> None:
    # The first read (the prompt's first layer) and two of the decodes' (cache off: every decode reads its
    # experts, each one used by the token decoded). Not any read of the prompt: it reads a layer's missing
    # experts in merged jobs, and the last layer's experts that only earlier prompt tokens route to change
    # nothing the output shows (only the last token's logits are computed): corrupting the middle of such a
    # job (gemma4's 7th and 8th reads, deepseek4's 16th) rightly leaves tokens and logits equal.
    spec = gates.FixtureSpec(arch, quant)
    good = gates.CASES["cache-off"]
    cells = [gates.GateCell(spec, good)] + [
        gates.GateCell(spec, replace(good, name=f"corrupt-{n}", overrides={"fault": f"corrupt:{n}"}))
        for n in (1, 40, 100)
    ]
    results = list(gates.run_gates(cells, gates.fixture_resolver(None), steps=12))
    assert results[0].passed, results[0]
    if quant in REPACKED_ON_AVX2 and "avx2" in Path("/proc/cpuinfo").read_text().split():
        assert REPACKED_ON_AVX2[quant] in results[0].repack_layouts, results[0]  # the corrupted slices: repacked
    for bad in results[1:]:
        assert not bad.passed and not bad.equal_logits, bad
        assert bad.first_difference is not None


def test_a_corrupted_slice_kept_in_the_cache_fails_the_whole_graph_cell() -> None:
    """The whole-graph case's decodes read nothing: the cache holds every expert and they compute on what it
    holds. A slice corrupted as the prompt read it stays there, and the decodes computed whole on it differ."""
    spec = gates.FixtureSpec("qwen3moe", "Q4_0")
    good = gates.CASES["whole-graph"]
    bad = replace(good, name="whole-graph-corrupt", overrides={**good.overrides, "fault": "corrupt:1"})
    ok, corrupt = gates.run_gates([gates.GateCell(spec, good), gates.GateCell(spec, bad)],
                                  gates.fixture_resolver(None), steps=12)
    assert ok.passed and ok.whole_graphs > 0, ok
    assert not corrupt.passed and not corrupt.equal_logits and corrupt.whole_graphs > 0, corrupt


def test_a_failed_read_fails_the_cell_with_the_message() -> None:
    spec = gates.FixtureSpec("olmoe", "Q8_0")
    case = replace(gates.CASES["cache-off"], name="fail", overrides={"fault": "fail:5"})
    (result,) = gates.run_gates([gates.GateCell(spec, case)], gates.fixture_resolver(None), steps=8)
    assert not result.passed
    assert "injected fault" in result.error


def test_bundle_fixture_names_cover_every_shard() -> None:
    spec = gates.FixtureSpec("olmoe", "Q8_0", split=3)
    assert spec.filenames == [f"tiny-olmoe-Q8_0-split3-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(s.filenames for s in gates.quick_fixture_specs())


def test_the_speculative_cell_accepts_and_rejects_drafts_and_a_corrupted_read_still_fails_it() -> None:
    spec = gates.FixtureSpec("qwen3moe", "Q4_0")
    good = gates.CASES["speculative-ngram"]
    bad = replace(good, name="speculative-corrupt", overrides={**good.overrides, "fault": "corrupt:30"})
    ok, corrupt = gates.run_gates([gates.GateCell(spec, good), gates.GateCell(spec, bad)],
                                  gates.fixture_resolver(None))
    assert ok.passed and 0 < ok.accepted < ok.drafted, ok  # drafts kept and drafts rolled back
    assert not corrupt.passed and not corrupt.equal_logits, corrupt
