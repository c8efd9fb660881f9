"""The HTTP fuzz campaign's CI sample: generated requests against a real `serve` on the tiny fixture,
each followed by a greedy probe and /health (bmoe_edge/proof/http_fuzz.py); the full run's data is in
bench-data/2026-12-01/http-fuzz/."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bmoe_edge.proof import http_checks, http_fuzz, request_space
from bmoe_edge.serve import params
from bmoe_edge.synthetic import tinymoe

from conftest import run_cli


def test_the_mutator_is_seeded_and_covers_every_layer() -> None:
    a = [(c.name, c.body, c.headers) for c in http_fuzz.cases(300, seed=4)]
    assert a == [(c.name, c.body, c.headers) for c in http_fuzz.cases(300, seed=4)]
    names = " ".join(n for n, _, _ in a)
    for step in ("value@", "drop@", "add:", "cut@", "garbage", "origin", "host:", "method:", "no-key", "valid",
                 "param:", "=bad", "=ok", "hangup@"):
        assert step in names, step
    assert any(b is not None and b"\\ud800" in b for _, b, _ in a)   # a lone surrogate, escaped as JSON allows


def test_every_routed_path_is_requested_and_mutated_from_the_server_s_own_tables() -> None:
    """The requests' paths are app.paths(): the routes create_app makes (the same set, checked against a real app),
    each one requested, and paths next to them (a traversal, an encoded or doubled character, ...) besides."""
    from types import SimpleNamespace

    from bmoe_edge.serve import app, ui

    made = {r.path: "GET" if "GET" in r.methods else "POST"
            for r in app.create_app(SimpleNamespace(), "m").routes}   # type: ignore[arg-type]
    assert app.paths() == made and {"/", "/ui/app.js", "/health", "/v1/chat/completions"} <= set(made)
    cases = list(http_fuzz.cases(3000, seed=9))
    requested = {c.path for c in cases}
    assert set(made) <= requested, set(made) - requested
    assert all(c.body is None for c in cases if c.method in ("GET", "HEAD"))
    gets = [c for c in cases if c.method == "GET" and c.path in made and made[c.path] == "GET"]
    assert any(c.path.startswith(ui.PREFIX) for c in gets) and any(c.method == "HEAD" for c in cases)
    near = {c.path for c in cases if c.path not in made and c.path not in http_fuzz.UNROUTED}
    assert len(near) > 100 and any("/../" in p for p in near) and any("%2F" in p for p in near), sorted(near)


def test_a_route_added_to_the_server_is_fuzzed_with_no_change_to_the_fuzzer(monkeypatch: pytest.MonkeyPatch) -> None:
    from bmoe_edge.serve import app

    monkeypatch.setattr(app, "OWN_ROUTES", {**app.OWN_ROUTES, "/v1/brand-new": ("models", False)})
    assert "/v1/brand-new" in {r.path for r in app.create_app(object(), "m").routes}   # type: ignore[arg-type]
    names = [c.name for c in http_fuzz.cases(600, seed=2)]
    assert any(n.split(":")[1] == "/v1/brand-new" for n in names)


def _bodies(count: int, seed: int) -> list[dict]:
    out = []
    for c in http_fuzz.cases(count, seed):
        try:
            body = json.loads(c.body or b"null")
        except (ValueError, RecursionError):
            continue
        if isinstance(body, dict):
            out.append(body)
    return out


def test_a_parameter_added_to_the_table_is_fuzzed_with_no_change_to_the_fuzzer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The request space is the server's own parameter table (serve/params.py): a row added there is drawn in range,
    at its edges and past them, without a line of the fuzzer changed."""
    new = params.Param("brand_new_knob", params.Integer(0, 7), **dict.fromkeys(params.ROUTES, "supported"),
                       openai=False)
    monkeypatch.setattr(params, "PARAMETERS", (*params.PARAMETERS, new))
    values = [b["brand_new_knob"] for b in _bodies(3000, seed=3) if "brand_new_knob" in b]
    inside = [v for v in values if type(v) is int and 0 <= v <= 7]
    assert {0, 7} <= set(inside), values   # its edges
    assert any(v in (-1, 8) for v in values), values   # just past them
    assert any(type(v) is not int for v in values), values   # the wrong type


def test_every_kind_of_value_in_the_table_has_a_generator() -> None:
    rng = random.Random(1)
    for p in params.PARAMETERS:
        for valid in (True, False):
            json.dumps(request_space.value(p, rng, valid))   # drawn, and JSON
    with pytest.raises(KeyError, match="no fuzz generator"):
        request_space.value(params.Param("x", object(), chat="supported"), rng, True)   # type: ignore[arg-type]


