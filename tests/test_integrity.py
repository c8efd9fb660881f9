"""Integrity under faults and hostile input (docs/integrity.md): the model's identity, a defined state
after a failure, prompts as text, the I/O deadline, slice checksums, the vocabulary checked before
loading, and bounded samples of the fault and fuzz campaigns (full runs: `bmoe-edge faults`,
`bmoe-edge fuzz`, and the slow tests at the end)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bmoe_edge.engine import Engine, Generation, checksums, info, native
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import faults, fuzz, gates
from bmoe_edge.synthetic import tinymoe

from conftest import assert_clean_error, run_cli

BASE = replace(gates.BASE, stream=True)
PROMPT = gates.PROMPTS[0]
STEPS = 8


@pytest.fixture(scope="module")
def qwen3() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


@pytest.fixture
def model(tmp_path: Path, qwen3: Path) -> Path:
    """A private copy: tests rewrite, truncate and replace it."""
    copy = tmp_path / "model.gguf"
    shutil.copyfile(qwen3, copy)
    return copy


@pytest.fixture(scope="module")
def expected(qwen3: Path) -> Generation:
    with Engine(qwen3, replace(BASE, stream=False)) as engine:
        return engine.run(PROMPT, STEPS, logits=True)


def garble_experts(path: Path, layer: int = 0) -> None:
    """Invert 256 bytes in the middle of every expert slice of the layer's first expert tensor, in
    place (same size, new mtime): what a bad flash page does to a model."""
    tensor = next(t for t in info.expert_tensors(path) if t.layer == layer)
    n_expert = info.model_summary(path).n_expert
    step = tensor.bytes // n_expert
    with path.open("r+b") as f:
        for e in range(n_expert):
            at = tensor.offset + e * step + step // 2 - 128
            f.seek(at)
            chunk = f.read(256)
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in chunk))


def same(a: Generation, b: Generation) -> bool:
    return a.tokens == b.tokens and a.logits == b.logits


# --- the model's identity ------------------------------------------------------------------------


def test_a_model_rewritten_in_place_fails_the_next_step_naming_the_file(model: Path) -> None:
    with Engine(model, BASE) as engine:
        engine.run(PROMPT, 2)
        garble_experts(model)
        for _ in range(2):  # and stays refused: the file is no longer the one opened
            with pytest.raises(BmoeError, match="changed on disk") as exc:
                engine.run(PROMPT, 2)
            assert str(model) in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("stream", [True, False])
def test_a_truncated_model_is_an_error_not_a_sigbus(model: Path, stream: bool) -> None:
    """dense=mmap: llama.cpp's mapping of the truncated file would fault with SIGBUS on first touch."""
    script = (
        "import os, sys\n"
        "from dataclasses import replace\n"
        "from bmoe_edge.engine import Engine\n"
        "from bmoe_edge.errors import BmoeError\n"
        "from bmoe_edge.proof import gates\n"
        f"e = Engine(sys.argv[1], replace(gates.BASE, stream={stream}, dense='mmap'))\n"
        "e.run('Hello', 2)\n"
        "os.truncate(sys.argv[1], os.path.getsize(sys.argv[1]) // 2)\n"
        "try:\n"
        "    e.run('Hello', 2)\n"
        "except BmoeError as x:\n"
        "    print('ERROR', x)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(model)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ERROR") and "changed on disk" in result.stdout and str(model) in result.stdout


def test_a_model_renamed_over_keeps_running_on_the_old_file(model: Path, tmp_path: Path,
                                                            expected: Generation) -> None:
    other = tmp_path / "other.gguf"
    shutil.copyfile(model, other)
    garble_experts(other)
    with Engine(model, BASE) as engine:
        os.replace(other, model)  # an update dropped in while the engine runs
        assert same(engine.run(PROMPT, STEPS, logits=True), expected)
    with Engine(model, BASE) as fresh:  # the new file is another model: the check above had teeth
        assert not same(fresh.run(PROMPT, STEPS, logits=True), expected)


def test_engines_opened_and_closed_leave_no_descriptors_behind(qwen3: Path) -> None:
    def cycle() -> None:
        with Engine(qwen3, replace(BASE, io_threads=3)) as engine:
            engine.run(PROMPT, 1)

    cycle()
    before = faults.open_fds()
    for _ in range(20):
        cycle()
    assert faults.open_fds() == before


# --- a defined state after a failure ---------------------------------------------------------------


def test_after_a_failed_step_the_generation_is_over_until_a_new_one(qwen3: Path, expected: Generation) -> None:
    with Engine(qwen3, replace(BASE, fault="fail:20")) as engine:
        with pytest.raises(BmoeError, match="injected fault"):
            engine.run(PROMPT, STEPS)
        with pytest.raises(native.load().EngineError, match=r"stopped on an error .*injected fault.*begin a new one"):
            engine._live().next(native.load().StepResult())
        assert same(engine.run(PROMPT, STEPS, logits=True), expected)  # a new generation starts clean


