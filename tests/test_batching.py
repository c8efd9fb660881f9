"""--parallel: several sequences in one context, one batched decode a step (engine/batching.py, serve)."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace

import pytest

from bmoe_edge.engine import Engine
from bmoe_edge.engine.batching import generate_together
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof.batch_gate import BATCH_PROMPTS, check_batch, format_result
from bmoe_edge.proof.gates import BASE
from bmoe_edge.synthetic import mtp_rows, tinymoe

from test_serve import KEY, Server, long_stream, start, stop


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize(("arch", "quant"), [("qwen3moe", "Q8_0"), ("qwen2moe", "Q4_K_M")])
def test_a_batch_streamed_equals_resident_and_each_sequence_its_tokens_alone(arch: str, quant: str, n: int) -> None:
    result = check_batch(tinymoe.fixture(arch, quant), f"{arch}-{quant}", n)
    assert result.passed, format_result(result)
    assert 0 < result.union_bytes < result.summed_bytes  # the batch's experts read once for all of them


def test_a_slot_freed_mid_batch_takes_a_new_prompt_and_the_others_go_on() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    with Engine(model, BASE) as alone:
        prompts = [alone.tokenize(p) for p in BATCH_PROMPTS[:3]]
        want = [alone.run(p, 8).tokens for p in prompts]
    with Engine(model, replace(BASE, parallel=2, prefill_chunk=4)) as engine:
        first = generate_together(engine, prompts[:2], 3)   # both stopped after 3 tokens, KV kept
        engine.slot_stop(0, forget=True)
        # slot 0 takes a new prompt while slot 1 continues its conversation (its prefix reused)
        again = generate_together(engine, [prompts[2], prompts[1] + first[1].tokens], 5, reuse_kv=True)
        assert again[1].reused_tokens == len(prompts[1]) + 2  # all but the last token it held
        assert again[0].tokens == want[2][:5]
        assert first[1].tokens + again[1].tokens == want[1]
        # the single-sequence path of a --parallel engine is the plain one
        assert engine.run(prompts[0], 8).tokens == want[0]
        with pytest.raises(Exception, match="slot 2 does not exist"):
            engine.slot_begin(2, prompts[0])


def _echoing_prompt(engine: Engine) -> list[int]:
    """A prompt that repeats the model's own continuation: prompt lookup finds its drafts there."""
    seed = engine.run("Once upon a time", 24).text
    return engine.tokenize(f"Once upon a time{seed} Once upon a time")


def test_parallel_slots_draft_by_prompt_lookup_and_keep_the_tokens_they_get_alone() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    with Engine(model, BASE) as alone:
        prompts = [_echoing_prompt(alone), alone.tokenize(BATCH_PROMPTS[0]), _echoing_prompt(alone)[:-3]]
        want = [alone.run(p, 24).tokens for p in prompts]
    config = replace(BASE, parallel=3, prefill_chunk=8, speculative="ngram", draft_max=6)
    with Engine(model, config) as engine:
        assert engine.run_info["speculative"] == "ngram"
        got = generate_together(engine, prompts, 24)
        assert [g.tokens for g in got] == want
        echoed = got[0].metrics
        # the echoing slots' drafts were verified in the shared batches and taken: fewer decodes than tokens
        assert sum(m.accepted for m in echoed) >= 8 and sum(m.drafted for m in echoed) >= 8
        assert sum(1 for m in echoed if m.n_tokens > 0) < len(got[0].tokens) - 4
        # a lone generation on the same engine drafts the same way (one step, one slot)
        lone = engine.run(prompts[0], 24)
        assert lone.tokens == want[0] and sum(m.accepted for m in lone.metrics) >= 8


def test_parallel_refuses_what_follows_one_sequence_in_one_place() -> None:
    head = mtp_rows.mtp_fixture("glm4moe", "Q8_0", head="agree")
    with pytest.raises(BmoeError, match=r"--parallel 2 requests draft by prompt lookup"):
        Engine(head, replace(BASE, parallel=2, speculative="mtp"))
    with Engine(head, replace(BASE, parallel=2, speculative="auto")) as engine:
        assert engine.run_info["speculative"] == "ngram"   # auto: the head is for a lone generation
        with pytest.raises(BmoeError, match="state files hold one conversation"):
            engine.save_state("/tmp/never-written")


def test_serve_parallel_drafts_and_metrics_count_them() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    with Engine(model, BASE) as alone:
        prompt = alone.detokenize(_echoing_prompt(alone)[1:])   # the server adds the BOS itself
    server = start(model, "--ctx", "512", "--api-key", KEY, "--parallel", "2", "--speculative", "ngram")
    try:
        client = server.client(KEY)
        asked = [threading.Thread(target=client.completions.create,
                                  kwargs={"model": server.model_id, "prompt": prompt, "max_tokens": 24,
                                          "temperature": 0}) for _ in range(2)]
        for t in asked:
            t.start()
        for t in asked:
            t.join()
        m = server.metrics()
        assert m["bmoe_draft_tokens_total"] >= 8 and m["bmoe_draft_tokens_accepted_total"] >= 8, m
    finally:
        stop(server)


# --- serve --parallel: a real server, OpenAI's own client -----------------------------------------------------

QUESTIONS = ("Tell me about the fox.", "What did the old sailor say?", "Count the lines by the sea.", "Hello")


