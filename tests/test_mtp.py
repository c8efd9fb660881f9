"""Speculative decoding from the model's own MTP head (`--speculative mtp`, docs/speculation.md).

The gate cells (gates.MTP_CASES on the MTP fixtures, gates.mtp_sample()): greedy tokens equal plain
decoding, logits bit for bit equal a resident run that speculates too, and the head's drafts both
accepted and rejected; a head that disagrees makes the draft policy back off; a model without a head
is refused (mtp) or falls back to prompt lookup (auto). step35's chained heads: head i drafts step i,
each head's layer streamed. gemma4: a separate assistant model (`--draft-model`) over the target's KV
cache, checked against the model before it loads; serve speculates with both kinds and answers as
plain decoding does.
"""

from __future__ import annotations

import csv
import functools
import itertools
import mmap
import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bmoe_edge.engine import Engine, Generation
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import mtp_rows, tinymoe
from bmoe_edge.synthetic.draft_model import draft_model_of
from bmoe_edge.synthetic.specs import fixture_resolver

from conftest import assert_clean_error, run_cli


@pytest.fixture(scope="module")
def mtp_results() -> list[gates.CellResult]:
    return list(gates.run_gates(gates.mtp_sample(), fixture_resolver(None), steps=gates.QUICK_STEPS * 2))


def test_mtp_gate_cells_pass(mtp_results: list[gates.CellResult]) -> None:
    chained = sum(1 for s in gates.MTP_FIXTURES if s.arch in gates.CHAINED_MTP_ARCHS)
    assert len(mtp_results) == (len(gates.MTP_FIXTURES) - chained) * len(gates.MTP_CASES) + chained + 1
    failed = [gates.format_result(r) for r in mtp_results if not r.passed]
    assert not failed, failed
    hybrid_ngram = mtp_results[-1]  # qwen35moe's recurrent state cut back to the accepted drafts
    assert hybrid_ngram.arch == "qwen35moe" and 0 < hybrid_ngram.accepted < hybrid_ngram.drafted, hybrid_ngram


def test_mtp_drafts_accepted_and_rejected(mtp_results: list[gates.CellResult]) -> None:
    by_head: dict[str, tuple[int, int]] = {}
    for r in mtp_results:
        drafted, accepted = by_head.get(r.arch, (0, 0))
        by_head[r.arch] = (drafted + r.drafted, accepted + r.accepted)
    for arch in dict.fromkeys(s.arch for s in gates.MTP_FIXTURES):
        agree, noisy, rand = (by_head[f"{arch}+mtp-{h}"] for h in ("agree", "noisy", "random"))
        assert agree[1] >= 0.9 * agree[0] > 0  # the head that agrees with the model: nearly all accepted
        assert 0 < noisy[1] < noisy[0]  # accepted and rejected
        assert rand[1] < 0.2 * max(rand[0], 1)


def test_chained_heads_draft_one_step_each_through_their_own_layers(tmp_path) -> None:
    # step35's three heads: draft step i runs head i (layer 4 + i) over the draft prefix, so a step
    # drafts at most 3 tokens whatever --draft-max says, and every head's experts are routed (streamed).
    model = mtp_rows.mtp_fixture("step35", "Q8_0", head="agree")
    trace = tmp_path / "route.csv"
    plain, _ = _run(model, stream=False, speculative="off")
    gen, info = _run(model, stream=True, speculative="mtp", draft_max=8, route_trace=str(trace))
    assert gen.tokens == plain.tokens and info["speculative"] == "mtp"
    drafted = [m.drafted for m in gen.metrics if m.drafted]
    assert max(drafted) == 3 and sum(m.accepted for m in gen.metrics) >= 0.9 * sum(drafted)
    with open(trace) as f:
        layers = {int(row["layer"]) for row in csv.DictReader(f)}
    assert {4, 5, 6} <= layers
    _, info = _run(model, steps=2, stream=True, speculative="auto")  # chained heads did not pay (findings)
    assert info["speculative"] == "ngram"


