"""A request's fault told apart from the engine's (issue 44): what a caller asked for wrong is a RequestError (a
client's 4xx), a failed read stays a plain BmoeError (the engine's); a refused grammar does not flood stderr; and
the long native calls a server makes off its event loop (a schema's conversion, a long text's tokens) let its other
Python threads run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from bmoe_edge.engine import Engine, Sampling, chat
from bmoe_edge.errors import BmoeError, RequestError
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import tinymoe

BASE = replace(gates.BASE, stream=True)
PROMPT = gates.PROMPTS[0]
# Over llama.cpp's grammar parser's repetition threshold (MAX_REPETITION_THRESHOLD, 2,000 in llama-grammar.cpp):
# what common writes for a JSON schema's {"type": "array", "minItems": 5000}.
REFUSED_GRAMMAR = 'root ::= "a"{4999,}'


@pytest.fixture(scope="module")
def qwen3() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


@pytest.fixture(scope="module")
def engine(qwen3: Path) -> Iterator[Engine]:
    with Engine(qwen3, BASE) as e:
        yield e


def first_token(engine: Engine, prompt: str | list[int], sampling: Sampling | None = None) -> None:
    next(iter(engine.generate(prompt, 1, sampling or Sampling(temp=0.0))))


@pytest.mark.parametrize(("prompt", "sampling", "needle"), [
    (PROMPT, Sampling(temp=0.0, grammar=REFUSED_GRAMMAR), "the grammar does not parse"),
    (PROMPT, Sampling(temp=0.0, grammar="root ::= nothing-here"), "the grammar does not parse"),
    (PROMPT, Sampling(temp=0.0, grammar='root ::= "a"', grammar_triggers="(unclosed"), "not regular expressions"),
    (PROMPT, Sampling(temp=0.0, logit_bias="99999:5"), "outside the vocabulary"),
    ([], None, "the prompt is empty"),
    ([1, 99999], None, "outside the vocabulary"),
], ids=["repetition-over-threshold", "undefined-rule", "trigger-regex", "logit-bias", "empty-prompt", "token-id"])
def test_what_a_request_asks_wrong_is_a_request_error_and_the_engine_goes_on(
        engine: Engine, prompt: str | list[int], sampling: Sampling | None, needle: str) -> None:
    with pytest.raises(RequestError, match=needle):
        first_token(engine, prompt, sampling)
    first_token(engine, PROMPT)  # the engine is as it was


def test_a_slots_request_is_checked_before_it_can_fail_the_batch(qwen3: Path) -> None:
    """--parallel: an id outside the vocabulary used to reach step_slots' llama_decode, failing every slot."""
    with Engine(qwen3, replace(BASE, parallel=2)) as engine:
        for prompt, sampling, needle in [([], Sampling(temp=0.0), "the prompt is empty"),
                                         ([1, 99999], Sampling(temp=0.0), "outside the vocabulary"),
                                         ([1, 2], Sampling(temp=0.0, grammar=REFUSED_GRAMMAR), "does not parse")]:
            with pytest.raises(RequestError, match=needle):
                engine.slot_begin(1, prompt, sampling)
            assert not engine._native.slot_active(1)
        engine.slot_begin(0, engine.tokenize(PROMPT), Sampling(temp=0.0))
        assert engine.step_slots().slots[0].produced


def test_what_a_text_to_score_has_wrong_is_a_request_error(engine: Engine) -> None:
    with pytest.raises(RequestError, match="more than the context"):
        engine.score_positions([1] * (BASE.ctx + 1))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.score_positions([1, 2, 99999])
    with pytest.raises(RequestError, match="at least two tokens"):
        engine.score_positions([1])


def test_a_schema_common_cannot_convert_is_a_request_error() -> None:
    with pytest.raises(RequestError, match="cannot be turned into a grammar"):
        chat.schema_grammar({"$ref": "#/nowhere"})


def test_a_failed_read_is_the_engines_fault_not_the_requests(qwen3: Path) -> None:
    with Engine(qwen3, replace(BASE, fault="fail:20")) as engine, \
            pytest.raises(BmoeError, match="injected fault") as failed:
        engine.run(PROMPT, 8)
    assert not isinstance(failed.value, RequestError)


