"""Long prompts: a prompt's compute buffers go back to the expert cache once it is in, the prompt's telemetry
(prompt tok/s, prefill bytes against the distinct experts routed, the time to the first token), and the
prompt cache (`generate --prompt-cache FILE`, `serve` keeping long prompts, `--prompt-cache DIR` across a
restart, another model's cache refused with one line)."""

from __future__ import annotations

import json
import time
from itertools import pairwise
from pathlib import Path

import pytest

from bmoe_edge.engine import report
from bmoe_edge.engine.prompt_cache import PromptCache
from bmoe_edge.engine.session import Engine
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic import tinymoe

from conftest import assert_clean_error, run_cli
from test_serve import start, stop

# ~600 tokens on the fixtures' vocabulary: longer than the prompt cache's 256-token minimum
LONG = " ".join(f"Line {i}: the fox, the dog and the sailor met by the sea." for i in range(30))


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_a_long_prompt_gives_its_compute_buffers_back_and_its_tokens_equal_resident(model: Path) -> None:
    """The prompt's ubatch of 512 writes compute buffers no decode after it touches again: they are given back
    (the budget taking them is measured under a cap on the 3 GB presets: bench-data/2026-12-01/long-prompt),
    and the tokens and logits are those of a resident run."""
    config = StreamConfig(threads=1, ctx=1024, batch=512, ubatch=512)
    with Engine(model, config) as streamed, Engine(model, StreamConfig(stream=False, threads=1, ctx=1024, batch=512,
                                                                       ubatch=512)) as resident:
        a = streamed.run(LONG, 8, logits=True)
        b = resident.run(LONG, 8, logits=True)
    assert a.tokens == b.tokens and a.logits == b.logits
    first = a.metrics[0]
    assert first.n_tokens == len(a.prompt_tokens) > 512  # two ubatches
    assert first.released_bytes > 0
    assert first.routed_bytes > 0 and first.bytes_read <= 1.1 * first.routed_bytes  # nothing read twice here
    s = report.summary(a, {})
    assert s["prompt_decoded_tokens"] == first.n_tokens and s["prompt_tok_s"] > 0
    assert s["prefill_bytes"] == first.bytes_read and s["ttft_ms"] >= s["prompt_ms"] > 0


def test_the_pool_warmed_between_requests_changes_no_token_and_the_prompt_adds_no_page(model: Path) -> None:
    """serve's idle steps fault the pool's pages in up to the cache's budget, a bounded piece at a time, so a
    prompt does not wait for the kernel to zero them on the eval thread (docs/memory.md; the first touch of
    a VM's fresh memory ran at 420 MB/s: bench-data/2026-12-02/ttft-warm). The tokens and logits are a
    cold engine's, and the warmed prompt's reads land in pages the pool already held."""
    config = StreamConfig(threads=1, ctx=1024, batch=512, ubatch=512, cache_mb=4)
    with Engine(model, config) as warmed, Engine(model, config) as cold:
        left = [warmed.warm_cache_memory(256 << 10)]
        while left[-1]:
            left.append(warmed.warm_cache_memory(256 << 10))
        assert len(left) > 2 and all(a - b <= 256 << 10 for a, b in pairwise(left))   # bounded steps
        assert warmed.warm_cache_memory() == 0                                               # warm stays warm
        a = warmed.run(LONG, 8, logits=True)
        b = cold.run(LONG, 8, logits=True)
    assert a.tokens == b.tokens and a.logits == b.logits
    budget = 4 << 20
    assert a.metrics[0].pool_bytes <= budget + (2 << 20) and b.metrics[0].pool_bytes <= budget + (2 << 20)


def test_generate_with_a_prompt_cache_file_restores_the_prompt_and_refuses_another_model_s(model: Path,
                                                                                          tmp_path: Path) -> None:
    cache = tmp_path / "prompt.state"
    runs = []
    for _ in range(2):
        result = run_cli("generate", "-m", str(model), "-p", LONG + " and then", "-n", "6", "-t", "1", "--json",
                         "--prompt-cache", str(cache))
        assert result.returncode == 0, result.stderr
        records = json_lines(result.stdout)
        runs.append(([r["id"] for r in records if r["type"] == "token"], records[-1]))
    (first, s1), (second, s2) = runs
    assert first == second
    assert s1["prompt_reused_tokens"] == 0 and s2["prompt_reused_tokens"] == s2["prompt_tokens"] - 1
    assert s2["prompt_ms"] < s1["prompt_ms"]
    # (the first run found the file empty: its tokens are a plain run's.) Other settings that change the
    # keys and values are another identity, refused like another model's (serve's test below):
    lossy = run_cli("generate", "-m", str(model), "-p", LONG, "-n", "2", "--prompt-cache", str(cache),
                    "--n-expert-used", "1")
    assert_clean_error(lossy, "another model or other settings")


def test_serve_restores_a_long_system_prompt_for_a_new_conversation_and_after_a_restart(model: Path,
                                                                                       tmp_path: Path) -> None:
    cache = tmp_path / "prompts"
    system_a = {"role": "system", "content": LONG}
    system_b = {"role": "system", "content": LONG.replace("fox", "cat")}

    def ask(server, system: dict, question: str) -> int:
        reply = server.client().chat.completions.create(
            model=server.model_id, max_tokens=4, temperature=0,
            messages=[system, {"role": "user", "content": question}])
        return reply.usage.prompt_tokens_details.cached_tokens

    server = start(model, "--no-auth", "--prompt-cache", str(cache))
    try:
        assert ask(server, system_a, "What did the fox do?") == 0
        assert ask(server, system_b, "And the cat?") < 256  # another system prompt: only the template's start
        # The context holds b's prompt: a's comes back from the prompt cache.
        assert ask(server, system_a, "Where did they meet?") > 256
        metrics = server.metrics()
        assert metrics["bmoe_time_to_first_token_seconds"] > 0 and metrics["bmoe_prompt_seconds_total"] > 0
        assert "bmoe_prefill_bytes_read_total" in metrics and metrics["bmoe_prompt_tokens_per_second"] > 0
        deadline = time.monotonic() + 60   # idle again: the engine faults the pool's pages in for the next prompt
        while server.metrics()["bmoe_expert_pool_to_warm_bytes"] > 0:
            assert time.monotonic() < deadline, "the idle server did not warm its expert pool"
            time.sleep(0.2)
    finally:
        stop(server)
    assert len(list(cache.glob("*.state"))) == 2
    again = start(model, "--no-auth", "--prompt-cache", str(cache))
    try:
        assert ask(again, system_b, "Who met?") > 256  # from the directory, before anything was decoded
    finally:
        stop(again)
    other = tinymoe.fixture("olmoe", "Q8_0")
    assert_clean_error(run_cli("serve", "-m", str(other), "--port", "0", "--prompt-cache", str(cache)),
                       "another model or other settings")


@pytest.mark.parametrize("record", ['{"format": "bmoe-prompt-cache/1", "identity": "me", "tokens": "x", "digest": 1}',
                                    '{"format": "bmoe-prompt-cache/1", "identity": "me"}', "[1]", "{", None])
def test_a_damaged_or_missing_record_is_one_clear_refusal(tmp_path: Path, record: str | None) -> None:
    (tmp_path / "a.state").write_bytes(b"not a state")
    if record is not None:
        (tmp_path / "a.state.json").write_text(record)
    with pytest.raises(BmoeError, match=r"--prompt-cache .*(damaged|not a|no prompt-cache record)"):
        PromptCache(tmp_path, "me")