def test_a_corrupted_read_of_a_chained_heads_experts_fails_the_cell() -> None:
    # Serial, one lane: read #400 is one of the second head's experts (blk.5), read while it drafts
    # the second token of a step; the model's tokens and logits stay, the drafts change. (Not the heads'
    # reads of a catch-up batch: those read a layer's missing experts in merged jobs, and the middle of
    # such a job can be experts only earlier positions route to, whose outputs no draft reads.)
    import gguf

    spec = gates.FixtureSpec("step35", "Q8_0", mtp="noisy")
    model = fixture_resolver(None)(spec)
    config = replace(gates.BASE, stream=True, speculative="mtp", io_threads=1, fault="fail:400")
    with Engine(model, config) as e, pytest.raises(BmoeError, match="injected fault") as failed:
        e.run(gates.PROMPTS[0], 24)
    offset = int(re.search(r"at offset (\d+)", str(failed.value)).group(1))
    tensor = next(t.name for t in gguf.GGUFReader(str(model)).tensors
                  if t.data_offset <= offset < t.data_offset + t.n_bytes)
    assert tensor.startswith("blk.5.ffn_") and "_exps" in tensor, tensor
    _assert_a_corrupted_read_fails_on_the_drafts(spec, 400)


def _run(model, steps: int = 48, **settings):
    with Engine(model, replace(gates.BASE, **settings)) as engine:
        return engine.run(gates.PROMPTS[0], steps), dict(engine.run_info)


def test_mtp_backs_off_when_the_head_disagrees() -> None:
    model = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="random")
    plain, _ = _run(model, stream=False, speculative="off")
    gen, info = _run(model, stream=True, speculative="mtp")
    assert gen.tokens == plain.tokens
    assert info["speculative"] == "mtp"
    # A head's drafts are probes until it agrees once: checked against the step's own token, one token
    # decoded (no reads for the draft's), never verified in a batch. Rejected outright twice in a row:
    # drafting pauses 4, 8, 16 ... decodes, so over 48 tokens only a handful of steps probe at all.
    assert sum(m.drafted for m in gen.metrics) == 0
    probes = [m for m in gen.metrics if m.probed]
    assert 3 <= len(probes) <= 5 and all(m.n_tokens == 1 for m in probes), probes


def _routed(trace: Path) -> list[dict[tuple[int, int], int]]:
    """Per generation of a route trace (its steps start at 0 again): positions routed per (step, layer)."""
    generations: list[dict[tuple[int, int], int]] = []
    last = -1
    with open(trace) as f:
        for row in csv.DictReader(f):
            step = int(row["step"])
            if step < last or not generations:
                generations.append({})
            last = step
            key = (step, int(row["layer"]))
            generations[-1][key] = generations[-1].get(key, 0) + 1
    return generations


def test_a_head_that_has_not_agreed_costs_a_prompt_nothing_and_a_probe_one_token(tmp_path) -> None:
    # Until a head first agrees, the target gives hidden states only where logits are asked for: the
    # prompt's last layer computes its last token alone (as without a head), and a probe is one head
    # decode from the target's latest state, nothing fed. A head that has agreed is given every state:
    # the next prompt's last layer computes all its tokens, and the head is fed them.
    for head, agreed in (("random", False), ("agree", True)):
        model = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head=head)
        trace = tmp_path / f"route-{head}.csv"
        with Engine(model, replace(gates.BASE, stream=True, speculative="mtp", route_trace=str(trace))) as engine:
            gens = [engine.run(prompt, 24) for prompt in gates.PROMPTS[:2]]
        routed = _routed(trace)
        assert len(routed) == 2
        head_layer = max(layer for _, layer in routed[0])
        first_moe = min(layer for _, layer in routed[0])
        for i, (gen, steps) in enumerate(zip(gens, routed, strict=True)):
            prompt_tokens = steps[(0, first_moe)]
            assert prompt_tokens > 4
            whole = agreed and i == 1
            assert steps[(0, head_layer - 1)] == (prompt_tokens if whole else 1), (head, i)
            if not whole:  # no feeds: a probe is its one token (a random head's: nothing else reads the layer)
                head_rows = {step: n for (step, layer), n in steps.items() if layer == head_layer}
                probed = [m.step for m in gen.metrics if m.probed]
                assert probed and head_rows[probed[0]] == 1, (head, head_rows)
                if not agreed:
                    assert head_rows == {step: 1 for step in probed}, (head_rows, probed)
            else:
                assert steps[(1, head_layer)] >= prompt_tokens  # the prompt fed to the head with its drafts
    assert sum(m.accepted for m in gens[1].metrics) > 0