def stderr_after_a_refused_grammar(qwen3: Path, grammar_bytes: int, *, log: bool) -> str:
    """What a process writes to stderr after a marker, while the engine refuses a grammar of about
    `grammar_bytes` (llama.cpp's parser used to print each refused grammar whole)."""
    script = f"""
import sys
from dataclasses import replace
from bmoe_edge.engine import Engine, Sampling
from bmoe_edge.errors import RequestError
from bmoe_edge.proof import gates
with Engine({str(qwen3)!r}, replace(gates.BASE, stream=True)) as engine:
    grammar = 'root ::= "a"{{4999,}}\\n' + ''.join(f'r{{i}} ::= "x"\\n' for i in range({grammar_bytes // 12}))
    assert len(grammar) > {grammar_bytes} * 0.9
    sys.stderr.write("MARK\\n")
    sys.stderr.flush()
    try:
        next(iter(engine.generate(gates.PROMPTS[0], 1, Sampling(temp=0.0, grammar=grammar))))
    except RequestError:
        pass
    sys.stderr.flush()
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "BMOE_LLAMA_LOG": "1" if log else "0"})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stderr.split("MARK\n", 1)[1]


@pytest.mark.parametrize("log", [False, True], ids=["quiet", "BMOE_LLAMA_LOG"])
def test_a_refused_grammar_does_not_flood_stderr(qwen3: Path, log: bool) -> None:
    after = stderr_after_a_refused_grammar(qwen3, 100_000, log=log)
    assert len(after.encode()) < 2_000, after[:400]
    if log:  # asked to log, llama.cpp's message is there: its start, and how much was left out
        assert "error parsing grammar" in after and "bytes more)" in after, after


def longest_stall(work: Callable[[], object]) -> tuple[float, float]:
    """(the call's seconds, the longest the main thread waited for the GIL meanwhile): `work` runs on another
    thread while this one ticks every millisecond."""
    go, done = threading.Event(), threading.Event()
    took: list[float] = []

    def run() -> None:
        go.wait()
        t0 = time.perf_counter()
        work()
        took.append(time.perf_counter() - t0)
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    last = time.perf_counter()
    go.set()  # the work starts once this thread is ticking: a call that keeps the GIL shows as one long tick
    stall = 0.0
    while True:
        time.sleep(0.001)
        now = time.perf_counter()
        stall, last = max(stall, now - last), now
        if done.is_set():
            break
    thread.join()
    return took[0], stall


def test_converting_a_large_schema_lets_other_threads_run() -> None:
    # 800 optional properties: about a second in common's converter (O(n^3) in them).
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(800)}}
    took, stall = longest_stall(lambda: chat.schema_grammar(schema))
    assert took > 0.2, f"the conversion took {took:.2f} s: too short to show anything"
    assert stall < min(0.25, took / 2), f"the main thread waited {stall:.2f} s of a {took:.2f} s conversion"


def test_tokenizing_a_long_text_lets_other_threads_run(engine: Engine) -> None:
    text = "hello world, this is some text. " * (4_000_000 // 32)  # 4 MB: seconds to tokenize
    took, stall = longest_stall(lambda: engine.tokenize(text))
    assert took > 0.2, f"tokenizing took {took:.2f} s: too short to show anything"
    assert stall < min(0.25, took / 2), f"the main thread waited {stall:.2f} s of a {took:.2f} s tokenization"


def test_a_request_error_is_an_engine_error_in_the_native_module(native) -> None:
    assert issubclass(native.RequestError, native.EngineError)
    with pytest.raises(native.RequestError):
        native.json_schema_grammar(json.dumps({"$ref": "#/nowhere"}))


def test_what_the_chat_layer_refuses_of_a_request_is_a_request_error(native) -> None:
    templates = native.ChatTemplates("chatml", "<s>", "</s>")
    inputs = native.ChatInputs()
    inputs.messages_json = json.dumps([{"role": "user", "content": "hi"}])
    inputs.tools_json = json.dumps([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    inputs.tool_choice, inputs.tool_name, inputs.add_generation_prompt = "required", "nope", True
    with pytest.raises(native.RequestError, match="not one of the tools"):
        templates.apply(inputs)
    inputs.tool_name, inputs.messages_json = "", json.dumps([{"role": 3}])
    with pytest.raises(native.RequestError, match="refused the conversation"):
        templates.apply(inputs)
    # A template that does not parse is the model's or the server's, not a request's.
    with pytest.raises(native.EngineError) as refused:
        native.ChatTemplates("{% for %}", "<s>", "</s>")
    assert not isinstance(refused.value, native.RequestError)
