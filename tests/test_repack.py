"""llama.cpp's repacked kernels while streaming (docs/streaming.md, "Repacked kernels"): the experts take the
layout ggml picks for their type on this CPU, their slices are converted as the lanes read them (checked
first), the dense weights repacked at load leave no file pages behind, and streamed equals resident with the
same kernels; `auto` repacks the experts only where the cache holds them all. The gates hold the oracle across
the matrix (their cases run `repack all` but for the repack-* ones); this file holds what they do not show."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from bmoe_edge.engine import Engine, Generation, checksums
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import tinymoe

from conftest import run_cli

BASE = replace(gates.BASE, stream=True, cache_mb=0.0)
PROMPT = gates.PROMPTS[0]
STEPS = 8


def _avx2() -> bool:
    return "avx2" in Path("/proc/cpuinfo").read_text().split()


# What ggml's repack picks on an AVX2 host (repack.cpp's selection): this machine's and CI's.
needs_avx2 = pytest.mark.skipif(not _avx2(), reason="the x86 layouts need AVX2")


@pytest.fixture(scope="module")
def q4k() -> Path:
    return tinymoe.fixture("qwen2moe", "Q4_K_M")


def _run(model: Path, **settings: object) -> tuple[Generation, dict[str, object]]:
    with Engine(model, replace(BASE, **settings)) as engine:
        return engine.run(PROMPT, STEPS, logits=True), engine.run_info


def _same(a: Generation, b: Generation) -> bool:
    return a.tokens == b.tokens and a.logits == b.logits


@needs_avx2
def test_the_experts_compute_in_the_repacked_layout_and_equal_the_resident_run(q4k: Path) -> None:
    streamed, run = _run(q4k, overlap=True)  # BASE: repack all
    resident, _ = _run(q4k, stream=False)
    assert run["repack"] == "all"
    # Q4_K_M: the Q4_K tensors repacked, its Q6_K ones (no AVX2 layout) computed by the plain kernels.
    assert run["repack_layouts"] == "q4_K: q4_K_8x8, q6_K: file"
    assert int(run["repacked_dense_tensors"]) > 0 and int(run["repacked_dense_bytes"]) > 0
    assert _same(streamed, resident)
    metrics = streamed.metrics
    # Every slice went through a lane's buffer (converted or copied), and the lanes timed the conversions.
    assert sum(m.copy_bytes for m in metrics) >= sum(m.slice_bytes for m in metrics) > 0
    assert sum(m.convert_ms for m in metrics) > 0
    # The plain kernels give other floats: the comparison above is between the repacked runs.
    plain, _ = _run(q4k, stream=False, repack="off")
    assert plain.logits != resident.logits


def test_repack_off_reads_in_place_with_the_plain_kernels(q4k: Path) -> None:
    streamed, run = _run(q4k, repack="off")
    resident, _ = _run(q4k, stream=False, repack="off")
    assert run["repack"] == "off" and run["repack_layouts"] == "" and run["repacked_dense_tensors"] == 0
    assert _same(streamed, resident)
    assert sum(m.copy_bytes for m in streamed.metrics) == 0  # zero-copy, as before repacking existed


@needs_avx2
def test_auto_repacks_the_experts_only_where_the_cache_holds_them_all(q4k: Path) -> None:
    """A slice read and used once costs more to convert than its kernel saves: auto keeps the experts on the
    plain kernels, in place, unless the cache holds every one of them; the dense weights are repacked either way.
    Each resolution equals the resident run with the same kernels."""
    small, run = _run(q4k, repack="auto")  # BASE: no cache
    assert run["repack"] == "dense" and run["repack_layouts"] == "" and int(run["repacked_dense_tensors"]) > 0
    assert sum(m.copy_bytes for m in small.metrics) == 0
    assert _same(small, _run(q4k, stream=False, repack="dense")[0])
    everything = 2 * q4k.stat().st_size / 2**20
    full, run = _run(q4k, repack="auto", cache_mb=everything)
    assert run["repack"] == "all" and run["repack_layouts"] == "q4_K: q4_K_8x8, q6_K: file"
    assert _same(full, _run(q4k, stream=False, repack="auto")[0])  # resident auto: all, llama.cpp's own choice
    assert not _same(small, full)  # the two kernels' floats differ: each was compared with its own


def test_a_model_without_a_layout_keeps_zero_copy_reads() -> None:
    model = tinymoe.fixture("qwen3moe", "F32")
    streamed, run = _run(model)
    assert run["repack_layouts"] == "f32: file"
    assert sum(m.copy_bytes for m in streamed.metrics) == 0


@needs_avx2
@pytest.mark.parametrize("overlap", [False, True])
def test_verify_slices_checks_the_file_bytes_before_the_conversion(q4k: Path, tmp_path: Path, overlap: bool) -> None:
    """A transient corruption is caught in the lane's buffer, read again there, and only then converted: the
    output is the resident run's. Unverified, the same corruption reaches the repacked slice (the gates'
    corrupted-read cells: tests/test_gates.py)."""
    model = tmp_path / "model.gguf"
    shutil.copyfile(q4k, model)
    checksums.write(model)
    resident, _ = _run(model, stream=False)
    got, run = _run(model, verify_slices=True, overlap=overlap, fault="corrupt:7")
    assert "q4_K_8x8" in str(run["repack_layouts"])
    assert _same(got, resident)
    assert sum(m.rereads for m in got.metrics) == 1
    damaged, _ = _run(model, overlap=overlap, fault="corrupt:7")
    assert not _same(damaged, resident)


def test_repack_is_a_flag_and_in_the_run_header(q4k: Path) -> None:
    off = run_cli("generate", "-m", str(q4k), "-p", PROMPT, "-n", "2", "--repack", "off")
    assert off.returncode == 0, off.stderr
    assert "repack " not in off.stdout + off.stderr
    auto = run_cli("generate", "-m", str(q4k), "-p", PROMPT, "-n", "2")
    assert auto.returncode == 0, auto.stderr
    if _avx2():
        # no knobs on this machine: the cache holds the whole model, so auto repacks the experts too
        assert "repack all: experts q4_K: q4_K_8x8, q6_K: file; dense" in auto.stdout + auto.stderr
    bad = run_cli("generate", "-m", str(q4k), "-p", PROMPT, "-n", "2", "--repack", "sideways")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


def test_flash_attention_is_what_llama_cpp_resolved_and_changes_the_floats(q4k: Path) -> None:
    """Flash attention is the rest of stock llama.cpp's decode speed (on by default there): `auto` runs it where
    llama.cpp does, the run info says what llama.cpp resolved (Grok refuses it whatever is asked), and off is
    another computation, so the gates compare each with a resident run of the same setting."""
    auto, run = _run(q4k, flash_attn="auto")
    off, run_off = _run(q4k, flash_attn=False)
    assert run["flash_attn"] is True and run_off["flash_attn"] is False
    assert auto.logits != off.logits  # flipping it alone changes the numbers (gates.KERNEL_SETTINGS)
    _, grok = _run(tinymoe.fixture("grok", "Q8_0"), flash_attn=True)
    assert grok["flash_attn"] is False