def test_mtp_saves_decodes_when_the_head_agrees() -> None:
    model = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="agree")
    gen, info = _run(model, stream=True, speculative="auto", cache_mb=0)
    assert info["speculative"] == "mtp"
    decodes = sum(1 for m in gen.metrics if m.n_tokens)
    assert decodes * 3 <= len(gen.tokens)  # at least 3 tokens per decode
    assert not info["warning"]


@pytest.mark.parametrize("arch", ["glm4moe", "step35"])
def test_a_prompt_longer_than_a_batch_speculates_and_answers_as_plain_decoding(arch: str) -> None:
    """A prompt decoded in several calls (here 64 tokens a call): only its last call asks for logits, so only
    that one has a hidden state for the head (masked). The calls before it once failed the generation ("the
    target context gave no hidden state")."""
    model = mtp_rows.mtp_fixture(arch, "Q8_0", head="agree")
    prompt = gates.LONG_PROMPTS[0]
    with Engine(model, replace(gates.BASE, stream=False, speculative="off")) as engine:
        plain = engine.run(prompt, 24)
    with Engine(model, replace(gates.BASE, stream=True, overlap=True, speculative="mtp")) as engine:
        assert len(engine.tokenize(prompt)) > 2 * gates.BASE.batch
        gen = engine.run(prompt, 24)
    assert gen.tokens == plain.tokens
    assert sum(m.accepted for m in gen.metrics) > 0   # the head drafted from the prompt's last state


def test_without_a_head_mtp_is_refused_and_auto_is_ngram() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    with pytest.raises(BmoeError, match="no MTP head"):
        _run(model, stream=False, speculative="mtp")
    _, info = _run(model, steps=2, stream=True, speculative="auto")
    assert info["speculative"] == "ngram"


def test_an_unused_head_is_not_reported_as_unstreamed() -> None:
    model = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="agree")
    _, info = _run(model, steps=2, stream=True, speculative="off")
    assert info["speculative"] == "off"
    assert "not streamed" not in info["warning"]


def test_a_corrupted_read_of_the_heads_experts_fails_the_cell_on_its_drafts() -> None:
    # Serial, one lane: the 75th read is one of the head's (layer 4) in a draft. The model's tokens and
    # logits do not depend on the head, its drafts do: the cell compares them with the resident run's.
    spec = gates.FixtureSpec("glm4moe", "Q8_0", mtp="noisy")
    _assert_a_corrupted_read_fails_on_the_drafts(spec, 75)


def _assert_a_corrupted_read_fails_on_the_drafts(spec: gates.FixtureSpec, read: int) -> None:
    """The serial MTP cell with the `read`-th slice read corrupted: tokens and logits equal (the model's do
    not depend on its heads), the cell failed on the drafts (the heads' do)."""
    good = gates.MTP_CASES["speculative-mtp-serial"]
    bad = replace(good, name="speculative-mtp-corrupt", overrides={**good.overrides, "io_threads": 1,
                                                                   "fault": f"corrupt:{read}"})
    (result,) = gates.run_gates([gates.GateCell(spec, bad)], fixture_resolver(None), steps=24)
    assert result.equal_tokens and result.equal_logits, result
    assert not result.passed and "drafts differ" in result.error, result