# --- prompts as text -------------------------------------------------------------------------------


def test_prompts_are_text_unless_parse_special(qwen3: Path) -> None:
    with Engine(qwen3, replace(BASE, stream=False)) as engine:
        as_text = engine.tokenize("</s>", add_special=False)
    with Engine(qwen3, replace(BASE, stream=False, parse_special=True)) as engine:
        special = engine.tokenize("</s>", add_special=False)
        assert engine.run_info["parse_special"]
    assert len(special) == 1 and special[0] not in as_text and len(as_text) > 1
    assert "--parse-special" in run_cli("generate", "--help").stdout


# --- the I/O deadline ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", [False, True])
def test_a_hung_read_fails_the_step_at_the_deadline_and_the_lanes_recover(qwen3: Path, expected: Generation,
                                                                          overlap: bool) -> None:
    config = replace(BASE, io_timeout=1, fault="hang:10", overlap=overlap)
    with Engine(qwen3, config) as engine:
        t0 = time.monotonic()
        with pytest.raises(BmoeError, match="I/O deadline") as exc:
            engine.run(PROMPT, STEPS)
        assert time.monotonic() - t0 < 2.9, "the step must fail at the deadline, not when the stall ends"
        assert "\n" not in str(exc.value)
        assert same(engine.run(PROMPT, STEPS, logits=True), expected)


def test_io_timeout_is_a_flag_and_a_profile_field(model: Path) -> None:
    from bmoe_edge.boards.profile_schema import ENGINE_FIELDS

    result = run_cli("generate", "-m", str(model), "-p", "Hi", "-n", "1", "--io-timeout", "7", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0])["io_timeout_s"] == 7.0
    assert {"io_timeout", "verify_slices"} <= set(ENGINE_FIELDS)
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "Hi", "--io-timeout", "-1"), "io_timeout")


# --- slice checksums -------------------------------------------------------------------------------


def test_crc32c_is_the_standard_one() -> None:
    assert native.load().crc32c(b"123456789") == 0xE3069283
    assert native.load().crc32c(b"") == 0


def test_verify_model_writes_the_sidecar_then_checks_it(model: Path) -> None:
    first = run_cli("verify-model", str(model))
    assert first.returncode == 0 and "wrote" in first.stdout, first.stderr
    assert checksums.sidecar_path(model).is_file()
    again = run_cli("verify-model", str(model))
    assert again.returncode == 0 and again.stdout.startswith("ok: all"), again.stderr


def test_verify_model_finds_damage_by_tensor_expert_and_offset(model: Path) -> None:
    checksums.write(model)
    garble_experts(model, layer=1)
    result = run_cli("verify-model", str(model))
    assert_clean_error(result, "differ", "damaged")
    mismatches = result.stdout.splitlines()
    assert len(mismatches) == info.model_summary(model).n_expert
    assert all(m.startswith("MISMATCH blk.1.") and " expert " in m and "at offset" in m for m in mismatches)


def test_a_damaged_sidecar_is_refused_not_believed(model: Path) -> None:
    sidecar = checksums.write(model).sidecar
    text = sidecar.read_text()
    at = text.index('"]', text.index('"slices":[[')) - 1  # the last hex digit of the first sum
    sidecar.write_text(text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1:])
    assert_clean_error(run_cli("verify-model", str(model)), "damaged")
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "Hi", "--verify-slices"), "damaged")


@pytest.mark.parametrize("overlap", [False, True])
def test_verify_slices_rereads_a_transient_corruption_with_identical_output(model: Path, expected: Generation,
                                                                             overlap: bool) -> None:
    checksums.write(model)
    with Engine(model, replace(BASE, verify_slices=True, overlap=overlap, fault="corrupt:7")) as engine:
        got = engine.run(PROMPT, STEPS, logits=True)
        assert engine.run_info["verify_slices"]
    assert same(got, expected)
    assert sum(m.rereads for m in got.metrics) == 1


def test_verify_slices_stops_on_damage_on_disk(model: Path, expected: Generation) -> None:
    checksums.write(model)
    garble_experts(model)
    with Engine(model, BASE) as engine:  # unverified, the damage streams silently: the check has teeth
        assert not same(engine.run(PROMPT, STEPS, logits=True), expected)
    result = run_cli("generate", "-m", str(model), "-p", PROMPT, "-n", "4", "--verify-slices")
    assert_clean_error(result, "checksum mismatch in blk.0.", " expert ", "at offset", "read twice", str(model))


def test_verify_slices_without_a_sidecar_says_how_to_make_one(model: Path) -> None:
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "Hi", "--verify-slices"),
                       "bmoe-edge verify-model")


# --- hostile files ---------------------------------------------------------------------------------


