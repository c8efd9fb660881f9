"""OpenAI's parameters as its own client sends them to a real `serve` on the tiny fixture: logprobs (the
engine's own score), echo, logit_bias and the penalties; and every parameter the installed `openai`
package defines walked against docs/serve.md's table and the server's refusals."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from bmoe_edge.engine.session import Engine, Sampling
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.serve import openai_api, params
from bmoe_edge.synthetic import tinymoe

from test_serve import KEY, Server, post, start, stop

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time there was a fox"


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[Server]:
    s = start(model, "--ctx", "512", "--api-key", KEY)
    yield s
    stop(s)


@pytest.fixture(scope="module")
def engine(model: Path) -> Iterator[Engine]:
    with Engine(model, StreamConfig(threads=1)) as e:
        yield e


def client(server: Server) -> openai.OpenAI:
    return server.client(KEY)


def test_completion_logprobs_are_the_engines_score_streamed_or_not(server: Server, engine: Engine) -> None:
    kw = {"model": server.model_id, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 3}
    whole = client(server).completions.create(**kw).choices[0]
    lp = whole.logprobs
    ids = engine.tokenize(PROMPT)
    gen = engine.run(ids, 8, Sampling(temp=0.0))
    assert whole.text == gen.text and len(lp.tokens) == len(gen.tokens) == 8
    score = engine.score(ids + gen.tokens)[len(ids) - 1:]
    assert lp.token_logprobs == pytest.approx(score, abs=1e-4)
    assert sum(lp.token_logprobs) == pytest.approx(sum(score), abs=1e-3)
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert next(iter(top)) == token and top[token] == chosen   # the chosen token first
        assert 3 <= len(top) <= 4 and max(top.values()) == chosen   # greedy: the most likely one
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == whole.text
    streamed = list(client(server).completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed) == whole.text
    got = [(t, p) for c in streamed if c.choices[0].logprobs for t, p in
           zip(c.choices[0].logprobs.tokens, c.choices[0].logprobs.token_logprobs, strict=True)]
    assert got == list(zip(lp.tokens, lp.token_logprobs, strict=True))
    offsets = [o for c in streamed if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset


def test_chat_logprobs_in_openais_shape_streamed_or_not(server: Server) -> None:
    kw = {"model": server.model_id, "messages": [{"role": "user", "content": "Name a colour"}], "max_tokens": 6,
          "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = client(server).chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 6
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob <= 0 and bytes(entry.bytes).decode() == entry.token
    streamed = [c for c in client(server).chat.completions.create(stream=True, **kw) if c.choices]
    assert [(e.token, e.logprob) for c in streamed if c.choices[0].logprobs for e in c.choices[0].logprobs.content] \
        == [(e.token, e.logprob) for e in content]
    plain = client(server).chat.completions.create(**{k: v for k, v in kw.items() if "logprobs" not in k})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content


def test_echo_with_logprobs_gives_one_entry_per_prompt_token(server: Server, engine: Engine) -> None:
    ids = engine.tokenize(PROMPT)
    only = client(server).completions.create(model=server.model_id, prompt=PROMPT, max_tokens=0, echo=True,
                                             logprobs=1, temperature=0).choices[0]
    assert only.text == PROMPT and len(only.logprobs.tokens) == len(ids)
    assert only.logprobs.token_logprobs[0] is None and only.logprobs.top_logprobs[0] is None
    assert only.logprobs.token_logprobs[1:] == pytest.approx(engine.score(ids), abs=1e-6)
    kw = {"model": server.model_id, "prompt": PROMPT, "max_tokens": 3, "echo": True, "logprobs": 0, "temperature": 0}
    more = client(server).completions.create(**kw).choices[0]
    gen = engine.run(ids, 3, Sampling(temp=0.0))
    assert more.text == PROMPT + gen.text and len(more.logprobs.tokens) == len(ids) + 3
    streamed = list(client(server).completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed) == more.text
    assert sum(len(c.choices[0].logprobs.tokens) for c in streamed if c.choices[0].logprobs) == len(ids) + 3
    plain = client(server).completions.create(model=server.model_id, prompt=PROMPT, max_tokens=3, echo=True,
                                              temperature=0).choices[0]
    assert plain.text == more.text and plain.logprobs is None
    # The prompt as token ids (as evaluation tools send it): the same scores, its text echoed.
    for prompt in (ids, [ids]):
        given = client(server).completions.create(model=server.model_id, prompt=prompt, max_tokens=0, echo=True,
                                                  logprobs=1, temperature=0).choices[0]
        assert given.text == engine.text(ids) and given.logprobs.token_logprobs == only.logprobs.token_logprobs
    for bad in ([1, 99999999], [ids, ids], [1, "x"], [True]):
        r = post(server, "/v1/completions", {"prompt": bad, "max_tokens": 1})
        assert r.status_code == 400 and "prompt" in r.json()["error"]["message"], r.text


def test_a_logit_bias_bans_or_forces_a_token(server: Server, engine: Engine) -> None:
    ids = engine.tokenize(PROMPT)
    greedy = engine.run(ids, 4, Sampling(temp=0.0)).tokens
    kw = {"model": server.model_id, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2}
    plain = client(server).completions.create(**kw).choices[0].logprobs
    banned = client(server).completions.create(logit_bias={str(greedy[0]): -100}, **kw).choices[0]
    # The first token changes to the model's second choice; its logprob is still the model's own.
    second = list(plain.top_logprobs[0].items())[1]
    assert banned.logprobs.tokens[0] != plain.tokens[0]
    assert (banned.logprobs.tokens[0], banned.logprobs.token_logprobs[0]) == second
    forced = client(server).completions.create(logit_bias={str(greedy[0]): 100}, **kw).choices[0]
    assert forced.logprobs.tokens == [plain.tokens[0]] * 4
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "logit_bias": {"99999999": 5}})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    for bad in ({"x": 1}, {"5": 101}, {"5": "high"}, [5]):
        r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "logit_bias": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
    assert client(server).completions.create(**kw).choices[0].logprobs.tokens == plain.tokens


def test_penalties_change_a_repetitive_continuation_as_llama_cpp_computes_them(server: Server,
                                                                             engine: Engine) -> None:
    ids = engine.tokenize(PROMPT)
    token = engine.run(ids, 1, Sampling(temp=0.0)).tokens[0]
    # The random fixture never repeats itself: a bias on its first token makes a continuation that does.
    kw = {"model": server.model_id, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 0,
          "logit_bias": {str(token): 25}}
    plain = client(server).completions.create(**kw).choices[0]
    assert plain.logprobs.tokens.count(plain.logprobs.tokens[0]) >= 12
    penalised = client(server).completions.create(presence_penalty=2, frequency_penalty=2, **kw).choices[0]
    assert penalised.text != plain.text
    assert penalised.logprobs.tokens.count(plain.logprobs.tokens[0]) < plain.logprobs.tokens.count(
        plain.logprobs.tokens[0])
    # Every step by hand from the raw logits: plus the bias, minus 2 per count and 2 per presence in the
    # window (the last 64 tokens, the prompt's included, as llama-server counts them).
    sampling = Sampling(temp=0.0, logit_bias=f"{token}:25", presence_penalty=2.0, frequency_penalty=2.0)
    gen = engine.run(ids, 16, sampling, logits=True)
    assert gen.text == penalised.text
    seen = list(ids)
    for raw, chosen in zip(gen.logits, gen.tokens, strict=True):
        logits = np.frombuffer(raw, dtype=np.float32).copy()
        logits[token] += np.float32(25)
        counts = np.bincount(seen[-64:], minlength=logits.size).astype(np.float32)
        assert int(np.argmax(logits - (counts * 2 + (counts > 0) * np.float32(2)))) == chosen
        seen.append(chosen)
    repeat = client(server).completions.create(extra_body={"repeat_penalty": 3.0, "repeat_last_n": -1}, **kw)
    assert repeat.choices[0].text != plain.text
    r = post(server, "/v1/completions", {"prompt": PROMPT, "presence_penalty": 2.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "presence_penalty"


def test_speculative_logprobs_are_the_verified_positions(model: Path) -> None:
    with Engine(model, StreamConfig(threads=1)) as plain_engine:
        ids = plain_engine.tokenize(PROMPT)
        token = plain_engine.run(ids, 1, Sampling(temp=0.0)).tokens[0]
        # A forced token repeats, so prompt-lookup drafts are accepted (the logprobs stay the model's own).
        sampling = Sampling(temp=0.0, logprobs=2, logit_bias=f"{token}:100")
        plain = list(plain_engine.generate(ids, 24, sampling))
    with Engine(model, StreamConfig(threads=1, speculative="ngram")) as spec_engine:
        spec = list(spec_engine.generate(ids, 24, sampling))
    assert sum(t.metrics.accepted for t in spec) > 0   # drafts were verified in a batch
    assert [t.id for t in spec] == [t.id for t in plain]
    for a, b in zip(spec, plain, strict=True):
        assert a.logprobs.chosen.token == a.id
        assert [t.token for t in a.logprobs.top] == [t.token for t in b.logprobs.top]
        assert a.logprobs.chosen.logprob == pytest.approx(b.logprobs.chosen.logprob, abs=1e-4)


def test_the_sampling_rows_check_what_a_request_cannot_reach() -> None:
    for bad in ({"logit_bias": "5"}, {"logit_bias": "5:200"}, {"logit_bias": "-1:3"}, {"presence_penalty": 3.0},
                {"repeat_penalty": 0.0}, {"logprobs": 21}):
        with pytest.raises(BmoeError, match=next(iter(bad))):
            Sampling(**bad)
    assert Sampling(logit_bias="5:-100,7:2.5", penalty_last_n=-1).logprobs == -1


def _table() -> dict[str, dict[str, str]]:
    """docs/serve.md's parameter table: route -> parameter -> supported, refused or ignored."""
    text = (ROOT / "docs" / "serve.md").read_text()
    section = text.split("### Parameters", 1)[1].split("\n\n**", 1)[0]
    out: dict[str, dict[str, str]] = {"chat": {}, "completions": {}}
    for row in re.findall(r"^\| (`.+?) \| (\S+) \| (\S+) \|", section, re.M):
        for name in re.findall(r"`(\w+)`", row[0]):
            for route, status in zip(("chat", "completions"), row[1:], strict=True):
                if status != "—":
                    assert name not in out[route], f"{name} is in the table twice for {route}"
                    out[route][name] = status
    return out