def test_a_recurrent_model_without_snapshots_refuses_speculation_and_auto_is_off() -> None:
    model = tinymoe.fixture("qwen3next", "Q8_0")  # llama.cpp keeps no rollback snapshots for it
    with pytest.raises(BmoeError, match="cannot roll back"):
        _run(model, steps=2, stream=False, speculative="ngram")
    _, info = _run(model, steps=2, stream=False, speculative="auto")
    assert info["speculative"] == "off"
    qwen35moe = tinymoe.fixture("qwen35moe", "Q8_0")  # snapshots, one per draft: ngram works there
    _, info = _run(qwen35moe, steps=2, stream=False, speculative="ngram")
    assert info["speculative"] == "ngram"
    _, info = _run(qwen35moe, steps=2, stream=False, speculative="auto")
    assert info["speculative"] == "off"  # but auto: no head, and the snapshots are not worth it


def _generate(engine: Engine, prompt: list[int], steps: int, reuse_kv: bool = False):
    gen = Generation(prompt)
    for _ in engine.generate(prompt, steps, result=gen, reuse_kv=reuse_kv):
        pass
    return gen


@pytest.mark.parametrize("arch", ["glm4moe", "gemma4"])
def test_the_head_follows_a_reused_context_and_a_loaded_state(tmp_path, arch: str) -> None:
    model = mtp_rows.mtp_fixture(arch, "Q8_0", head="noisy")
    draft = str(draft_model_of(model)) if arch == "gemma4" else ""
    with Engine(model, replace(gates.BASE, stream=False, speculative="off")) as plain_engine:
        first = plain_engine.run(gates.PROMPTS[0], 12)
        longer = first.prompt_tokens + first.tokens + plain_engine.tokenize(" and then", add_special=False)
        want = plain_engine.run(longer, 16).tokens
    settings = {"stream": True, "speculative": "mtp", "draft_model": draft, "cache_mb": 0.5}
    with Engine(model, replace(gates.BASE, **settings)) as engine:
        assert engine.run(gates.PROMPTS[0], 12).tokens == first.tokens
        again = _generate(engine, longer, 16, reuse_kv=True)  # the context's prefix kept, the head's too
        assert again.reused_tokens > 0 and again.tokens == want
        assert sum(m.drafted for m in again.metrics) > 0
        state = tmp_path / "state.bin"
        _generate(engine, longer, 1)
        engine.save_state(state)
        engine.reset()
        engine.load_state(state)  # the head's context starts again after the loaded positions
        loaded = _generate(engine, longer, 16, reuse_kv=True)
        assert loaded.reused_tokens > 0 and loaded.tokens == want


def test_a_head_given_up_on_gives_its_cache_share_back() -> None:
    # The random head: 7 outright rejections in a row (pauses 4 ... 64 between them), then no more
    # drafts, and its layer's share of the cache goes to the trunk: from there on every token reads
    # exactly what it reads without speculation.
    model = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="random")
    expert_mb = 0.2  # MiB, of 0.4 MiB of experts: evictions in every layer
    runs = {}
    for spec in ("off", "mtp"):
        gen, _ = _run(model, steps=220, stream=True, cache_mb=expert_mb, speculative=spec)
        runs[spec] = gen
    tail = {spec: [(m.bytes_read, m.cache_hits) for m in gen.metrics[-60:]] for spec, gen in runs.items()}
    assert sum(m.drafted for m in runs["mtp"].metrics) <= 10
    assert runs["mtp"].tokens == runs["off"].tokens
    assert tail["mtp"] == tail["off"]


def test_a_failed_read_of_the_heads_experts_stops_the_generation_and_the_next_one_is_whole() -> None:
    model = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="noisy")
    plain, _ = _run(model, steps=24, stream=False, speculative="off")
    config = replace(gates.BASE, stream=True, speculative="mtp", io_threads=1, fault="fail:55")  # a head read (blk.4)
    with Engine(model, config) as engine:
        with pytest.raises(BmoeError, match="injected fault"):
            engine.run(gates.PROMPTS[0], 24)
        again = engine.run(gates.PROMPTS[0], 24)  # the head's context started afresh
    assert again.tokens == plain.tokens
    assert sum(m.drafted for m in again.metrics) > 0


def _assistant(head: str = "noisy") -> tuple[Path, str]:
    model = mtp_rows.mtp_fixture("gemma4", "Q8_0", head=head)
    return model, str(draft_model_of(model))


