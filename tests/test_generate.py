"""`bmoe-edge generate` as a user runs it: output, telemetry files, and one-line errors."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from bmoe_edge.synthetic import tinymoe

from conftest import assert_clean_error, run_cli


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_streamed_generate_prints_the_same_ids_as_resident(model: Path) -> None:
    ids = {}
    for flag in ("--stream", "--no-stream"):
        result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "16", "-t", "1", "--json", flag)
        assert result.returncode == 0, result.stderr
        records = json_lines(result.stdout)
        assert records[0]["type"] == "run" and records[-1]["type"] == "summary"
        ids[flag] = [r["id"] for r in records if r["type"] == "token"]
        assert records[-1]["generated_tokens"] == len(ids[flag]) == 16
    assert ids["--stream"] == ids["--no-stream"]


def test_progress_csv_and_summary(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "telemetry.csv"
    result = run_cli("generate", "-m", str(model), "-p", "Hello", "-n", "8", "--cache-mb", "0", "--io-threads", "2",
                     "--progress", "--csv", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("[step") == 8
    assert "tok/s decode" in result.stderr and "read path odirect" in result.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 8
    assert all(int(r["bytes_read"]) > 0 for r in rows)
    assert {"wall_ms", "io_ms", "stall_ms", "compute_ms", "cache_hits", "cache_lookups", "evictions",
            "major_faults", "rss_bytes"} <= set(rows[0])


def test_board_profile_supplies_the_defaults(model: Path) -> None:
    result = run_cli("generate", "-m", str(model), "-p", "Hi", "-n", "2", "--board", "rpi5", "--json")
    assert result.returncode == 0, result.stderr
    run = json_lines(result.stdout)[0]
    # rpi5: threads auto (one core left to the read lanes while streaming), 2 lanes, cache auto
    assert run["threads"] == max(1, (os.cpu_count() or 1) - 1) and run["io_threads"] == 2
    assert run["cache_mode"] == "auto"


def test_no_knobs_take_this_machines_profile(model: Path) -> None:
    """`generate -m M -p P` is the fast path: the machine's profile (host here; a deployed release's
    launcher names its board) gives auto cache, overlap where the hook is, its lanes."""
    result = run_cli("generate", "-m", str(model), "-p", "Hi", "-n", "2", "--json")
    assert result.returncode == 0, result.stderr
    run = json_lines(result.stdout)[0]
    assert run["cache_mode"] == "auto" and run["cache_adaptive"] and run["memory_limit_source"]
    assert run["overlap"] == run["hook_compiled_in"] and run["io_threads"] == 4  # host.yaml
    on_board = run_cli("generate", "-m", str(model), "-p", "Hi", "-n", "2", "--json",
                       env={**os.environ, "BMOE_EDGE_BOARD": "qemu-arm64"})
    assert on_board.returncode == 0, on_board.stderr
    assert json_lines(on_board.stdout)[0]["io_threads"] == 1  # qemu-arm64.yaml


def test_no_knobs_size_the_context_and_batch_to_the_job(model: Path) -> None:
    """A one-shot `generate` leaves the memory a job cannot use to the expert cache: its context holds the
    prompt and -n (in steps of 256), its batch the prompt (at least 64). The tokens and every logit equal
    a run with the table's 2048/512, given explicitly (and kept)."""
    runs = {}
    for name, flags in (("fitted", []), ("given", ["--ctx", "2048"])):
        result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "300", "-t", "1", "--json",
                         *flags)
        assert result.returncode == 0, result.stderr
        runs[name] = json_lines(result.stdout)
    fitted, given = runs["fitted"][0], runs["given"][0]
    assert (fitted["ctx"], fitted["batch"], fitted["ubatch"]) == (512, 64, 64)  # 24 + 300 + 9 -> 512
    assert (given["ctx"], given["batch"]) == (2048, 64)                          # --ctx kept, the batch fitted
    assert [r["id"] for r in runs["fitted"] if r["type"] == "token"] == \
           [r["id"] for r in runs["given"] if r["type"] == "token"]


