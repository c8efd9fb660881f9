"""The HTTP fuzz campaign's CI sample: generated requests against a real `serve` on the tiny fixture,
each followed by a greedy probe and /health (bmoe_edge/proof/http_fuzz.py); the full run's data is in
docs/bench-data/2026-12-01/http-fuzz/."""

from __future__ import annotations

import json
from pathlib import Path

from bmoe_edge.proof import http_fuzz
from bmoe_edge.synthetic import tinymoe

from conftest import run_cli


def test_the_mutator_is_seeded_and_covers_every_layer() -> None:
    a = [(c.name, c.body, c.headers) for c in http_fuzz.cases(300, seed=4)]
    assert a == [(c.name, c.body, c.headers) for c in http_fuzz.cases(300, seed=4)]
    names = " ".join(n for n, _, _ in a)
    for step in ("value@", "drop@", "add:", "cut@", "garbage", "origin", "host:", "method:", "no-key", "valid"):
        assert step in names, step
    assert any(b is not None and b"\\ud800" in b for _, b, _ in a)   # a lone surrogate, escaped as JSON allows


def test_a_sample_of_the_campaign_finds_nothing(tmp_path: Path) -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    results = list(http_fuzz.run_campaign(model, tmp_path, 150, seed=11, template=http_fuzz.qwen3_template()))
    bad = [r for r in results if r.outcome not in http_fuzz.PASSING]
    assert not bad, bad[:5]
    outcomes = {r.outcome for r in results}
    assert {"ok", "refused"} <= outcomes


def test_the_command_writes_its_records(tmp_path: Path) -> None:
    result = run_cli("fuzz", "--http", "--requests", "12", "--seed", "2", "--out", str(tmp_path / "out"),
                     "--workdir", str(tmp_path / "work"), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "http-fuzz.jsonl").read_text().splitlines()]
    assert len(records) == 12 and all(r["outcome"] in http_fuzz.PASSING for r in records)
    assert "| requests |" in (tmp_path / "out" / "http-fuzz.md").read_text()