def test_a_draft_model_is_checked_against_the_model_before_it_runs(tmp_path) -> None:
    from bmoe_edge.synthetic import assistant_rows

    model, assistant = _assistant()
    glm = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="agree")
    wider, _ = assistant_rows.write_target_and_assistant(tmp_path / "wide.gguf", "gemma4", "Q8_0", n_embd=96)
    cut = tmp_path / "cut-assistant.gguf"
    cut.write_bytes(Path(assistant).read_bytes()[: 3 * 2**20])
    refused = {
        "drafts with --speculative mtp or auto, not off": (model, {"speculative": "off", "draft_model": assistant}),
        "not ngram": (model, {"speculative": "ngram", "draft_model": assistant}),
        "a 'glm4moe' model takes no separate draft model": (glm, {"speculative": "mtp", "draft_model": assistant}),
        "a 'glm4moe' model is not a draft model for this 'gemma4'": (model, {"speculative": "mtp",
                                                                           "draft_model": str(glm)}),
        "takes hidden states 96 wide, the model's are 64": (model, {"speculative": "auto",
                                                                    "draft_model": str(draft_model_of(wider))}),
        "cut-assistant.gguf": (model, {"speculative": "mtp", "draft_model": str(cut)}),
        "missing.gguf": (model, {"speculative": "mtp", "draft_model": str(tmp_path / "missing.gguf")}),
        "no MTP head .* or give its --draft-model": (model, {"speculative": "mtp"}),
        "is a draft model: it decodes over a 'gemma4' model's KV cache": (Path(assistant), {}),
    }
    for why, (target, settings) in refused.items():
        for stream in (False, True):
            with pytest.raises(BmoeError, match=why):
                _run(target, steps=2, stream=stream, **settings)
    _, info = _run(model, steps=2, stream=True, speculative="auto")  # no draft model given: prompt lookup
    assert info["speculative"] == "ngram"


def test_the_assistant_saves_decodes_when_it_agrees_and_backs_off_when_it_does_not() -> None:
    model, assistant = _assistant("agree")
    plain, _ = _run(model, stream=False, speculative="off")
    gen, info = _run(model, stream=True, speculative="auto", draft_model=assistant, cache_mb=0)
    assert info["speculative"] == "mtp" and gen.tokens == plain.tokens
    assert sum(1 for m in gen.metrics if m.n_tokens) * 3 <= len(gen.tokens)  # at least 3 tokens per decode
    model, assistant = _assistant("random")
    plain, _ = _run(model, stream=False, speculative="off")
    gen, _ = _run(model, stream=True, speculative="mtp", draft_model=assistant)
    assert gen.tokens == plain.tokens  # probed (one token each), never verified in a batch
    assert sum(m.drafted for m in gen.metrics) == 0 and 0 < sum(m.probed for m in gen.metrics) <= 8


def _session_turns(model: Path, **settings) -> tuple[list[str], int]:
    """Two greedy turns of one chat session (the context kept between them), and the drafts accepted."""
    from bmoe_edge.engine import Sampling, chat

    with Engine(model, replace(gates.BASE, ctx=1024, **settings)) as engine:
        session = chat.Session(engine, system="You are terse.", sampling=Sampling(temp=0.0), max_tokens=24)
        answers, accepted = [], 0
        for text in ("Tell me about the sea", "And the mountains"):
            for _ in session.send(text):
                pass
            answers.append(session.last.content)
            accepted += sum(m.accepted for m in session.last.metrics)
    return answers, accepted


@pytest.mark.parametrize("arch", ["glm4moe", "gemma4"])
def test_a_chat_session_speculates_and_answers_as_plain_decoding(arch: str) -> None:
    model = mtp_rows.mtp_fixture(arch, "Q8_0", head="agree")
    draft = str(draft_model_of(model)) if arch == "gemma4" else ""
    plain, _ = _session_turns(model, stream=False)
    answers, accepted = _session_turns(model, stream=True, speculative="auto", draft_model=draft)
    assert answers == plain and accepted > 24