def _ask(server: Server, question: str, stream: bool, max_tokens: int = 24) -> str:
    client = server.client(KEY)
    messages = [{"role": "user", "content": question}]
    if not stream:
        r = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=max_tokens,
                                           temperature=0)
        return r.choices[0].message.content or ""
    chunks = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _together(server: Server, stream: bool) -> list[str]:
    answers = [""] * len(QUESTIONS)
    start = threading.Barrier(len(QUESTIONS))

    def one(i: int) -> None:
        start.wait()
        answers[i] = _ask(server, QUESTIONS[i], stream)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_four_clients_at_once_each_get_their_answer_alone_streamed_and_not() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    alone_server = start(model, "--ctx", "512", "--api-key", KEY)
    try:
        alone = [_ask(alone_server, q, stream=False) for q in QUESTIONS]
    finally:
        stop(alone_server)
    server = start(model, "--ctx", "512", "--api-key", KEY, "--parallel", "4", "--prefill-chunk", "16")
    try:
        assert all(alone), alone
        assert _together(server, stream=True) == alone
        assert _together(server, stream=False) == alone
        m = server.metrics()
        assert m["bmoe_slots"] == 4 and m["bmoe_batch_sequences_max"] >= 2
        assert 0 < m["bmoe_batch_union_expert_bytes_total"] < m["bmoe_batch_summed_expert_bytes_total"]
        # each batched step's reads once: a request's own counters share its steps with the others
        # (the decodes may read nothing: the tiny model's experts fit the cache once the prompts are in)
        assert 0 <= m["bmoe_batch_decode_bytes_read_total"] < m["bmoe_batch_bytes_read_total"]
        # a client hanging up mid-stream frees its slot at once: the others' slots and the next request go on
        before = server.metrics()
        conn, response = long_stream(server, timeout=60)
        assert response.status == 200
        response.readline()
        conn.close()
        deadline = time.monotonic() + 30
        while (m := server.metrics())["bmoe_requests_cancelled_total"] <= before["bmoe_requests_cancelled_total"]:
            assert time.monotonic() < deadline, "the hung-up request was not cancelled"
            time.sleep(0.05)
        assert m["bmoe_completion_tokens_total"] - before["bmoe_completion_tokens_total"] < 400
        while server.metrics()["bmoe_slots_busy"] != 0:
            assert time.monotonic() < deadline, "the hung-up request's slot stayed busy"
            time.sleep(0.05)
        assert _ask(server, QUESTIONS[0], stream=True) == alone[0]
    finally:
        stop(server)


def _answer(events: queue.Queue) -> list:
    got = [events.get(timeout=60)]
    while got[-1][0] == "delta":
        got.append(events.get(timeout=60))
    return got


def test_parallel_workers_keep_the_guarantees_hostile_jobs_and_a_fatal_error() -> None:
    """--parallel's scheduler as the serial worker: a refused grammar is the request's 400, a job that raises
    its own 500, the engine thread lives on; a fatal error answers the running and queued jobs 503."""
    from bmoe_edge.engine.session import Sampling
    from bmoe_edge.engine.settings import StreamConfig
    from bmoe_edge.serve.worker import Job, Request, Worker

    greedy = Sampling(temp=0.0)
    with Engine(tinymoe.fixture("qwen3moe", "Q8_0"), StreamConfig(ctx=256, threads=1, parallel=2)) as e:
        worker = Worker(e)
        try:
            events: queue.Queue = queue.Queue()
            bad = Request(max_tokens=2, sampling=Sampling(temp=0.0, grammar="root ::= nothing-here"), prompt="Hi")
            worker.submit(Job(bad, events.put))
            kind, (status, message) = events.get(timeout=30)
            assert (kind, status) == ("error", 400) and "grammar" in message
            worker.submit(Job(Request(max_tokens=2, sampling=greedy, prompt="\ud800"), events.put))
            kind, (status, message) = events.get(timeout=30)
            assert (kind, status) == ("error", 500) and "EncodeError" in message
            worker.submit(Job(Request(max_tokens=3, sampling=greedy, prompt="Hi"), events.put))
            got = _answer(events)
            assert got[-1][0] == "done" and got[-1][1].completion_tokens == 3
            assert worker.unavailable() is None and worker.engine_failures == 0
            # a fatal error while two jobs run and one waits: all three answered 503, /health says why
            running: list[queue.Queue] = [queue.Queue() for _ in range(3)]
            for q in running:
                worker.submit(Job(Request(max_tokens=200, sampling=greedy, prompt="Go"), q.put))
            while worker.batch.slots_busy < 2:
                time.sleep(0.01)
            worker.fatal("error: the RPC worker is gone")
            for q in running:
                assert _answer(q)[-1] == ("error", (503, "the server cannot answer: the RPC worker is gone"))
            assert worker.unavailable() == "the RPC worker is gone"
        finally:
            worker.close()


def test_a_client_gone_mid_prompt_frees_its_slot_before_the_prompt_is_in() -> None:
    from bmoe_edge.engine.session import Sampling
    from bmoe_edge.engine.settings import StreamConfig
    from bmoe_edge.serve.worker import Job, Request, Worker

    # a chunk of one token a step: the 400-token prompt takes 400 steps
    config = StreamConfig(ctx=512, threads=1, parallel=2, prefill_chunk=1)
    with Engine(tinymoe.fixture("qwen3moe", "Q8_0"), config) as e:
        worker = Worker(e)
        try:
            events: queue.Queue = queue.Queue()
            job = Job(Request(max_tokens=4, sampling=Sampling(temp=0.0), prompt=" ".join(["sea"] * 400)), events.put)
            worker.submit(job)
            while not e.slot_tokens(0):
                time.sleep(0.001)
            job.cancelled.set()
            assert _answer(events)[-1] == ("error", (499, "the request was cancelled"))
            assert worker.batch.slots_busy == 0 or not worker._running
            assert len(e.slot_tokens(0)) < 300   # stopped between two chunks, not at the prompt's end
            assert worker.stats.cancelled == 1
        finally:
            worker.close()