def test_fitting_never_grows_a_setting_and_keeps_what_was_given() -> None:
    from bmoe_edge.engine import runner
    from bmoe_edge.engine.settings import StreamConfig

    table = StreamConfig()
    long_prompt = "x" * 5000
    # A long prompt in one ubatch up to the table's context (each ubatch reads the routed experts again).
    fitted = runner.fit_to_job(table, long_prompt, 4000)
    assert (fitted.ctx, fitted.batch, fitted.ubatch) == (table.ctx, table.ctx, table.ctx)
    assert runner.fit_to_job(table, 700, 64).ubatch == 704
    short = runner.fit_to_job(table, "Hi", 8)
    assert (short.ctx, short.batch, short.ubatch) == (256, 64, 64)
    kept = runner.fit_to_job(StreamConfig(ctx=1024, batch=256, ubatch=128), "Hi", 8, fixed={"ctx", "ubatch"})
    assert (kept.ctx, kept.batch, kept.ubatch) == (1024, 128, 128)


def test_a_conversation_decodes_a_long_prompt_in_one_ubatch_up_to_its_context() -> None:
    """serve and chat do not know their prompts ahead: a batch and ubatch of the context (at most
    CONVERSATION_UBATCH), so a 1,000-token system prompt is not two ubatches that each read every routed
    expert; given settings and --parallel's chunked prompts keep theirs."""
    from dataclasses import replace

    from bmoe_edge.engine import runner
    from bmoe_edge.engine.settings import StreamConfig

    table = StreamConfig()
    fitted = runner.fit_to_conversation(table)
    assert (fitted.ctx, fitted.batch, fitted.ubatch) == (table.ctx, table.ctx, table.ctx) and table.ubatch < table.ctx
    big = runner.fit_to_conversation(replace(table, ctx=16384))
    assert (big.batch, big.ubatch) == (runner.CONVERSATION_UBATCH, runner.CONVERSATION_UBATCH)
    assert runner.fit_to_conversation(replace(table, ctx=256)).ubatch == table.batch   # never below the table's
    assert runner.fit_to_conversation(table, fixed={"ubatch"}) == table
    assert runner.fit_to_conversation(replace(table, parallel=2)) == replace(table, parallel=2)


