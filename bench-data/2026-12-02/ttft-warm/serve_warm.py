"""Issue 29, in `serve`: a fresh `bmoe-edge serve` (40% cap and the Pi 5 Gen 2 throttle, in one cgroup as bench
stream's cells) gets a 512-token prompt either at once (cold: its engine thread has had no idle time to warm the
pool) or once `/metrics` says the pool is warm (`bmoe_expert_pool_to_warm_bytes` 0). TTFT measured by OpenAI's
client (streaming: the first chunk with text), and the server's own. Rounds alternate the order. Writes
serve-warm.jsonl beside this file.

usage: serve_warm.py MODEL CAP_MIB [ROUNDS]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

from bmoe_edge.bench import ramcap
from bmoe_edge.bench.machine import LONG_TEXT, drop_page_cache
from bmoe_edge.bench.storage import block_device
from bmoe_edge.engine import Engine, StreamConfig

GEN2_BPS, GEN2_IOPS = 430_000_000, 50_000


def prompt_of(model: Path, n_tokens: int, salt: str) -> str:
    with Engine(model, StreamConfig(ctx=256, batch=64, ubatch=64, cache_mb=0)) as e:  # lazy: reads no experts
        text = salt
        while len(e.tokenize(text)) < n_tokens:
            text += " " + LONG_TEXT
        return text


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        return {k: float(v) for k, v in re.findall(r"^(\w+) (\S+)$", r.read().decode(), re.M)}


def one(model: Path, cap_mib: int, mode: str, prompt: str, launcher: tuple[str, ...] = ("-m", "bmoe_edge")
        ) -> dict[str, object]:
    drop_page_cache(model)
    cap = ramcap.make_cap(cap_mib * 2**20, "auto", ramcap.ReadLimit(block_device(model), GEN2_BPS, GEN2_IOPS))
    cap.prepare()
    proc = subprocess.Popen([sys.executable, *launcher, "serve", "-m", str(model), "--port", "0", "--no-auth"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=cap.preexec)
    assert proc.stderr is not None
    try:
        while True:
            line = proc.stderr.readline()
            if not line:
                raise SystemExit(f"serve exited: {proc.wait()}")
            found = re.search(r"on (http://[\d.]+:\d+)/v1", line)
            if found:
                url = found[1]
                break
        t_up = time.perf_counter()
        warm_s = 0.0
        if mode == "warm":
            while metrics(url)["bmoe_expert_pool_to_warm_bytes"] > 0 or time.perf_counter() - t_up < 0.5:
                time.sleep(0.1)
            warm_s = time.perf_counter() - t_up
        left = metrics(url)["bmoe_expert_pool_to_warm_bytes"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=900)
        t0 = time.perf_counter()
        first = None
        for chunk in client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=8,
                                               temperature=0, stream=True):
            if chunk.choices and chunk.choices[0].text and first is None:
                first = time.perf_counter() - t0
        after = metrics(url)
        return {"mode": mode, "warm_wait_s": round(warm_s, 2), "to_warm_mib_at_request": round(left / 2**20, 1),
                "ttft_s": round(first or -1, 3), "server_ttft_s": round(after["bmoe_time_to_first_token_seconds"], 3),
                "prompt_tokens": after["bmoe_prompt_tokens_total"],
                "prefill_mib": round(after["bmoe_prefill_bytes_read_total"] / 2**20, 1)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        cap.finish()


def main() -> None:
    model, cap_mib = Path(sys.argv[1]), int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    out = Path(__file__).with_name("serve-warm.jsonl")
    with out.open("a") as f:
        for r in range(rounds):
            for mode in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
                row = {"round": r, **one(model, cap_mib, mode, prompt_of(model, 512, f"Round {r} {mode}."))}
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