def _openai_parameters(module: typing.Any) -> set[str]:
    params = module.CompletionCreateParamsStreaming
    return set(params.__required_keys__ | params.__optional_keys__)


def test_every_openai_parameter_is_in_the_table_and_refused_ones_are_400s(server: Server) -> None:
    table = _table()
    for route, module in (("chat", chat_params), ("completions", completion_params)):
        assert set(table[route]) == _openai_parameters(module), route
        assert set(table[route].values()) <= {"supported", "refused", "ignored"}
        refused = {name for name, status in table[route].items() if status == "refused"}
        assert refused == set(openai_api.REFUSED[route]), route
        # the table in the docs is the server's own (serve/params.py, which the fuzzer draws from)
        declared = {p.name: p.status(route) for p in params.of(route).values() if p.openai}
        assert table[route] == declared, route
    base = {"chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
            "completions": ("/v1/completions", {"prompt": "Hi", "max_tokens": 1})}
    for route, (path, body) in base.items():
        for name, status in table[route].items():
            if status == "supported":
                continue
            r = post(server, path, body | {name: "something-else"})
            if status == "refused":
                assert r.status_code == 400 and r.json()["error"]["param"] == name, (route, name, r.text)
            else:
                assert r.status_code == 200, (route, name, r.text)
    # The values the server does honour pass, and so does a parameter OpenAI does not define.
    ok = post(server, "/v1/chat/completions", base["chat"][1] | {
        "store": False, "parallel_tool_calls": True, "service_tier": "auto", "modalities": ["text"], "n": 1,
        "not_an_openai_parameter": {"x": 1}})
    assert ok.status_code == 200, ok.text
    assert post(server, "/v1/completions", base["completions"][1] | {"best_of": 1, "suffix": ""}).status_code == 200