def test_a_failed_read_stops_generation_with_one_line(model: Path) -> None:
    env = dict(os.environ, BMOE_FAULT="fail:60")
    result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "40", "--cache-mb", "0",
                     "--json", env=env, timeout=120)
    assert_clean_error(result, "injected fault", "failed")
    tokens = [r for r in json_lines(result.stdout) if r["type"] == "token"]
    assert 0 < len(tokens) < 40, "some tokens before the failure, none after it"
    assert not any(r["type"] == "summary" for r in json_lines(result.stdout))


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory: pytest.TempPathFactory, model: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    data = model.read_bytes()
    (d / "truncated.gguf").write_bytes(data[:2000])
    (d / "past-eof.gguf").write_bytes(data[: len(data) // 2])
    unknown = d / "unknown-arch.gguf"
    tinymoe.write_tiny_moe(unknown, "qwen3moe", "Q8_0", vocab_size=300)
    raw = unknown.read_bytes().replace(b"qwen3moe", b"qwen9zzz")
    unknown.write_bytes(raw)
    dense = d / "dense.gguf"
    tinymoe.write_tiny_moe(dense, "dense", "Q8_0", vocab_size=300)
    split = tinymoe.fixture("olmoe", "Q8_0", split=3)
    for i, shard in enumerate(tinymoe.shard_paths(split, 3)):
        if i != 1:
            shutil.copyfile(shard, d / shard.name)
    return {"truncated": d / "truncated.gguf", "past_eof": d / "past-eof.gguf", "unknown": unknown,
            "dense": dense, "missing_shard": d / tinymoe.shard_paths(split, 3)[0].name}


@pytest.mark.parametrize("case,needles", [
    ("truncated", ["truncated.gguf", "gguf"]),
    ("past_eof", ["past the end of the file"]),
    ("unknown", ["qwen9zzz", "unknown model architecture"]),
    ("dense", ["dense", "--no-stream"]),
    ("missing_shard", ["missing shard 2 of 3"]),
])
def test_bad_models_get_one_line(bad_models: dict[str, Path], case: str, needles: list[str]) -> None:
    result = run_cli("generate", "-m", str(bad_models[case]), "-p", "Hi", "-n", "2", "--stream")
    assert_clean_error(result, *needles)


def test_dense_model_runs_resident(bad_models: dict[str, Path]) -> None:
    """A model without experts: --stream refuses it (above); resident, it generates, and says so."""
    result = run_cli("generate", "-m", str(bad_models["dense"]), "-p", "Hi", "-n", "3", "--no-stream", "--json")
    assert result.returncode == 0, result.stderr
    assert "error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    records = json_lines(result.stdout)
    run, summary = records[0], records[-1]
    assert run["type"] == "run" and summary["type"] == "summary", records
    assert (run["architecture"], run["n_expert"], run["expert_bytes"]) == ("llama", 0, 0)
    assert run["streaming"] is False and run["streamed_tensors"] == 0 and not run["warning"], run
    assert [r["type"] for r in records[1:-1]] == ["token"] * 3
    assert summary["generated_tokens"] == 3 and summary["stop_reason"] == "max_tokens"
    assert summary["bytes_read"] == 0


@pytest.mark.parametrize("args,needle", [
    (["-m", "/no/such/model.gguf"], "No such file"),
    (["--cache-mb", "-5"], "--cache-mb"),
    (["--cache-mb", "lots"], "--cache-mb"),
    (["--io-threads", "0"], "io_threads"),
    (["--read-path", "mmap"], "read_path"),
])
def test_bad_arguments_get_one_line(model: Path, args: list[str], needle: str) -> None:
    base = ["generate", "-p", "Hi", "-n", "2"]
    if "-m" not in args:
        base += ["-m", str(model)]
    assert_clean_error(run_cli(*base, *args), needle)


def _route_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_route_trace_has_every_token_and_layer_and_does_not_depend_on_how_experts_are_read(
        model: Path, tmp_path: Path) -> None:
    traces = {}
    # Read-ahead off but where asked (auto may read ahead from the fourth decode: prefetch_policy.h).
    for name, flags in {"serial": ["--no-overlap", "--cache-mb", "0", "--prefetch", "off"],
                        "overlap-cache": ["--overlap", "--cache-mb", "64", "--prefetch", "off"],
                        "prefetch": ["--overlap", "--cache-mb", "0", "--prefetch", "predict"]}.items():
        path = tmp_path / f"{name}.csv"
        result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "6", "-t", "1",
                         "--route-trace", str(path), *flags)
        assert result.returncode == 0, result.stderr
        traces[name] = _route_rows(path)
    rows = traces["serial"]
    assert rows == traces["overlap-cache"]
    # Read-ahead changes no route; it adds its guess of each layer after the first, in the decodes.
    assert [{**r, "predicted": ""} for r in traces["prefetch"]] == rows
    assert all(not r["predicted"] for r in rows)
    for r in traces["prefetch"]:
        guessed = r["step"] != "0" and r["layer"] != "0"
        assert bool(r["predicted"]) == guessed, r
        assert not guessed or len(r["predicted"].split()) == 2
    layers = sorted({int(r["layer"]) for r in rows})
    assert layers == list(range(len(layers))) and len(layers) >= 2
    prompt = [r for r in rows if r["step"] == "0"]
    n_prompt = len({r["pos"] for r in prompt})
    # Every prompt token in every layer but the last, which computes only the token whose logits count.
    assert n_prompt >= 2 and len(prompt) == n_prompt * (len(layers) - 1) + 1
    assert [r["pos"] for r in prompt if r["layer"] == str(layers[-1])] == [str(n_prompt - 1)]
    steps = sorted({int(r["step"]) for r in rows})
    assert steps == list(range(6))  # the prompt, then one decode per further token
    for r in rows:
        ids = [int(e) for e in r["experts"].split()]
        assert len(ids) == 2 and len(set(ids)) == 2 and all(0 <= e < 8 for e in ids)  # top-2 of 8 experts
    assert {r["pos"] for r in rows if r["step"] == "1"} == {str(n_prompt)}


def test_a_route_trace_that_cannot_be_written_fails_before_loading(model: Path, tmp_path: Path) -> None:
    result = run_cli("generate", "-m", str(model), "-p", "Hi", "-n", "2", "--route-trace",
                     str(tmp_path / "missing" / "trace.csv"))
    assert_clean_error(result, "cannot write the route trace")
    result = run_cli("generate", "-m", str(model), "-p", "Hi", "-n", "2", "--no-stream", "--route-trace",
                     str(tmp_path / "trace.csv"))
    assert_clean_error(result, "needs streaming")


def _ids(result) -> list[int]:
    return [r["id"] for r in json_lines(result.stdout) if r["type"] == "token"]


def test_speculative_decoding_gives_the_same_tokens_in_fewer_decodes(model: Path) -> None:
    # A prompt that repeats itself: after its second "Once upon a time" the model's continuation is
    # already in the text, so prompt-lookup drafts are accepted.
    first = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "24", "-t", "1", "--json")
    assert first.returncode == 0, first.stderr
    text = "".join(r["text"] for r in json_lines(first.stdout) if r["type"] == "token")
    prompt = f"Once upon a time{text} Once upon a time"
    runs = {}
    for name, flags in {"plain-resident": ["--no-stream"],
                        "speculative": ["--speculative", "ngram", "--draft-max", "6", "--overlap", "--cache-mb", "8"],
                        "speculative-serial": ["--speculative", "ngram", "--no-overlap", "--cache-mb", "0"]}.items():
        result = run_cli("generate", "-m", str(model), "-p", prompt, "-n", "24", "-t", "1", "--json", *flags)
        assert result.returncode == 0, result.stderr
        runs[name] = result
    plain = _ids(runs["plain-resident"])
    assert _ids(runs["speculative"]) == plain == _ids(runs["speculative-serial"])
    summary = json_lines(runs["speculative"].stdout)[-1]
    assert summary["run"]["speculative"] == "ngram"
    assert summary["accepted"] >= 8 and summary["decodes"] < 23 - 4, summary