def test_serve_speculates_with_the_models_drafts_and_answers_as_plain_decoding() -> None:
    from test_serve import KEY, start, stop

    gemma, assistant = _assistant("agree")
    messages = [{"role": "user", "content": "Tell me a story about a fox"}]
    for model, flags in ((mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="agree"), ["--speculative", "mtp"]),
                         (gemma, ["--speculative", "auto", "--draft-model", assistant])):
        seen = {}
        for name, extra in (("plain", []), ("speculative", flags)):
            server = start(model, "--ctx", "512", "--api-key", KEY, *extra)
            try:
                client = server.client(KEY)
                ask = {"model": server.model_id, "messages": messages, "max_tokens": 32, "temperature": 0}
                whole = client.chat.completions.create(**ask).choices[0].message.content
                streamed = "".join(c.choices[0].delta.content or "" for c in
                                   client.chat.completions.create(**ask, stream=True) if c.choices)
                sampled = client.completions.create(model=server.model_id, prompt="Once upon a time", max_tokens=16,
                                                    temperature=0.9, seed=7).choices[0].text
                seen[name] = (whole, streamed, sampled, server.metrics())
            finally:
                stop(server)
        (*plain, plain_metrics), (*spec, spec_metrics) = seen["plain"], seen["speculative"]
        assert spec == plain and spec[0] == spec[1] != "", (model, spec, plain)
        assert plain_metrics["bmoe_draft_tokens_total"] == 0
        # Greedy requests draft (two 32-token answers, nearly all accepted); the sampled one does not.
        assert spec_metrics["bmoe_draft_tokens_accepted_total"] >= 40, spec_metrics
    # A draft model follows one sequence: beside --parallel's slots it is refused at start, in one line.
    assert_clean_error(run_cli("serve", "-m", str(gemma), "--port", "0", "--api-key", KEY, "--parallel", "2",
                               "--speculative", "mtp", "--draft-model", str(assistant)),
                       "--parallel 2 requests draft by prompt lookup")


def test_a_sleeping_draft_model_gives_its_memory_back_and_its_drafts_are_unchanged() -> None:
    # The random assistant: its 4 probes rejected (decodes 1, 2, 7, 16), the policy gives up and its pages
    # are dropped, so the cache can take their memory; the next generation wakes it (its pages come back
    # from the file). Its context stays: a new one would reset the target's KV cells. The drafts are the
    # resident run's, the tokens plain decoding's, also for a generation over a kept prefix (its logits
    # too: the fixture is a bigram chain, tokens alone would not show a wiped cache) after it slept.
    model, assistant = _assistant("random")
    size = Path(assistant).stat().st_size
    with Engine(model, replace(gates.BASE, stream=False, speculative="off")) as plain_engine:
        plain = plain_engine.run(gates.PROMPTS[0], 220)
        longer = plain.prompt_tokens + plain.tokens[:40]
        plain_longer = plain_engine.run(longer, 24, logits=True)
    with Engine(model, replace(gates.BASE, stream=False, speculative="mtp", draft_model=assistant)) as resident:
        drafts = [(m.drafted, m.accepted, m.probed) for m in resident.run(gates.PROMPTS[0], 220).metrics]
    with Engine(model, replace(gates.BASE, stream=True, cache_mb=0.3, speculative="mtp",
                               draft_model=assistant)) as engine:
        for again in (False, True):
            gen = engine.run(gates.PROMPTS[0], 220)
            assert gen.tokens == plain.tokens and [(m.drafted, m.accepted, m.probed) for m in gen.metrics] == drafts
            probes = [i for i, m in enumerate(gen.metrics) if m.drafted or m.probed]
            assert probes == [1, 2, 7, 16], (again, probes)
            rss = [m.rss_bytes for m in gen.metrics]  # (read every few steps, not at each)
            awake = max(rss[probes[0]:probes[3]])
            assert awake - min(rss[probes[3] + 4:]) >= 0.8 * size  # given up: asleep
            assert rss[-1] - min(rss[probes[3] + 4:]) < 0.5 * size  # ... to the end
            if not again:
                kept = Generation(longer)
                for _ in engine.generate(longer, 24, result=kept, reuse_kv=True, logits=True):
                    pass
                assert kept.reused_tokens > 0 and kept.tokens == plain_longer.tokens
                worst = max(float(np.max(np.abs(np.frombuffer(a, np.float32) - np.frombuffer(b, np.float32))))
                            for a, b in zip(kept.logits, plain_longer.logits, strict=True))
                assert worst < 1e-3, worst
                assert sum(m.probed for m in kept.metrics) > 0  # awake again