def test_streams_and_errors_are_checked_in_their_apis_shapes() -> None:
    """The campaign's own checks: a stream ends as its API ends one, an event's name is its data's type, an error is
    the route's API's object."""
    sse = {"content-type": "text/event-stream"}

    def stream(*events: tuple[str | None, str]) -> bytes:
        return "".join((f"event: {name}\n" if name else "") + f"data: {data}\n\n" for name, data in events).encode()

    assert http_checks.good_success(sse, stream((None, "{}"), (None, "[DONE]"))) == ""
    assert http_checks.good_success(sse, stream(("message_start", '{"type": "message_start"}'),
                                               ("message_stop", '{"type": "message_stop"}'))) == ""
    assert http_checks.good_success(sse, stream(("response.created", '{"type": "response.created"}'),
                                               ("response.incomplete", '{"type": "response.incomplete"}'))) == ""
    assert "ends without" in http_checks.good_success(sse, stream(("message_start", '{"type": "message_start"}')))
    assert "not of that type" in http_checks.good_success(sse, stream(("message_stop", '{"type": "ping"}')))
    anthropic_error = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}'
    openai_error = b'{"error": {"message": "x", "type": "invalid_request_error", "param": null, "code": null}}'
    assert http_checks.is_error_object(anthropic_error, "/v1/messages/count_tokens")
    assert not http_checks.is_error_object(openai_error, "/v1/messages?x=1")
    assert http_checks.is_error_object(openai_error, "/v1/responses")
    assert not http_checks.is_error_object(anthropic_error, "/v1/chat/completions")
    # judged by the path the server routes: percent-decoded (seed 2 of the 1,000-request campaign sent this one)
    assert http_checks.is_error_object(anthropic_error, "/v1/messages%2F")
    assert not http_checks.is_error_object(openai_error, "/v1/messages%2F?x=1")
    assert http_checks.is_error_object(openai_error, "/v1/chat%2Fcompletions")


def test_an_answer_to_head_is_judged_by_its_headers() -> None:
    """HEAD's answers carry no body (RFC 9110): a refusal is one by its JSON content type; a body is a finding."""
    json_type = {"content-type": "application/json"}
    assert http_checks.outcome_of("HEAD", "/v1/completions", 405, json_type, b"")[0] == "refused"
    assert http_checks.outcome_of("HEAD", "/v1/completions", 405, {"content-type": "text/html"}, b"")[0] == "bad-body"
    assert http_checks.outcome_of("HEAD", "/v1/completions", 405, json_type, b'{"error": 1}')[0] == "bad-body"
    assert http_checks.outcome_of("HEAD", "/v1/completions", 500, json_type, b"")[0] == "server-error"
    # a GET's refusal is the error object
    assert http_checks.outcome_of("GET", "/v1/completions", 405, json_type, b"")[0] == "bad-body"


def test_a_sample_of_the_campaign_finds_nothing(tmp_path: Path) -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    vitals = http_fuzz.Vitals()
    results = list(http_fuzz.run_campaign(model, tmp_path, 150, seed=11, template=http_fuzz.qwen3_template(),
                                          parallel=2, vitals=vitals))
    bad = [r for r in results if r.outcome not in http_fuzz.PASSING]
    assert not bad, bad[:5]
    outcomes = {r.outcome for r in results}
    assert {"ok", "refused"} <= outcomes
    assert vitals.health_polls > 0 and vitals.health_slow == 0 and vitals.restarts == 0, vitals.summary()
    assert len(vitals.samples) == 150


def test_the_command_writes_its_records(tmp_path: Path) -> None:
    result = run_cli("fuzz", "--http", "--requests", "12", "--seed", "2", "--out", str(tmp_path / "out"),
                     "--workdir", str(tmp_path / "work"), "--parallel", "2", "--connection-rounds", "1", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "http-fuzz.jsonl").read_text().splitlines()]
    requests = [r for r in records if "outcome" in r]
    assert len(requests) == 12 and all(r["outcome"] in http_fuzz.PASSING for r in requests)
    [connections] = [r["connections"] for r in records if "connections" in r]
    assert connections["rounds"] == 1 and connections["ok"], connections
    assert records[-1]["problems"] == []
    assert "| requests |" in (tmp_path / "out" / "http-fuzz.md").read_text()