@pytest.mark.parametrize(("flags", "needle"), [
    (["--draft-max", "0"], "draft_max"),
    (["--speculative", "medusa"], "speculative"),
])
def test_bad_speculative_settings_are_one_line(model: Path, flags: list[str], needle: str) -> None:
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "Hi", "-n", "2", *flags), needle)


def test_fewer_experts_per_token_is_lossy_and_says_so(model: Path) -> None:
    runs = {}
    for k in ("2", "1"):  # the fixture routes to 2 of 8 experts
        result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "12", "-t", "1", "--json",
                         "--n-expert-used", k, "--cache-mb", "0")
        assert result.returncode == 0, result.stderr
        runs[k] = json_lines(result.stdout)
    assert runs["1"][0]["lossy"] == "n_expert_used=1" and runs["1"][0]["n_expert_used"] == 1
    assert runs["2"][0]["lossy"] == "n_expert_used=2"
    # One expert per token reads half the expert bytes (the cache off: every routed slice is read).
    per_token = {k: lines[-1]["bytes_read_per_token"] for k, lines in runs.items()}
    assert 0.4 < per_token["1"] / per_token["2"] < 0.6, per_token
    default = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "2", "-t", "1", "--json")
    assert json_lines(default.stdout)[0]["lossy"] == ""
    # ... and computes another model: the logits move (the fixture's clear margins keep the tokens).
    from bmoe_edge.engine import Engine, StreamConfig

    logits = {}
    for k in ("auto", 1):
        with Engine(model, StreamConfig(threads=1, n_expert_used=k)) as e:
            logits[k] = e.run("Once upon a time", 4, logits=True).logits
    assert logits[1] != logits["auto"]


@pytest.mark.parametrize("k", ["0", "9"])
def test_an_impossible_expert_count_is_one_line_before_loading(model: Path, k: str) -> None:
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "Hi", "-n", "2", "--n-expert-used", k),
                       "n_expert_used")


def test_speculative_mtp_drafts_from_the_models_head_through_the_cli() -> None:
    from bmoe_edge.synthetic import mtp_rows

    head = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="noisy")
    runs = {}
    for name, flags in {"plain": ["--no-stream"], "mtp": ["--speculative", "mtp", "--cache-mb", "0"],
                        "auto": ["--speculative", "auto", "--overlap", "--cache-mb", "1"]}.items():
        result = run_cli("generate", "-m", str(head), "-p", "Once upon a time", "-n", "24", "-t", "1", "--json",
                         *flags)
        assert result.returncode == 0, result.stderr
        runs[name] = json_lines(result.stdout)
    ids = {name: [r["id"] for r in lines if r["type"] == "token"] for name, lines in runs.items()}
    assert ids["mtp"] == ids["plain"] == ids["auto"]
    for name in ("mtp", "auto"):
        summary = runs[name][-1]
        assert summary["run"]["speculative"] == "mtp"
        assert 0 < summary["accepted"] < summary["drafted"] and summary["decodes"] < 24, summary
    no_head = run_cli("generate", "-m", str(tinymoe.fixture("qwen3moe", "Q8_0")), "-p", "Hi", "-n", "2",
                      "--speculative", "mtp")
    assert_clean_error(no_head, "no MTP head", "--speculative ngram")