@functools.cache
def _head_pages(model: Path) -> frozenset[int]:
    """The file's pages (by index) over the MTP head's dense tensors: its layer's (the file's last block),
    experts aside, whole pages inside the layer's span of the file (what a sleeping head drops)."""
    import gguf

    reader = gguf.GGUFReader(str(model))
    layer = max(int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk."))
    head = [t for t in reader.tensors if t.name.startswith(f"blk.{layer}.")]
    span = (min(t.data_offset for t in head), max(t.data_offset + t.n_bytes for t in head))
    page = mmap.PAGESIZE
    return frozenset(p for t in head if "_exps" not in t.name
                     for p in range(t.data_offset // page, (t.data_offset + t.n_bytes - 1) // page + 1)
                     if p * page >= span[0] and (p + 1) * page <= span[1])


def _head_pages_mapped(model: Path) -> int:
    """Of _head_pages, those mapped into this process (/proc/self/pagemap's present bit, in any mapping of
    `model`): the memory a sleeping head gives back. Not the page cache's (mincore): with buffered reads
    (pread) the kernel's read-ahead of a neighbouring tensor can bring such a page into the cache again,
    unmapped and reclaimable."""
    pages = _head_pages(model)
    page = mmap.PAGESIZE
    inode, mapped = os.stat(model).st_ino, 0
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or int(fields[4]) != inode:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            offset = int(fields[2], 16)
            for p in pages:
                address = start + p * page - offset
                if start <= address < end:
                    pagemap.seek(address // page * 8)
                    mapped += int.from_bytes(pagemap.read(8), "little") >> 63
    return mapped


def _resident_after_each_token(engine: Engine, model: Path, steps: int) -> tuple[Generation, list[int]]:
    gen, resident = Generation(gates.PROMPTS[0]), []
    for _ in engine.generate(gates.PROMPTS[0], steps, result=gen):
        resident.append(_head_pages_mapped(model))
    return gen, resident


def test_an_mtp_heads_dense_weights_sleep_through_long_pauses_and_once_it_gave_up() -> None:
    # An in-file head's dense tensors are pages of the model's mapping that only its drafts read: dropped
    # (and out of the page cache) through a pause of 16 decodes and more and once the policy gave up, as
    # a draft model's are, and back for the probe that ends a pause and for the next greedy generation;
    # its draft context is freed meanwhile and made again (the tokens are plain decoding's throughout).
    # The noisy head meets a 16-decode pause; the random one gives up after its first 4 probes.
    for head in ("noisy", "random"):
        model = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head=head)
        plain, _ = _run(model, steps=120, stream=False, speculative="off")
        with Engine(model, replace(gates.BASE, stream=True, cache_mb=0.3, speculative="mtp")) as engine:
            gen, resident = _resident_after_each_token(engine, model, 120)
            assert gen.tokens == plain.tokens[:120]
            assert resident[0] > 0  # the warm-up read them
            drafts = [i for i, m in enumerate(gen.metrics) if m.drafted or m.probed]
            if head == "random":
                assert drafts == [1, 2, 7, 16] and max(resident[16:]) == 0, (drafts, resident)
                again, resident = _resident_after_each_token(engine, model, 8)
                assert again.metrics[1].probed and resident[1] > 0  # woken for the next generation's probe
                assert again.tokens == plain.tokens[:8]  # (its context freed asleep, made again awake)
                continue
            pauses = [(i, j) for i, j in itertools.pairwise(drafts) if j - i > 16]
            assert pauses, drafts
            for i, j in pauses:  # (woken a decode ahead: the step before the probe's reads them ahead)
                assert max(resident[i:j - 1]) == 0 and resident[j] > 0, (i, j, resident[i - 1:j + 1])