def test_a_duplicated_vocabulary_token_is_one_line_not_an_abort(tmp_path: Path) -> None:
    from gguf import GGUFReader

    path = tmp_path / "dup.gguf"
    tinymoe.write_tiny_moe(path, "qwen3moe", "Q8_0", vocab_size=300)
    reader = GGUFReader(path, "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    words = [field.parts[i] for i in field.data]
    first, second = next((a, b) for a in range(260, 300) for b in range(a + 1, 300)
                         if words[a].nbytes == words[b].nbytes and bytes(words[a]) != bytes(words[b]))
    words[second][:] = words[first]
    reader.data.flush()
    del reader, field, words
    for command in (["info", str(path)], ["generate", "-m", str(path), "-p", "Hi"]):
        result = run_cli(*command, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
        assert_clean_error(result, "twice", f"ids {first} and {second}")


def test_a_model_name_that_is_not_utf8_is_shown_not_a_crash(tmp_path: Path) -> None:
    """Found by the fuzz campaign: a metadata string with a byte that is not UTF-8 made `info` raise
    UnicodeDecodeError from the bindings."""
    from gguf import GGUFReader

    path = tmp_path / "name.gguf"
    tinymoe.write_tiny_moe(path, "qwen3moe", "Q8_0", vocab_size=300)
    reader = GGUFReader(path, "r+")
    field = reader.fields["general.name"]
    field.parts[field.data[0]][1] = 0xAA
    reader.data.flush()
    del reader, field
    result = run_cli("info", str(path))
    assert result.returncode == 0, result.stderr
    assert "name:" in result.stdout and "?" in result.stdout


def test_a_vocabulary_missing_a_byte_token_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzz campaign: llama.cpp's tokenizer throws std::out_of_range through its C API
    when a byte token is missing; it escaped as an IndexError."""
    from gguf import GGUFReader

    path = tmp_path / "bytes.gguf"
    tinymoe.write_tiny_moe(path, "qwen3moe", "Q8_0", vocab_size=300)
    reader = GGUFReader(path, "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    token = next(field.parts[i] for i in field.data if bytes(field.parts[i]) == b"<0x48>")  # "H"
    token[:] = list(b"<0xQQ>")
    reader.data.flush()
    del reader, field, token
    assert_clean_error(run_cli("generate", "-m", str(path), "-p", "Hello", "-n", "2"),
                       "llama.cpp failed while tokenizing the prompt", "corrupt")


def test_fuzz_sample_ends_every_run_in_a_result_or_one_line(tmp_path: Path) -> None:
    seed = fuzz.seed_model(tmp_path)
    results = list(fuzz.run_campaign(seed, tmp_path / "work", count=30, seed=1))
    assert len(results) == 60
    bad = [r for r in results if r.outcome not in fuzz.PASSING]
    assert not bad, bad[:3]
    assert {r.outcome for r in results} >= {"error"}


def test_fault_sample_never_changes_a_token_silently(qwen3: Path, tmp_path: Path) -> None:
    results = list(faults.run_campaign(qwen3, tmp_path, count=12, seed=3))
    assert not [r for r in results if r.outcome == "different"], [r.record() for r in results]
    outcomes = {r.outcome for r in results}
    assert "error" in outcomes and "recovered" in outcomes, [r.record() for r in results]


# The full campaigns take most of an hour: they are commands (`bmoe-edge faults --count 1000`, `bmoe-edge fuzz
# --count 2000`) whose results are committed (bench-data/2026-12-01/integrity); CI runs the bounded samples
# above. BMOE_EDGE_FULL_CAMPAIGNS=1 runs them here too (docs/testing.md).


@pytest.mark.slow
@pytest.mark.full_campaign
def test_fault_campaign_full(qwen3: Path, tmp_path: Path) -> None:
    results = list(faults.run_campaign(qwen3, tmp_path, count=1000))
    assert not [r for r in results if r.outcome == "different"]


@pytest.mark.slow
@pytest.mark.full_campaign
def test_fuzz_campaign_full(tmp_path: Path) -> None:
    results = list(fuzz.run_campaign(fuzz.seed_model(tmp_path), tmp_path / "work", count=2000))
    assert not [r for r in results if r.outcome not in fuzz.PASSING]


@pytest.mark.slow
def test_a_long_run_with_constant_eviction_keeps_rss_flat(qwen3: Path) -> None:
    """2000 tokens with a cache of a third of the experts (evictions in every layer of every token):
    RSS after warm-up stays within 5%."""
    expert_bytes = info.model_summary(qwen3).expert_bytes
    config = replace(BASE, cache_mb=0.3 * expert_bytes / 2**20, ctx=2100, overlap=True)
    with Engine(qwen3, config) as engine:
        gen = engine.run(PROMPT, 2000)
    assert len(gen.tokens) == 2000 and sum(m.evictions for m in gen.metrics) > 2000
    warm = gen.metrics[200].rss_bytes
    assert all(abs(m.rss_bytes - warm) <= 0.05 * warm for m in gen.metrics[200:]), \
        (warm, max(m.rss_bytes for m in gen.metrics[200:]))
